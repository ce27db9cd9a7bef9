"""Events -> the critical path's inputs: device work with its step, CPU launch and layer label (`device_nodes`,
schema NODES), and the CPU runtime calls that may have blocked on the GPU (`sync_calls`, schema SYNCS).

`tracelens.analyze.critical.critical_path` builds the graph from these two tables (see its docstring).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.core.intset import distinct, member
from tracelens.analyze.rank.classify import COMM_KERNEL, DEVICE_KINDS
from tracelens.schema import NODES, SYNCS

#: A sync-type runtime call blocked on the GPU when device work of its rank ended inside the call and the call
#: returned at most this long after the latest such end (the runtime's return and, for a device-to-host copy
#: into pageable memory, the staging copy: 9-17 µs on hta/trace_filter).
SYNC_TOL_NS = 50_000
#: Runtime (and driver) calls that wait for the GPU: synchronize calls of the device, a stream, an event or the
#: context (CUDA, HIP, driver API; `_ptsz` per-thread-default-stream variants).
SYNC_NAME = re.compile(r"^(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx)Synchronize(?:_v\d+|_ptsz|_spt)?$")
#: Copies that can block the CPU (`.item()`, `.cpu()`, `.tolist()`): they count only when their own device copy
#: (same correlation) ended inside the call, i.e. the call waited for it (a device-to-host copy into pageable
#: memory, a synchronous cudaMemcpy / hipMemcpy / hipMemcpyWithStream).
COPY_NAME = re.compile(
    r"^(?:(?:cuda|hip)Memcpy(?:2D|3D|Peer|WithStream|DtoH|FromSymbol)?|cuMemcpy(?:DtoH|2D|3D)?)"
    r"(?:Async)?(?:_v\d+|_ptsz|_ptds|_spt)?$"
)


def _is_comm_kernel(v: str) -> int:
    return int(bool(COMM_KERNEL.match(v)))


def _is_sync_name(v: str) -> int:
    return int(bool(SYNC_NAME.match(v)))


def _is_copy_name(v: str) -> int:
    return int(bool(COPY_NAME.match(v)))


def device_nodes(events: pa.Table, spans: pa.Table | None = None) -> pa.Table:
    """Device work with its step and CPU launch time (schema NODES), from one or more ranks' events."""
    return rank_nodes(events, spans)[0]


