"""Cross-rank reduction: the per-rank stages of a run concatenated into what one all-ranks pass gives."""

from __future__ import annotations

import pyarrow as pa

from tracelens import schema
from tracelens.analyze.breakdown import BREAKDOWN
from tracelens.analyze.composition import SPANS
from tracelens.analyze.critical_nodes import SYNCS
from tracelens.analyze.idle import IDLE
from tracelens.store import pages
from tracelens.store.cache import concat
from tracelens.store.stages import OPS, STORED_NODES, RankStage, Staged


def reduce_stages(stages: list[RankStage]) -> Staged:
    """Concatenate per-rank stages (in rank order) into what one all-ranks computation would give.

    One rule is not a plain concatenation: a rank without `ProfilerStep` gets a whole-trace window from
    the breakdown, but only when NO rank has steps (as `breakdown()` over all ranks decides); the idle rows
    (computed on those windows) follow the breakdown rows."""
    stages = sorted(stages, key=lambda s: s.rank)
    # the largest parts first, each rank's memory-mapped stage file's pages given back once copied into the
    # concatenation (store.pages; a stage computed in memory is left alone): at 1,024 ranks the cross-rank
    # events are ~0.4 GB of such pages beside their ~0.4 GB copy
    xevents = _concat_released([s.xevents for s in stages], schema.EVENTS)
    nodes = _concat_released([s.nodes for s in stages if s.nodes is not None], STORED_NODES)
    any_steps = any(s.has_steps for s in stages)
    kept = [s for s in stages if s.has_steps or not any_steps]
    bds = [s.breakdown for s in kept]
    idle_errs = [s.idle_error for s in kept if s.idle_error]
    errs = [f"rank {s.rank}: {s.spans_error}" for s in stages if s.spans_error]
    spans = None if errs else concat([s.spans for s in stages if s.spans is not None], SPANS)
    tr = [(s.rank, *s.time_range) for s in stages if s.time_range is not None]
    time_ranges = pa.table(
        {
            "rank": pa.array([t[0] for t in tr], pa.int32()),
            "ts_ns": pa.array([t[1] for t in tr], pa.int64()),
            "dur_ns": pa.array([t[2] - t[1] for t in tr], pa.int64()),
        }
    )
    return Staged(
        sets={s.rank: s.sets for s in stages if s.sets is not None},
        breakdown=concat(bds, BREAKDOWN),
        spans=spans,
        xevents=xevents,
        spans_error=errs[0] if errs else None,
        time_ranges=time_ranges,
        ops=concat(
            [
                s.ops.append_column("rank", pa.array([s.rank] * s.ops.num_rows, pa.int32()))
                for s in stages
                if s.ops is not None
            ],
            OPS.append(pa.field("rank", pa.int32())),
        ),
        idle=concat([s.idle for s in kept if s.idle is not None], IDLE),
        idle_error=idle_errs[0] if idle_errs else None,
        nodes=nodes,
        syncs=concat([s.syncs for s in stages if s.syncs is not None], SYNCS),
        nodes_stepped=tuple(s.rank for s in stages if s.nodes_stepped),
    )


def _concat_released(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    out = concat(tables, sch)
    for t in tables:
        if t is not out:
            pages.release(t)
    return out


__all__ = ["Staged", "reduce_stages"]
