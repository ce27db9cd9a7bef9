"""The one way a run gets into memory: `load_run(path, options, executor) -> Run`.

The CLI, the notebook API (`tracelens.load`), the report and the Dask engine all come through here, and a
one-rank run takes the same path (in this process). For each Kineto rank, one plain task
(`tracelens.engine.tasks.process_rank`) ingests its trace into the cache and computes its per-rank
stage; the tasks run on an executor (a local pool by default, Dask's `Client.get_executor()` for a cluster).
This process then reads back only the metadata and the small stage results and reduces them
(`tracelens.engine.reduce`); the events and memory tables are read lazily, when asked for.

The cache lives in the user cache directory (`tracelens.store.cache`), never in the run folder. With
`no_cache`, or when the cache directory cannot be written, the work is done in a scratch folder that is
removed with the `Run`.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tracelens import errors, schema
from tracelens.discover import TraceFile, discover
from tracelens.engine import kept
from tracelens.engine.executor import SMALL_RUN_GZIP_FACTOR, local_executor, run_all
from tracelens.engine.tasks import needs_work, process_rank, stage_rank
from tracelens.ingest.sniff import KINETO
from tracelens.store import cache, pages, runs
from tracelens.store.cache import RankEntry

if TYPE_CHECKING:  # (the reduction is imported when a run's stages are first read: not by a load alone)
    from tracelens.engine.reduce import Staged

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LoadOptions:
    """How to load a run. `ranks`: keep only these ranks (a set or a "0-7,12" text, see
    `discover.parse_rank_filter`); `cache_dir`: the cache root (default `store.cache.default_cache_dir()`);
    `workers`: size of the default local pool; `progress(done, total)` is called as ranks finish.
    `defer_stages`: compute the per-rank stages when `Run.stages` is first asked for, not during the load
    (the notebook API: reading a run's events then costs the read alone); only with the default executor."""

    no_cache: bool = False
    cache_dir: str | Path | None = None
    salvage: bool = False
    ranks: str | Iterable[int] | None = None
    workers: int | None = None
    progress: Progress | None = None
    defer_stages: bool = False


@dataclass(eq=False)
class Run:
    """One loaded run. `metadata` (schema.METADATA, one row per rank), `files` (every discovered input, all
    formats) are in memory; `stages` (the per-rank stage results of every rank, reduced) too, unless the
    load deferred them (`LoadOptions.defer_stages`): then they are computed on first use. `events` and
    `memory` (all ranks) are read from the cache when first asked for, `events_of(ranks)` reads only those
    ranks. `warnings`: what the loader had to work around (e.g. an unwritable cache)."""

    path: Path
    run_dir: Path
    files: list[TraceFile]
    metadata: pa.Table
    entries: list[RankEntry]
    cache_root: Path | None
    _stages: Callable[[], Staged] = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    _scratch: weakref.finalize[Any, Any] | None = field(default=None, repr=False)

    @cached_property
    def stages(self) -> Staged:
        """The per-rank stage results of every rank, reduced (`tracelens.engine.reduce.Staged`)."""
        return self._stages()

    @cached_property
    def events(self) -> pa.Table:
        """Every event of every rank (schema.EVENTS), ranks in order."""
        return cache.read_part(self.entries, "events")

    @cached_property
    def memory(self) -> pa.Table:
        """Every `[memory]` record of every rank (schema.MEMORY): the run memo's (one memory-mapped file), else
        read from the entries."""
        got = runs.read_memory(self.entries) if self.cache_root is not None else None
        return got if got is not None else cache.read_part(self.entries, "memory")

    def events_of(self, ranks: Iterable[int], columns: list[str] | None = None) -> pa.Table:
        """Events of only these ranks (each read from its own cache file; nothing else is read), only
        `columns` of them when given."""
        want = {int(r) for r in ranks}
        return cache.read_part([e for e in self.entries if e.rank in want], "events", columns)

    @property
    def ranks(self) -> list[int]:
        return [e.rank for e in self.entries]

    def close(self) -> None:
        """Remove the scratch folder of a run loaded without cache (also done when the Run is collected)."""
        if self._scratch is not None:
            self._scratch()


#: errno values of a write that found no room: the disk (ENOSPC) or the user's quota (EDQUOT) is full.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT}


def _read_memo(entries: list[RankEntry]) -> tuple[pa.Table, Staged] | None:
    """`runs.read_run`, with the memo's launch flags of the cross-rank events taken (`kept.apply_flags`)."""
    got = runs.read_run(entries)
    if got is not None:
        kept.apply_flags(got[1])
    return got


def disk_full(err: BaseException) -> bool:
    """Whether an error says a write found no room (also Arrow's, which carry the errno in their text)."""
    if isinstance(err, OSError) and err.errno in _NO_ROOM:
        return True
    text = str(err)
    return "No space left on device" in text or "Disk quota exceeded" in text


def _why(err: BaseException) -> str:
    return (err.strerror if isinstance(err, OSError) and err.strerror else None) or "No space left on device"


def _scratch_dir(root: Path | None) -> Path:
    """A scratch folder for one uncached load: under the cache root when it is writable (workers of a
    cluster see it where they see the cache), else in the system temporary folder."""
    if root is not None:
        d = root / "tmp" / uuid.uuid4().hex
        try:
            d.mkdir(parents=True)
            return d
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix="tracelens-"))