def rank_nodes(events: pa.Table, spans: pa.Table | None = None) -> tuple[pa.Table, bool]:
    """(`device_nodes`, whether any device work of `events` has a step).

    When some device work has a step, only such work is kept; otherwise (no ProfilerStep annotations) all of it
    is step 0. Over several ranks that rule is the run's: the nodes of ranks computed one at a time equal the
    nodes of all ranks at once after `select_nodes` (the per-rank stage computes them one rank at a time)."""
    if events.num_rows == 0:
        return NODES.empty_table(), False
    c = columns(events)  # (the per-rank stage's shared decode, inside `dictcol.sharing`)
    dev = c.kinds(*DEVICE_KINDS)
    has_step = c.valid("step")
    stepped = bool((dev & has_step).any())
    if stepped:
        dev = dev & has_step
    # without ProfilerStep annotations the whole trace is one window (step 0), as the breakdown does
    if not dev.any():
        return NODES.empty_table(), stepped
    rt = c.kinds("cuda_runtime")
    d_idx = np.flatnonzero(dev)
    is_comm = (c.flag("name", _is_comm_kernel) | c.valid("collective"))[d_idx]
    # (columns read at the device rows and the runtime rows only: no whole-column copies)
    rank, start, corr = (c.int64_at(k, d_idx, -1) for k in ("rank", "ts_ns", "correlation"))
    end = start + np.maximum(c.int64_at("dur_ns", d_idx, 0), 0)
    # the CPU launch: the first cuda_runtime event of the same rank and correlation
    launch_ns = np.full(d_idx.size, np.nan)
    launch_tid = np.full(d_idx.size, np.nan)
    r_idx = np.flatnonzero(rt)
    if r_idx.size:
        l_rank, l_corr = c.int64_at("rank", r_idx, -1), c.int64_at("correlation", r_idx, -1)
        ok = np.flatnonzero(l_corr >= 0)
        hit, first = _first_of_keys(l_rank[ok], l_corr[ok], rank, corr)
        del l_rank, l_corr
        rows = r_idx[ok[first]]
        # (as a float, as the frame it came through held it: ns since the epoch rounded to float64)
        launch_ns[hit] = c.int64_at("ts_ns", rows, -1).astype(np.float64)
        # (as pandas held the column: float64, NaN where null)
        tid = c.int64_at("tid", rows, -1).astype(np.float64)
        tid[~c.valid("tid")[rows]] = np.nan
        launch_tid[hit] = tid
    step = c.int64_at("step", d_idx, -1) if stepped else np.zeros(d_idx.size, np.int64)
    mods, at = _label_at({"rank": rank, "start_ns": start}, spans)
    label = mods.take(pa.array(at, mask=at < 0)).cast(pa.string())
    nodes = pa.table(
        {
            "rank": pa.array(rank, pa.int32()),
            "step": pa.array(step, pa.int32()),
            "stream": pa.array(c.int64_at("stream", d_idx, -1), pa.int32()),
            "start_ns": pa.array(start, pa.int64()),
            "end_ns": pa.array(end, pa.int64()),
            "launch_ns": pa.array(launch_ns, pa.float64(), from_pandas=True).cast(pa.int64()),
            "launch_tid": pa.array(launch_tid, pa.float64(), from_pandas=True).cast(pa.int64()),
            "is_comm": pa.array(is_comm, pa.bool_()),
            "label": label,
        },
        schema=NODES,
    )
    return nodes, stepped


def select_nodes(nodes: pa.Table, stepped: Collection[int], ranks: Collection[int]) -> pa.Table:
    """The nodes of `ranks` that `device_nodes` over those ranks' events at once gives, from nodes computed
    one rank at a time (`rank_nodes`; `stepped`: the ranks whose device work has steps): once any of them has
    steps, the ranks without are left out (their work has no step); otherwise every rank's work is step 0."""
    keep = set(ranks) & set(stepped) or set(ranks)
    rank = nodes.column("rank").to_numpy(zero_copy_only=False)
    mask = np.isin(rank, np.fromiter(keep, np.int64, len(keep)))
    return nodes if mask.all() else nodes.filter(pa.array(mask))


def relabel(nodes: pa.Table, spans: pa.Table | None) -> pa.Table:
    """`nodes` with their labels taken from `spans` (another layer rule than the one they were computed with)."""
    d = {k: nodes.column(k).to_numpy(zero_copy_only=False) for k in ("rank", "start_ns")}
    label = _labels(d, spans)
    return nodes.set_column(nodes.column_names.index("label"), "label", pa.array(label, pa.string()))


