"""Cross-rank analysis: who makes the others wait, why, and what it costs.

In a blocking collective the early ranks wait inside the collective, so a slow rank shows the *shortest*
collectives and the *least* exposed communication while its peers look communication-bound. Ranking ranks by
step time or communication time blames the wrong ones. Here a rank is a straggler only when it has its own
excess (not time spent waiting on others) against the robust centre of its peers, in most steps, and it
materially delays the step:

* compute: its compute time is above its stage peers' median (one-sided, MAD-scaled), and it arrives last;
* host: its device sat idle longer than its peers' (launch, data loading, CPU stall), and it arrives last;
* communication: the transfers of every group it belongs to are slower than those of other groups doing the
  same op on the same size (a slow link: the one rank common to all slow groups).

See docs/stragglers.md for the method and a worked example.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.comm import collectives as C
from tracelens.analyze.comm.wait_split import lanes_for
from tracelens.analyze.comm.wait_transfer import to_table, wait_transfer
from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.frame_cells import first_rows, per_distinct, row_codes, unique_inverse
from tracelens.analyze.rank.breakdown import breakdown as _breakdown
from tracelens.analyze.rank.breakdown import class_sets
from tracelens.findings import finding
from tracelens.schema import RankSets
from tracelens.thresholds import DEFAULT, Thresholds

CAUSES = ("compute", "host", "communication")


@dataclass
class StragglerConfig:
    """Thresholds of the straggler verdict: `StragglerConfig.of(thresholds)` (the defaults and their reasons are
    in tracelens.thresholds; docs/stragglers.md)."""

    persistence: float = 0.5  # flagged in at least this fraction of the analyzed steps
    min_cost_fraction: float = 0.03  # median per-step cost >= this fraction of the median step time
    min_excess_fraction: float = 0.03  # per step: excess >= this fraction of the peers' step time ...
    mad_k: float = 3.0  # ... and >= k x 1.4826 x MAD of the peers
    min_blame_fraction: float = 0.25  # per step (compute, host): delay caused >= this fraction of the excess
    slow_link_ratio: float = 1.3  # communication: transfers >= this many times the reference of the same kind
    min_link_calls: int = 4  # communication: a group is judged on at least this many calls
    clock_skew_ns: int = 100_000  # CLOCK_SKEW above 0.1 ms between clock domains
    ops_excess: float = 0.02  # time-shared CPUs: compute-op count excess over stage peers
    stall_min_ns: int = 1_000_000  # a host stall is at least this long ...
    stall_spread: float = 1.5  # ... and repeats within this factor of its length in every step

    @classmethod
    def of(cls, t: Thresholds) -> StragglerConfig:
        """The straggler thresholds of a run's verdict thresholds (tracelens.thresholds)."""
        return cls(
            persistence=t.straggler_persistence,
            min_cost_fraction=t.straggler_min_cost,
            min_excess_fraction=t.straggler_min_excess,
            mad_k=t.straggler_mad_k,
            min_blame_fraction=t.straggler_min_blame,
            slow_link_ratio=t.slow_link_ratio,
            min_link_calls=t.slow_link_min_calls,
            clock_skew_ns=int(round(t.clock_skew_us * 1000)),
            ops_excess=t.ops_excess,
            stall_min_ns=int(round(t.stall_min_ms * 1e6)),
            stall_spread=t.stall_spread,
        )


@dataclass
class CrossRankResult:
    """Everything the cross-rank analysis found; tables are Arrow, times in ns unless named *_ms."""

    collectives: pa.Table
    offsets_ns: dict[int, int]
    exposed_split: pa.Table
    arrival_lag: pa.Table
    stragglers: list[dict[str, Any]]
    findings: list[dict[str, Any]]
    peers: dict[int, int] = field(default_factory=dict)  # rank -> peer group (stage) used for comparisons
    clock: C.ClockResult | None = None

    def one_line(self) -> str:
        """E.g. "straggler: rank 5 (compute, +23% compute vs stage peers, costs 41 ms/step)"."""
        if not self.stragglers:
            return "no straggler"
        parts = [_describe(s) for s in self.stragglers]
        return ("straggler: " if len(parts) == 1 else "stragglers: ") + "; ".join(parts)


def _describe(s: dict[str, Any]) -> str:
    ev = s["evidence"]
    vs = ev["peer_kind"] if str(ev["peer_kind"]).startswith("other") else f"{ev['peer_kind']} peers"
    if s["cause"] == "compute" and ev.get("work_per_layer_ratio"):
        what = f"{ev['work_per_layer_ratio']:.1f}x the matmul work per layer of the other stages"
    elif s["cause"] == "compute" and ev.get("time_shared_host"):
        what = f"+{100 * (ev['ops_ratio'] - 1):.0f}% compute ops per step vs {vs}"
    elif s["cause"] == "compute":
        what = f"+{100 * (ev['compute_ratio'] - 1):.0f}% compute vs {vs}"
    elif s["cause"] == "host" and ev.get("host_frames"):
        what = f"host stall +{ev['idle_excess_ms']:.1f} ms/step in {ev['host_frames'][0]} vs {vs}"
    elif s["cause"] == "host":
        what = f"device idle +{ev['idle_excess_ms']:.1f} ms/step vs {vs}"
    else:
        what = f"transfers {ev['transfer_ratio']:.1f}x slower than other groups'"
    cost = s["cost_ms"]
    text = f"{cost:.1f}" if cost >= 1 else f"{cost:.2f}"
    return f"rank {s['rank']} ({s['cause']}, {what}, costs {text} ms/step)"