def _read_metadata(entries: list[RankEntry]) -> pa.Table:
    """Metadata of all ranks from the entries; OSError when one is missing or damaged. The files (Arrow IPC,
    one row each) are read by a few threads (opening them waits on the file system)."""
    try:
        if len(entries) > 1:
            with ThreadPoolExecutor(4) as ex:
                tabs = list(ex.map(cache.read_small, [e.meta for e in entries]))
        else:
            tabs = [cache.read_small(e.meta) for e in entries]
        meta = cache.concat(tabs, schema.METADATA)
    except (pa.ArrowException, ValueError) as err:
        raise OSError(f"cache entries vanished or are corrupt: {err}") from err
    if not meta.schema.equals(schema.METADATA):
        raise OSError("cached metadata has another schema")
    return meta


def load_run(path: str | Path, options: LoadOptions | None = None, executor: Executor | None = None) -> Run:
    """Discover the run at `path` (a folder or one trace), run the per-rank tasks still needed on
    `executor` (default: `engine.executor.local_executor`) and return the `Run`.

    Ranks whose time ranges lie far apart (traces of different runs in one folder) raise RankError naming
    two of the files."""
    o = options or LoadOptions()
    p = Path(path).expanduser()
    run_dir = p if p.is_dir() else p.parent
    warnings: list[str] = []
    root = None if o.no_cache else cache.open_cache(o.cache_dir)
    if not o.no_cache and root is None:
        where = o.cache_dir or cache.default_cache_dir()
        warnings.append(f"cache folder {where} is not writable: analyzed without cache")
    if root is not None and p.is_dir():
        # (the memo is the folder's: a file given by name is read as Kineto whatever its content, which
        # must not change how the folder is read later)
        memo = cache.load_memo(root, run_dir)
        known = len(memo)
        files = discover(p, o.ranks, memo=memo)
        if len(memo) != known:
            cache.save_memo(root, run_dir, memo)
    else:
        files = discover(p, o.ranks)
    scratch = None
    if root is None:
        scratch = _scratch_dir(None if o.no_cache and o.cache_dir is None else cache.open_cache(o.cache_dir))
    work = root if root is not None else scratch
    assert work is not None
    try:
        run = _load(p, run_dir, files, work, o, executor, use_cache=root is not None)
    except OSError as err:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if root is None or not disk_full(err):
            raise
        # a full cache: what this load began there goes, and the run is analyzed without cache (as with a
        # cache folder that is not writable); the scratch folder then lives in the system's temporary folder
        cache.remove_incomplete(root, files, o.salvage)
        warnings.append(f"cache folder {root} is full ({_why(err)}): analyzed without cache")
        root, scratch = None, _scratch_dir(None)
        try:
            run = _load(p, run_dir, files, scratch, o, executor, use_cache=False)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    run.cache_root = root
    run.warnings = warnings
    if scratch is not None:  # the folder lives as long as the Run (events are read lazily)
        run._scratch = weakref.finalize(run, shutil.rmtree, scratch, True)
    return run


