"""Cross-rank reduction: the per-rank stages of a run concatenated into what one all-ranks pass gives, either in
memory (`reduce_stages`) or straight into the run memo, one table at a time (`write_memo`)."""

from __future__ import annotations

import contextlib
import os
import uuid
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracelens import schema
from tracelens.engine import kept, tasks
from tracelens.engine.executor import InlineExecutor
from tracelens.schema import BREAKDOWN, IDLE, SPANS, SYNCS
from tracelens.store import pages, runs
from tracelens.store.cache import RankEntry, concat, read_ipc
from tracelens.store.stages import CHUNK_ROWS, OPS, STORED_NODES, RankStage, Staged, rank_bounds, read_stage

_OPS_RANKED = OPS.append(pa.field("rank", pa.int32()))
#: Bytes of columns `concat_released` makes between two releases of its inputs' pages.
RELEASE_BYTES = 48 * 2**20
#: Ranks whose allocator samples one memo task gathers (`tasks.gather_memory`).
MEMORY_SLICE = 128


class _Plan:
    """What the reduction of a run's per-rank stages (in rank order) is made of: per table, the per-rank parts
    to concatenate and their schema, and the few values that are not tables.

    One rule is not a plain concatenation: a rank without `ProfilerStep` gets a whole-trace window from the
    breakdown, but only when NO rank has steps (as `breakdown()` over all ranks decides); the idle rows
    (computed on those windows) follow the breakdown rows."""

    def __init__(self, stages: list[RankStage]):
        stages = sorted(stages, key=lambda s: s.rank)
        any_steps = any(s.has_steps for s in stages)
        kept = [s for s in stages if s.has_steps or not any_steps]
        idle_errs = [s.idle_error for s in kept if s.idle_error]
        errs = [f"rank {s.rank}: {s.spans_error}" for s in stages if s.spans_error]
        self.stages = stages
        self.spans_error = errs[0] if errs else None
        self.idle_error = idle_errs[0] if idle_errs else None
        self.nodes_stepped = tuple(s.rank for s in stages if s.nodes_stepped)
        # (the largest first: each one's inputs, memory-mapped stage files, are given back as it is made)
        self.tables: dict[str, tuple[list[pa.Table], pa.Schema]] = {
            "xevents": ([s.xevents for s in stages], schema.EVENTS),
            "nodes": ([s.nodes for s in stages if s.nodes is not None], STORED_NODES),
            "syncs": ([s.syncs for s in stages if s.syncs is not None], SYNCS),
            "breakdown": ([s.breakdown for s in kept], BREAKDOWN),
            "ops": (
                [
                    s.ops.append_column("rank", pa.array([s.rank] * s.ops.num_rows, pa.int32()))
                    for s in stages
                    if s.ops is not None
                ],
                _OPS_RANKED,
            ),
            "idle": ([s.idle for s in kept if s.idle is not None], IDLE),
        }
        if not errs:
            self.tables["spans"] = ([s.spans for s in stages if s.spans is not None], SPANS)
        tr = [(s.rank, *s.time_range) for s in stages if s.time_range is not None]
        self.time_ranges = pa.table(
            {
                "rank": pa.array([t[0] for t in tr], pa.int32()),
                "ts_ns": pa.array([t[1] for t in tr], pa.int64()),
                "dur_ns": pa.array([t[2] - t[1] for t in tr], pa.int64()),
            }
        )
        self.sets = {s.rank: s.sets for s in stages if s.sets is not None}


def reduce_stages(stages: list[RankStage]) -> Staged:
    """Concatenate per-rank stages (in rank order) into what one all-ranks computation would give."""
    plan = _Plan(stages)
    # the largest parts first, each rank's memory-mapped stage file's pages given back once copied into the
    # concatenation (store.pages; a stage computed in memory is left alone): at 1,024 ranks the cross-rank
    # events are ~0.4 GB of such pages beside their ~0.4 GB copy
    t = {name: concat_released(parts, sch) for name, (parts, sch) in plan.tables.items()}
    return Staged(
        sets=plan.sets,
        breakdown=t["breakdown"],
        spans=t.get("spans"),
        xevents=t["xevents"],
        spans_error=plan.spans_error,
        time_ranges=plan.time_ranges,
        ops=t["ops"],
        idle=t["idle"],
        idle_error=plan.idle_error,
        nodes=t["nodes"],
        syncs=t["syncs"],
        nodes_stepped=plan.nodes_stepped,
    )


