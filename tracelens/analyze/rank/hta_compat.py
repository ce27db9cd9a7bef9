"""HolisticTraceAnalysis 0.5 compatible numbers, for users migrating from HTA (`--compat hta`).

Reproduces `TraceAnalysis.get_temporal_breakdown()` and `get_comm_comp_overlap()` of HTA 0.5 with its
own definitions, not tracelens' (docs/hta-compat.md has the exact rules and how they differ):

- GPU events are rows with a stream other than -1 (HTA's `args.stream`, also on Triton launch cpu ops, which
  HTA therefore counts as kernels); kernel classes come from the
  name alone: communication `^nccl.*Kernel`, memory `^(Memcpy|Memset|dma)`, computation anything that is
  not `^nccl.*Kernel`, does not contain `Memcpy` or `Sync` and does not start with `Memset`; the rest
  (e.g. `Stream Sync`) is "other" and counts as non-compute time.
- The window is the first to the last GPU event of each rank, after HTA's "drop the last profiler step"
  filter: GPU kernels survive only if the CPU event that launched them (same correlation id) starts
  before the last `ProfilerStep` of that rank. The filter only runs when the traces hold at least two
  distinct `ProfilerStep` names.
- Traces with sub-microsecond timestamps are rounded as HTA does: start up, end down, to whole µs.

Everything is vectorised numpy over all events of a rank; the only Python loop is over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The HTA release whose definitions this module reproduces.
HTA_VERSION = "0.5"

# HTA 0.5 hta/utils/utils.py, translated from `re.match` to search semantics.
COMM_RE = r"^nccl.*Kernel"  # is_comm_kernel
MEMORY_RE = r"^(Memcpy|Memset|dma)"  # is_memory_kernel
NOT_COMPUTE_RE = r"^nccl.*Kernel|^.*Memcpy|^Memset|^.*Sync"  # NCCL_COMPUTE_KERNEL_RE

#: Kernel classes, HTA's `KernelType` order.
COMMUNICATION, MEMORY, COMPUTATION, OTHER = 0, 1, 2, 3

#: Device-level sync events HTA counts as GPU events although their stream is -1.
_DEVICE_SYNC_NAMES = ("Event Sync", "Context Sync")

#: Kinds that never carry `args.stream` in Kineto although an ingester may give them the stream of their
#: timeline (their tid); HTA sees stream -1 for them.
_NO_STREAM_KINDS = ("gpu_user_annotation",)

#: Kineto `cuda_sync` event names (`cuda_sync_kind`). They sit on their stream's timeline (tid = args.stream);
#: when the events table leaves their stream null, the tid stands in for HTA's `args.stream`.
_CUDA_SYNC_NAMES = ("Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event")

TEMPORAL_BREAKDOWN = pa.schema(
    [
        ("rank", pa.int32()),
        ("idle_time_ns", pa.int64()),
        ("compute_time_ns", pa.int64()),
        ("non_compute_time_ns", pa.int64()),
        ("kernel_time_ns", pa.int64()),
        ("idle_time_pctg", pa.float64()),
        ("compute_time_pctg", pa.float64()),
        ("non_compute_time_pctg", pa.float64()),
    ]
)

COMM_COMP_OVERLAP = pa.schema(
    [
        ("rank", pa.int32()),
        ("comm_time_ns", pa.int64()),  # merged communication kernel time (the ratio's denominator)
        ("overlap_time_ns", pa.int64()),  # communication time during which a compute kernel runs
        ("comp_comm_overlap_pctg", pa.float64()),
    ]
)


def _per_value(col: pa.Array | pa.ChunkedArray, fn: Callable[[pa.Array], np.ndarray]) -> np.ndarray:
    """`fn(strings) -> numpy array` evaluated once per distinct value of a (dictionary) string column
    and gathered to every row; a null reads as the empty string."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        return fn(pc.fill_null(arr.cast(pa.string()), ""))
    values = fn(pc.fill_null(arr.dictionary.cast(pa.string()), ""))
    null_value = fn(pa.array([""], pa.string()))
    table = np.concatenate([values, null_value])
    codes = pc.fill_null(arr.indices, len(values)).to_numpy(zero_copy_only=False).astype(np.int64)
    out: np.ndarray = table[codes]
    return out