# ----------------------------------------------------------------------------------------------------
# peers
# ----------------------------------------------------------------------------------------------------
def infer_peer_groups(df: pd.DataFrame, ranks: list[int]) -> dict[int, int]:
    """rank -> peer-group id when no stages are given: ranks joined by non-p2p collectives, leaving out any
    group that spans both ends of a send/recv (stages talk by p2p, so such a group crosses stages)."""
    parent = {r: r for r in ranks}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if not df.empty:
        p2p = df[df["is_p2p"].astype(bool) & ~df["peer"].isna()]
        pairs = {tuple(sorted((int(a), int(b)))) for a, b in zip(p2p["rank"], p2p["peer"])}
        coll = df[~df["is_p2p"].astype(bool)]
        # ranks without an analyzed step (a cut trace's, all left out) take no part in a verdict
        members = coll.groupby("group_key")["rank"].agg(lambda s: sorted({int(x) for x in s} & parent.keys()))
        for grp in members:
            if not grp:
                continue
            gs = set(grp)
            if any(a in gs and b in gs for a, b in pairs):
                continue
            for r in grp[1:]:
                ra, rb = find(grp[0]), find(r)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    return {r: find(r) for r in ranks}


# ----------------------------------------------------------------------------------------------------
# per-step tables
# ----------------------------------------------------------------------------------------------------
ARRIVAL_LAG = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("lag_ns", pa.int64()),  # sum over its collectives of (own aligned start - earliest start)
        ("blame_ns", pa.int64()),  # sum over collectives it reached last of (its start - second latest start)
        ("last_count", pa.int32()),  # collectives it reached last
        ("collectives", pa.int32()),  # non-p2p collectives it took part in
    ]
)


def arrival_lag(df: pd.DataFrame) -> pa.Table:
    """Per (rank, step) arrival lag over non-p2p collectives (p2p waits are pipeline structure)."""
    if not df.empty:  # (the columns used here only, not a copy of the whole frame)
        keep = ~df["is_p2p"].astype(bool) & (df["n_participants"] > 1)
        coll = df.loc[keep, ["rank", "step", "lag_ns", "blame_ns", "is_last", "op"]]
    else:
        coll = df
    if coll.empty:
        return ARRIVAL_LAG.empty_table()
    if not all(pd.api.types.is_integer_dtype(coll[c]) for c in ("lag_ns", "blame_ns")):
        return _arrival_lag_grouped(coll)
    # per (rank, step), ascending as groupby gives them: integer sums (exact in any order) by one sort
    rank = coll["rank"].astype("Int64")
    if rank.isna().any():  # (groupby leaves rows without a rank out)
        coll = coll[rank.notna().to_numpy()]
        if coll.empty:
            return ARRIVAL_LAG.empty_table()
    rank_v = coll["rank"].astype("int64").to_numpy()
    step_v = coll["step"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    s0 = int(step_v.min())
    key = (rank_v - int(rank_v.min())) * (int(step_v.max()) - s0 + 1) + (step_v - s0)
    o = np.argsort(key, kind="stable")
    ks = key[o]
    start = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])

    def sums(col: str) -> np.ndarray:
        out: np.ndarray = np.add.reduceat(coll[col].astype("int64").to_numpy()[o], start)
        return out

    step = step_v[o][start]
    return pa.table(
        {
            "rank": pa.array(rank_v[o][start], pa.int32()),
            "step": pa.array(step, pa.int32(), mask=step < 0),
            "lag_ns": pa.array(sums("lag_ns"), pa.int64()),
            "blame_ns": pa.array(sums("blame_ns"), pa.int64()),
            "last_count": pa.array(
                np.add.reduceat(coll["is_last"].astype(int).to_numpy()[o], start), pa.int32()
            ),
            "collectives": pa.array(np.diff(np.r_[start, ks.size]), pa.int32()),
        },
        schema=ARRIVAL_LAG,
    )


def _arrival_lag_grouped(coll: pd.DataFrame) -> pa.Table:
    """`arrival_lag` by pandas' group-by (sums of non-integer columns: summed before they are truncated)."""
    g = (
        coll.assign(
            step=coll["step"].astype("Int64").fillna(-1).astype(int), last=coll["is_last"].astype(int)
        )
        .groupby(["rank", "step"])
        .agg(
            lag_ns=("lag_ns", "sum"),
            blame_ns=("blame_ns", "sum"),
            last_count=("last", "sum"),
            collectives=("op", "size"),
        )
        .reset_index()
    )
    step = g["step"].astype(int)
    return pa.table(
        {
            "rank": pa.array(g["rank"].astype(int), pa.int32()),
            "step": pa.array([None if s < 0 else int(s) for s in step], pa.int32()),
            "lag_ns": pa.array(g["lag_ns"].astype("int64"), pa.int64()),
            "blame_ns": pa.array(g["blame_ns"].astype("int64"), pa.int64()),
            "last_count": pa.array(g["last_count"].astype(int), pa.int32()),
            "collectives": pa.array(g["collectives"].astype(int), pa.int32()),
        },
        schema=ARRIVAL_LAG,
    )


