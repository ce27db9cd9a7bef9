"""Why the GPU sits idle: each idle gap of each rank's step split by cause (HTA's idle time breakdown and
beyond), with the CPU ops responsible.

For a gap [g0, g1) between device activity (kernels, copies, memsets on any stream) inside a step window,
the device event that ends it was launched by a runtime call at `launch` (kernel -> launch by correlation):

* synchronization: the part of the gap the host spent blocked in a sync call (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize`, blocking `cudaMemcpy`, `.item()`'s D2H wait);
* host-bound: the rest of [g0, launch): nothing was queued, the CPU was busy elsewhere (Python, data
  loading, launch-bound op dispatch); the top-level CPU ops running then are named;
* launch overhead: [max(g0, launch), g1), the latency from the launch call to the work starting;
* other-stream wait: the whole gap when the work was already queued at g0 on a rank that uses several
  streams (it waited for an event on another stream);
* other: no launch found (no correlation).

Finding GPU_IDLE when a rank's device is idle more than `threshold` of its step (mean over steps): the
dominant cause, ms per step per cause, and the CPU ops behind host-bound and synchronization time.
See docs/summary.md.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.core.intset import distinct, member
from tracelens.analyze.rank.classify import is_step_name
from tracelens.findings import finding
from tracelens.schema import IDLE, IDLE_CAUSES, OPS_MAP
from tracelens.thresholds import DEFAULT

IDLE_THRESHOLD = DEFAULT.gpu_idle  # (tracelens.thresholds: gpu_idle)
CAUSES = IDLE_CAUSES
LABELS = {
    "host_bound": "host-bound (no work queued)",
    "synchronization": "synchronization",
    "launch_overhead": "launch overhead",
    "other_stream": "waiting on another stream",
    "other": "other",
}
SYNC = re.compile(
    r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy|MemcpyDtoH|Memcpy2D|"
    r"StreamWaitEvent)$|Synchronize$"
)
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_KINDS = ("cuda_runtime", "cuda_driver", "hip_runtime", "runtime")


#: Most distinct op names for which tied sums are ordered as pandas' sort orders them (numpy's quicksort
#: on the window's sums over every name: O(names) a window with a tie). A rank with more names (a trace
#: naming every op differently) orders ties by name, so that its cost stays O(ops) whatever the step count.
DENSE_TIES_MAX = 1 << 16
COLUMNS = IDLE.names


def idle_table(df: pd.DataFrame) -> pa.Table:
    """`idle_breakdown`'s DataFrame as an IDLE table (op dicts as maps, their order kept)."""
    if df.empty:
        return IDLE.empty_table()
    cols = {}
    for f in IDLE:
        if f.type == OPS_MAP:
            cols[f.name] = pa.array([list(d.items()) for d in df[f.name]], OPS_MAP)
        else:
            cols[f.name] = pa.array(df[f.name], f.type, from_pandas=True)
    return pa.table(cols, schema=IDLE)


def idle_frame(table: pa.Table) -> pd.DataFrame:
    """The DataFrame `idle_breakdown` returns, from IDLE rows (the inverse of `idle_table`)."""
    if table.num_rows == 0:
        return pd.DataFrame(columns=COLUMNS)
    return table.to_pandas(maps_as_pydicts="strict")


def _arr(t: pa.Table, col: str, fill: int = 0) -> np.ndarray:
    out: np.ndarray = t.column(col).fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64)
    return out


def _is_sync_name(v: str) -> bool:
    return SYNC.search(v) is not None


def _desc(values: np.ndarray) -> np.ndarray:
    """Positions of `values` (int64, no NaN) from largest to smallest, ties in the order pandas'
    `Series.sort_values(ascending=False)` puts them (a reversed quicksort argsort of the reversed values)."""
    rev = np.arange(values.size)[::-1]
    out: np.ndarray = rev[values[::-1].argsort(kind="quicksort")][::-1]
    return out


