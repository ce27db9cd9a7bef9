"""The per-rank stage: one rank's events -> the small results the cross-rank analyses need.

Everything here looks at ONE rank's events at a time, so a run of any size needs at most one rank's events
in memory per process. The results of a rank (`RankStage`):

- `breakdown`: its rows of the per-step breakdown (`tracelens.analyze.breakdown.BREAKDOWN`);
- `sets`: its canonical compute / communication / memory interval sets (`RankSets`);
- `spans`: its module annotation spans (`tracelens.analyze.composition.SPANS`);
- `idle`: its rows of the GPU idle breakdown (`tracelens.analyze.idle.IDLE`; GPU ranks only);
- `xevents`: the few event rows the cross-rank analyses read (collectives and their CPU records, step and
  module annotations, point-to-point ops; every row on ranks analysed on the CPU timeline), in the events
  schema and in trace order (see `cross_rank_mask`).

Each is written as an Arrow IPC file next to the rank's ingest cache entry (`<entry>/stage-<STAGE_VERSION>/`), so a
second analysis of the same run reads only these small files.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tracelens.analyze.breakdown import BREAKDOWN, RankSets, breakdown, class_sets, step_windows
from tracelens.analyze.classify import COMM, COMPUTE, DEVICE_KINDS, STEP, _dict_lookup, classify
from tracelens.store.stages import OPS, RankStage, write_stage

_ANNOTATION_KINDS = ("user_annotation", "gpu_user_annotation")
# Names the cross-rank analyses look for beyond collectives (pipeline: SendRecv kernels / c10d send-recv).
_CROSS_NAMES = re.compile(r"^record_param_comms$|send|recv|SendRecv", re.IGNORECASE)


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
    kind = events.column("kind")
    keep = classes == COMM
    keep |= _dict_lookup(kind, lambda v: int(v in _ANNOTATION_KINDS)).astype(bool)
    keep |= _dict_lookup(events.column("name"), lambda v: int(bool(_CROSS_NAMES.search(v)))).astype(bool)
    for col in ("collective", "pg_ranks", "pg_name", "src_rank", "dst_rank"):
        keep |= events.column(col).is_valid().to_numpy(zero_copy_only=False)
    dev = np.flatnonzero(_dict_lookup(kind, lambda v: int(v in DEVICE_KINDS)).astype(bool))
    if dev.size:
        keep[dev[0]] = True
    keep[_pipeline_marks(events, classes)] = True
    keep |= _comm_launch_rows(events, classes)
    keep |= _dict_lookup(events.column("name"), lambda v: int(bool(STEP.match(v)))).astype(bool)
    out: np.ndarray = keep
    return out


def _comm_launch_rows(events: pa.Table, classes: np.ndarray) -> np.ndarray:
    """Communication cpu ops and the launch calls of communication kernels: collectives.collectives_from_events
    reads a collective's kind and size from the CPU ops around its launch (launch_link) when the kernel
    carries no collective args (PyTorch < ~2.3)."""
    from tracelens.ingest.comm_families import is_comm_cpu_op

    keep = _dict_lookup(events.column("name"), lambda v: int(is_comm_cpu_op(v))).astype(bool)
    kind = events.column("kind")
    keep &= _dict_lookup(kind, lambda v: int(v in ("cpu_op", "user_annotation"))).astype(bool)
    corr = events.column("correlation").fill_null(-1).to_numpy(zero_copy_only=False)
    comm_corr = np.unique(corr[(classes == COMM) & (corr >= 0)])
    if comm_corr.size:
        launch = _dict_lookup(kind, lambda v: int(v in ("cuda_runtime", "cuda_driver"))).astype(bool)
        keep |= launch & np.isin(corr, comm_corr)
    out: np.ndarray = keep
    return out


def _pipeline_marks(events: pa.Table, classes: np.ndarray) -> np.ndarray:
    """Row numbers of the compute events that decide the pipeline analysis' per-step marks, per step:
    the earliest-starting and the latest-ending compute event, and the latest-ending one starting before the
    first collective after the step's last point-to-point op (`pipeline._fallback_last`). Those marks are
    minima and maxima, so these few rows give exactly what all compute rows give."""
    from tracelens.analyze.pipeline import _p2p_mask

    ts = events.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    end = ts + events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    step = events.column("step").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    valid = step >= 0
    comp = np.flatnonzero((classes == COMPUTE) & valid)
    if comp.size == 0:
        return comp
    p2p = _p2p_mask(events) & (classes == COMM)
    coll = (classes == COMM) & ~p2p
    df = pd.DataFrame({"i": comp, "step": step[comp], "ts": ts[comp], "end": end[comp]})
    g = df.groupby("step")
    rows = [df.loc[g["ts"].idxmin(), "i"].to_numpy(), df.loc[g["end"].idxmax(), "i"].to_numpy()]
    pi = np.flatnonzero(p2p & valid)
    if pi.size:
        lp = pd.Series(ts[pi]).groupby(step[pi]).max().rename("lp")
        ci = np.flatnonzero(coll & valid)
        c = pd.DataFrame({"step": step[ci], "ts": ts[ci]}).join(lp, on="step")
        fc = c[c["ts"] >= c["lp"]].groupby("step")["ts"].min().rename("fc")
        d = df.join(fc, on="step")
        d = d[d["fc"].isna() | (d["ts"] < d["fc"])]
        if len(d):
            rows.append(d.loc[d.groupby("step")["end"].idxmax(), "i"].to_numpy())
    return np.unique(np.concatenate(rows))


def rank_stage(events: pa.Table, rank: int) -> RankStage:
    """Compute one rank's stage from its events (all rows must belong to `rank`)."""
    from tracelens.analyze.composition import module_spans

    classes = classify(events) if events.num_rows else np.zeros(0, np.int8)
    sets = class_sets(events, classes) if events.num_rows else {}
    rs = sets.get(rank)
    has_steps = step_windows(events).num_rows > 0 if events.num_rows else False
    bd = breakdown(events, sets=sets) if events.num_rows else BREAKDOWN.empty_table()
    spans, err = None, None
    if events.num_rows:
        try:
            spans = module_spans(events, None, sets=sets)
        except Exception as e:  # noqa: BLE001 (the analysis turns it into a warning, as for one table)
            err = f"{type(e).__name__}: {e}"
    idle, idle_err = _idle(events, bd, rs)
    mask = cross_rank_mask(events, classes, rs.path if rs is not None else None)
    xev = events.filter(pa.array(mask)) if events.num_rows else events
    return RankStage(
        rank, bd, rs, spans, xev, has_steps, err, _time_range(events), op_totals(events), idle, idle_err
    )