def _peer_stats(per: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """Leave-one-out median and 1.4826 x MAD of `col` among the rows of the same (peer group, step)."""
    centre = np.full(len(per), np.nan)
    scale = np.full(len(per), np.nan)
    vals = per[col].to_numpy(dtype=float)
    for idx in per.groupby(["group", "step"]).indices.values():
        x = vals[idx]
        m = x.size
        if m < 2:
            continue
        if m <= 64 and not np.isnan(x).any():  # each row's others: the m - 1 values off the diagonal
            others = np.broadcast_to(x, (m, m))[~np.eye(m, dtype=bool)].reshape(m, m - 1)
            c = np.median(others, axis=1)
            s = 1.4826 * np.median(np.abs(others - c[:, None]), axis=1)
        elif m <= 64:
            others = np.where(~np.eye(m, dtype=bool), x[None, :], np.nan)
            c = np.nanmedian(others, axis=1)
            s = 1.4826 * np.nanmedian(np.abs(others - c[:, None]), axis=1)
        else:
            c = np.full(m, np.median(x))
            s = np.full(m, 1.4826 * np.median(np.abs(x - c[0])))
        centre[idx] = c
        scale[idx] = s
    return centre, scale


def _slow_links(
    df: pd.DataFrame, cfg: StragglerConfig, hosts: dict[int, str] | None = None
) -> tuple[dict[int, float], pd.DataFrame]:
    """rank -> slowness of its link: the smallest, over its groups that can be compared, of the group's
    transfer ratio (time per byte / the reference of the same kind: op, size bucket, group size, intra- or
    inter-host). Every group of a rank slow means its own link is slow; a rank sharing only some slow groups
    is a bystander. Also returns the rows (rank, step, instance, transfer_ns) with their excess transfer
    time (`excess`).

    Computed on integer codes (one sort per grouping), with pandas' groupby semantics: a "first" value is
    the first non-null one of the instance in row order, medians and quantiles as pandas takes them."""
    if df.empty:
        return {}, df
    d = df.loc[df["n_participants"] >= 2, ["rank", "step", "instance", "transfer_ns"]]
    if d.empty:
        return {}, d
    keep = (df["n_participants"] >= 2).to_numpy(dtype=bool)
    rk = d["rank"].astype("int64").to_numpy()
    transfer = d["transfer_ns"].astype(float).to_numpy()
    inst_s = d["instance"].astype("Int64")
    has_inst = inst_s.notna().to_numpy(dtype=bool)  # (groupby leaves rows without an instance out)
    row_inst = inst_s.to_numpy(dtype=np.int64, na_value=-1)
    # the link: "p2p|low|high" of a send/recv pair, else the group (one string per distinct link)
    pe = df["peer"][keep].fillna(-1).astype("int64").to_numpy()
    p2p = df["is_p2p"][keep].astype(bool).to_numpy()
    lo, hi = np.where(p2p, np.minimum(rk, pe), -1), np.where(p2p, np.maximum(rk, pe), -1)
    gk = df["group_key"][keep].astype(str)
    pair_tuple = row_codes(p2p, lo, hi, gk)
    tf = first_rows(pair_tuple)
    pair_text = [
        f"p2p|{a}|{b}" if p else str(g)
        for p, a, b, g in zip(p2p[tf].tolist(), lo[tf].tolist(), hi[tf].tolist(), gk.iloc[tf].tolist())
    ]
    pair_of_tuple = pd.factorize(pd.Series(pair_text, dtype=object))[0]
    pair = np.asarray(pair_of_tuple, dtype=np.int64)[pair_tuple]  # (equal strings: one code)
    # per instance (ascending, as groupby orders them): rows sorted by (instance, transfer)
    rows = np.flatnonzero(has_inst)
    o = rows[_sort_by(row_inst[rows], d["transfer_ns"].to_numpy()[rows], transfer[rows])]
    si = row_inst[o]
    start = np.flatnonzero(np.r_[True, si[1:] != si[:-1]]) if o.size else np.zeros(0, dtype=np.int64)
    end = np.r_[start[1:], o.size]
    inst_ids = si[start]
    n_inst = inst_ids.size
    if n_inst == 0:
        return {}, d.assign(excess=transfer * 0.0)
    ts = transfer[o]
    inst_transfer = (ts[start + (end - start - 1) // 2] + ts[start + (end - start) // 2]) / 2  # median

    by_inst = rows[np.argsort(row_inst[rows], kind="stable")]  # (row order within an instance)
    first_row = by_inst[start]

    def first_valid(null: np.ndarray) -> np.ndarray:
        """Per instance: the row of its first non-null value (in row order), -1 when it has none."""
        if not null.any():
            return first_row
        ob = by_inst[~null[by_inst]]
        out = np.full(n_inst, -1, dtype=np.int64)
        if ob.size:
            u, f = np.unique(row_inst[ob], return_index=True)
            out[np.searchsorted(inst_ids, u)] = ob[f]
        return out

    op_obj = df["op"][keep].to_numpy(dtype=object)
    f_op = first_valid(pd.isna(op_obj))
    nexp = df["n_expected"][keep]
    f_n = first_valid(nexp.isna().to_numpy(dtype=bool))
    inst_nbytes = df["bytes"][keep].astype("Float64").fillna(-1).astype("int64").to_numpy()[first_row]
    inst_pair = pair[first_row]
    # the op with recv as send, and the group size, as the strings the kind is made of
    op_word = per_distinct(
        lambda v: str(v).replace("recv", "send"), np.where(f_op >= 0, op_obj[np.maximum(f_op, 0)], None)
    )
    n_word = nexp.iloc[np.maximum(f_n, 0)].astype(str).to_numpy(dtype=object)
    # hosts per instance: its distinct (instance, host) pairs
    host_of = hosts or {}
    u_rank, r_inv = unique_inverse(rk)
    host_names = pd.Series([host_of.get(int(r), "") for r in u_rank], dtype=object)
    host_code = np.asarray(pd.factorize(host_names)[0], dtype=np.int64)[r_inv]
    hc = host_code[o]  # (more than one host: its lowest and highest host codes differ)
    inter = np.minimum.reduceat(hc, start) != np.maximum.reduceat(hc, start)
    # time per byte when sizes are known (bytes bucketed by powers of two), else the transfer time itself
    sized = inst_nbytes > 0
    nbytes = np.where(sized, inst_nbytes, 1).astype(float)
    unit = inst_transfer / nbytes
    bucket = np.where(sized, np.floor(np.log2(nbytes)).astype(int), np.iinfo(np.int64).min)
    sig = row_codes(op_word, bucket, n_word, inter)
    has_sig = (f_op >= 0) & (f_n >= 0)  # (an unknown op or size makes the kind null: no kind, no reference)
    # reference: the lower quartile (an actual group's value) of the per-group medians of the same kind:
    # a healthy group, even when a slow rank slows several groups of that kind
    sg = row_codes(sig, inst_pair)
    og = np.flatnonzero(has_sig)
    og = og[np.lexsort((unit[og], sg[og]))]
    if not og.size:
        return {}, d.iloc[0:0].assign(excess=np.zeros(0))
    sgs = sg[og]
    g0 = np.flatnonzero(np.r_[True, sgs[1:] != sgs[:-1]])
    g1 = np.r_[g0[1:], og.size]
    us = unit[og]
    g_med = (us[g0 + (g1 - g0 - 1) // 2] + us[g0 + (g1 - g0) // 2]) / 2
    g_sig = sig[og[g0]]
    os_ = np.lexsort((g_med, g_sig))
    gs_sorted = g_sig[os_]
    s0 = np.flatnonzero(np.r_[True, gs_sorted[1:] != gs_sorted[:-1]])
    s1 = np.r_[s0[1:], os_.size]
    m = s1 - s0
    ref_of_sig = np.full(int(sig.max()) + 1, np.nan)
    ngroups = np.zeros(int(sig.max()) + 1, dtype=np.int64)
    ref_of_sig[gs_sorted[s0]] = g_med[os_][s0 + (0.25 * (m - 1)).astype(np.int64)]
    ngroups[gs_sorted[s0]] = m
    ref_unit = ref_of_sig[sig]
    ok = has_sig & (ngroups[sig] >= 2) & (ref_unit > 0)  # the reference needs another group to compare with
    if not ok.any():
        return {}, d.iloc[0:0].assign(excess=np.zeros(0))
    with np.errstate(divide="ignore", invalid="ignore"):  # (rows outside `ok` divide by 0 or NaN, unused)
        ratio = unit / ref_unit
    excess = (unit - ref_unit) * nbytes
    excess = np.where(excess < 0, 0.0, excess)  # (as clip(lower=0): NaN and -0.0 stay)
    # a group is slow when most of its calls are: its lower-quartile ratio, over enough calls to tell
    kept = np.flatnonzero(ok)
    ob = kept[np.lexsort((ratio[kept], inst_pair[kept]))]
    ps = inst_pair[ob]
    p0 = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])
    p1 = np.r_[p0[1:], ob.size]
    cnt = p1 - p0
    q = 0.25 * (cnt - 1)
    qi = q.astype(np.int64)
    frac = q % 1
    rs = ratio[ob]
    lo_v = rs[p0 + qi]
    hi_v = rs[np.minimum(p0 + qi + 1, p1 - 1)]
    q_val = np.where(frac == 0.0, lo_v, lo_v + (hi_v - lo_v) * frac)
    enough = cnt >= cfg.min_link_calls
    gr = {int(g): float(v) for g, v in zip(ps[p0][enough], q_val[enough])}
    # the distinct (rank, group) pairs of the rows of kept instances, once
    kept_inst = np.zeros(n_inst, dtype=bool)
    kept_inst[kept] = True
    dense = inst_ids[0] == 0 and inst_ids[-1] == n_inst - 1  # (ids 0 .. n-1: an id is its position)
    row_pos = row_inst[rows] if dense else np.searchsorted(inst_ids, row_inst[rows])
    sel = rows[kept_inst[row_pos]]
    width, r0 = int(pair.max()) + 1, int(rk.min())
    rg = unique_inverse((rk[sel] - r0) * width + pair[sel])[0]  # (ascending rank, then group)
    rank_groups: dict[int, list[int]] = {}
    members: dict[int, set[int]] = {}
    for r, g in zip((rg // width + r0).tolist(), (rg % width).tolist()):
        rank_groups.setdefault(r, []).append(g)
        members.setdefault(g, set()).add(r)
    ratios = {r: [gr[g] for g in gs if g in gr] for r, gs in rank_groups.items()}
    cleared = {r for r, v in ratios.items() if v and min(v) < cfg.slow_link_ratio}  # has a healthy group
    out = {}
    for r, groups in rank_groups.items():
        vals = ratios[r]
        if len(vals) >= 2:
            out[r] = min(vals)
        elif len(vals) == 1:
            # one slow group names its slow member only when every other member has a healthy group
            g = next(g for g in groups if g in gr)
            if all(x in cleared for x in members[g] - {r}):
                out[r] = vals[0]
    # excess transfer: measured against the reference where there is one; elsewhere (a group of a kind
    # nothing else does) what the rank's own slowness factor k predicts: transfer x (1 - 1/k)
    k_of = np.array([max(out.get(int(r), 1.0), 1.0) for r in u_rank], dtype=float)
    predicted = transfer * (1.0 - 1.0 / k_of[r_inv])
    row_excess = np.full(len(d), np.nan)
    measured = rows[kept_inst[row_pos]]
    row_excess[measured] = excess[row_pos[kept_inst[row_pos]]]
    row_excess = np.where(np.isnan(row_excess), predicted, row_excess)
    return out, d.assign(excess=row_excess)


def _sort_by(key: np.ndarray, raw: np.ndarray, value: np.ndarray) -> np.ndarray:
    """np.lexsort((value, key)) (`value`: `raw` as floats); one sort of key x (max + 1) + raw when both are
    non-negative integers that fit (the order of equal pairs does not matter to the callers' medians)."""
    if raw.dtype.kind in "iu" and key.size and key.min() >= 0 and raw.min() >= 0:
        width = int(raw.max()) + 1
        if (int(key.max()) + 1) * width < 1 << 62:
            return np.argsort(key.astype(np.int64) * width + raw.astype(np.int64), kind="stable")
    return np.lexsort((value, key))


def pre_arrival_idle(breakdown: pa.Table, sets: dict[int, RankSets], df: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): device idle between the step start and the rank's last collective arrival of the
    step. Idle after that point (a rank that finished early) says nothing about its host: left out."""
    b = breakdown.select(["rank", "step", "window_start_ns", "window_end_ns"]).to_pandas()
    b["step"] = b["step"].astype("Int64").fillna(-1).astype(int)
    if not df.empty:
        d = df[["rank", "step", "is_p2p", "start_ns"]]
        d = d.assign(step=d["step"].astype("Int64").fillna(-1).astype(int))
        coll = d[~d["is_p2p"].astype(bool)]
        last = (
            (coll if not coll.empty else d).groupby(["rank", "step"])["start_ns"].max().rename("last_arrival")
        )
        b = b.merge(last.astype("int64").reset_index(), on=["rank", "step"], how="left")
    else:
        b["last_arrival"] = np.nan
    lo = b["window_start_ns"].to_numpy(dtype=np.int64)
    hi_w = b["window_end_ns"].to_numpy(dtype=np.int64)
    la = b["last_arrival"].to_numpy(dtype=float, na_value=np.nan)
    hi = np.where(np.isnan(la), hi_w, np.clip(np.nan_to_num(la, nan=0).astype(np.int64), lo, hi_w))
    idle = np.zeros(len(b), dtype=np.int64)
    ranks = b["rank"].to_numpy()
    # each rank's rows once: one stable sort, then slices (a mask per rank is quadratic in the ranks)
    order = np.argsort(ranks, kind="stable")
    u_rank, first = np.unique(ranks[order], return_index=True)
    todo = list(zip(u_rank, first, np.r_[first[1:], order.size]))
    known = [(int(r), sets[int(r)]) for r, _, _ in todo if sets.get(int(r)) is not None]
    if known:  # every rank at once, on lanes of one line (wait_split.RankLanes)
        parts = [p for _, rs in known for p in (rs.compute, rs.comm, rs.memory)]
        lane_ranks = np.array([r for r, _ in known], dtype=np.int64)
        on = np.isin(ranks, lane_ranks)
        lanes = lanes_for(lane_ranks, parts, lo[on], hi[on])
        if lanes.ok:
            sets3 = [lanes.sets([rs.compute for _, rs in known]), lanes.sets([rs.comm for _, rs in known])]
            sets3.append(lanes.sets([rs.memory for _, rs in known]))
            busy = iv.union(np.concatenate([x[0] for x in sets3]), np.concatenate([x[1] for x in sets3]))
            shift = lanes.of(ranks[on])
            idle[on] = (hi[on] - lo[on]) - iv.measure_in_windows(busy, lo[on] + shift, hi[on] + shift)
            idle[~on] = hi[~on] - lo[~on]
            todo = []
    for r, i0, i1 in todo:  # (rank by rank: times too far apart for lanes)
        rs = sets.get(int(r))
        m = order[i0:i1]
        if rs is None:
            idle[m] = hi[m] - lo[m]
            continue
        busy = iv.union2(iv.union2(rs.compute, rs.comm), rs.memory)
        idle[m] = (hi[m] - lo[m]) - iv.measure_in_windows(busy, lo[m], hi[m])
    return pd.DataFrame({"rank": b["rank"], "step": b["step"], "pre_idle_ns": idle})


def _per_rank_step(
    breakdown: pa.Table, split: pa.Table, lag: pa.Table, pre_idle: pd.DataFrame
) -> pd.DataFrame:
    b = breakdown.select(
        ["rank", "step", "step_time_ns", "compute_ns", "idle_ns", "exposed_comm_ns"]
    ).to_pandas()
    b["step"] = b["step"].astype("Int64").fillna(-1).astype(int)
    s = split.select(["rank", "step", "exposed_wait_ns", "exposed_transfer_ns"]).to_pandas()
    s["step"] = s["step"].astype("Int64").fillna(-1).astype(int)
    lg = lag.to_pandas()
    lg["step"] = lg["step"].astype("Int64").fillna(-1).astype(int)
    per = b.merge(s, on=["rank", "step"], how="left").merge(lg, on=["rank", "step"], how="left")
    per = per.merge(pre_idle, on=["rank", "step"], how="left")
    for c in ("lag_ns", "blame_ns", "last_count", "collectives", "exposed_wait_ns", "exposed_transfer_ns"):
        per[c] = per[c].fillna(0)
    per["pre_idle_ns"] = per["pre_idle_ns"].fillna(per["idle_ns"])
    return per


def detect(
    per: pd.DataFrame,
    df: pd.DataFrame,
    groups: dict[int, int],
    cfg: StragglerConfig,
    stage_of: dict[int, int] | None = None,
    hosts: dict[int, str] | None = None,
    shared: pd.DataFrame | None = None,
) -> list[dict[str, Any]]:
    """Straggler verdicts from per-(rank, step) times, matched collectives and peer groups.

    `shared`: per (rank, step) evidence of CPU ranks that time-share a host (`_shared_evidence`); their
    compute and host verdicts come from op counts and stall frames, not from wall durations."""
    per = per.copy()
    per["group"] = per["rank"].map(lambda r: groups.get(int(r), -1))
    steps_total = per.groupby("rank")["step"].nunique()
    per["comp_c"], per["comp_s"] = _peer_stats(per, "compute_ns")
    per["idle_c"], per["idle_s"] = _peer_stats(per, "pre_idle_ns")
    per["step_c"], _ = _peer_stats(per, "step_time_ns")
    floor = cfg.min_excess_fraction * per["step_c"]
    out: list[dict[str, Any]] = []
    verdicts: dict[int, dict[str, Any]] = {}
    for cause, col, centre, scale in (
        ("compute", "compute_ns", "comp_c", "comp_s"),
        ("host", "pre_idle_ns", "idle_c", "idle_s"),
    ):
        excess = per[col] - per[centre]
        thresh = np.maximum(cfg.mad_k * per[scale], floor)
        flag = (excess > thresh) & (per["blame_ns"] >= cfg.min_blame_fraction * excess) & per[centre].notna()
        per[f"{cause}_excess"] = excess
        per[f"{cause}_flag"] = flag
        per[f"{cause}_cost"] = np.where(flag, np.minimum(excess, per["blame_ns"]), 0.0)
    if shared is not None and len(shared):
        per = _apply_shared(per, shared, cfg, floor)
    slow, d = _slow_links(df, cfg, hosts)
    if shared is not None and len(shared):  # one host's ranks share no link: transfer times are descheduling
        slow = {r: v for r, v in slow.items() if r not in set(shared["rank"].astype(int))}
    if slow:
        # per (rank, step) sums (pandas' sums, in row order), looked up by one integer key
        d_rank = d["rank"].astype("int64").to_numpy()
        d_step = d["step"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
        p_rank = per["rank"].astype("int64").to_numpy()
        p_step = per["step"].astype("int64").to_numpy()
        r0, s0 = min(d_rank.min(), p_rank.min()), min(d_step.min(), p_step.min())
        width = int(max(d_step.max(), p_step.max()) - s0) + 1
        d_key, p_key = (d_rank - r0) * width + (d_step - s0), (p_rank - r0) * width + (p_step - s0)
        for col, name in (("excess", "xfer_excess"), ("transfer_ns", "xfer_total")):
            sums = pd.Series(d[col].to_numpy()).groupby(d_key).sum()
            per[name] = sums.reindex(p_key).fillna(0.0).to_numpy()
        exposed_frac = np.where(
            per["xfer_total"] > 0, (per["exposed_transfer_ns"] / per["xfer_total"]).clip(0, 1), 0
        )
        cost = per["xfer_excess"] * exposed_frac
        is_slow = per["rank"].map(lambda r: slow.get(int(r), 0.0) >= cfg.slow_link_ratio)
        per["communication_excess"] = cost
        per["communication_flag"] = is_slow & (
            cost > cfg.min_excess_fraction * per["step_c"].fillna(per["step_time_ns"])
        )
        per["communication_cost"] = np.where(per["communication_flag"], cost, 0.0)
    else:
        per["communication_excess"] = 0.0
        per["communication_flag"] = False
        per["communication_cost"] = 0.0
    step_ref = float(per["step_time_ns"].median()) if len(per) else 0.0
    # only ranks flagged persistently for some cause are looked at one by one (one groupby, not a pass per rank)
    flagged_steps = pd.concat([per.groupby("rank")[f"{c}_flag"].sum() for c in CAUSES], axis=1)
    persistent = ((flagged_steps > 0) & (flagged_steps.ge(cfg.persistence * steps_total, axis=0))).any(axis=1)
    candidates = per[per["rank"].isin(persistent.index[persistent.to_numpy(dtype=bool)])]
    for r, sub in candidates.groupby("rank"):
        r = int(r)
        n = int(steps_total[r])
        best = None
        for cause in CAUSES:
            flagged = int(sub[f"{cause}_flag"].sum())
            if flagged == 0 or flagged < cfg.persistence * n:
                continue
            # materiality on the median over *all* analyzed steps, so one noisy step cannot make a straggler
            median_excess = float(
                np.median(
                    np.where(sub[f"{cause}_flag"], sub[f"{cause}_cost"], sub[f"{cause}_excess"].clip(upper=0))
                )
            )
            cost = float(sub[f"{cause}_cost"].mean())
            counted = cause == "compute" and "ops_ratio" in sub and sub["ops_ratio"].notna().all()
            if counted:  # time-shared CPUs: material when the op-count excess is (durations are descheduling)
                material = float(sub["ops_ratio"].median()) - 1.0 >= cfg.min_cost_fraction
            else:
                material = median_excess >= cfg.min_cost_fraction * step_ref
            if not material or cost <= 0:
                continue
            cand = (flagged, cost, cause)
            if best is None or cand[:2] > best[:2]:
                best = cand
        if best is None:
            continue
        flagged, cost, cause = best
        verdicts[r] = {"cause": cause, "flagged": flagged, "cost": cost, "sub": sub, "steps_total": n}
    for r in sorted(verdicts, key=lambda x: -verdicts[x]["cost"]):
        v = verdicts[r]
        sub = v["sub"]
        steps = sub["step"].to_numpy()
        skey = [int(s) if s >= 0 else None for s in steps]

        def per_step(col: str, sub: pd.DataFrame = sub, skey: list[int | None] = skey) -> dict[str, float]:
            return {str(k): round(float(x) / 1e6, 3) for k, x in zip(skey, sub[col])}

        def per_step_count(
            sub: pd.DataFrame, col: str, skey: list[int | None] = skey
        ) -> dict[str, int | None]:
            return {str(k): (None if pd.isna(x) else int(x)) for k, x in zip(skey, sub[col])}

        comp_ratio = float(np.median(sub["compute_ns"] / sub["comp_c"].replace(0, np.nan)))
        peers = sorted(int(x) for x, g in groups.items() if g == groups.get(r) and x != r)
        # no rank shares its stage or group (a pipeline without replicas): the other ranks were the reference
        kind = (
            ("stage" if stage_of else "group") if peers else ("other stages" if stage_of else "other ranks")
        )
        evidence: dict[str, Any] = {
            "arrival_lag_ms": per_step("lag_ns"),
            "delay_caused_ms": per_step("blame_ns"),
            "last_arrivals": int(sub["last_count"].sum()),
            "compute_ratio": round(comp_ratio, 4) if np.isfinite(comp_ratio) else None,
            "compute_excess_ms": per_step("compute_excess"),
            "idle_excess_ms": round(float(np.median(sub["host_excess"])) / 1e6, 3),
            "transfer_ratio": round(slow[r], 3) if r in slow else None,
            "exposed_wait_ms": per_step("exposed_wait_ns"),
            "peers": peers,
            "peer_kind": kind,
        }
        if "ops_ratio" in sub and sub["ops_ratio"].notna().any():
            evidence["time_shared_host"] = True
            evidence["ops_per_step"] = per_step_count(sub, "ops")
            evidence["peer_ops_per_step"] = per_step_count(sub, "ops_c")
            evidence["ops_ratio"] = round(float(sub["ops_ratio"].median()), 4)
            if v["cause"] == "compute":
                evidence["compute_ratio"] = evidence["ops_ratio"]
        if v["cause"] == "host" and "host_frame" in sub and sub["host_frame"].notna().any():
            evidence["idle_excess_ms"] = round(float(sub["host_cost"].median()) / 1e6, 3)
            evidence["host_frames"] = sorted({f for f in sub["host_frame"].dropna()})
            evidence["host_ms_per_step"] = per_step("host_cost")
        s = {
            "rank": r,
            "cause": v["cause"],
            "steps_flagged": int(v["flagged"]),
            "steps_total": int(v["steps_total"]),
            "score": round(v["cost"] / step_ref, 4) if step_ref else None,
            "evidence": evidence,
            "cost_ms": round(v["cost"] / 1e6, 3),
        }
        if stage_of and stage_of.get(r) is not None:
            s["stage"] = int(stage_of[r])
        out.append(s)
    return out


def _shared_evidence(
    events: pa.Table, ranks: set[int], groups: dict[int, int], cfg: StragglerConfig | None = None
) -> pd.DataFrame:
    """Per (rank, step) of time-shared CPU ranks: `ops`, and a regular stall frame with its excess host time
    over peers (`host_frame`, `host_ns`; tracelens.analyze.rank.cpu_evidence.stall_frames)."""
    from tracelens.analyze.rank import cpu_evidence as ce

    ops = ce.per_rank_step(events, ranks)[["rank", "step", "ops"]]
    cfg = cfg or StragglerConfig()
    host = ce.stall_frames(events, ranks, groups, cfg.stall_min_ns, cfg.stall_spread)
    host = host[["rank", "step", "host_frame", "host_ns"]]
    gaps = ce.stall_gaps(events, ranks, groups, cfg.stall_min_ns, cfg.stall_spread)
    out = ops.merge(host, on=["rank", "step"], how="left").merge(gaps, on=["rank", "step"], how="left")
    out["host_ns"] = out["host_ns"].fillna(0.0)
    # a stall outside any op (a sleep, data loading): the larger of the two kinds of host evidence
    use_gap = out["gap_ns"].fillna(0.0) > out["host_ns"]
    out.loc[use_gap, "host_frame"] = ce.GAP_FRAME
    out["host_ns"] = np.maximum(out["host_ns"], out["gap_ns"].fillna(0.0))
    return out.drop(columns=["gap_ns"])


def _apply_shared(
    per: pd.DataFrame, shared: pd.DataFrame, cfg: StragglerConfig, floor: pd.Series
) -> pd.DataFrame:
    """Compute and host verdicts of time-shared CPU ranks from exact op counts and persistent stall frames;
    their wall-duration verdicts are dropped (descheduling inflates any rank's durations)."""
    per = per.merge(shared, on=["rank", "step"], how="left")
    m = per["ops"].notna().to_numpy()
    if not m.any():
        return per
    per["ops_c"], _ = _peer_stats(per.assign(ops=per["ops"].astype(float)), "ops")
    per["ops_ratio"] = per["ops"] / per["ops_c"].replace(0, np.nan)
    ratio = per["ops_ratio"].fillna(1.0)
    comp_flag = (ratio > 1.0 + cfg.ops_excess) & per["ops_c"].notna()
    comp_cost = per["compute_ns"] * (1.0 - 1.0 / ratio.clip(lower=1.0))
    comp_cost = comp_cost.to_numpy(dtype=float)
    # the extra ops at the peers' rate: the rank's own wall compute is what descheduling distorts most
    # (a slow TP rank can show the least compute time of its stage), the peers' median much less
    comp_c, _ = _peer_stats(per.assign(compute_ns=per["compute_ns"].astype(float)), "compute_ns")
    at_peers = np.nan_to_num(comp_c * (ratio.clip(lower=1.0).to_numpy(dtype=float) - 1.0))
    comp_cost = np.maximum(comp_cost, at_peers)
    comp_flag = comp_flag.to_numpy(dtype=bool)
    host = pd.to_numeric(per["host_ns"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
    host_flag = host > floor.fillna(0).to_numpy(dtype=float)
    for col, val in (
        ("compute_excess", comp_cost),
        ("compute_flag", comp_flag),
        ("compute_cost", np.where(comp_flag, comp_cost, 0.0)),
        ("host_excess", host),
        ("host_flag", host_flag),
        ("host_cost", np.where(host_flag, host, 0.0)),
    ):
        cur = per[col].to_numpy().astype(val.dtype)
        cur[m] = val[m]
        per[col] = cur
    return per


def group_verdicts(
    stragglers: list[dict[str, Any]], df: pd.DataFrame
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """When every member of a (non-p2p) group is a communication straggler, the group or its link is slow,
    not a rank: those verdicts become one SLOW_GROUP finding naming the group."""
    comm = {s["rank"] for s in stragglers if s["cause"] == "communication"}
    if len(comm) < 2 or df.empty:
        return stragglers, []
    coll = df[~df["is_p2p"].astype(bool)]
    findings: list[dict[str, Any]] = []
    taken: set[int] = set()
    for key, g in coll.groupby("group_key"):
        members = {int(x) for x in g["rank"].unique()}
        if len(members) < 2 or not members <= comm or members & taken:
            continue
        taken |= members
        desc = g["pg_desc"].dropna().astype(str)
        name = desc.iloc[0] if len(desc) else str(key)
        ratio = min(s["evidence"].get("transfer_ratio") or 0 for s in stragglers if s["rank"] in members)
        cost = max(s["cost_ms"] for s in stragglers if s["rank"] in members)
        findings.append(
            finding(
                "SLOW_GROUP",
                "warning",
                f"group {name} ({_ranks(members)}) is slow as a whole: its transfers are {ratio:.1f}x slower than "
                f"other groups' of the same kind (costs up to {cost:.1f} ms/step); a slow link or a schedule "
                f"that makes all its members late, not a rank straggler",
                ranks=sorted(members),
                group=name,
                transfer_ratio=ratio,
                cost_ms=cost,
            )
        )
    return [s for s in stragglers if s["rank"] not in taken], findings


def with_layer_work(
    res: CrossRankResult,
    work: dict[int, Any],
    stage_of: dict[int, int],
    breakdown: pa.Table,
    excess: float = DEFAULT.layer_work_excess,
) -> CrossRankResult:
    """`res` with compute stragglers among ranks that share their stage with no other rank (a pipeline
    without data-parallel replicas, where `detect` has no peers): a rank whose layers cost more matmul work
    than the other stages' (analyze.pipeline.layer_work.heavy_layer_ranks) does work its peers do not. A stage that
    holds more layers at the same cost per layer is not one (STAGE_IMBALANCE says so). Cost: its compute
    per step x (1 - 1/ratio), the time its extra work takes."""
    from tracelens.analyze.pipeline.layer_work import heavy_layer_ranks

    named = {int(s["rank"]) for s in res.stragglers}
    heavy = [h for h in heavy_layer_ranks(work, stage_of, excess) if h["rank"] not in named]
    if not heavy:
        return res
    bd = breakdown.select(["rank", "step", "compute_ns", "step_time_ns"]).to_pandas()
    step_ref = float(bd["step_time_ns"].median()) if len(bd) else 0.0
    added = []
    for h in heavy:
        r, ratio = int(h["rank"]), float(h["ratio"])
        mine = bd[bd["rank"] == r]
        n = int(mine["step"].nunique())
        cost = float(mine["compute_ns"].median()) * (1.0 - 1.0 / ratio) if len(mine) else 0.0
        s: dict[str, Any] = {
            "rank": r,
            "cause": "compute",
            "steps_flagged": n,
            "steps_total": n,
            "score": round(cost / step_ref, 4) if step_ref else None,
            "evidence": {
                "work_per_layer_ratio": round(ratio, 4),
                "flops_per_layer": h["flops_per_layer"],
                "peer_flops_per_layer": h["peer_flops_per_layer"],
                "layers": work[r].layers,
                "peers": h["peers"],
                "peer_kind": "other stages, per layer",
            },
            "cost_ms": round(cost / 1e6, 3),
        }
        if stage_of.get(r) is not None:
            s["stage"] = int(stage_of[r])
        added.append(s)
    from dataclasses import replace

    return replace(res, stragglers=res.stragglers + added, findings=res.findings + _straggler_findings(added))


def _ranks(rs: Iterable[int]) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _straggler_findings(stragglers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in stragglers:
        out.append(
            finding(
                "STRAGGLER",
                "warning",
                f"straggler {_describe(s)}; flagged in {s['steps_flagged']} of {s['steps_total']} steps",
                ranks=[s["rank"]],
                stages=[s["stage"]] if "stage" in s else [],
                cause=s["cause"],
                cost_ms=s["cost_ms"],
            )
        )
    return out


def analyze_cross_rank(
    events: pa.Table,
    metadata: pa.Table | None,
    breakdown: pa.Table | None = None,
    stage_of: dict[int, int] | None = None,
    config: StragglerConfig | None = None,
    sets: dict[int, RankSets] | None = None,
    collectives: pa.Table | None = None,
) -> CrossRankResult:
    """Match collectives, align clocks, split wait vs transfer, find stragglers with their cause and cost.
    `collectives`: `collectives_from_events(events)` when the caller has it already (the run memo's)."""
    cfg = config or StragglerConfig()
    if sets is None:
        sets = class_sets(events)
    if breakdown is None:
        breakdown = _breakdown(events, sets=sets)
    coll = C.collectives_from_events(events) if collectives is None else collectives
    df, findings = C.match_with_findings(coll, metadata)
    clock = C.clock_offsets(df, metadata)
    findings += C.clock_findings(clock, cfg.clock_skew_ns)
    df = wait_transfer(df, clock.offsets_ns)
    split = C.exposed_split(df, breakdown, sets)
    lag = arrival_lag(df)
    ranks = sorted(int(r) for r in np.unique(breakdown.column("rank").to_numpy(zero_copy_only=False)))
    if stage_of:  # ranks without a known stage have no peers
        groups = {r: int(stage_of[r]) if stage_of.get(r) is not None else -1 - r for r in ranks}
    else:
        groups = infer_peer_groups(df, ranks)
    per = _per_rank_step(breakdown, split, lag, pre_arrival_idle(breakdown, sets, df))
    hosts = {r: u for r, u in clock.unit_of.items() if u.startswith("host ")}
    from tracelens.analyze.rank.cpu_evidence import shared_host_ranks

    shared_ranks = shared_host_ranks(metadata, sets)
    shared = _shared_evidence(events, shared_ranks, groups, cfg) if shared_ranks and len(per) else None
    stragglers = detect(per, df, groups, cfg, stage_of, hosts, shared=shared) if len(per) else []
    stragglers, group_findings = group_verdicts(stragglers, df)
    findings += group_findings + _straggler_findings(stragglers)
    return CrossRankResult(
        collectives=to_table(df, source=coll),
        offsets_ns=dict(clock.offsets_ns),
        exposed_split=split,
        arrival_lag=lag,
        stragglers=stragglers,
        findings=findings,
        peers=groups,
        clock=clock,
    )