class _ByName:
    """Sums of per-row values grouped by the rows' names, top `top` names by sum (ties as pandas orders
    them), positive sums only: `pd.Series(v, index=names).groupby(level=0).sum().sort_values(ascending=False)
    .head(top)` with its zero sums dropped, without building a Series per call. Rows without a name are in
    no group (pandas' group-by drops a null key)."""

    def __init__(self, name_of: np.ndarray, canon: np.ndarray, idx: np.ndarray) -> None:
        """The rows' names are `name_of[idx]`; `canon`: per slot of `name_of`, the first slot of equal value.

        Grouped on the integer codes, the groups ordered by name as `np.unique` of the names orders them."""
        code, inv = np.unique(canon[idx], return_inverse=True)
        names = name_of[code]
        named = np.array([n is not None for n in names], bool)
        by_name = sorted(np.flatnonzero(named).tolist(), key=names.__getitem__)  # (distinct: no ties)
        place = np.full(names.size, -1, np.int64)
        place[by_name] = np.arange(len(by_name))
        self.keys = names[by_name]
        #: each row's group (-1: a row without a name)
        self.inv = place[inv.reshape(-1)]

    def top(self, values: np.ndarray, top: int) -> dict[str, int]:
        """The top groups of one set of per-row values."""
        sums = np.zeros(self.keys.size, np.int64)
        ok = self.inv >= 0
        np.add.at(sums, self.inv[ok], values[ok])
        return self._top_of(sums, top)

    def _top_of(self, sums: np.ndarray, top: int) -> dict[str, int]:
        first = _desc(sums)[:top]
        return {str(self.keys[i]): int(sums[i]) for i in first if sums[i] > 0}

    def top_per_window(
        self, window: np.ndarray, row: np.ndarray, values: np.ndarray, n: int, top: int
    ) -> list[dict[str, int]]:
        """`top` of each of `n` windows at once, from sparse (window, row, value) triples (a window's
        missing rows count 0): what `top` gives for each window's dense values, in O(triples) instead of
        O(windows x rows). A window whose top groups tie in sum is ordered by `top` itself (the tie order is
        numpy's quicksort's on the dense sums; beyond DENSE_TIES_MAX groups, by name)."""
        out: list[dict[str, int]] = [{} for _ in range(n)]
        grp = self.inv[row]
        keep = (grp >= 0) & (values > 0)
        if not keep.any():
            return out
        w, g, v = window[keep], grp[keep], values[keep]
        k = self.keys.size
        key = w.astype(np.int64) * np.int64(k) + g
        order = np.argsort(key, kind="stable")
        key, v = key[order], v[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        sums = np.add.reduceat(v, first)
        ukey = key[first]
        uw, ug = ukey // k, ukey % k
        # per window: its groups by sum, largest first (groups ascending among ties, then checked below)
        o = np.lexsort((ug, -sums, uw))
        uw, ug, sums = uw[o], ug[o], sums[o]
        starts = np.flatnonzero(np.r_[True, uw[1:] != uw[:-1]])
        ends = np.r_[starts[1:], uw.size]
        sums_l, ug_l, keys = sums.tolist(), ug.tolist(), self.keys
        dense_ties = k <= DENSE_TIES_MAX
        for a, b in zip(starts.tolist(), ends.tolist()):
            m = min(top, b - a)
            # ties among the chosen groups or at the cut: the dense sums decide the order as `top` does
            if dense_ties and any(sums_l[i] == sums_l[i + 1] for i in range(a, min(a + m, b - 1))):
                dense = np.zeros(k, np.int64)
                dense[ug[a:b]] = sums[a:b]
                out[int(uw[a])] = self._top_of(dense, top)
            else:
                out[int(uw[a])] = {str(keys[ug_l[i]]): int(sums_l[i]) for i in range(a, a + m)}
        return out


def idle_breakdown(events: pa.Table, breakdown: pa.Table, top: int = 3) -> pd.DataFrame:
    """Per (rank, step) of GPU ranks: idle ns by cause (CAUSES + "_ns"), step_time_ns, and the top CPU
    ops (name -> ns) behind host-bound (`host_ops`) and synchronization (`sync_ops`) time."""
    cols = COLUMNS
    if breakdown.num_rows == 0 or events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    rows = _idle_rows(events, breakdown, top)
    if rows is None:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows, columns=cols)


def idle_breakdown_table(events: pa.Table, breakdown: pa.Table, top: int = 3) -> pa.Table:
    """`idle_table(idle_breakdown(events, breakdown, top))`, built without the DataFrame."""
    if breakdown.num_rows == 0 or events.num_rows == 0:
        return IDLE.empty_table()
    rows = _idle_rows(events, breakdown, top)
    if not rows:
        return IDLE.empty_table()
    out = {}
    for i, f in enumerate(IDLE):
        vals = [row[i] for row in rows]
        if f.type == OPS_MAP:
            out[f.name] = pa.array([list(d.items()) for d in vals], OPS_MAP)
        elif f.name == "step":  # NaN (from a null step, as pandas holds it) -> null
            out[f.name] = pa.array([None if v != v else int(v) for v in vals], f.type)
        else:
            out[f.name] = pa.array(vals, f.type)
    return pa.table(out, schema=IDLE)


