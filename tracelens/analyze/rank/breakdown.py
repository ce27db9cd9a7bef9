"""Per-rank, per-step time breakdown: compute, overlapped / exposed communication, memcpy, idle.

For each rank the union of each class of intervals (see `classify`) is clipped to each step window:

    compute        = |C|                      (C: union of compute intervals)
    overlapped_comm= |K ∩ C|                  (K: union of communication intervals)
    exposed_comm   = |K − C|
    memcpy         = |M − (C ∪ K)|            (M: union of memory intervals)
    idle           = step − |C ∪ K ∪ M|

so that  (compute − overlapped_comm) + overlapped_comm + exposed_comm + memcpy + idle = step  exactly.
Step windows come from the rank's `ProfilerStep#N` annotations, moved to where the device runs each step's
work when the GPU lags the CPU, disjoint and inside the trace (analyze.rank.steps); GPU and CPU events share one
clock in Kineto. Without any ProfilerStep the whole trace is one window (step = null).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.core.intset import distinct
from tracelens.analyze.rank.classify import (
    COMM,
    COMPUTE,
    MEMORY,
    classify,
    gpu_ranks,
    main_threads,
)
from tracelens.schema import BREAKDOWN, RankSets


def _by_rank(events: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorting permutation by rank and the [lo, hi) slice of each rank in it."""
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    if rank.size and rank.min() == rank.max():  # one rank's table (the per-rank stage): already in order
        order = np.arange(rank.size)
        return order, rank[:1].copy(), np.array([[0, rank.size]], dtype=np.int64)
    order = np.argsort(rank, kind="stable")
    ranks = distinct(rank)
    lo = np.searchsorted(rank[order], ranks, side="left")
    hi = np.searchsorted(rank[order], ranks, side="right")
    return order, ranks, np.stack([lo, hi], axis=1)


def _async_lifetimes(
    s: np.ndarray, e: np.ndarray, comm: np.ndarray, compute: np.ndarray, is_ann: np.ndarray
) -> np.ndarray:
    """Communication annotations (`gloo:send` of an `isend`) that span an async op's lifetime: the host
    starts compute ops inside them, so they are not waits. Blocking ops (and `c10d::*` cpu ops) hold none."""
    out = np.zeros(len(s), bool)
    cand = np.flatnonzero(comm & is_ann)
    if cand.size == 0 or not compute.any():
        return out
    starts = np.sort(s[compute])
    inside = np.searchsorted(starts, e[cand], side="left") - np.searchsorted(starts, s[cand], side="right")
    out[cand[inside > 0]] = True
    return out


def class_sets(events: pa.Table, classes: np.ndarray | None = None) -> dict[int, RankSets]:
    """Per rank, the union of compute, communication and memory intervals over the whole trace."""
    if classes is None:
        classes = classify(events)
    cols = columns(events)
    ts = cols.int64("ts_ns")
    end = cols.end()
    tid = cols.int64("tid", -1)
    gpu = gpu_ranks(events)
    mains = main_threads(events) if len(gpu) < len(distinct(cols.int64("rank"))) else {}
    order, ranks, bounds = _by_rank(events)
    is_ann = cols.kinds("user_annotation")
    out: dict[int, RankSets] = {}
    for r, (lo, hi) in zip(ranks, bounds):
        idx = order[lo:hi]
        c = classes[idx]
        s, e = ts[idx], end[idx]
        comp = iv.union(s[c == COMPUTE], e[c == COMPUTE])
        comm = iv.union(s[c == COMM], e[c == COMM])
        mem = iv.union(s[c == MEMORY], e[c == MEMORY])
        path = "gpu" if int(r) in gpu else "cpu"
        if path == "cpu":
            # Communication ops on the main thread are waits, not compute, even when nested in an op.
            main = (c == COMM) & (tid[idx] == mains.get(int(r), -2))
            main &= ~_async_lifetimes(s, e, main, c == COMPUTE, is_ann[idx])
            comp = iv.subtract(comp, iv.union(s[main], e[main]))
        out[int(r)] = RankSets(int(r), path, comp, comm, mem)
    return out