def _load(
    p: Path,
    run_dir: Path,
    files: list[TraceFile],
    work: Path,
    o: LoadOptions,
    executor: Executor | None,
    use_cache: bool,
) -> Run:
    kin = sorted((f for f in files if f.fmt == KINETO and f.rank is not None), key=lambda f: f.rank or 0)
    entries = [cache.entry(work, f.path, int(f.rank or 0), o.salvage, scratch=not use_cache) for f in kin]
    defer = o.defer_stages and executor is None

    pools: list[Executor] = []  # (the local pool, started for the tasks, kept while the stages are read)

    def on_executor(
        fn: Callable[..., Any], todo: list[tuple[TraceFile, RankEntry]], calls: list[tuple[Any, ...]]
    ) -> None:
        done, total = len(entries) - len(todo), len(entries)
        if o.progress:
            o.progress(done, total)
        if todo:
            ex = executor or (pools[0] if pools else None)
            if ex is None:
                est = sum(
                    f.size * (SMALL_RUN_GZIP_FACTOR if f.path.name.endswith(".gz") else 1) for f, _ in todo
                )
                ex = local_executor(len(todo), o.workers, est)
                pools.append(ex)
            run_all(ex, fn, calls, o.progress, done, total)

    def run_tasks(cached: bool, stage: bool) -> int:
        todo = [(f, e) for f, e in zip(kin, entries) if needs_work(e, cached, stage)]
        on_executor(process_rank, todo, [(str(f.path), e.rank, e, o.salvage, cached, stage) for f, e in todo])
        return len(todo)

    def close_pool() -> None:
        while pools:
            pools.pop().shutdown(wait=True)

    # a run opened before: its metadata and reduced stages in one place (store.runs), no per-rank checks
    memo = _read_memo(entries) if use_cache else None
    try:
        if memo is not None:
            if o.progress:
                o.progress(len(entries), len(entries))
            meta = memo[0]
            cache.touch(entries)
        else:
            wrote = run_tasks(use_cache, not defer)
            try:
                meta = _read_metadata(entries)
            except OSError:  # an entry was removed or damaged between the check and the read: rebuild once
                wrote += run_tasks(False, not defer)
                meta = _read_metadata(entries)
            if use_cache:
                cache.touch(entries)
                if wrote:
                    cache.evict(work, keep=[e.folder for e in entries])

        def stages() -> Staged:
            if memo is not None:
                staged = memo[1]
            else:
                try:
                    if defer:  # the stages of the ranks that have none yet, from their cached events
                        todo = [(f, e) for f, e in zip(kin, entries) if needs_work(e, True)]
                        on_executor(stage_rank, todo, [(e,) for _, e in todo])
                    pool = pools.pop() if pools else None
                    staged = _reduce(entries, meta, use_cache, executor, pool, run_tasks)
                finally:
                    close_pool()  # (a deferred load's pool: started and closed here)
            if staged.time_ranges is not None:
                check_time_ranges(staged.time_ranges, meta)
            return staged

        run = Run(p, run_dir, files, meta, entries, work if use_cache else None, stages)
        if not defer:
            run.stages  # computed now: a run of mixed traces fails at load  # noqa: B018
    finally:
        close_pool()
    return run


def _reduce(
    entries: list[RankEntry],
    meta: pa.Table,
    use_cache: bool,
    executor: Executor | None,
    pool: Executor | None,
    run_tasks: Callable[[bool, bool], int],
) -> Staged:
    """The reduced stages of the entries: written into the run memo part by part (`reduce.write_memo`) and
    read back from it, memory-mapped (what a later open reads; its pages can be given back between phases:
    Staged.release_pages); in memory when there is no cache or it cannot take the memo. A stage file removed
    or damaged since: every rank is ingested and staged again.

    The load's local `pool` (or the caller's `executor`, a cluster) gathers the allocator samples and computes
    the memo's derived tables from the stage files while this process reads the stages (at 1,024 ranks ~3.4
    CPU s that were spent here, one core idle, after the cross-rank events were written), and is shut down
    before the tables are made: its idle workers (~130 MB each) would otherwise count beside the largest of
    them (the cross-rank events: ~0.4 GB at 1,024 ranks). Without either, the derived tables are computed
    here over slices of whole ranks of the written events."""
    from tracelens.engine.reduce import (
        collect_memory,
        derive_from_stages,
        derived_parts,
        gather_memory,
        read_stages,
        reduce_stages,
        write_memo,
    )

    mem: list[Any] = []
    deriving: list[Any] = []
    derived = None
    ex = executor or pool
    threads = 4 if executor is not None else 1  # (a caller's executor: a cluster's workers wrote the files)
    try:
        if use_cache and ex is not None and entries:
            with contextlib.suppress(OSError):
                mem_dir = runs.memo_dir(entries)
                mem_dir.mkdir(exist_ok=True)
                mem = gather_memory(ex, entries, mem_dir)
                deriving = derive_from_stages(ex, entries, mem_dir)
        try:
            stages = read_stages(entries, threads)
        except OSError:
            derived_parts(deriving)  # (made from the files now replaced: dropped)
            deriving = []
            run_tasks(False, True)
            stages = read_stages(entries, threads)
        memory = collect_memory(mem) if mem else None
        derived = derived_parts(deriving) if deriving else None
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if use_cache and write_memo(entries, meta, stages, executor, memory=memory, derived=derived):
        del stages, memory
        reopened = _read_memo(entries)
        pages.trim_heap()  # (what reading and writing the stages left in the heap: ~90 MB at 1,024 ranks)
        if reopened is not None:
            return reopened[1]
        stages = read_stages(entries, threads)
    try:
        return reduce_stages(stages)
    except (pa.ArrowException, ValueError) as err:
        raise OSError(f"stage files vanished or are corrupt: {err}") from err


