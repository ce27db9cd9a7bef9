"""Exposed communication split into wait and transfer, per (rank, step): the part of each rank's exposed
communication (tracelens.analyze.rank.breakdown) that falls before the last participant of its collective arrived
(wait) and after (transfer), from the matched instances (tracelens.analyze.comm.collectives). Re-exported there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core import intervals as iv

if TYPE_CHECKING:
    from tracelens.schema import RankSets

EXPOSED_SPLIT = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("exposed_comm_ns", pa.int64()),
        ("exposed_wait_ns", pa.int64()),
        ("exposed_transfer_ns", pa.int64()),
    ]
)


def _incomplete(rows: pd.DataFrame) -> np.ndarray:
    """Rows of instances seen on fewer ranks than take part (a single traced rank of a multi-rank job)."""
    if rows.empty or "n_participants" not in rows:
        return np.zeros(len(rows), dtype=bool)
    n = rows["n_participants"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    exp = rows["n_expected"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    # unknown group size: a lone participant cannot be a whole collective
    out: np.ndarray = np.where(np.isnan(exp), n < 2, n < exp)
    return out


class RankLanes:
    """Every rank's times moved onto its own lane of one line, so that an interval operation runs once for
    all ranks: rank i's times t become t - lo + i * width, lanes apart by more than any rank's span (nothing
    of two ranks touches or overlaps), which leaves each rank's own results exactly as they were (the
    algebra of tracelens.analyze.core.intervals only compares and subtracts times)."""

    def __init__(self, ranks: np.ndarray, lo: int, hi: int) -> None:
        self.ranks = np.asarray(ranks, dtype=np.int64)  # (ascending)
        width = int(hi) - int(lo) + 2
        self.ok = self.ranks.size * width < 1 << 62 and abs(int(lo)) < 1 << 62  # (else int64 would overflow)
        self.shift = np.zeros(0, dtype=np.int64)  # (not ok: callers go rank by rank)
        if self.ok:
            self.shift = np.arange(self.ranks.size, dtype=np.int64) * width - int(lo)

    def of(self, rank: np.ndarray) -> np.ndarray:
        """The shift of each of these ranks (all of them among `ranks`)."""
        return self.shift[np.searchsorted(self.ranks, rank)]

    def sets(self, parts: list[iv.Intervals]) -> iv.Intervals:
        """The canonical sets of `ranks` (in that order), moved and joined: one canonical set."""
        if not parts:
            return iv.empty()
        s = np.concatenate([p[0] + d for p, d in zip(parts, self.shift.tolist())])
        e = np.concatenate([p[1] + d for p, d in zip(parts, self.shift.tolist())])
        return s.astype(np.int64), e.astype(np.int64)


def lanes_for(ranks: np.ndarray, sets: list[iv.Intervals], *times: np.ndarray) -> RankLanes:
    """RankLanes spanning the given sets and times."""
    lo = [int(t.min()) for t in times if t.size] + [int(p[0][0]) for p in sets if p[0].size]
    hi = [int(t.max()) for t in times if t.size] + [int(p[1][-1]) for p in sets if p[1].size]
    return RankLanes(ranks, min(lo, default=0), max(hi, default=0))


def exposed_split(df: pd.DataFrame, breakdown: pa.Table, sets: dict[int, RankSets]) -> pa.Table:
    """Per (rank, step): exposed communication (breakdown's K − C) split into the part inside the wait head
    [start, start + wait) of a collective on that rank and the rest (transfer). The two add up exactly.

    Both are null (unknown) in a step where exposed communication overlaps a collective whose other
    participants are not in the traces: without them its wait cannot be told from its transfer."""
    b_rank = breakdown.column("rank").to_numpy(zero_copy_only=False)
    # each rank's rows once (one stable sort, then slices: a mask per rank is quadratic at 1,024 ranks)
    b_order = np.argsort(b_rank, kind="stable")
    b_sorted = b_rank[b_order]
    exposed_all = breakdown.column("exposed_comm_ns").to_numpy(zero_copy_only=False)[b_order]
    lo_all = breakdown.column("window_start_ns").to_numpy(zero_copy_only=False)[b_order]
    hi_all = breakdown.column("window_end_ns").to_numpy(zero_copy_only=False)[b_order]
    waited_all = np.zeros(b_order.size, dtype=np.int64)
    unknown_all = np.zeros(b_order.size, dtype=bool)
    if not df.empty:
        d_rank = df["rank"].astype(int).to_numpy()
        d_order = np.argsort(d_rank, kind="stable")  # within a rank: table order
        d_sorted = d_rank[d_order]
        s_all = df["start_ns"].astype("int64").to_numpy()[d_order]
        wt_all = df["wait_ns"].astype("int64").to_numpy()[d_order]
        inc_all = _incomplete(df)[d_order]
        e_col = df["end_ns"]
    u_rank, b_first = np.unique(b_sorted, return_index=True)
    b_last = np.r_[b_first[1:], b_sorted.size]
    todo = [(int(r), b0, b1) for r, b0, b1 in zip(u_rank, b_first, b_last) if sets.get(int(r)) is not None]
    if df.empty:
        todo = []
    if todo:
        lane_ranks = np.array([r for r, _, _ in todo], dtype=np.int64)
        comm = [sets[r].comm for r, _, _ in todo]
        compute = [sets[r].compute for r, _, _ in todo]
        in_lane = np.isin(d_sorted, lane_ranks)
        inc_in = inc_all & in_lane
        e_inc = e_col.iloc[d_order[inc_in]].astype("int64").to_numpy()  # (only where they are needed)
        s_in, wt_in = s_all[in_lane], wt_all[in_lane]
        b_rows = np.concatenate([np.arange(b0, b1) for _, b0, b1 in todo])
        lanes = lanes_for(
            lane_ranks, comm + compute, s_in, s_in + wt_in, e_inc, lo_all[b_rows], hi_all[b_rows]
        )
        if lanes.ok:
            k = iv.subtract(lanes.sets(comm), lanes.sets(compute))  # every rank's exposed_comm
            shift_d = lanes.of(d_sorted[in_lane])
            shift_b = lanes.of(b_sorted[b_rows])
            lo, hi = lo_all[b_rows] + shift_b, hi_all[b_rows] + shift_b
            s = s_in + shift_d
            wait_set = iv.union(s, s + wt_in)
            waited_all[b_rows] = iv.measure_in_windows(iv.intersect(k, wait_set), lo, hi)
            # a collective whose other participants are not in the traces: its wait cannot be measured
            inc = inc_all[in_lane]
            if inc.any():
                blind = iv.union(s[inc], e_inc + shift_d[inc])
                unknown_all[b_rows] = iv.measure_in_windows(iv.intersect(k, blind), lo, hi) > 0
            todo = []
    for r, b0, b1 in todo:  # (rank by rank: times too far apart for lanes)
        rs = sets[r]
        lo, hi = lo_all[b0:b1], hi_all[b0:b1]
        d0, d1 = np.searchsorted(d_sorted, r, "left"), np.searchsorted(d_sorted, r, "right")
        s, wt = s_all[d0:d1], wt_all[d0:d1]
        wait_set = iv.union(s, s + wt)
        exposed = iv.subtract(rs.comm, rs.compute)
        waited_all[b0:b1] = iv.measure_in_windows(iv.intersect(exposed, wait_set), lo, hi)
        # a collective whose other participants are not in the traces: its wait cannot be measured
        inc = inc_all[d0:d1]
        if inc.any():
            e = e_col.iloc[d_order[d0:d1]].astype("int64").to_numpy()
            blind = iv.union(s[inc], e[inc])
            unknown_all[b0:b1] = iv.measure_in_windows(iv.intersect(exposed, blind), lo, hi) > 0
    out = {
        "rank": pa.array(b_sorted, pa.int32()),
        "step": breakdown.column("step").take(pa.array(b_order, pa.int64())).cast(pa.int32()),
        "exposed_comm_ns": pa.array(exposed_all, pa.int64()),
        "exposed_wait_ns": pa.array(waited_all, pa.int64(), mask=unknown_all),
        "exposed_transfer_ns": pa.array(exposed_all - waited_all, pa.int64(), mask=unknown_all),
    }
    return pa.table(out, schema=EXPOSED_SPLIT)