def step_windows(events: pa.Table) -> pa.Table:
    """rank, step, start_ns, end_ns: one disjoint window per rank and `ProfilerStep#N` (analyze.rank.steps)."""
    from tracelens.analyze.rank.steps import step_windows as _windows

    return _windows(events)


def _whole_trace_window(events: pa.Table, sets: dict[int, RankSets]) -> pa.Table:
    """One window per rank spanning its analysed timeline, for traces without ProfilerStep."""
    rows: dict[str, list[int | None]] = {"rank": [], "step": [], "start_ns": [], "end_ns": []}
    for r, rs in sets.items():
        parts = [p for p in (rs.compute, rs.comm, rs.memory) if p[0].size]
        if not parts:
            continue
        rows["rank"].append(r)
        rows["step"].append(None)
        rows["start_ns"].append(int(min(p[0][0] for p in parts)))
        rows["end_ns"].append(int(max(p[1][-1] for p in parts)))
    return pa.table(
        {
            "rank": pa.array(rows["rank"], pa.int32()),
            "step": pa.array(rows["step"], pa.int32()),
            "start_ns": pa.array(rows["start_ns"], pa.int64()),
            "end_ns": pa.array(rows["end_ns"], pa.int64()),
        }
    )


def breakdown(
    events: pa.Table,
    sets: dict[int, RankSets] | None = None,
    windows: pa.Table | None = None,
) -> pa.Table:
    """One row per (rank, step) in the BREAKDOWN schema; the parts add up to step_time_ns exactly."""
    if sets is None:
        sets = class_sets(events)
    if windows is None:
        windows = step_windows(events)
        if windows.num_rows == 0:
            windows = _whole_trace_window(events, sets)
    w_rank = windows.column("rank").to_numpy(zero_copy_only=False)
    cols: dict[str, list[Any]] = {f.name: [] for f in BREAKDOWN}
    for r in distinct(w_rank):
        rs = sets.get(int(r))
        w = windows.filter(pa.array(w_rank == r))
        lo = w.column("start_ns").to_numpy(zero_copy_only=False)
        hi = w.column("end_ns").to_numpy(zero_copy_only=False)
        step = w.column("step").to_pylist()
        n = w.num_rows
        if rs is None:
            rs = RankSets(int(r), "gpu", iv.empty(), iv.empty(), iv.empty())
        c_k = iv.union2(rs.compute, rs.comm)
        busy = iv.union2(c_k, rs.memory)
        span = hi - lo
        compute = iv.measure_in_windows(rs.compute, lo, hi)
        comm = iv.measure_in_windows(rs.comm, lo, hi)
        # the other parts by inclusion-exclusion of these exact integer lengths (a window never ends before it
        # starts): |K ∩ C| = |C| + |K| - |C ∪ K|, |K − C| = |C ∪ K| - |C|, |M − (C ∪ K)| = |busy| - |C ∪ K|
        in_ck = iv.measure_in_windows(c_k, lo, hi)
        in_busy = iv.measure_in_windows(busy, lo, hi)
        overlapped = compute + comm - in_ck
        exposed = in_ck - compute
        memcpy = in_busy - in_ck
        idle = span - in_busy
        cols["rank"] += [int(r)] * n
        cols["step"] += step
        cols["window_start_ns"] += lo.tolist()
        cols["window_end_ns"] += hi.tolist()
        cols["step_time_ns"] += span.tolist()
        cols["compute_ns"] += compute.tolist()
        cols["comm_ns"] += comm.tolist()
        cols["overlapped_comm_ns"] += overlapped.tolist()
        cols["exposed_comm_ns"] += exposed.tolist()
        cols["memcpy_ns"] += memcpy.tolist()
        cols["idle_ns"] += idle.tolist()
        cols["path"] += [rs.path] * n
    return pa.table(cols, schema=BREAKDOWN)
