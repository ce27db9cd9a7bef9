"""Clock alignment across hosts: per-rank offsets from the matched collective instances (`clock_offsets`),
the clock domains ranks share (`clock_domains`), and the CLOCK_SKEW finding (`clock_findings`).

Used by `tracelens.analyze.stragglers` after `tracelens.analyze.collectives.match`; re-exported there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

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
    d = df[~df["end_ns"].isna() & ~df["instance"].isna()][["instance", "rank", "end_ns"]].copy()
    d["unit"] = d["rank"].astype(int).map(unit_of)
    nunits = d.groupby("instance")["unit"].nunique()
    d = d[d["instance"].isin(nunits[nunits > 1].index)]
    if d.empty:
        return ClockResult(offsets, unit_of, 0, 0.0, {u: 0 for u in units})
    n = len(units)
    uidx = {u: i for i, u in enumerate(units)}
    end = d["end_ns"].astype("int64").to_numpy()
    d = pd.DataFrame(
        {
            "instance": d["instance"].astype("int64").to_numpy(),
            "u": d["unit"].map(uidx).to_numpy(),
            "e": (end - end.min()).astype(np.float64),
        }
    )
    # one end per (instance, domain): the median of its ranks' ends; anchored on the instance's first domain
    g = d.groupby(["instance", "u"])["e"].median().reset_index()
    g["anchor"] = g.groupby("instance")["u"].transform("min")
    anchor_end = g[g["u"] == g["anchor"]].set_index("instance")["e"]
    g["diff"] = g["e"] - g["instance"].map(anchor_end)
    pairs = g[g["u"] != g["anchor"]].groupby(["u", "anchor"])["diff"].agg(["median", "size"]).reset_index()
    rows = np.arange(len(pairs))
    a = np.zeros((len(pairs), n))
    a[rows, pairs["u"].to_numpy()] = 1.0
    a[rows, pairs["anchor"].to_numpy()] = -1.0
    w = np.sqrt(pairs["size"].to_numpy(dtype=float))
    o = np.linalg.lstsq(a * w[:, None], pairs["median"].to_numpy(dtype=float) * w, rcond=None)[0]
    inst_idx = np.unique(d["instance"].to_numpy(), return_inverse=True)[1]
    u = d["u"].to_numpy()
    comp = _components(u, inst_idx, n)
    ref: dict[int, int] = {}
    for i in range(n):  # reference domain of each component: the first (lowest rank) one
        ref.setdefault(comp[i], i)
    o = o - np.array([o[ref[comp[i]]] for i in range(n)])
    e = d["e"].to_numpy()
    common = pd.Series(e - o[u]).groupby(inst_idx).median().to_numpy()
    residual = float(np.median(np.abs(e - o[u] - common[inst_idx])))
    unit_off = {units[i]: round(float(o[i])) for i in range(n)}
    offsets = {r: unit_off[unit_of[r]] for r in ranks}
    return ClockResult(offsets, unit_of, int(inst_idx.max()) + 1, residual, unit_off)


def _components(u: np.ndarray, inst_idx: np.ndarray, n_units: int) -> list[int]:
    """Connected components of clock domains linked by shared instances (small union-find)."""
    parent = list(range(n_units))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[int, int] = {}
    for a, i in zip(u.tolist(), inst_idx.tolist()):
        if i in first:
            ra, rb = find(a), find(first[i])
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
        else:
            first[i] = a
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