def _sum_by(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """int64 sums of `values` per group 0..n-1 (exact: no float weights)."""
    out = np.zeros(n, np.int64)
    if group.size:
        np.add.at(out, group, values.astype(np.int64, copy=False))
    return out


def _pieces(sa: np.ndarray, ea: np.ndarray, b: iv.Intervals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(which interval of a, start, end) of every overlap of a's intervals (any order, each non-empty)
    with the canonical set b: `iv.intersect` of each interval of a on its own, all at once."""
    sb, eb = b
    if sa.size == 0 or sb.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    lo = np.searchsorted(eb, sa, side="right")  # the first interval of b ending after a's start
    hi = np.searchsorted(sb, ea, side="left")  # past the last one of b starting before a's end
    count = np.maximum(hi - lo, 0)
    ia = np.repeat(np.arange(sa.size), count)
    ib = np.arange(ia.size) - (np.cumsum(count) - count)[ia] + lo[ia]
    return ia, np.maximum(sa[ia], sb[ib]).astype(np.int64), np.minimum(ea[ia], eb[ib]).astype(np.int64)


def _overlaps(
    pieces: iv.Intervals, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(piece, query, positive overlap) of every piece of a sorted disjoint set overlapping each query
    interval [lo, hi): `iv.measure_in_windows(pieces, lo, hi)` split by piece, zeros left out."""
    ps, pe = pieces
    ip = np.zeros(0, np.int64)
    if ps.size == 0 or lo.size == 0:
        return ip, ip, ip
    first = np.searchsorted(pe, lo, side="right")  # the first piece ending after the query's start
    last = np.searchsorted(ps, hi, side="left")  # past the last piece starting before its end
    count = np.maximum(last - first, 0)
    q = np.repeat(np.arange(lo.size), count)
    ip = np.arange(q.size) - (np.cumsum(count) - count)[q] + first[q]
    ov = np.minimum(pe[ip], hi[q]) - np.maximum(ps[ip], lo[q])
    keep = ov > 0
    return ip[keep], q[keep], ov[keep]


def _disjoint_batches(lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """The windows (positions into lo / hi) in batches of pairwise disjoint windows, each sorted by start:
    one batch for a rank's step windows (disjoint by construction), more only for overlapping ones."""
    todo = np.argsort(lo, kind="stable")
    out = []
    while todo.size:
        h = hi[todo]
        reach = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, np.maximum(h[:-1], lo[todo][:-1])])
        free = lo[todo] >= reach  # starts after every window before it (in start order) has ended
        out.append(todo[free])
        todo = todo[~free]
    return out


def _idle_rows(events: pa.Table, breakdown: pa.Table, top: int) -> list[tuple[Any, ...]] | None:
    """The rows of `idle_breakdown` (None: no GPU rows in the breakdown)."""
    path = breakdown.column("path").to_numpy(zero_copy_only=False)
    is_gpu = path == "gpu"
    if not is_gpu.any():
        return None
    bd_rank = breakdown.column("rank").to_numpy(zero_copy_only=False)[is_gpu]
    # as pandas holds the column (float64 with NaN when any step is null), then as Python scalars
    bd_step = breakdown.column("step").to_numpy(zero_copy_only=False)[is_gpu].tolist()
    bd_lo = breakdown.column("window_start_ns").to_numpy(zero_copy_only=False)[is_gpu].astype(np.int64)
    bd_hi = breakdown.column("window_end_ns").to_numpy(zero_copy_only=False)[is_gpu].astype(np.int64)
    bd_len = breakdown.column("step_time_ns").to_numpy(zero_copy_only=False)[is_gpu]
    ec = columns(events)
    is_dev = ec.kinds(*DEVICE_KINDS)
    is_rt = ec.kinds(*RUNTIME_KINDS)
    is_op = ec.kinds("cpu_op")
    is_sync = ec.flag("name", _is_sync_name)
    is_step = ec.flag("name", is_step_name)
    rank = ec.int64("rank")
    ts = ec.int64("ts_ns")
    end = ec.end()
    tid = ec.int64("tid", -1)
    values, name_idx = ec.codes("name")
    name_of = np.array([*values, None], dtype=object)
    canon = ec.canonical("name")
    rows = []
    # each rank's rows once (a stable sort by rank), not a mask over every event per rank: O(events); one
    # rank's table (the per-rank stage) is its own rows in order
    one_rank = rank.size > 0 and rank.min() == rank.max()
    by_rank = np.arange(rank.size) if one_rank else np.argsort(rank, kind="stable")
    sorted_rank = rank if one_rank else rank[by_rank]
    bd_order = np.argsort(bd_rank, kind="stable")  # the breakdown's GPU rows grouped by rank, in order
    for r in distinct(bd_rank):
        r = int(r)
        w = bd_order[bd_rank[bd_order] == r]
        mine = by_rank[np.searchsorted(sorted_rank, r, "left") : np.searchsorted(sorted_rank, r, "right")]
        whole = mine.size == rank.size  # (every row is r's, in order: the masks' rows directly)
        dev = np.flatnonzero(is_dev) if whole else mine[is_dev[mine]]
        if dev.size == 0:
            continue
        busy = iv.union(ts[dev], end[dev])
        # (the streams and correlations read at the rows that have them: no whole-column copies)
        n_streams = len(distinct(ec.int64_at("stream", dev, -1)))
        dorder = dev[np.argsort(ts[dev], kind="stable")]
        dstart = ts[dorder]  # (the sorted starts)
        dcorr = ec.int64_at("correlation", dorder, -1)
        rt = np.flatnonzero(is_rt) if whole else mine[is_rt[mine]]
        rt_corr = ec.int64_at("correlation", rt, -1)
        rt, rt_corr = rt[rt_corr >= 0], rt_corr[rt_corr >= 0]
        by_corr = np.argsort(rt_corr, kind="stable")
        rt_sorted, rt_corr = rt[by_corr], rt_corr[by_corr]
        sync = np.flatnonzero(is_rt & is_sync) if whole else mine[is_rt[mine] & is_sync[mine]]
        sync_set = iv.union(ts[sync], end[sync])
        # top-level cpu ops of the launching threads (threads that issued runtime calls); a step annotation
        # (`ProfilerStep#N`, a cpu_op in older traces) encloses the whole step and is never the op
        # responsible: the ops inside it are the top-level ones
        threads = distinct(tid[rt]) if rt.size else np.array([], np.int64)
        op_rows = np.flatnonzero(is_op & ~is_step) if whole else mine[is_op[mine] & ~is_step[mine]]
        ops = op_rows[member(tid[op_rows], threads)]
        ops = ops[np.lexsort((-end[ops], ts[ops]))]
        if ops.size:
            prev_max = np.maximum.accumulate(np.concatenate([[np.iinfo(np.int64).min], end[ops][:-1]]))
            ops = ops[ts[ops] >= prev_max]
        op_names = _ByName(name_of, canon, name_idx[ops]) if ops.size else None
        rk = _RankTimeline(
            busy, n_streams, dorder, dstart, dcorr, rt_sorted, rt_corr, sync, sync_set, ops, op_names
        )
        found: dict[int, tuple[Any, ...]] = {}
        for batch in _disjoint_batches(bd_lo[w], bd_hi[w]):
            wb = w[batch]  # breakdown rows of this batch, by window start
            rows_of = _window_rows(rk, bd_lo[wb], bd_hi[wb], ts, end, name_of, canon, name_idx, top)
            found.update(zip(wb.tolist(), rows_of))
        for b in w:
            idle, parts, host_ops, sync_ops = found[int(b)]
            rows.append((r, bd_step[b], int(bd_len[b]), idle, *parts, host_ops, sync_ops))
    return rows


class _RankTimeline(NamedTuple):
    """One rank's device busy set, its device work by start, launches by correlation, sync calls and
    top-level ops (rows of the events), as `_idle_rows` prepares them once for all its windows."""

    busy: iv.Intervals
    n_streams: int
    dorder: np.ndarray  # device rows by start
    dstart: np.ndarray  # their starts
    dcorr: np.ndarray  # their correlations (-1: none)
    rt_sorted: np.ndarray  # runtime rows with a correlation, by correlation
    rt_corr: np.ndarray  # their correlations
    sync: np.ndarray  # sync call rows
    sync_set: iv.Intervals
    ops: np.ndarray  # top-level cpu op rows of the launching threads
    op_names: _ByName | None


def _window_rows(
    rk: _RankTimeline,
    lo: np.ndarray,
    hi: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    name_of: np.ndarray,
    canon: np.ndarray,
    name_idx: np.ndarray,
    top: int,
) -> list[tuple[int, list[int], dict[str, int], dict[str, int]]]:
    """(idle ns, ns per cause, host ops, sync ops) of each of a rank's pairwise disjoint windows [lo, hi)
    (sorted by start), all windows in one pass over the rank's gaps: sorted sweeps and searches, never a
    scan of the rank's events per window."""
    busy, dorder, dstart, rt_sorted, rt_corr = rk.busy, rk.dorder, rk.dstart, rk.rt_sorted, rk.rt_corr
    sync, sync_set, ops, op_names = rk.sync, rk.sync_set, rk.ops, rk.op_names
    n = lo.size
    g0, g1, gw = _window_gaps(busy, lo, hi)
    parts = {c: np.zeros(n, np.int64) for c in CAUSES}
    sync_w = host_w = np.zeros(0, np.int64)
    sync_iv = host_iv = iv.empty()
    if g0.size:
        k = np.searchsorted(dstart, g1, side="left")
        at = np.minimum(k, dorder.size - 1)
        has_next = (k < dorder.size) & (dstart[at] == g1)
        c = rk.dcorr[at]
        j = np.searchsorted(rt_corr, c)
        ok = has_next & (c >= 0) & (j < rt_corr.size)
        last = max(rt_corr.size - 1, 0)
        ok &= rt_corr[np.minimum(j, last)] == c if rt_corr.size else False
        launch = np.where(ok, ts[rt_sorted[np.minimum(j, last)]] if rt_corr.size else 0, -1)
        queued = ok & (launch < g0)
        not_q = ok & ~queued
        length = g1 - g0
        parts["other"] = _sum_by(gw[~ok], length[~ok], n)
        parts["other_stream" if rk.n_streams > 1 else "launch_overhead"] = _sum_by(
            gw[queued], length[queued], n
        )
        parts["launch_overhead"] += _sum_by(gw[not_q], g1[not_q] - np.maximum(launch[not_q], g0[not_q]), n)
        # the host's part of each gap not queued: [g0, launch), sorted and disjoint as the gaps are
        hs, he, hw = g0[not_q], np.minimum(launch[not_q], g1[not_q]), gw[not_q]
        keep = he > hs
        hs, he, hw = hs[keep], he[keep], hw[keep]
        ia, s_s, s_e = _pieces(hs, he, sync_set)
        sync_iv, sync_w = (s_s, s_e), hw[ia]
        if sync_set[0].size and hs.size:
            span_lo = int(min(hs.min(), sync_set[0][0]))
            span_hi = int(max(he.max(), sync_set[1][-1]))
            ia, h_s, h_e = _pieces(hs, he, iv.complement(sync_set, span_lo, span_hi))
            host_iv, host_w = (h_s, h_e), hw[ia]
        else:
            host_iv, host_w = (hs, he), hw
        parts["synchronization"] = _sum_by(sync_w, sync_iv[1] - sync_iv[0], n)
        parts["host_bound"] = _sum_by(host_w, host_iv[1] - host_iv[0], n)
    host_ops: list[dict[str, int]] = [{} for _ in range(n)]
    sync_ops: list[dict[str, int]] = [{} for _ in range(n)]
    if op_names is not None:
        o_lo, o_hi = ts[ops], end[ops]
        ip, q, ov = _overlaps(host_iv, o_lo, o_hi)
        host_ops = op_names.top_per_window(host_w[ip], q, ov, n, top)
        ip, q, ov = _overlaps(sync_iv, o_lo, o_hi)
        sync_ops = op_names.top_per_window(sync_w[ip], q, ov, n, top)
        # windows with synchronization time but no top-level op around it: the sync calls' own names
        bare = np.flatnonzero((parts["synchronization"] > 0) & np.array([not d for d in sync_ops], bool))
        if sync.size and bare.size:
            ip, q, ov = _overlaps(sync_iv, ts[sync], end[sync])
            on = member(sync_w[ip], bare)
            by_call = _ByName(name_of, canon, name_idx[sync]).top_per_window(
                sync_w[ip][on], q[on], ov[on], n, top
            )
            for i in bare.tolist():
                sync_ops[i] = by_call[i]
    idle = _sum_by(gw, g1 - g0, n) if g0.size else np.zeros(n, np.int64)
    cols = [parts[c].tolist() for c in CAUSES]
    return [
        (idle_i, [col[i] for col in cols], host_ops[i], sync_ops[i]) for i, idle_i in enumerate(idle.tolist())
    ]


def _window_gaps(
    busy: iv.Intervals, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_gaps(busy, lo[i], hi[i])` of every window i at once, concatenated in window order: (g0, g1, window).

    A window's clipped busy intervals are a slice of the canonical set found by two binary searches; its
    gaps are the stretches between them, so the work is O(windows + busy intervals inside them)."""
    bs, be = busy
    first = np.searchsorted(be, lo, side="right")  # the first busy interval ending after the window's start
    last = np.searchsorted(bs, hi, side="left")  # past the last one starting before its end
    count = np.where(hi > lo, np.maximum(last - first, 0), 0)
    # a window with c clipped intervals has c + 1 candidate gaps: [lo, e0), [s1, e1) ... [s_c-1, hi)
    w = np.repeat(np.arange(lo.size), count + 1)
    j = np.arange(w.size) - (np.cumsum(count + 1) - (count + 1))[w]  # position within the window
    c = count[w]
    i = first[w] + j  # the busy interval after candidate gap j
    g0 = np.where(j == 0, lo[w], np.minimum(be[np.minimum(i - 1, be.size - 1)] if be.size else 0, hi[w]))
    g1 = np.where(j == c, hi[w], np.maximum(bs[np.minimum(i, bs.size - 1)] if bs.size else 0, lo[w]))
    keep = (g1 > g0) | (c == 0)  # (a window with nothing busy in it is its own gap, even an empty one)
    return g0[keep].astype(np.int64), g1[keep].astype(np.int64), w[keep]


def _gaps(busy: iv.Intervals, lo: int, hi: int) -> iv.Intervals:
    """`iv.subtract(([lo], [hi]), iv.clip(busy, lo, hi))` of a canonical set: the non-empty stretches of
    [lo, hi) between its clipped intervals (sorted, disjoint, non-touching), read off their bounds."""
    g0, g1, _ = _window_gaps(busy, np.array([lo], np.int64), np.array([hi], np.int64))
    return g0, g1


def idle_findings(table: pd.DataFrame, threshold: float = IDLE_THRESHOLD) -> list[dict[str, Any]]:
    """GPU_IDLE per group of ranks sharing a dominant cause, when idle > threshold of the step."""
    if table.empty:
        return []
    per = table.groupby("rank").agg(
        step_ms=("step_time_ns", "mean"), idle=("idle_ns", "mean"), **{c: (c + "_ns", "mean") for c in CAUSES}
    )
    per = per[(per["step_ms"] > 0) & (per["idle"] / per["step_ms"] > threshold)]
    out = []
    for r, row in per.iterrows():
        frac = row["idle"] / row["step_ms"]
        causes = {c: float(row[c]) / 1e6 for c in CAUSES}
        dominant = max(causes, key=lambda c: causes[c])
        sub = table[table["rank"] == r]

        def top_ops(col: str, sub: pd.DataFrame = sub) -> dict[str, float]:
            acc: dict[str, float] = {}
            for d in sub[col]:
                for k, v in (d or {}).items():
                    acc[k] = acc.get(k, 0.0) + v / 1e6 / len(sub)
            return {k: round(v, 3) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:3]}

        host_ops, sync_ops = top_ops("host_ops"), top_ops("sync_ops")
        split = ", ".join(
            f"{LABELS[c]} {v:.1f}" for c, v in sorted(causes.items(), key=lambda kv: -kv[1]) if v >= 0.05
        )
        ops = host_ops if dominant == "host_bound" else sync_ops if dominant == "synchronization" else {}
        named = "; CPU ops then: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ops.items()) if ops else ""
        out.append(
            finding(
                "GPU_IDLE",
                "warning",
                f"rank {int(r)}: GPU idle {frac:.0%} of the step ({row['idle'] / 1e6:.1f} ms/step), mostly "
                f"{LABELS[dominant]}; ms per step: {split}{named}",
                ranks=[int(r)],
                cause=dominant,
                idle_fraction=round(float(frac), 4),
                idle_ms=round(float(row["idle"]) / 1e6, 6),
                causes_ms={c: round(v, 6) for c, v in causes.items()},
                host_ops_ms=host_ops,
                sync_ops_ms=sync_ops,
            )
        )
    return out