def load_tables(
    path: str | Path,
    no_cache: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    *,
    salvage: bool = False,
    ranks: str | Iterable[int] | None = None,
    cache_dir: str | Path | None = None,
) -> Run:
    """`load_run` with keyword options (the notebook-friendly spelling); `.events`, `.memory`,
    `.metadata` and `.files` are the run's tables."""
    opts = LoadOptions(no_cache, cache_dir, salvage, ranks, workers, progress)
    return load_run(path, opts)


#: Ranks whose event time ranges are separated by more than this are taken for traces of different runs.
MIXED_RUN_GAP_NS = 10 * 60 * 10**9


def check_time_ranges(events: pa.Table, metadata: pa.Table, gap_ns: int = MIXED_RUN_GAP_NS) -> None:
    """Raise RankError when the ranks' event time ranges fall into groups more than `gap_ns` apart.

    Ranks of one run overlap in time (clocks of different hosts differ by milliseconds, not minutes); two
    jobs' traces copied into one folder do not. The message names a file of each group.
    """
    if events.num_rows == 0 or metadata.num_rows < 2:
        return
    ts_col = events.column("ts_ns")
    if ts_col.null_count:
        events = events.filter(ts_col.is_valid())
        if events.num_rows == 0:
            return
    ts = events.column("ts_ns").to_numpy()
    dur = np.maximum(events.column("dur_ns").fill_null(0).to_numpy(), 0)
    with np.errstate(over="ignore"):
        end = ts + dur
    end[end < ts] = np.iinfo(np.int64).max  # an absurd duration saturates instead of wrapping
    rk = events.column("rank").to_numpy()
    # per run of equal ranks (the cache concatenates ranks in blocks), then per rank
    starts = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1]])
    blk_lo, blk_hi, blk_rank = np.minimum.reduceat(ts, starts), np.maximum.reduceat(end, starts), rk[starts]
    ranks, inv = np.unique(blk_rank, return_inverse=True)
    lo = np.full(ranks.size, np.iinfo(np.int64).max, np.int64)
    hi = np.full(ranks.size, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, inv, blk_lo)
    np.maximum.at(hi, inv, blk_hi)
    order = lo.argsort(kind="stable")
    ranks, lo, hi = ranks[order], lo[order], hi[order]
    reach = np.maximum.accumulate(hi)  # latest end among the ranks starting earlier
    gaps = lo[1:] - reach[:-1]
    if len(gaps) == 0 or gaps.max() <= gap_ns:
        return
    i = int(gaps.argmax())
    before = int(ranks[int(np.argmax(hi[: i + 1]))])
    after = int(ranks[i + 1])
    paths = dict(zip(metadata.column("rank").to_pylist(), metadata.column("path").to_pylist()))
    raise errors.RankError(
        f"traces of different runs in one folder? rank {after} ({paths.get(after)}) starts "
        f"{gaps[i] / 6e10:.0f} min after rank {before} ({paths.get(before)}) ended; "
        "choose one run's ranks with --rank-filter"
    )


__all__ = ["LoadOptions", "MIXED_RUN_GAP_NS", "Run", "check_time_ranges", "load_run", "load_tables"]
