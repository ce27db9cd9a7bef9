"""The staged engine: per-rank ingest + per-rank stage in worker processes, cross-rank reduction here.

`load_staged(path)` makes sure every Kineto rank of the run has its ingest cache entry (`tracelens.loader`)
and its stage files (`tracelens.engine.stage`), running one task per rank (ingest when needed, then the
per-rank stage) on a pool of worker interpreters, then reads back only the small per-rank results and
concatenates them (`Staged`). The full events table is never built unless something asks for
`StagedTables.events` (the notebook API, `--compat hta`, `tracelens report`'s trace export), which then
reads it from the Parquet cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracelens import schema
from tracelens.analyze.breakdown import BREAKDOWN, RankSets
from tracelens.discover import TraceFile
from tracelens.engine import stage as S
from tracelens.ingest.sniff import KINETO
from tracelens.loader import (
    RankParquet,
    _entry,
    _valid_entry,
    cache_root,
    check_time_ranges,
    discover_remembered,
    ingest_rank,
)

Progress = Callable[[int, int], None]


# ----------------------------------------------------------------------------------------- results
@dataclass
class Staged:
    """The reduced per-rank results of a whole run (what `Analysis` reads instead of the events table).

    `sets`: rank -> RankSets; `breakdown`: BREAKDOWN rows of all ranks; `spans`: SPANS rows of all ranks,
    or None with `spans_error` when a rank's module_spans failed; `xevents`: the cross-rank event rows of
    all ranks (events schema, rank order, trace order within a rank)."""

    sets: dict[int, RankSets]
    breakdown: pa.Table
    spans: pa.Table | None
    xevents: pa.Table
    spans_error: str | None = None
    time_ranges: pa.Table | None = None  # rank, ts_ns (first start), dur_ns (to the last end)
    ops: pa.Table | None = None  # stage.OPS of all ranks plus their "rank" column


def _concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    if not tables:
        return sch.empty_table()
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return t.unify_dictionaries().combine_chunks()


def reduce_stages(stages: list[S.RankStage]) -> Staged:
    """Concatenate per-rank stages (in rank order) into what one all-ranks computation would give.

    One rule is not a plain concatenation: a rank without `ProfilerStep` gets a whole-trace window from
    the breakdown, but only when NO rank has steps (as `breakdown()` over all ranks decides)."""
    from tracelens.analyze.composition import SPANS

    stages = sorted(stages, key=lambda s: s.rank)
    any_steps = any(s.has_steps for s in stages)
    bds = [s.breakdown for s in stages if s.has_steps or not any_steps]
    errs = [f"rank {s.rank}: {s.spans_error}" for s in stages if s.spans_error]
    spans = None if errs else _concat([s.spans for s in stages if s.spans is not None], SPANS)
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
        breakdown=_concat(bds, BREAKDOWN),
        spans=spans,
        xevents=_concat([s.xevents for s in stages], schema.EVENTS),
        spans_error=errs[0] if errs else None,
        time_ranges=time_ranges,
        ops=_concat(
            [
                s.ops.append_column("rank", pa.array([s.rank] * s.ops.num_rows, pa.int32()))
                for s in stages
                if s.ops is not None
            ],
            S.OPS.append(pa.field("rank", pa.int32())),
        ),
    )


@dataclass
class StagedTables:
    """Duck-typed `tracelens.loader.Tables`: `metadata` is read at once, `events` and `memory` only when
    asked for (from the per-rank Parquet cache)."""

    entries: list[RankParquet]
    metadata: pa.Table
    files: list[TraceFile]
    run_dir: Path
    _tmp: object = field(default=None, repr=False)  # finalizer removing a --no-cache temporary folder

    def _read_all(self, part: str, sch: pa.Schema) -> pa.Table:
        return _concat([_read_parquet(getattr(e, part)) for e in self.entries], sch)

    @cached_property
    def events(self) -> pa.Table:
        return self._read_all("events", schema.EVENTS)

    def events_of(self, ranks: Iterable[int]) -> pa.Table:
        """Events of only these ranks (each read from its own cache file; nothing else is read)."""
        want = {int(r) for r in ranks}
        parts = [_read_parquet(e.events) for e in self.entries if e.rank in want]
        return _concat(parts, schema.EVENTS)

    @cached_property
    def memory(self) -> pa.Table:
        return self._read_all("memory", schema.MEMORY)


def _read_parquet(p: Path) -> pa.Table:
    with pq.ParquetFile(p) as f:
        return f.read()


# ------------------------------------------------------------------------------------------- tasks
def process_rank(
    path: str, rank: int, events: str, memory: str, meta: str, salvage: bool, use_cache: bool
) -> int:
    """Worker task for one rank: ingest into the cache unless a valid entry exists, then compute and
    write its stage unless complete stage files exist (always recomputed after a fresh ingest)."""
    e = RankParquet(rank, Path(events), Path(memory), Path(meta))
    fresh = not (use_cache and _valid_entry(e))
    if fresh:
        ingest_rank(path, rank, events, memory, meta, salvage)
    if fresh or not S.stage_complete(e.events, rank):
        S.compute_and_write(events, rank)
    return rank


def rank_tasks(
    files: list[TraceFile], root: Path, *, use_cache: bool = True, salvage: bool = False
) -> tuple[list[RankParquet], list[dict]]:
    """Cache entries of the run's Kineto files (rank order) and the tasks still to run for them."""
    kin = sorted((f for f in files if f.fmt == KINETO), key=lambda f: f.rank)
    entries = [_entry(root, f, salvage) for f in kin]
    tasks = []
    for f, e in zip(kin, entries):
        if use_cache and _valid_entry(e) and S.stage_complete(e.events, e.rank):
            continue
        kw = {
            "path": str(f.path),
            "rank": f.rank,
            "events": str(e.events),
            "memory": str(e.memory),
            "meta": str(e.meta),
            "salvage": salvage,
            "use_cache": use_cache,
        }
        tasks.append({"fn": "process_rank", "kw": kw})
    return entries, tasks


