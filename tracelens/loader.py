"""Run folder -> Arrow tables for all ranks, through a per-rank Parquet cache filled by a process pool.

Each rank is ingested by one worker process, which writes that rank's tables as Parquet into the cache and
returns only the paths: memory stays bounded by one rank per worker, and a second load reads Parquet only.
Cache layout: `run_dir/.tracelens/cache/<key>/rank<r>.{events,memory,meta}.parquet`, `<key>` derived from the
file's absolute path, size, mtime, rank and the tracelens version. A read-only run folder falls back to the
user cache folder (`$XDG_CACHE_HOME/tracelens` or `~/.cache/tracelens`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelens import __version__, errors, schema
from tracelens.discover import TraceFile, discover
from tracelens.ingest import kineto
from tracelens.ingest.sniff import KINETO

Progress = Callable[[int, int], None]
_PARTS = ("events", "memory", "meta")
_SCHEMAS = {"events": schema.EVENTS, "memory": schema.MEMORY, "meta": schema.METADATA}


@dataclass
class Tables:
    """All ranks of a run: `events` (schema.EVENTS), `memory` (schema.MEMORY), `metadata` (schema.METADATA,
    one row per rank), the discovered `files` (all formats; only Kineto ones are in the tables), `run_dir`."""

    events: pa.Table
    memory: pa.Table
    metadata: pa.Table
    files: list[TraceFile]
    run_dir: Path


@dataclass(frozen=True)
class RankParquet:
    """Where one rank's cached tables are (what the pool workers produce)."""

    rank: int
    events: Path
    memory: Path
    meta: Path


