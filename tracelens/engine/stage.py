"""The per-rank stage: one rank's events -> the small results the cross-rank analyses need.

Everything here looks at ONE rank's events at a time, so a run of any size needs at most one rank's events
in memory per process. The results of a rank (`RankStage`):

- `breakdown`: its rows of the per-step breakdown (`tracelens.analyze.rank.breakdown.BREAKDOWN`);
- `sets`: its canonical compute / communication / memory interval sets (`RankSets`);
- `spans`: its module annotation spans (`tracelens.analyze.pipeline.composition.SPANS`);
- `idle`: its rows of the GPU idle breakdown (`tracelens.analyze.rank.idle.IDLE`; GPU ranks only);
- `nodes`, `syncs`: its device work and blocking CPU calls, the critical path's inputs
  (`tracelens.analyze.critical.critical_nodes`);
- `xevents`: the few event rows the cross-rank analyses read (collectives and their CPU records, step and
  module annotations, point-to-point ops; every row on ranks analysed on the CPU timeline), in the events
  schema and in trace order (see `cross_rank_mask`).

They are written next to the rank's ingest cache entry (`<entry>/stage-<STAGE_VERSION>/`: the cross-rank events
in one file, the others in one stage file; `store.stages`), so that reducing the run reads two small files a rank
instead of the events.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracelens.analyze.core.dictcol import columns, sharing
from tracelens.analyze.core.intset import member
from tracelens.analyze.critical.critical_nodes import rank_nodes, sync_calls
from tracelens.analyze.rank.breakdown import breakdown, class_sets, step_windows
from tracelens.analyze.rank.classify import COMM, COMPUTE, DEVICE_KINDS, classify, is_step_name
from tracelens.schema import BREAKDOWN, RankSets
from tracelens.store.cache import read_small
from tracelens.store.pages import trim_heap
from tracelens.store.stages import OPS, RankStage, stored_nodes, write_stage

#: Events from which the stage hands freed memory back between its analyzers (`_rank_stage`): one large
#: trace (a rank of a 1,024-rank run has ~20,000 events and keeps it for its next rank).
TRIM_ROWS = 1_000_000
_ANNOTATION_KINDS = ("user_annotation", "gpu_user_annotation")
# Names the cross-rank analyses look for beyond collectives (pipeline: SendRecv kernels / c10d send-recv).
_CROSS_NAMES = re.compile(r"^record_param_comms$|send|recv|SendRecv", re.IGNORECASE)


def _is_cross_name(v: str) -> bool:
    return _CROSS_NAMES.search(v) is not None


def cross_rank_mask(events: pa.Table, classes: np.ndarray, path: str | None) -> np.ndarray:
    """Rows of one rank's events that the cross-rank analyses (collectives, clock offsets, stragglers,
    layout inference, pipeline) read once the per-rank results are given to them.

    CPU-timeline ranks keep every row (their compute is defined by their cpu ops; such traces are small).
    GPU ranks keep communication-class rows, rows with collective fields, `record_param_comms` and
    point-to-point named ops, step and module annotations, their first device event (so that the rank
    is still recognised as a GPU rank by `classify.gpu_ranks`) and the few compute events that set the
    pipeline's per-step marks (`_pipeline_marks`). The other compute kernels, runtime calls and cpu ops,
    the bulk of a trace, are dropped: their contribution is in `sets`, `breakdown` and `spans`.
    """
    n = events.num_rows
    if n == 0:
        return np.zeros(0, bool)
    if path != "gpu":
        return np.ones(n, bool)
    cols = columns(events)
    keep = classes == COMM
    keep |= cols.kinds(*_ANNOTATION_KINDS)
    keep |= cols.flag("name", _is_cross_name)
    for col in ("collective", "pg_ranks", "pg_name", "src_rank", "dst_rank"):
        keep |= cols.valid(col)
    dev = np.flatnonzero(cols.kinds(*DEVICE_KINDS))
    if dev.size:
        keep[dev[0]] = True
    keep[_pipeline_marks(events, classes)] = True
    keep |= _comm_launch_rows(events, classes)
    keep |= cols.flag("name", is_step_name)
    out: np.ndarray = keep
    return out


def _comm_launch_rows(events: pa.Table, classes: np.ndarray) -> np.ndarray:
    """Communication cpu ops and the launch calls of communication kernels: collectives.collectives_from_events
    reads a collective's kind and size from the CPU ops around its launch (launch_link) when the kernel
    carries no collective args (PyTorch < ~2.3)."""
    from tracelens.ingest.comm_families import is_comm_cpu_op

    cols = columns(events)
    keep = cols.flag("name", is_comm_cpu_op) & cols.kinds("cpu_op", "user_annotation")
    corr = cols.int64("correlation", -1)
    comm_corr = corr[(classes == COMM) & (corr >= 0)]
    if comm_corr.size:
        keep |= cols.kinds("cuda_runtime", "cuda_driver") & member(corr, comm_corr)
    out: np.ndarray = keep
    return out


def _first_per_group(group: np.ndarray, key: np.ndarray, rows: np.ndarray, largest: bool) -> np.ndarray:
    """Per distinct `group` (ascending): the row of `rows` (ascending) with the smallest (`largest`: the
    largest) `key`, the first row among ties (pandas' groupby idxmin / idxmax)."""
    if largest:  # sorted by key ascending, rows descending among ties: the last of each group
        o = np.lexsort((-rows, key, group))
        g = group[o]
        last = np.ones(o.size, bool)
        last[:-1] = g[1:] != g[:-1]
        out: np.ndarray = rows[o[last]]
        return out
    o = np.lexsort((rows, key, group))
    g = group[o]
    first = np.ones(o.size, bool)
    first[1:] = g[1:] != g[:-1]
    out = rows[o[first]]
    return out


def _per_group(group: np.ndarray, values: np.ndarray, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(distinct groups ascending, max or min of `values` in each)."""
    keys, inv = np.unique(group, return_inverse=True)
    if largest:
        acc = np.full(keys.size, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(acc, inv, values)
    else:
        acc = np.full(keys.size, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(acc, inv, values)
    return keys, acc


def _lookup(keys: np.ndarray, vals: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found?, value) of each query in a sorted key -> value map."""
    if keys.size == 0:
        return np.zeros(q.size, bool), np.zeros(q.size, np.int64)
    pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
    return keys[pos] == q, vals[pos]


def _pipeline_marks(events: pa.Table, classes: np.ndarray) -> np.ndarray:
    """Row numbers of the compute events that decide the pipeline analysis' per-step marks, per step:
    the earliest-starting and the latest-ending compute event, and the latest-ending one starting before the
    first collective after the step's last point-to-point op (`pipeline._fallback_last`). Those marks are
    minima and maxima, so these few rows give exactly what all compute rows give.

    Compared as pandas' joins compare in `_fallback_last`: in float64 once a row's step has no value."""
    from tracelens.analyze.pipeline.pipeline import _p2p_mask

    cols = columns(events)
    ts = cols.int64("ts_ns")
    end = cols.end_signed()
    step = cols.int64("step", -1)
    valid = step >= 0
    comp = np.flatnonzero((classes == COMPUTE) & valid)
    if comp.size == 0:
        return comp
    p2p = _p2p_mask(events) & (classes == COMM)
    coll = (classes == COMM) & ~p2p
    c_step, c_ts, c_end = step[comp], ts[comp], end[comp]
    rows = [
        _first_per_group(c_step, c_ts, comp, largest=False),
        _first_per_group(c_step, c_end, comp, largest=True),
    ]
    pi = np.flatnonzero(p2p & valid)
    if pi.size:
        lp_step, lp = _per_group(step[pi], ts[pi], largest=True)  # last p2p start per step
        ci = np.flatnonzero(coll & valid)
        has, lpv = _lookup(lp_step, lp, step[ci])
        after = ts[ci] >= lpv if has.all() else has & (ts[ci].astype(np.float64) >= lpv.astype(np.float64))
        fc_step, fc = _per_group(step[ci[after]], ts[ci[after]], largest=False)  # first collective after
        has, fcv = _lookup(fc_step, fc, c_step)
        before = c_ts < fcv if has.all() else ~has | (c_ts.astype(np.float64) < fcv.astype(np.float64))
        if before.any():
            rows.append(_first_per_group(c_step[before], c_end[before], comp[before], largest=True))
    return np.unique(np.concatenate(rows))


def rank_stage(events: pa.Table, rank: int) -> RankStage:
    """Compute one rank's stage from its events (all rows must belong to `rank`).

    The analyzers run inside one `dictcol.sharing` block: each column and dictionary lookup is decoded once
    for all of them."""
    if events.num_rows == 0:
        empty = BREAKDOWN.empty_table()
        idle, idle_err = _idle(events, empty, None)
        return RankStage(
            rank, empty, None, None, events, False, None, None, op_totals(events), idle, idle_err
        )
    with sharing(events):
        return _rank_stage(events, rank)


def _rank_stage(events: pa.Table, rank: int) -> RankStage:
    from tracelens.analyze.pipeline.composition import module_spans

    # one large trace: between analyzers, the shared decoded arrays are dropped and the memory freed is
    # handed back, before the next one allocates its own (its arrays are tens of MB; a rank of a large run
    # is far below this and keeps both for the next analyzer and rank)
    if events.num_rows >= TRIM_ROWS:
        cols = columns(events)

        def settle() -> None:
            cols.drop_rows()
            trim_heap()

    else:

        def settle() -> None:
            pass

    totals = op_totals(events)  # (first: its sort's temporaries come before the other analyzers' arrays)
    time_range = _time_range(events)
    settle()
    classes = classify(events)
    settle()
    sets = class_sets(events, classes)
    rs = sets.get(rank)
    settle()
    windows = step_windows(events)
    has_steps = windows.num_rows > 0
    settle()
    bd = breakdown(events, sets=sets, windows=windows if has_steps else None)
    spans, err = None, None
    try:
        spans = module_spans(events, None, sets=sets)
    except Exception as e:  # noqa: BLE001 (the analysis turns it into a warning, as for one table)
        err = f"{type(e).__name__}: {e}"
    settle()
    idle, idle_err = _idle(events, bd, rs)
    settle()
    mask = cross_rank_mask(events, classes, rs.path if rs is not None else None)
    xev = events.filter(pa.array(mask))
    del mask
    settle()
    nodes, stepped = rank_nodes(events, spans)
    settle()
    return RankStage(
        rank,
        bd,
        rs,
        spans,
        xev,
        has_steps,
        err,
        time_range,
        totals,
        idle,
        idle_err,
        stored_nodes(nodes),
        sync_calls(events),
        stepped,
    )


def _idle(events: pa.Table, bd: pa.Table, rs: RankSets | None) -> tuple[pa.Table, str | None]:
    """(IDLE rows of a GPU rank, None) or (empty, why idle_breakdown_table failed); empty for other ranks."""
    from tracelens.analyze.rank.idle import idle_breakdown_table
    from tracelens.schema import IDLE

    if rs is None or rs.path != "gpu":
        return IDLE.empty_table(), None
    try:
        return idle_breakdown_table(events, bd), None
    except Exception as e:  # noqa: BLE001 (Analysis.idle turns it into a warning, as over all ranks)
        return IDLE.empty_table(), f"{type(e).__name__}: {e}"


def op_totals(events: pa.Table) -> pa.Table:
    """OPS rows of one rank: per kernel / cpu op name, calls and summed duration (null duration = 0),
    groups in the order of their first row (the order Arrow's single-threaded hash group-by gives them).

    On the shared dictionary codes (`dictcol.columns`): one integer key a row and one sort, no string
    columns built for a hash group-by."""
    if events.num_rows == 0:
        return OPS.empty_table()
    cols = columns(events)
    sel = np.flatnonzero(cols.kinds("kernel", "cpu_op"))
    kinds, kind_idx = cols.codes("kind")
    names, name_idx = cols.codes("name")
    # a value's canonical id (a dictionary may repeat a value; null -> its own id), then one key a row
    kind_id = cols.canonical("kind")[kind_idx[sel]]
    name_id = cols.canonical("name")[name_idx[sel]]
    key = kind_id * np.int64(len(names) + 1) + name_id
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]]) if sk.size else np.zeros(0, np.int64)
    first = order[starts]  # (stable: each group's first row)
    calls = np.diff(np.r_[starts, sk.size])
    dur = cols.int64("dur_ns", 0)[sel][order]
    total = np.add.reduceat(dur, starts) if sk.size else np.zeros(0, np.int64)
    by_first = np.argsort(first, kind="stable")
    rows = sel[first[by_first]]
    kind_of = np.array([*kinds, None], dtype=object)
    name_of = np.array([*names, None], dtype=object)
    return pa.table(
        {
            "kind": pa.array(kind_of[kind_idx[rows]], pa.string()),
            "name": pa.array(name_of[name_idx[rows]], pa.string()),
            "calls": pa.array(calls[by_first], pa.int64()),
            "dur_ns": pa.array(total[by_first], pa.int64()),
        },
        schema=OPS,
    )


def _time_range(events: pa.Table) -> tuple[int, int] | None:
    if events.num_rows == 0:
        return None
    cols = columns(events)
    return int(cols.int64("ts_ns").min()), int(cols.end().max())


def compute_and_write(events_file: str, rank: int) -> int:
    """Read one rank's cached events, compute its stage and write it; returns the rank (a worker task)."""
    events = read_small(Path(events_file))
    st = rank_stage(events, rank)
    del events
    write_stage(st, Path(events_file))
    pa.default_memory_pool().release_unused()
    return rank


__all__ = [
    "compute_and_write",
    "cross_rank_mask",
    "op_totals",
    "rank_stage",
]