def read_staged(entries: list[RankParquet]) -> tuple[pa.Table, Staged]:
    """(metadata of all ranks, reduced stages) from the cache entries; OSError when one is missing."""
    try:
        meta = _concat([_read_parquet(e.meta) for e in entries], schema.METADATA)
        stages = [S.read_stage(e.events, e.rank) for e in entries]
    except (pa.ArrowException, ValueError) as err:
        raise OSError(f"stage files vanished or are corrupt: {err}") from err
    if not meta.schema.equals(schema.METADATA):
        raise OSError("cached metadata has another schema")
    return meta, reduce_stages(stages)


def default_workers(n_tasks: int, workers: int | None = None) -> int:
    return max(1, min(workers or os.cpu_count() or 1, n_tasks))


def load_staged(
    path: str | Path,
    no_cache: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    *,
    salvage: bool = False,
    ranks: str | Iterable[int] | None = None,
    runner: Callable[[list[dict], Progress | None, int, int], None] | None = None,
    temp_cache: bool = True,
) -> tuple[StagedTables, Staged]:
    """Discover the run at `path`, run the per-rank tasks still needed and reduce their results.

    `runner(tasks, progress, done, total)` runs the tasks (default: the local worker pool with
    min(cpu count, ranks) workers, or `workers`); the Dask engine passes its own. `ranks` keeps only those
    ranks (as `tracelens.loader.load_tables`); traces of different runs in one folder raise RankError.
    `no_cache` works in a temporary folder removed with the tables, or, when not `temp_cache` (a cluster
    whose workers cannot see this machine's temporary folder), rebuilds the run's cache entries in place.
    """
    from tracelens.workers import run_tasks

    p = Path(path).expanduser()
    run_dir = p if p.is_dir() else p.parent
    files, save_memo = discover_remembered(p, ranks, no_cache)
    tmp_dir = Path(tempfile.mkdtemp(prefix="tracelens-")) if no_cache and temp_cache else None
    root = tmp_dir if tmp_dir is not None else cache_root(run_dir)
    save_memo(root)

    def run(tasks: list[dict], done: int, total: int) -> None:
        if progress:
            progress(done, total)
        if runner is not None:
            runner(tasks, progress, done, total)
        else:
            run_tasks(tasks, default_workers(len(tasks), workers), progress, done, total)

    try:
        entries, tasks = rank_tasks(files, root, use_cache=not no_cache, salvage=salvage)
        run(tasks, len(entries) - len(tasks), len(entries))
        try:
            meta, staged = read_staged(entries)
        except OSError:  # an entry was removed or damaged between the check and the read: rebuild once
            entries, tasks = rank_tasks(files, root, use_cache=False, salvage=salvage)
            run(tasks, 0, len(entries))
            meta, staged = read_staged(entries)
        check_time_ranges(staged.time_ranges, meta)
    except BaseException:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    tables = StagedTables(entries, meta, files, run_dir)
    if tmp_dir is not None:  # --no-cache: the folder lives as long as the tables (events are read lazily)
        tables._tmp = weakref.finalize(tables, shutil.rmtree, tmp_dir, True)
    return tables, staged


__all__ = [
    "Staged",
    "StagedTables",
    "load_staged",
    "process_rank",
    "rank_tasks",
    "read_staged",
    "reduce_stages",
]