# ------------------------------------------------------------------------------------------- cache
def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/tracelens`, else `~/.cache/tracelens`."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "tracelens"


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def _owner_writable(d: Path) -> bool:
    try:
        return bool(d.stat().st_mode & 0o200) and os.access(d, os.W_OK)
    except OSError:
        return False


def cache_root(run_dir: Path) -> Path:
    """The cache folder of a run: `run_dir/.tracelens/cache`, or the user cache folder when not writable."""
    d = run_dir / ".tracelens" / "cache"
    # A folder without write permission bits is read-only by intent, even for root (who could write it).
    if _owner_writable(run_dir) and _writable(d):
        return d
    d = _user_cache_of(run_dir)
    if _writable(d):
        return d
    raise OSError(f"no writable cache folder for {run_dir}")


def _user_cache_of(run_dir: Path) -> Path:
    """The cache folder of a read-only run in the user cache directory."""
    tag = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return user_cache_dir() / "runs" / tag / "cache"


def cache_key(f: TraceFile, salvage: bool = False) -> str:
    """Key of one file's cache entry: its absolute path, size, mtime, rank and the tracelens version."""
    st = f.path.stat()
    text = "|".join(
        [str(f.path.resolve()), str(st.st_size), str(st.st_mtime_ns), str(f.rank), __version__, str(salvage)]
    )
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _entry(root: Path, f: TraceFile, salvage: bool) -> RankParquet:
    d = root / cache_key(f, salvage)
    r = f.rank
    return RankParquet(
        r, d / f"rank{r}.events.parquet", d / f"rank{r}.memory.parquet", d / f"rank{r}.meta.parquet"
    )


def _write_atomic(table: pa.Table, dest: Path) -> None:
    """Write Parquet to a temporary name, then rename: readers never see a half-written file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        # uncompressed: the cache is read far more often than written, and Parquet's own dictionary and
        # run-length encodings already keep it at ~6% of the JSON (lz4 saved a third of that and cost ~1 ms
        # per 100k events on every read)
        pq.write_table(table, tmp, compression="none")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def _read_checked(p: Path, part: str) -> pa.Table | None:
    """A cached table, or None when missing, unreadable or of another schema (then it is rebuilt).

    Columns that the file's statistics say are entirely null (the collective fields of most events) are not
    decoded: they are built as null arrays over one shared zero buffer, which saves decoding them and, in a
    fresh process, faulting in their memory (a quarter of a cached reload)."""
    try:
        # a memory-mapped source: no read() copies of the pages, and steadier than a path in a fresh process
        with pa.memory_map(str(p)) as src, pq.ParquetFile(src) as f:  # lighter than pq.read_table
            if not f.schema_arrow.equals(_SCHEMAS[part]):
                return None
            empty = _all_null_columns(f.metadata)
            if not empty:
                return f.read()
            sch = f.schema_arrow
            t = f.read(columns=[c for c in sch.names if c not in empty])
    except (OSError, pa.ArrowException, ValueError):
        return None
    n = t.num_rows
    zero = pa.py_buffer(bytes(8 * (n + 1)))  # zero-filled lazily by the OS: no page is touched
    cols = [t.column(c) if c not in empty else _null_array(sch.field(c).type, n, zero) for c in sch.names]
    return pa.Table.from_arrays(cols, schema=sch)


def _all_null_columns(md: pq.FileMetaData) -> set[str]:
    """Flat (non-nested) columns whose every value is null by the writer's statistics (one row group only).
    Nested columns are never skipped: a list's leaf statistics count an empty list as a null element."""
    if md.num_row_groups != 1 or md.num_rows == 0:
        return set()
    rg = md.row_group(0)
    out = set()
    for j in range(rg.num_columns):
        c = rg.column(j)
        st = c.statistics
        if (
            "." not in c.path_in_schema
            and st is not None
            and st.has_null_count
            and st.null_count == md.num_rows
        ):
            out.add(c.path_in_schema)
    return out


def _null_array(tp: pa.DataType, n: int, zero: pa.Buffer) -> pa.Array:
    """n nulls of type `tp` over the shared zero buffer (validity bits 0, values / offsets / indices 0)."""
    if pa.types.is_dictionary(tp):
        idx = pa.Array.from_buffers(tp.index_type, n, [zero, zero], null_count=n)
        return pa.DictionaryArray.from_arrays(idx, pa.array([], tp.value_type))
    if pa.types.is_list(tp):
        return pa.Array.from_buffers(
            tp, n, [zero, zero], null_count=n, children=[pa.array([], tp.value_type)]
        )
    if pa.types.is_primitive(tp) and tp.bit_width <= 64:
        return pa.Array.from_buffers(tp, n, [zero, zero], null_count=n)
    return pa.nulls(n, tp)


def _valid_entry(e: RankParquet) -> bool:
    """Cheap check (Parquet footers only): all three files exist and carry the expected schemas."""
    for part in _PARTS:
        try:
            if not pq.read_schema(getattr(e, part)).equals(_SCHEMAS[part]):
                return False
        except (OSError, pa.ArrowException, ValueError):
            return False
    return True


def ingest_rank(path: str, rank: int, events: str, memory: str, meta: str, salvage: bool = False) -> int:
    """Worker: read one Kineto file and write its three Parquet files atomically; returns the rank."""
    tr = kineto.read(path, rank=rank, salvage=salvage)
    _write_atomic(tr.events, Path(events))
    _write_atomic(tr.memory, Path(memory))
    _write_atomic(kineto.metadata_table([tr.metadata]), Path(meta))  # last: marks the entry complete
    del tr
    pa.default_memory_pool().release_unused()  # hand freed Arrow memory back before the next rank
    return rank


def ingest_to_parquet(
    files: list[TraceFile],
    root: Path,
    *,
    use_cache: bool = True,
    progress: Progress | None = None,
    workers: int | None = None,
    salvage: bool = False,
) -> list[RankParquet]:
    """Make sure every Kineto file of `files` has its Parquet entry under `root` (ingesting the missing ones
    in parallel) and return the entries in rank order. Corrupt entries are rebuilt."""
    kin = [f for f in files if f.fmt == KINETO]
    entries = [_entry(root, f, salvage) for f in kin]
    todo = [(f, e) for f, e in zip(kin, entries) if not (use_cache and _valid_entry(e))]
    total, done = len(kin), len(kin) - len(todo)
    if progress:
        progress(done, total)
    n = min(workers or os.cpu_count() or 1, len(todo)) if sys.executable else 1  # embedded: no workers
    tasks = [
        {
            "fn": "ingest_rank",
            "kw": {
                "path": str(f.path),
                "rank": f.rank,
                "events": str(e.events),
                "memory": str(e.memory),
                "meta": str(e.meta),
                "salvage": salvage,
            },
        }
        for f, e in todo
    ]
    if tasks:
        from tracelens.workers import run_tasks

        run_tasks(tasks, n, progress, done, total)
    return entries


def _concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    if not tables:
        return sch.empty_table()
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return t.unify_dictionaries().combine_chunks()


def read_entries(entries: list[RankParquet]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Concatenate cached per-rank Parquet into (events, memory, metadata), dictionaries unified."""
    jobs = [(getattr(e, part), part) for e in entries for part in _PARTS]
    tabs = _read_jobs(jobs)
    for (p, _), t in zip(jobs, tabs):
        if t is None:
            raise OSError(f"cache entry {p} vanished or is corrupt")
    out = [tabs[i :: len(_PARTS)] for i in range(len(_PARTS))]
    ev, mem, meta = (_concat(ts, _SCHEMAS[part]) for ts, part in zip(out, _PARTS))
    return ev, mem, meta


def _read_jobs(jobs: list[tuple[Path, str]]) -> list[pa.Table | None]:
    """_read_checked of each (path, part), in order; several files are read concurrently (the Parquet reader
    releases the GIL)."""
    if len(jobs) <= 1:
        return [_read_checked(*j) for j in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(4, len(jobs))) as ex:
        return list(ex.map(lambda j: _read_checked(*j), jobs))


#: File beside the Parquet cache remembering what discovery read from each trace (see discover's `memo`).
DISCOVER_MEMO = "discover.json"


def _existing_cache_root(run_dir: Path) -> Path | None:
    """cache_root(run_dir) when that folder already exists (nothing is created here)."""
    d = run_dir / ".tracelens" / "cache"
    if _owner_writable(run_dir) and d.is_dir():
        return d
    d = _user_cache_of(run_dir)
    return d if d.is_dir() else None


def _load_memo(run_dir: Path) -> dict:
    """What discovery read from each trace on an earlier load (DISCOVER_MEMO), or an empty memo."""
    root = _existing_cache_root(run_dir)
    if root is None:
        return {}
    try:
        doc = json.loads((root / DISCOVER_MEMO).read_bytes())
    except (OSError, ValueError):
        return {}
    if isinstance(doc, dict) and doc.get("version") == __version__ and isinstance(doc.get("files"), dict):
        return doc["files"]
    return {}


def _save_memo(root: Path, memo: dict) -> None:
    f = root / DISCOVER_MEMO
    tmp = f.with_name(f".{f.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps({"version": __version__, "files": memo}))
        os.replace(tmp, f)
    except OSError:  # a cache that cannot take it: discovery just reads the files again next time
        pass
    finally:
        if tmp.exists():
            tmp.unlink()


def discover_remembered(
    p: Path, ranks: str | Iterable[int] | None, no_cache: bool
) -> tuple[list[TraceFile], Callable[[Path], None]]:
    """`discover` with the memo of an earlier load (DISCOVER_MEMO, beside the cache): per (path, size,
    mtime) what each trace said, so an unchanged run is not opened file by file again (1,024 ranks: ~1 s).
    Returns the files and `save(cache_root)`, which writes the memo back when discovery added to it. With
    `no_cache` plain discovery, and `save` does nothing."""
    if no_cache or not p.exists():
        return discover(p, ranks), lambda root: None
    memo = _load_memo(p if p.is_dir() else p.parent)
    known = len(memo)
    files = discover(p, ranks, memo=memo)

    def save(root: Path) -> None:
        if len(memo) != known:
            _save_memo(root, memo)

    return files, save


def _read_warm(entries: list[RankParquet]) -> tuple[pa.Table, pa.Table, pa.Table] | None:
    """The tables when every entry is cached with the current schemas (each file read once, its schema
    checked as it is read), else None."""
    if not entries or not all(getattr(e, part).is_file() for e in entries for part in _PARTS):
        return None  # no rank, or a cold or partial cache: nothing is read
    try:
        return read_entries(entries)
    except OSError:
        return None


def load_tables(
    path: str | Path,
    no_cache: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    *,
    salvage: bool = False,
    ranks: str | Iterable[int] | None = None,
) -> Tables:
    """Discover the run at `path` and return the Arrow tables of all its Kineto ranks.

    Ranks are ingested in parallel (a process pool of min(cpu count, ranks) workers, or `workers`), through
    the Parquet cache unless `no_cache` (then a temporary folder is used and removed). `progress(done, total)`
    is called as ranks finish. `ranks` keeps only those ranks (a set or a "0-7,12" text, see
    `discover.parse_rank_filter`). Ranks whose time ranges lie far apart (traces of different runs in one
    folder) raise RankError naming two of the files.
    """
    p = Path(path).expanduser()
    run_dir = p if p.is_dir() else p.parent
    files, save_memo = discover_remembered(p, ranks, no_cache)
    kin = [f for f in files if f.fmt == KINETO]
    if len(kin) == 1 and no_cache:
        f = kin[0]
        if progress:
            progress(0, 1)
        tr = kineto.read(f.path, rank=f.rank, salvage=salvage)
        if progress:
            progress(1, 1)
        return Tables(tr.events, tr.memory, kineto.metadata_table([tr.metadata]), files, run_dir)
    if no_cache:
        tmp = Path(tempfile.mkdtemp(prefix="tracelens-"))
        try:
            entries = ingest_to_parquet(
                files, tmp, use_cache=False, progress=progress, workers=workers, salvage=salvage
            )
            ev, mem, meta = read_entries(entries)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        root = cache_root(run_dir)
        save_memo(root)
        warm = _read_warm([_entry(root, f, salvage) for f in kin])
        if warm is not None:  # every rank cached: read once, no separate validation pass
            if progress:
                progress(len(kin), len(kin))
            ev, mem, meta = warm
            check_time_ranges(ev, meta)
            return Tables(ev, mem, meta, files, run_dir)
        entries = ingest_to_parquet(files, root, progress=progress, workers=workers, salvage=salvage)
        try:
            ev, mem, meta = read_entries(entries)
        except OSError:  # an entry was removed or damaged between the check and the read: rebuild once
            entries = ingest_to_parquet(
                files, root, use_cache=False, progress=progress, workers=workers, salvage=salvage
            )
            ev, mem, meta = read_entries(entries)
    check_time_ranges(ev, meta)
    return Tables(ev, mem, meta, files, run_dir)


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


__all__ = [
    "RankParquet",
    "Tables",
    "cache_key",
    "cache_root",
    "check_time_ranges",
    "ingest_to_parquet",
    "load_tables",
    "read_entries",
]
