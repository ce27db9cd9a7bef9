"""Clock alignment across hosts: per-rank offsets from the matched collective instances (`clock_offsets`),
the clock domains ranks share (`clock_domains`), and the CLOCK_SKEW finding (`clock_findings`).

Used by `tracelens.analyze.comm.stragglers` after `tracelens.analyze.comm.collectives.match`; re-exported there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core.blas import one_blas_thread
from tracelens.analyze.core.frame_cells import unique_inverse
from tracelens.findings import finding


@dataclass
class ClockResult:
    """Per-rank clock offsets (ns to subtract from a rank's timestamps) and how they were found."""

    offsets_ns: dict[int, int]
    unit_of: dict[int, str]  # rank -> clock domain (host name, or "rank N" when hosts are unknown)
    instances_used: int = 0
    residual_ns: float = 0.0  # median |end - aligned common end| after alignment
    unit_offsets_ns: dict[str, int] = field(default_factory=dict)


def clock_domains(ranks: Iterable[int], metadata: pa.Table | None) -> dict[int, str]:
    """rank -> clock domain: its host name when every rank's host is known, else the rank itself."""
    ranks = [int(r) for r in ranks]
    hosts: dict[int, str] = {}
    if metadata is not None and "host_name" in metadata.column_names:
        for r, h in zip(metadata.column("rank").to_pylist(), metadata.column("host_name").to_pylist()):
            if r is not None and h:
                hosts[int(r)] = str(h)
    if ranks and all(r in hosts for r in ranks):
        return {r: f"host {hosts[r]}" for r in ranks}
    return {r: f"rank {r}" for r in ranks}


def clock_offsets(df: pd.DataFrame, metadata: pa.Table | None = None) -> ClockResult:
    """Offsets from end times of matched instances. Ranks on one host share CLOCK_REALTIME, so hosts are the
    clock domains. For every pair of domains meeting in instances, the median over those instances of the
    difference of their ends estimates the difference of their offsets; a weighted least-squares fit of all
    pairs gives one offset per domain (the lowest rank's domain is 0 in each connected set of domains)."""
    ranks = sorted(int(r) for r in df["rank"].unique()) if len(df) else []
    unit_of = clock_domains(ranks, metadata)
    offsets = {r: 0 for r in ranks}
    if not ranks:
        return ClockResult(offsets, unit_of)
    units = sorted(set(unit_of.values()), key=lambda u: min(r for r in ranks if unit_of[r] == u))
    if len(units) == 1:
        return ClockResult(offsets, unit_of, 0, 0.0, {units[0]: 0})
    n = len(units)
    uidx = {u: i for i, u in enumerate(units)}
    keep = (~df["end_ns"].isna() & ~df["instance"].isna()).to_numpy(dtype=bool)
    rank_all = df["rank"].astype(int).to_numpy()[keep]
    inst_all = df["instance"].astype("Int64").to_numpy(dtype=np.int64, na_value=-1)[keep]
    u_rank, r_inv = unique_inverse(rank_all)
    u_all = np.array([uidx[unit_of[int(r)]] for r in u_rank], dtype=np.int64)[r_inv.reshape(-1)]
    # instances seen from more than one domain (their distinct (instance, domain) pairs)
    i_code, i_inv = unique_inverse(inst_all)
    i_inv = i_inv.reshape(-1)
    nunits = np.bincount(unique_inverse(i_inv * n + u_all)[0] // n, minlength=i_code.size)
    sel = nunits[i_inv] > 1
    if not sel.any():
        return ClockResult(offsets, unit_of, 0, 0.0, {u: 0 for u in units})
    end = df["end_ns"].astype("Int64").to_numpy(dtype=np.int64, na_value=0)[keep][sel]
    inst, u = inst_all[sel], u_all[sel]
    e = (end - end.min()).astype(np.float64)
    inst_idx = unique_inverse(inst)[1]
    # one end per (instance, domain): the median of its ranks' ends; anchored on the instance's first domain
    g_inst, g_u, g_e = _group_median(inst_idx * n + u, e, n)
    first = np.r_[True, g_inst[1:] != g_inst[:-1]]  # (pairs in (instance, domain) order: the lowest first)
    anchor = g_u[np.flatnonzero(first)][np.cumsum(first) - 1]
    anchor_e = g_e[np.flatnonzero(first)][np.cumsum(first) - 1]
    other = ~first
    p_key, p_med, p_size = _group_median_size(g_u[other] * n + anchor[other], (g_e - anchor_e)[other])
    p_u, p_anchor = p_key // n, p_key % n
    rows = np.arange(p_key.size)
    a = np.zeros((p_key.size, n))
    a[rows, p_u] = 1.0
    a[rows, p_anchor] = -1.0
    w = np.sqrt(p_size.astype(float))
    with (
        one_blas_thread()
    ):  # (threaded OpenBLAS spins for 0.05-1.3 s on this small fit: analyze/core/blas.py)
        o = np.linalg.lstsq(a * w[:, None], p_med * w, rcond=None)[0]
    comp = _components(u, inst_idx, n)
    ref: dict[int, int] = {}
    for i in range(n):  # reference domain of each component: the first (lowest rank) one
        ref.setdefault(comp[i], i)
    o = o - np.array([o[ref[comp[i]]] for i in range(n)])
    _, _, common = _group_median(inst_idx, e - o[u], 1)
    residual = float(np.median(np.abs(e - o[u] - common[inst_idx])))
    unit_off = {units[i]: round(float(o[i])) for i in range(n)}
    offsets = {r: unit_off[unit_of[r]] for r in ranks}
    return ClockResult(offsets, unit_of, int(inst_idx.max()) + 1, residual, unit_off)


def _group_median(key: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct key (ascending), as pandas' groupby median: key // n, key % n and the median of v."""
    k, med, _ = _group_median_size(key, v)
    return k // n, k % n, med


def _group_median_size(key: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct keys (ascending), the median of v over each (the mean of the two middle values when even,
    as pandas takes it) and the number of values."""
    o = np.lexsort((v, key))
    ks, vs = key[o], v[o]
    start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    size = np.diff(np.r_[start, ks.size])
    med = (vs[start + (size - 1) // 2] + vs[start + size // 2]) / 2
    return ks[start], med, size


def _components(u: np.ndarray, inst_idx: np.ndarray, n_units: int) -> list[int]:
    """Connected components of clock domains linked by shared instances (small union-find)."""
    parent = list(range(n_units))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    # each instance's domains joined to its lowest one: the distinct (lowest, domain) pairs, once
    low = np.full(int(inst_idx.max(initial=-1)) + 1, n_units, dtype=np.int64)
    np.minimum.at(low, inst_idx, u)
    for code in unique_inverse(low[inst_idx] * n_units + u)[0].tolist():
        ra, rb = find(code // n_units), find(code % n_units)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [find(i) for i in range(n_units)]


def clock_findings(clock: ClockResult, threshold_ns: int) -> list[dict[str, Any]]:
    """CLOCK_SKEW when two clock domains differ by more than `threshold_ns`."""
    if not clock.unit_offsets_ns:
        return []
    vals = clock.unit_offsets_ns
    spread = max(vals.values()) - min(vals.values())
    if spread <= threshold_ns:
        return []
    lo = min(vals, key=lambda u: vals[u])
    hi = max(vals, key=lambda u: vals[u])
    ranks = sorted(r for r, o in clock.offsets_ns.items() if abs(o) > threshold_ns)
    return [
        finding(
            "CLOCK_SKEW",
            "warning" if spread > 10 * threshold_ns else "info",
            f"clocks differ by up to {spread / 1e6:.3f} ms ({hi} vs {lo}); cross-rank timing is aligned "
            f"using the end times of {clock.instances_used} matched collectives",
            ranks=ranks,
            offsets_ms={k: v / 1e6 for k, v in vals.items()},
            max_skew_ms=spread / 1e6,
        )
    ]