def _first_of_keys(
    k_rank: np.ndarray, k_val: np.ndarray, q_rank: np.ndarray, q_val: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(found?, position in the keys of the first (rank, value) pair equal to it) of each query pair whose
    value is >= 0; keys' values are >= 0."""
    q_ok = q_val >= 0
    ranks = distinct(k_rank)
    span = int(k_val.max()) + 1 if k_val.size else 1
    if ranks.size == 0 or ranks.size * span >= 2**62:  # (correlations are far below that: a fallback)
        key = pd.MultiIndex.from_arrays([k_rank, k_val])
        first = ~key.duplicated(keep="first")
        pos = key[first].get_indexer(pd.MultiIndex.from_arrays([q_rank, q_val]))
        pos[~q_ok] = -1
        return pos >= 0, np.flatnonzero(first)[pos[pos >= 0]]
    # (rank, value) as one int64: the rank's position times the values' span, plus the value
    ki = np.searchsorted(ranks, k_rank) * span + k_val
    if ki.size and bool((ki[1:] > ki[:-1]).all()):  # (one rank's launches in correlation order: all distinct)
        uniq, first = ki, np.arange(ki.size)
    else:
        uniq, first = np.unique(ki, return_index=True)  # (return_index: the first occurrence of each)
    qr = np.minimum(np.searchsorted(ranks, q_rank), ranks.size - 1)
    q_ok &= (ranks[qr] == q_rank) & (q_val < span)
    qk = qr * span + np.where(q_ok, q_val, 0)
    at = np.minimum(np.searchsorted(uniq, qk), uniq.size - 1)
    hit = q_ok & (uniq[at] == qk)
    return hit, first[at[hit]]


def sync_calls(events: pa.Table) -> pa.Table:
    """CPU runtime/driver calls that can block on the GPU (schema SYNCS), from one or more ranks' events.

    Synchronize calls (SYNC_NAME) all; copies (COPY_NAME) only when their own device copy (same rank and
    correlation) ended inside the call. Whether a call really waited is decided in `build_graph` against the
    device work of its rank (SYNC_TOL_NS).
    """
    if events.num_rows == 0 or "tid" not in events.column_names:
        return SYNCS.empty_table()
    cols = columns(events)
    rt = cols.kinds("cuda_runtime", "cuda_driver")
    is_sync = rt & cols.flag("name", _is_sync_name)
    is_copy = rt & cols.flag("name", _is_copy_name)
    cand = (is_sync | is_copy) & cols.valid("tid")
    if not cand.any():
        return SYNCS.empty_table()
    if not (is_copy[cand] & ~is_sync[cand]).any():  # synchronize calls only: all of them, no join
        start = cols.int64("ts_ns", -1)[cand]
        return pa.table(
            {
                "rank": pa.array(cols.int64("rank", -1)[cand], pa.int32()),
                "tid": pa.array(cols.int64("tid", -1)[cand], pa.int64()),
                "start_ns": pa.array(start, pa.int64()),
                "end_ns": pa.array(start + np.maximum(cols.int64("dur_ns", 0)[cand], 0), pa.int64()),
                "name": events.column("name").filter(pa.array(cand)).cast(pa.string()).combine_chunks(),
            },
            schema=SYNCS,
        )
    c = pd.DataFrame(
        {
            "rank": cols.int64("rank", -1)[cand],
            "tid": cols.int64("tid", -1)[cand],
            "start_ns": cols.int64("ts_ns", -1)[cand],
            "dur": cols.int64("dur_ns", 0)[cand],
            "corr": cols.int64("correlation", -1)[cand],
            "copy": is_copy[cand] & ~is_sync[cand],
            "name": events.column("name").filter(pa.array(cand)).cast(pa.string()).to_pylist(),
        }
    )
    c["end_ns"] = c["start_ns"] + np.maximum(c["dur"], 0)
    if c["copy"].any():
        dev = cols.kinds(*DEVICE_KINDS)
        own = pd.DataFrame(
            {
                "rank": cols.int64("rank", -1)[dev],
                "corr": cols.int64("correlation", -1)[dev],
                "own_end": cols.end()[dev],
            }
        )
        own = own[own["corr"] >= 0].drop_duplicates(["rank", "corr"])
        c = c.merge(own, on=["rank", "corr"], how="left")
        inside = (c["own_end"] > c["start_ns"]) & (c["own_end"] <= c["end_ns"]) & (c["corr"] >= 0)
        c = c[~c["copy"] | inside.fillna(False).to_numpy(dtype=bool)]
    return pa.table(
        {
            "rank": pa.array(c["rank"].to_numpy(), pa.int32()),
            "tid": pa.array(c["tid"].to_numpy(), pa.int64()),
            "start_ns": pa.array(c["start_ns"].to_numpy(), pa.int64()),
            "end_ns": pa.array(c["end_ns"].to_numpy(), pa.int64()),
            "name": pa.array(c["name"].tolist(), pa.string()),
        },
        schema=SYNCS,
    )


def _labels(d: Mapping[str, Any], spans: pa.Table | None) -> list[str | None]:
    """Layer type (`layers.N.<type>` annotation) around each kernel's start, when module spans are known: the
    span of the kernel's rank with the latest GPU start at or before the kernel's start (the last listed of
    spans starting together), if it has not ended before it. One sorted search over all ranks at once."""
    mods, at = _label_at(d, spans)
    res = np.full(at.size, None, dtype=object)
    res[at >= 0] = np.asarray(mods.to_pylist(), dtype=object)[at[at >= 0]]
    labels: list[str | None] = res.tolist()
    return labels


def _label_at(d: Mapping[str, Any], spans: pa.Table | None) -> tuple[pa.Array, np.ndarray]:
    """`_labels` as (the module of each candidate span, per kernel the position of its label there or -1)."""
    rank = np.asarray(d["rank"]).astype(np.int64)  # d: a frame or a dict of arrays, "rank" and "start_ns"
    start = np.asarray(d["start_ns"]).astype(np.int64)
    none = (pa.array([], pa.string()), np.full(len(rank), -1, np.int64))
    need = {"rank", "gpu_start_ns", "gpu_end_ns", "module"}
    if spans is None or spans.num_rows == 0 or not need <= set(spans.column_names) or not len(rank):
        return none
    sp = spans.select(["rank", "gpu_start_ns", "gpu_end_ns", "module"])
    if sp.column("gpu_start_ns").null_count:
        sp = sp.filter(sp.column("gpu_start_ns").is_valid())
    s_rank = sp.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    keep = member(s_rank, rank)
    if not keep.any():
        return none
    if not keep.all():
        sp = sp.filter(pa.array(keep))
        s_rank = s_rank[keep]
    s_start = sp.column("gpu_start_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    s_end = sp.column("gpu_end_ns").fill_null(np.iinfo(np.int64).min).to_numpy(zero_copy_only=False)
    # stable: spans starting together keep their listed order (one rank's spans: by start alone)
    one = s_rank.size > 0 and s_rank.min() == s_rank.max()
    order = np.argsort(s_start, kind="stable") if one else np.lexsort((s_start, s_rank))
    s_rank, s_start, s_end = s_rank[order], s_start[order], s_end[order]
    s_mod = sp.column("module").combine_chunks().take(pa.array(order))
    # (rank, time) as one sortable int64: the rank's position above 40 bits of time since its earliest instant
    ranks = distinct(np.concatenate([s_rank, rank]))
    ri_s, ri_d = np.searchsorted(ranks, s_rank), np.searchsorted(ranks, rank)
    if ranks.size == 1:  # (one rank's kernels, the per-rank stage: its earliest instant, one reduction each)
        base = np.array([min(int(s_start.min()), int(start.min()))], np.int64)
    else:
        base = np.full(ranks.size, np.iinfo(np.int64).max)
        np.minimum.at(base, ri_s, s_start)
        np.minimum.at(base, ri_d, start)
    rel_s, rel_d = s_start - base[ri_s], start - base[ri_d]
    if max(int(rel_s.max()), int(rel_d.max())) < 2**40 and ranks.size < 2**22:
        idx = np.searchsorted((ri_s << 40) + rel_s, (ri_d << 40) + rel_d, side="right") - 1
    else:  # a trace longer than ~18 minutes: one search per rank
        idx = np.full(start.size, -1, dtype=np.int64)
        lo = np.searchsorted(s_rank, ranks, side="left")
        hi = np.searchsorted(s_rank, ranks, side="right")
        for k in range(ranks.size):
            m = ri_d == k
            if lo[k] < hi[k] and m.any():
                idx[m] = lo[k] + np.searchsorted(s_start[lo[k] : hi[k]], start[m], side="right") - 1
    jj = np.maximum(idx, 0)
    hit = (idx >= 0) & (s_rank[jj] == rank) & (s_end[jj] >= start)
    return s_mod, np.where(hit, jj, -1)