def _idle(events: pa.Table, bd: pa.Table, rs: RankSets | None) -> tuple[pa.Table, str | None]:
    """(IDLE rows of a GPU rank, None) or (empty, why idle_breakdown failed); empty for other ranks."""
    from tracelens.analyze.idle import IDLE, idle_breakdown, idle_table

    if rs is None or rs.path != "gpu":
        return IDLE.empty_table(), None
    try:
        return idle_table(idle_breakdown(events, bd)), None
    except Exception as e:  # noqa: BLE001 (Analysis.idle turns it into a warning, as over all ranks)
        return IDLE.empty_table(), f"{type(e).__name__}: {e}"


def op_totals(events: pa.Table) -> pa.Table:
    """OPS rows of one rank: per kernel / cpu op name, calls and summed duration (null duration = 0),
    groups in order of first appearance."""
    import pyarrow.compute as pc

    if events.num_rows == 0:
        return OPS.empty_table()
    kind = events.column("kind").cast(pa.string())
    sel = events.filter(pc.is_in(kind, value_set=pa.array(["kernel", "cpu_op"])))
    t = pa.table(
        {
            "kind": sel.column("kind").cast(pa.string()),
            "name": sel.column("name").cast(pa.string()),
            "dur_ns": sel.column("dur_ns").fill_null(0),
        }
    )
    agg = t.group_by(["kind", "name"], use_threads=False).aggregate([("dur_ns", "count"), ("dur_ns", "sum")])
    return pa.table(
        {
            "kind": agg.column("kind"),
            "name": agg.column("name"),
            "calls": agg.column("dur_ns_count").cast(pa.int64()),
            "dur_ns": agg.column("dur_ns_sum").cast(pa.int64()),
        },
        schema=OPS,
    )


def _time_range(events: pa.Table) -> tuple[int, int] | None:
    if events.num_rows == 0:
        return None
    ts = events.column("ts_ns").to_numpy(zero_copy_only=False)
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False), 0)
    return int(ts.min()), int(end.max())


def compute_and_write(events_parquet: str, rank: int) -> int:
    """Read one rank's cached events, compute its stage and write it; returns the rank (a worker task)."""
    with pq.ParquetFile(events_parquet) as f:
        events = f.read()
    st = rank_stage(events, rank)
    del events
    write_stage(st, Path(events_parquet))
    pa.default_memory_pool().release_unused()
    return rank


__all__ = [
    "compute_and_write",
    "cross_rank_mask",
    "op_totals",
    "rank_stage",
]
