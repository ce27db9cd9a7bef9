"""What the cache keeps of the analyzers' own results, converted to and from their types: the tables the run
memo derives from the cross-rank events (`DERIVED`), the critical path's dependency graph and the cross-rank
result. `store/` persists tables, arrays and JSON and knows no analyzer; this module is where the two meet.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from tracelens.store import results, runs
from tracelens.store.stages import Staged, by_rank_chunks

if TYPE_CHECKING:
    from tracelens.analyze.comm.stragglers import CrossRankResult
    from tracelens.analyze.critical.critical_path import Graph
    from tracelens.analyze.critical.critical_replay import ReplayPlan

#: The tables derived from the cross-rank events that the memo keeps (`derive`), in the order it writes them.
DERIVED = runs.DERIVED


def derive(name: str, xevents: pa.Table) -> pa.Table:
    """One derived table (`DERIVED`) of cross-rank events whose rows of each rank come from that rank's events
    alone: `collectives_from_events` (`cross_collectives`), the launch links' verdict per row
    (`classify.comm_launched`, schema `runs.XFLAGS`) or `layout.groups.pg_rows` (`grid_rows`). Raises what
    those raise on odd events."""
    if name == "collectives":
        from tracelens.analyze.comm.collectives import collectives_from_events

        return collectives_from_events(xevents)
    if name == "pg":
        from tracelens.analyze.layout.groups import pg_rows

        return pg_rows(xevents)
    if name == "xflags":
        from tracelens.analyze.rank.classify import comm_launched

        return pa.table({"comm_launched": pa.array(comm_launched(xevents), pa.bool_())}, schema=runs.XFLAGS)
    raise KeyError(name)


def derive_or_none(name: str, xevents: pa.Table) -> pa.Table | None:
    """`derive` over slices of whole ranks (`stages.by_rank_chunks`, at the memory of one slice's work), or
    None when that fails on odd events: then the memo goes without it and the analysis computes it itself,
    where the failure is reported as it would be without a memo."""
    try:
        return by_rank_chunks(lambda part: derive(name, part), xevents)
    except Exception:
        return None


def cross_collectives(st: Staged) -> pa.Table:
    """`collectives_from_events(st.xevents)` (schema.COLLECTIVES): the run memo's (computed when it was
    written), else computed on the first call and kept in `st`. Raises what `collectives_from_events` raises."""
    if st.collectives is None:
        from tracelens.analyze.comm.collectives import collectives_from_events

        st.collectives = by_rank_chunks(collectives_from_events, st.xevents)
    return st.collectives


def grid_rows(st: Staged) -> pa.Table:
    """`layout.groups.pg_rows(st.xevents)`: what the grid inference reads of the cross-rank events (the run
    memo's, else computed on the first call and kept in `st`)."""
    if st.pg is None:
        from tracelens.analyze.layout.groups import pg_rows

        st.pg = by_rank_chunks(pg_rows, st.xevents)
    return st.pg


def apply_flags(st: Staged) -> None:
    """Make the memo's launch flags of the cross-rank events (`xflags`) what `classify.comm_launched` gives
    for them from now on, instead of computing them again; nothing when the memo has none."""
    if st.xflags is not None:
        from tracelens.analyze.rank.classify import keep_comm_launched

        keep_comm_launched(st.xevents, st.xflags)
        st.xflags = None


# ------------------------------------------------------------------------------- the critical path's graph
def read_graph(memo: Path, key: str) -> Graph | None:
    """The graph `write_graph` kept under `key` in the run memo `memo`, memory-mapped, its replay plan kept with
    it when the file has one (`critical_path.plan_of` takes it); None when there is none or it cannot be read
    (damaged, cut short, of another layout)."""
    from tracelens.analyze.core.dictcol import per_object
    from tracelens.analyze.critical.graph_state import graph_from_state, is_plan_array, plan_from_state

    # (the plan's arrays in memory of their own: the what-if drops the plan, and its memory is handed back
    # then, where touched pages of the mapping would stay resident as long as the graph)
    got = runs.read_graph_arrays(memo, key, own=is_plan_array)
    if got is None:
        return None
    try:
        g = graph_from_state(*got)
        plan = plan_from_state(got[0])
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if plan is not None:
        per_object(g)["replay_plan"] = plan
    return g


def write_graph(memo: Path, key: str, g: Graph, plan: ReplayPlan | None = None) -> None:
    """Keep `g` (and its replay plan `plan`, when given) in the run memo `memo` under `key`, in place of any
    graph kept before. OSError when the cache cannot take it."""
    from tracelens.analyze.critical.graph_state import graph_state

    runs.write_graph_state(memo, key, *graph_state(g, plan))


def write_graph_later(memo: Path, key: str, g: Graph, plan: ReplayPlan | None = None) -> Future[None]:
    """`write_graph` in a thread of its own, started here: the future is done when the file is (its
    exception: what went wrong other than an OSError). The graph's state is taken now (`graph_state`: the
    arrays themselves, not copies), so later changes of what `g` holds by reference (its plan dropped, its
    per-object memo) do not reach the file; nothing the analysis does changes an array in place. The writes
    release the GIL, so the file is written while the caller replays the graph. A cache that cannot take the
    graph is no error (OSError: the future's result is None): it is built again next time."""
    from tracelens.analyze.critical.graph_state import graph_state

    return runs.write_graph_state_later(memo, key, *graph_state(g, plan))


# ------------------------------------------------------------------------------- the cross-rank result
def read_cross(memo: Path, key: str) -> CrossRankResult | None:
    """The cross-rank result `write_cross` kept under `key` in the run memo `memo` (its tables memory-mapped),
    or None when there is none or it cannot be read."""
    from tracelens.analyze.comm.clock import ClockResult
    from tracelens.analyze.comm.stragglers import CrossRankResult

    got = results.read_result(memo, key, CROSS_TABLES)
    if got is None:
        return None
    tables, rest = got
    try:
        clock = rest.pop("clock")
        return CrossRankResult(**tables, **rest, clock=None if clock is None else ClockResult(**clock))
    except (KeyError, TypeError):
        return None


#: The tables of a CrossRankResult, each in a file of its own.
CROSS_TABLES = ("collectives", "exposed_split", "arrival_lag")


def _parts(res: CrossRankResult) -> tuple[dict[str, pa.Table], dict[str, object]]:
    import dataclasses

    rest: dict[str, object] = {
        f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name not in CROSS_TABLES
    }
    if res.clock is not None:
        rest["clock"] = {f.name: getattr(res.clock, f.name) for f in dataclasses.fields(res.clock)}
    return {name: getattr(res, name) for name in CROSS_TABLES}, rest


def write_cross(memo: Path, key: str, res: CrossRankResult) -> None:
    """Keep `res` in the run memo `memo` under `key`, in place of any kept before. OSError when the cache
    cannot take it; results.NotExact when a value of it would not read back the same (then nothing is kept)."""
    results.write_result(memo, key, *_parts(res))


def write_cross_later(memo: Path, key: str, res: CrossRankResult) -> Future[None]:
    """`write_cross` with its files written in a thread of its own: the future is done when they are. What
    `res` holds beside its tables is taken now, as text, so that later changes of its findings (the what-if
    sets their `saving_ms`) do not reach the files; its Arrow tables do not change. A cache that cannot take
    them, or a result that JSON would change, is no error (it is computed again next time)."""
    return results.write_result_later(memo, key, *_parts(res))


__all__ = [
    "CROSS_TABLES",
    "DERIVED",
    "apply_flags",
    "cross_collectives",
    "derive",
    "derive_or_none",
    "grid_rows",
    "read_cross",
    "read_graph",
    "write_cross",
    "write_cross_later",
    "write_graph",
    "write_graph_later",
]
