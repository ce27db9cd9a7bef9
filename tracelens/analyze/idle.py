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
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze import intervals as iv
from tracelens.analyze.classify import is_step_name
from tracelens.analyze.dictcol import columns
from tracelens.analyze.intset import distinct, member
from tracelens.findings import finding
from tracelens.thresholds import DEFAULT

IDLE_THRESHOLD = DEFAULT.gpu_idle  # (tracelens.thresholds: gpu_idle)
CAUSES = ("host_bound", "synchronization", "launch_overhead", "other_stream", "other")
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


#: Top CPU ops of a gap cause: name -> ns, in the order `idle_breakdown` ranks them.
OPS_MAP = pa.map_(pa.string(), pa.int64())
#: `idle_breakdown`'s table in Arrow (the per-rank stage file; `idle_frame` gives the DataFrame back).
IDLE = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),  # null: the whole-trace window of a run without ProfilerStep
        ("step_time_ns", pa.int64()),
        ("idle_ns", pa.int64()),
        *((c + "_ns", pa.int64()) for c in CAUSES),
        ("host_ops", OPS_MAP),
        ("sync_ops", OPS_MAP),
    ]
)
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
    .head(top)` with its zero sums dropped, without building a Series per call."""

    def __init__(self, name_of: np.ndarray, canon: np.ndarray, idx: np.ndarray) -> None:
        """The rows' names are `name_of[idx]`; `canon`: per slot of `name_of`, the first slot of equal value.

        Grouped on the integer codes, the groups ordered by name as `np.unique` of the names orders them."""
        code, inv = np.unique(canon[idx], return_inverse=True)
        names = name_of[code]
        self.pandas = any(n is None for n in names)  # null names: pandas' dropna rules, done by pandas
        if self.pandas:
            self.names = name_of[idx]
            return
        by_name = sorted(range(names.size), key=names.__getitem__)  # (distinct strings: no ties)
        place = np.empty(names.size, np.int64)
        place[by_name] = np.arange(names.size)
        self.keys = names[by_name]
        self.inv = place[inv.reshape(-1)]

    def top(self, values: np.ndarray, top: int) -> dict[str, int]:
        if self.pandas:
            s = pd.Series(values, index=self.names).groupby(level=0).sum().sort_values(ascending=False)
            return {str(k): int(v) for k, v in s.head(top).items() if v > 0}
        sums = np.zeros(self.keys.size, np.int64)
        np.add.at(sums, self.inv, values)
        first = _desc(sums)[:top]
        return {str(self.keys[i]): int(sums[i]) for i in first if sums[i] > 0}


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


def _idle_rows(events: pa.Table, breakdown: pa.Table, top: int) -> list[tuple[Any, ...]] | None:
    """The rows of `idle_breakdown` (None: no GPU rows in the breakdown)."""
    path = breakdown.column("path").to_numpy(zero_copy_only=False)
    is_gpu = path == "gpu"
    if not is_gpu.any():
        return None
    bd_rank = breakdown.column("rank").to_numpy(zero_copy_only=False)[is_gpu]
    # as pandas holds the column (float64 with NaN when any step is null), then as Python scalars
    bd_step = breakdown.column("step").to_numpy(zero_copy_only=False)[is_gpu].tolist()
    bd_lo = breakdown.column("window_start_ns").to_numpy(zero_copy_only=False)[is_gpu]
    bd_hi = breakdown.column("window_end_ns").to_numpy(zero_copy_only=False)[is_gpu]
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
    corr = ec.int64("correlation", -1)
    stream = ec.int64("stream", -1)
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
        n_streams = len(distinct(stream[dev]))
        dorder = dev[np.argsort(ts[dev], kind="stable")]
        dstart = ts[dorder]  # (the sorted starts)
        rt = np.flatnonzero(is_rt & (corr >= 0)) if whole else mine[is_rt[mine] & (corr[mine] >= 0)]
        rt_sorted = rt[np.argsort(corr[rt], kind="stable")]
        rt_corr = corr[rt_sorted]
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
        for b in w:
            lo, hi = int(bd_lo[b]), int(bd_hi[b])
            gaps = _gaps(busy, lo, hi)
            g0, g1 = gaps
            parts = dict.fromkeys(CAUSES, 0)
            host_iv = iv.empty()
            if g0.size:
                k = np.searchsorted(dstart, g1, side="left")
                nxt = dorder[np.minimum(k, dorder.size - 1)]
                has_next = (k < dorder.size) & (dstart[np.minimum(k, dorder.size - 1)] == g1)
                c = corr[nxt]
                j = np.searchsorted(rt_corr, c)
                ok = has_next & (c >= 0) & (j < rt_corr.size)
                ok &= rt_corr[np.minimum(j, max(rt_corr.size - 1, 0))] == c if rt_corr.size else False
                launch = np.where(
                    ok, ts[rt_sorted[np.minimum(j, max(rt_corr.size - 1, 0))]] if rt_corr.size else 0, -1
                )
                queued = ok & (launch < g0)
                not_q = ok & ~queued
                length = g1 - g0
                parts["other"] = int(length[~ok].sum())
                if n_streams > 1:
                    parts["other_stream"] = int(length[queued].sum())
                else:
                    parts["launch_overhead"] += int(length[queued].sum())
                hs, he = g0[not_q], np.minimum(launch[not_q], g1[not_q])
                parts["launch_overhead"] += int((g1[not_q] - np.maximum(launch[not_q], g0[not_q])).sum())
                cpu_part = iv.union(hs, he)
                sync_part = iv.intersect(cpu_part, sync_set)
                host_part = iv.subtract(cpu_part, sync_set)
                parts["synchronization"] = iv.total(sync_part)
                parts["host_bound"] = iv.total(host_part)
                host_iv = host_part
                sync_iv = sync_part
            host_ops: dict[str, int] = {}
            sync_ops: dict[str, int] = {}
            if op_names is not None and parts["host_bound"]:
                host_ops = op_names.top(iv.measure_in_windows(host_iv, ts[ops], end[ops]), top)
            if op_names is not None and parts["synchronization"]:
                sync_ops = op_names.top(iv.measure_in_windows(sync_iv, ts[ops], end[ops]), top)
                if not sync_ops and sync.size:
                    ov = iv.measure_in_windows(sync_iv, ts[sync], end[sync])
                    sync_ops = _ByName(name_of, canon, name_idx[sync]).top(ov, top)
            idle = int((g1 - g0).sum()) if g0.size else 0
            rows.append(
                (r, bd_step[b], int(bd_len[b]), idle, *(parts[c] for c in CAUSES), host_ops, sync_ops)
            )
    return rows


def _gaps(busy: iv.Intervals, lo: int, hi: int) -> iv.Intervals:
    """`iv.subtract(([lo], [hi]), iv.clip(busy, lo, hi))` of a canonical set: the non-empty stretches of
    [lo, hi) between its clipped intervals (sorted, disjoint, non-touching), read off their bounds."""
    bs, be = iv.clip(busy, lo, hi)
    if bs.size == 0:  # (subtract returns the window itself, even an empty one)
        return np.array([lo]), np.array([hi])
    g0 = np.concatenate([[lo], be]).astype(np.int64)
    g1 = np.concatenate([bs, [hi]]).astype(np.int64)
    keep = g1 > g0
    return g0[keep], g1[keep]


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