def kernel_type(names: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """HTA's `get_kernel_type` for every name: COMMUNICATION, MEMORY, COMPUTATION or OTHER (int8)."""
    return _per_value(names, _classify_strings)


def _classify_strings(values: pa.Array) -> np.ndarray:
    comm = pc.match_substring_regex(values, COMM_RE).to_numpy(zero_copy_only=False)
    mem = pc.match_substring_regex(values, MEMORY_RE).to_numpy(zero_copy_only=False)
    not_comp = pc.match_substring_regex(values, NOT_COMPUTE_RE).to_numpy(zero_copy_only=False)
    out = np.full(len(values), OTHER, dtype=np.int8)
    out[~not_comp] = COMPUTATION
    out[mem] = MEMORY
    out[comm] = COMMUNICATION
    return out


def _is_in(col: pa.Array | pa.ChunkedArray, values: tuple[str, ...]) -> np.ndarray:
    return _per_value(col, lambda v: pc.is_in(v, value_set=pa.array(values)).to_numpy(zero_copy_only=False))


def _int_column(events: pa.Table, name: str, fill: int) -> np.ndarray:
    col = events.column(name)
    out: np.ndarray = pc.fill_null(col, fill).to_numpy().astype(np.int64, copy=False)
    return out


def _prepared(
    events: pa.Table, base_time_ns: dict[int, int] | None
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int
]:
    """Per-row numpy columns in HTA's view: µs-rounded times, args.stream, correlation, classes."""
    dur_valid = pc.is_valid(events.column("dur_ns")).to_numpy(zero_copy_only=False)
    if not dur_valid.all():  # HTA drops events without a duration
        events = events.filter(pa.array(dur_valid))
    rank = _int_column(events, "rank", -1)
    ts = _int_column(events, "ts_ns", 0)
    dur = _int_column(events, "dur_ns", 0)
    names = events.column("name")
    stream = _int_column(events, "stream", -1)
    stream_null = pc.is_null(events.column("stream")).to_numpy(zero_copy_only=False)
    sync_fallback = stream_null & _is_in(names, _CUDA_SYNC_NAMES)
    if sync_fallback.any():
        stream = np.where(sync_fallback, _int_column(events, "tid", -1), stream)
    stream = np.where(_is_in(events.column("kind"), _NO_STREAM_KINDS), -1, stream)
    corr = _int_column(events, "correlation", -1)
    is_step = _per_value(
        names, lambda v: pc.match_substring(v, "ProfilerStep").to_numpy(zero_copy_only=False)
    )
    is_dev_sync = _is_in(names, _DEVICE_SYNC_NAMES)
    ktype = kernel_type(names)
    step_names = (
        pc.count_distinct(pc.filter(names, pa.array(is_step)).cast(pa.string())).as_py()
        if is_step.any()
        else 0
    )

    # HTA's round_down_time_stamps, applied per trace file (rank) whose timestamps have sub-µs digits:
    # ceil(ts) and floor(ts + dur) on float µs relative to baseTimeNanoseconds, in float64 as HTA does.
    ranks, inv = np.unique(rank, return_inverse=True)
    base = np.array([int((base_time_ns or {}).get(int(r), 0) or 0) for r in ranks], dtype=np.int64)[inv]
    rel = ts - base
    fractional = np.bincount(inv, weights=(rel % 1000 != 0), minlength=ranks.size) > 0
    start, end = ts.copy(), ts + dur
    rnd = fractional[inv]
    if rnd.any():
        # Nearest float64 to the µs value, as json.loads gives HTA (rel / 1000.0 would round twice).
        q, r = np.divmod(rel[rnd], 1000)
        ts_us = q.astype(np.float64) + r / 1000.0
        end_us = ts_us + dur[rnd] / 1000.0
        start[rnd] = np.ceil(ts_us).astype(np.int64) * 1000 + base[rnd]
        end[rnd] = np.floor(end_us).astype(np.int64) * 1000 + base[rnd]
    return rank, start, end, stream, corr, is_step, is_dev_sync, ktype, step_names


def _window_mask(
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    stream: np.ndarray,
    corr: np.ndarray,
    is_step: np.ndarray,
    is_dev_sync: np.ndarray,
    step_names: int,
    include_last_profiler_step: bool,
) -> np.ndarray:
    """Rows HTA keeps after `Trace._filter_irrelevant_gpu_kernels` (drop the last profiler step)."""
    if step_names < 2:  # HTA skips the filter with zero or one distinct ProfilerStep name
        return np.ones(rank.shape, dtype=bool)
    is_gpu = ((stream >= 0) & (corr >= 0)) | is_dev_sync  # HTA's GPUKernelFilter
    cpu = ~is_gpu
    ranks, inv = np.unique(rank, return_inverse=True)
    steps = cpu & is_step
    # Per rank: the last ProfilerStep's start (or, keeping it, the latest step end). A rank without a
    # step compares against NaN in HTA, so nothing of it survives; int64 min does the same here.
    limit = np.full(ranks.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(limit, inv[steps], (end if include_last_profiler_step else start)[steps])
    lim = limit[inv]
    before = (start <= lim) if include_last_profiler_step else (start < lim)
    kept_cpu = cpu & before
    # GPU rows survive when a kept CPU row of the same rank has their correlation id (inner merge).
    key = (inv.astype(np.int64) << 40) + corr
    kept_gpu = is_gpu & np.isin(key, key[kept_cpu])
    keep: np.ndarray = kept_cpu | kept_gpu
    return keep


def _hta_merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's `merge_kernel_intervals`: sort by start, a new group starts beyond every earlier end."""
    if start.size == 0:
        return start, end
    order = np.lexsort((end, start))
    s, e = start[order], end[order]
    prev_max = np.maximum.accumulate(e)[:-1]
    new = np.concatenate([[True], s[1:] > prev_max])
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    g_end = np.full(first.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(g_end, group, e)
    return s[first], g_end


def _overlap(comm: tuple[np.ndarray, np.ndarray], comp: tuple[np.ndarray, np.ndarray]) -> int:
    """HTA's sweep: time during which the running status (comm ±1, comp ±2) equals 3."""
    times = np.concatenate([comm[0], comm[1], comp[0], comp[1]])
    if times.size == 0:
        return 0
    status = np.concatenate(
        [
            np.ones(comm[0].size, np.int64),
            -np.ones(comm[1].size, np.int64),
            np.full(comp[0].size, 2, np.int64),
            np.full(comp[1].size, -2, np.int64),
        ]
    )
    order = np.lexsort((status, times))
    times, running = times[order], np.cumsum(status[order])
    both = running[:-1] == 3
    return int((times[1:] - times[:-1])[both].sum())


def _rank_gpu_rows(
    events: pa.Table, base_time_ns: dict[int, int] | None, include_last_profiler_step: bool
) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]]:
    """Per rank: (rank, start, end, kernel type) of the GPU rows HTA's analyses see."""
    rank, start, end, stream, corr, is_step, is_dev_sync, ktype, step_names = _prepared(events, base_time_ns)
    keep = _window_mask(
        rank, start, end, stream, corr, is_step, is_dev_sync, step_names, include_last_profiler_step
    )
    gpu = keep & (stream != -1)
    ranks = np.unique(rank)
    idx = np.flatnonzero(gpu)
    idx = idx[np.argsort(rank[idx], kind="stable")]
    bounds = np.searchsorted(rank[idx], ranks, side="left"), np.searchsorted(rank[idx], ranks, side="right")
    out = []
    for r, lo, hi in zip(ranks, *bounds):
        sl = idx[lo:hi]
        out.append((int(r), start[sl], end[sl], ktype[sl]))
    return ranks, out


def _pctg(part: int | None, whole: int) -> float | None:
    """HTA's rounded percentage; null where HTA cannot analyse (no window, or a negative part: µs rounding of
    sub-µs kernels can make HTA's non-compute time negative)."""
    if whole == 0 or part is None or part < 0:
        return None
    return float(np.round(100.0 * part / whole, 2))


def _nonneg(v: int) -> int | None:
    return None if v < 0 else v


def temporal_breakdown(
    events: pa.Table,
    base_time_ns: dict[int, int] | None = None,
    include_last_profiler_step: bool = False,
) -> pa.Table:
    """HTA 0.5 `get_temporal_breakdown`: one row per rank (schema `TEMPORAL_BREAKDOWN`).

    kernel_time = last GPU event end - first GPU event start (HTA's window); idle = kernel_time minus the
    union of all GPU events; compute = union of computation kernels; non_compute = the rest. Percentages
    are of kernel_time, rounded to 2 decimals as HTA does. A rank without GPU events in the window (HTA
    raises IndexError there) gets nulls. `base_time_ns` maps rank -> the trace's baseTimeNanoseconds,
    needed only to round sub-µs timestamps exactly where HTA does (metadata table `base_time_ns`).
    """
    _, per_rank = _rank_gpu_rows(events, base_time_ns, include_last_profiler_step)
    rows: dict[str, list[Any]] = {f.name: [] for f in TEMPORAL_BREAKDOWN}
    for r, s, e, kt in per_rank:
        rows["rank"].append(r)
        if s.size == 0:
            for key in list(rows)[1:]:
                rows[key].append(None)
            continue
        ms, me = _hta_merge(s, e)
        kernel_time = int(me[-1] - ms[0])
        idle = kernel_time - int((me - ms).sum())
        cs, ce = _hta_merge(s[kt == COMPUTATION], e[kt == COMPUTATION])
        compute = int((ce - cs).sum())
        non_compute = kernel_time - compute - idle
        rows["idle_time_ns"].append(_nonneg(idle))
        rows["compute_time_ns"].append(_nonneg(compute))
        rows["non_compute_time_ns"].append(_nonneg(non_compute))
        rows["kernel_time_ns"].append(kernel_time)
        rows["idle_time_pctg"].append(_pctg(idle, kernel_time))
        rows["compute_time_pctg"].append(_pctg(compute, kernel_time))
        rows["non_compute_time_pctg"].append(_pctg(non_compute, kernel_time))
    return pa.Table.from_pydict(rows, schema=TEMPORAL_BREAKDOWN)


def comm_comp_overlap(
    events: pa.Table,
    base_time_ns: dict[int, int] | None = None,
    include_last_profiler_step: bool = False,
) -> pa.Table:
    """HTA 0.5 `get_comm_comp_overlap`: one row per rank (schema `COMM_COMP_OVERLAP`).

    comp_comm_overlap_pctg = 100 * |merged comm ∩ merged compute| / |merged comm|, rounded to 2 decimals;
    null where a rank has no communication kernels (HTA reports NaN). Same window as `temporal_breakdown`.
    """
    _, per_rank = _rank_gpu_rows(events, base_time_ns, include_last_profiler_step)
    rows: dict[str, list[Any]] = {f.name: [] for f in COMM_COMP_OVERLAP}
    for r, s, e, kt in per_rank:
        comm = _hta_merge(s[kt == COMMUNICATION], e[kt == COMMUNICATION])
        comp = _hta_merge(s[kt == COMPUTATION], e[kt == COMPUTATION])
        comm_time = int((comm[1] - comm[0]).sum())
        overlap = _overlap(comm, comp)
        rows["rank"].append(r)
        rows["comm_time_ns"].append(comm_time)
        rows["overlap_time_ns"].append(overlap)
        rows["comp_comm_overlap_pctg"].append(_pctg(overlap, comm_time))
    return pa.Table.from_pydict(rows, schema=COMM_COMP_OVERLAP)


def base_times(metadata: pa.Table | None) -> dict[int, int]:
    """rank -> baseTimeNanoseconds from a `schema.METADATA` table (absent or null -> 0)."""
    if metadata is None or metadata.num_rows == 0:
        return {}
    ranks = metadata.column("rank").to_pylist()
    bases = metadata.column("base_time_ns").to_pylist()
    return {int(r): int(b or 0) for r, b in zip(ranks, bases) if r is not None}


def summary_rows(
    events: pa.Table, metadata: pa.Table | None = None, include_last_profiler_step: bool = False
) -> list[dict[str, Any]]:
    """Per-rank dicts for summary.json's `compat` block (times in ms, HTA's percentages), sorted by rank.

    Joins `temporal_breakdown` and `comm_comp_overlap`; unknown values are None.
    """
    bases = base_times(metadata)
    tb = temporal_breakdown(events, bases, include_last_profiler_step).to_pylist()
    ov = {r["rank"]: r for r in comm_comp_overlap(events, bases, include_last_profiler_step).to_pylist()}

    def ms(v: int | None) -> float | None:
        return None if v is None else v / 1e6

    return [
        {
            "rank": r["rank"],
            "kernel_time_ms": ms(r["kernel_time_ns"]),
            "idle_time_ms": ms(r["idle_time_ns"]),
            "compute_time_ms": ms(r["compute_time_ns"]),
            "non_compute_time_ms": ms(r["non_compute_time_ns"]),
            "idle_time_pctg": r["idle_time_pctg"],
            "compute_time_pctg": r["compute_time_pctg"],
            "non_compute_time_pctg": r["non_compute_time_pctg"],
            "comp_comm_overlap_pctg": ov[r["rank"]]["comp_comm_overlap_pctg"],
        }
        for r in tb
    ]