def concat_released(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    """`cache.concat(tables, sch)` made one column at a time, the pages of the memory-mapped inputs
    (`store.pages`) given back after each column: the same table, at the memory of the result and one
    column of the inputs (not the result and all of the inputs: at 1,024 ranks ~0.4 GB more for the
    cross-rank events)."""
    if len(tables) <= 1:
        out = concat(tables, sch)
        for t in tables:
            if t is not out:
                pages.release(t)
        return out
    cols, touched = [], 0
    for i, name in enumerate(tables[0].column_names):
        chunks = [c for t in tables for c in t.column(i).chunks]
        typ = tables[0].schema.field(i).type
        one = pa.Table.from_arrays([pa.chunked_array(chunks, typ)], names=[name])
        cols.append(one.unify_dictionaries().combine_chunks().column(0))
        touched += cols[-1].nbytes
        del one, chunks
        if touched >= RELEASE_BYTES or i == tables[0].num_columns - 1:
            for t in tables:
                pages.release(t)
            touched = 0
    return pa.Table.from_arrays(cols, schema=tables[0].schema)


def read_stages(entries: list[RankEntry], threads: int = 1) -> list[RankStage]:
    """The stages of the entries (memory-mapped), in their order; OSError when a stage file is missing or
    damaged. By default read one after the other: files this machine's pool has just written are in the page
    cache, reading a rank's is ~1 ms of Python and Arrow calls, and threads only contend for the interpreter
    (at 1,024 ranks 0.75-0.9 s serially against 1.2-1.6 s with four threads). `threads`
    > 1 for files that opening waits on (written by a cluster's workers to shared storage)."""
    try:
        if threads <= 1 or len(entries) <= 1:
            return [read_stage(e.events, e.rank) for e in entries]
        with ThreadPoolExecutor(threads) as ex:
            return list(ex.map(lambda e: read_stage(e.events, e.rank), entries))
    except (pa.ArrowException, ValueError) as err:
        raise OSError(f"stage files vanished or are corrupt: {err}") from err


def write_memo(
    entries: list[RankEntry],
    meta: pa.Table,
    stages: list[RankStage],
    executor: Executor | None = None,
    rows: int = CHUNK_ROWS,
    memory: pa.Table | None = None,
    derived: list[dict[str, str | None] | None] | None = None,
) -> bool:
    """Write the run memo of these entries (`store.runs`) from their stages, one table at a time: each is
    concatenated (`concat_released`), written and dropped, its memory given back (`pages.trim_heap`), before
    the next. The tables derived from the cross-rank events (collectives, launch flags, process-group rows)
    are computed over slices of whole ranks of the written events, and the allocator samples gathered, as
    tasks on `executor` (default: in this process) while this process writes the rest (`rows`: of the
    events a task takes, `stages.rank_slices`), unless given: `derived` (`derived_parts`, computed from the
    stage files while they were read) and `memory`. False when the cache cannot take the memo (then nothing
    is complete: the run is reduced in memory)."""
    if not entries:
        return False
    ex = executor or InlineExecutor()
    plan = _Plan(stages)
    del stages
    pages.trim_heap()  # (before the largest tables are made: what reading the metadata and stages left)
    try:
        w = runs.MemoWriter(entries)
        pending: list[Future[Any]] = []
        for name in plan.tables:
            parts, sch = plan.tables[name]
            t = concat_released(parts, sch)
            plan.tables[name] = ([], sch)  # (the parts' references dropped with the result)
            del parts
            w.put(name, t)
            del t
            pages.trim_heap()
            if name == "xevents" and derived is None:  # (now on disk: the derived tables are made from it)
                pending = _submit_derived(ex, w, rows)
        w.put("time_ranges", plan.time_ranges)
        w.put("sets", runs.sets_table(plan.sets))
        w.put("meta", meta)
        if memory is None:
            memory = collect_memory(gather_memory(ex, entries, w.dir))
        w.put("memory", memory)
        parts = derived if derived is not None else _results(pending)
        for name, table in zip(runs.DERIVED, _collect_derived(parts, w)):
            w.put(name, table)
            del table
        pages.trim_heap()
        w.finish(
            {r: rs.path for r, rs in plan.sets.items()}, plan.spans_error, plan.idle_error, plan.nodes_stepped
        )
    except (OSError, pa.ArrowException):
        return False
    return True


def gather_memory(ex: Executor, entries: list[RankEntry], folder: Path) -> list[Future[Any]]:
    """Tasks on `ex` that gather the allocator samples of the entries, `MEMORY_SLICE` ranks each, into part
    files in `folder` (`collect_memory` puts them together)."""
    tag = _scratch_tag()
    return [
        ex.submit(
            tasks.gather_memory, entries[i : i + MEMORY_SLICE], str(folder / f".memory-{tag}-{i}.arrow")
        )
        for i in range(0, len(entries), MEMORY_SLICE)
    ]


def _scratch_tag() -> str:
    """A name part of this call's own for the scratch files it leaves in a memo folder: two analyses of one run
    at once write the same memo folder, and each must read back (and remove) its own parts, not the other's."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _submit_derived(ex: Executor, w: runs.MemoWriter, rows: int) -> list[Future[Any]]:
    x = read_ipc(w.path("xevents"))
    bounds = rank_bounds(x, rows) or [(0, x.num_rows)]
    pages.release(x)
    tag = _scratch_tag()
    return [
        ex.submit(tasks.derive_rows, str(w.dir), lo, n, f".derived-{tag}-{i}")
        for i, (lo, n) in enumerate(bounds)
    ]


def collect_memory(futures: list[Future[Any]]) -> pa.Table | None:
    """The allocator samples of all ranks from the gathered parts (None: one could not be read; `Run.memory`
    then reads the entries and reports it)."""
    paths = []
    for f in futures:
        try:
            p = f.result()
        except Exception:  # noqa: BLE001 (left out of the memo; reported when the samples are read)
            p = None
        paths.append(p)
    try:
        if any(p is None for p in paths):
            return None
        return concat([read_ipc(Path(p)) for p in paths], schema.MEMORY)
    except (OSError, pa.ArrowException):  # (a part removed or damaged since it was written)
        return None
    finally:
        for p in paths:
            if p is not None:
                with contextlib.suppress(OSError):
                    Path(p).unlink()


def _results(futures: list[Future[Any]]) -> list[dict[str, str | None] | None]:
    """Each derivation task's result (None for a task that failed: a dead worker)."""
    got: list[dict[str, str | None] | None] = []
    for f in futures:
        try:
            got.append(f.result())
        except Exception:  # noqa: BLE001 (a dead worker: the derived tables are left out)
            got.append(None)
    return got


def derive_from_stages(
    ex: Executor, entries: list[RankEntry], folder: Path, rows: int = CHUNK_ROWS
) -> list[Future[Any]]:
    """Tasks on `ex` that compute the memo's derived tables of the entries from their stage files,
    `MEMORY_SLICE` ranks each (`tasks.derive_stages`, `rows` as there), their parts written into `folder`:
    run by the pool while this process reads the stages, instead of after the cross-rank events are written
    (`derived_parts` collects them)."""
    tag = _scratch_tag()
    return [
        ex.submit(
            tasks.derive_stages, entries[i : i + MEMORY_SLICE], str(folder), f".derived-{tag}-{i}", rows
        )
        for i in range(0, len(entries), MEMORY_SLICE)
    ]


def derived_parts(futures: list[Future[Any]]) -> list[dict[str, str | None] | None] | None:
    """The parts of `derive_from_stages`' tasks, in rank order (`write_memo`'s `derived`); None when one of
    them failed (a stage file missing or damaged): its parts are removed, and the memo's derived tables are
    then computed from its written cross-rank events."""
    got: list[dict[str, str | None] | None] = []
    failed = False
    for f in futures:
        try:
            got.extend(f.result())
        except Exception:  # noqa: BLE001 (computed again from the memo's events)
            failed = True
    if failed or not futures:
        tasks.remove_parts(got)
        return None
    return got


def _collect_derived(got: list[dict[str, str | None] | None], w: runs.MemoWriter) -> list[pa.Table | None]:
    """Each derived table over all ranks from its per-slice parts (`got`: each slice's name -> part file, None
    for a slice whose task failed), put together as `stages.by_rank_chunks` does; None for one that failed
    on some slice (the analysis computes it itself, and reports why). The part files are removed."""
    out: list[pa.Table | None] = []
    try:
        for name in runs.DERIVED:
            paths = [g.get(name) if g is not None else None for g in got]
            if not paths or any(p is None for p in paths):
                out.append(None)
                continue
            try:
                parts = [read_ipc(Path(p)) for p in paths if p is not None]
            except (OSError, pa.ArrowException):  # (a part removed or damaged since it was written)
                out.append(None)
                continue
            if len(parts) == 1:
                out.append(parts[0])
            elif any(not p.schema.equals(parts[0].schema) for p in parts):  # (as by_rank_chunks: whole)
                out.append(kept.derive_or_none(name, read_ipc(w.path("xevents"))))
            else:
                out.append(pa.concat_tables(parts).unify_dictionaries().combine_chunks())
    finally:
        tasks.remove_parts(got)
    return out


__all__ = [
    "Staged",
    "collect_memory",
    "concat_released",
    "derive_from_stages",
    "derived_parts",
    "gather_memory",
    "read_stages",
    "reduce_stages",
    "write_memo",
]
