"""The per-rank cache: where it lives, its keys, its entries, reading them back, LRU eviction.

Default place: the user cache directory (`$TRACELENS_CACHE_DIR`, else `$XDG_CACHE_HOME/tracelens`, else
`~/.cache/tracelens`), never the run folder; `--cache-dir` chooses another (shared storage for a Dask
cluster). Layout under the cache root:

    entries/<key>/rank<r>.events.parquet                  one rank's ingested events
    entries/<key>/rank<r>.{memory,meta}.arrow              its allocator samples and metadata row (Arrow IPC)
    entries/<key>/stage-<v>/rank<r>.<part>.arrow           its per-rank stage (tracelens.store.stages)
    memo/<run id>.json                                     what discovery read from each trace of a run

`<key>` is the trace file's identity: its absolute path, device, inode, size, mtime and ctime (a same-size
edit whose mtime is put back with `touch -r` still changes the ctime), plus the rank, the salvage flag and
the tracelens version. Entries are stamped on use (the folder's mtime); after a load that wrote new entries,
the least recently used ones are removed until the cache is under its size bound
(`$TRACELENS_CACHE_MAX_BYTES`, default 10 GiB).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tracelens import schema
from tracelens._version import __version__
from tracelens.store.atomic import write_text

PARTS = ("events", "memory", "meta")
SCHEMAS = {"events": schema.EVENTS, "memory": schema.MEMORY, "meta": schema.METADATA}
#: Default bound on the cache's size in bytes (override with $TRACELENS_CACHE_MAX_BYTES).
DEFAULT_MAX_BYTES = 10 * 2**30
#: Columns of the events table with nearly one value per event (times, durations, ids): written with
#: Parquet's delta encoding instead of a dictionary (which hashes every value to find few repeats).
_EVENTS_DELTA = (
    "ts_ns",
    "dur_ns",
    "correlation",
    "external_id",
    "sequence_nr",
    "seq",
    "in_nelems",
    "out_nelems",
)
#: pq.write_table options of a cached events table: dictionaries for the columns with few distinct values,
#: delta encoding for _EVENTS_DELTA, uncompressed (docs/performance.md). Against Parquet's defaults (a
#: dictionary for every column) on a 9,100-event rank: ~20% less CPU to write, 40% smaller, as fast to read.
EVENTS_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "none",
    "use_dictionary": [
        n if n != "pg_ranks" else "pg_ranks.list.element"
        for n in schema.EVENTS.names
        if n not in _EVENTS_DELTA
    ],
    "column_encoding": dict.fromkeys(_EVENTS_DELTA, "DELTA_BINARY_PACKED"),
    # values handed to the column encoders at a time (Parquet's default: 1,024): a rank's whole column at
    # once costs ~10% less CPU to write (fewer level-encoder runs and calls). Pages are still cut at the
    # default data page size, checked per batch: a rank's usual events table is written to the same bytes,
    # and a larger one may cut its pages at other rows (any Parquet reader reads either)
    "write_batch_size": 64 * 1024,
}


@dataclass(frozen=True)
class RankParquet:
    """Where one rank's cached tables are."""

    rank: int
    events: Path
    memory: Path
    meta: Path

    @property
    def folder(self) -> Path:
        return self.events.parent


# ------------------------------------------------------------------------------------------ location
def default_cache_dir() -> Path:
    """`$TRACELENS_CACHE_DIR`, else `$XDG_CACHE_HOME/tracelens`, else `~/.cache/tracelens`."""
    env = os.environ.get("TRACELENS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "tracelens"


def writable_dir(d: Path) -> bool:
    """Create `d` if needed and check that a file can be written there."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def open_cache(cache_dir: str | Path | None = None) -> Path | None:
    """The cache root (`cache_dir`, else `default_cache_dir()`), or None when it cannot be written."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root if writable_dir(root) else None


def existing_cache(cache_dir: str | Path | None = None) -> Path | None:
    """The cache root when it already exists (nothing is created)."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root if root.is_dir() else None


# ------------------------------------------------------------------------------------------- keys
@functools.lru_cache(maxsize=256)
def _real_dir(d: str) -> str:
    return os.path.realpath(d)


def real_path(path: Path) -> str:
    """`str(path.resolve())`, with the folder's real path looked up once per folder: a run's traces share
    one, and resolving each file walks every component of its path (~0.3 ms a file)."""
    s = os.fspath(path)
    # (split as text, not parsed by pathlib: this runs ~3 times per trace file)
    parts = (s.replace(os.altsep, os.sep) if os.altsep else s).split(os.sep)
    if ".." in parts:  # (".." after a folder link is resolved from the link's target)
        return os.path.realpath(s)
    p = os.path.abspath(s)
    if os.path.islink(p):
        return os.path.realpath(p)
    head, name = os.path.split(p)
    if name in ("", ".", ".."):
        return os.path.realpath(p)
    return os.path.join(_real_dir(head), name)


def file_identity(path: Path) -> str:
    """What identifies one version of a file: absolute path, device, inode, size, mtime and ctime."""
    st = path.stat()
    return "|".join(
        map(str, (real_path(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    )


def cache_key(path: Path, rank: int, salvage: bool = False) -> str:
    """Key of one trace file's cache entry (see the module docstring)."""
    text = "|".join([file_identity(path), str(rank), __version__, str(salvage)])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


@functools.cache
def code_digest() -> str:
    """A digest of the source of every module of this tracelens: part of the key of results the cache keeps
    of a whole analysis step (`store.runs.read_graph`), so that any change of the code that computed them,
    released or not, is another key."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1(__version__.encode())
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:20]


def entry(root: Path, path: Path, rank: int, salvage: bool = False, scratch: bool = False) -> RankParquet:
    """The cache entry of one rank's trace under `root` (nothing is created). `scratch`: an entry of a
    load without cache (a temporary folder, removed with the run): its events are Arrow IPC too."""
    d = os.path.join(root, "entries", cache_key(path, rank, salvage), f"rank{rank}.")
    # (joined as text, one Path each: pathlib's `/` parses both sides, ~4 Paths per rank). The events are
    # Parquet (encoded: ~6% of the JSON); the two small tables are Arrow IPC, which costs a quarter as much to
    # write and to open as a Parquet file of a few rows (two of each per rank of a 1,024-rank run). In a
    # scratch folder the events are IPC as well: ~4x faster to write, ~20x the bytes, read back memory-mapped.
    ev = "events.arrow" if scratch else "events.parquet"
    return RankParquet(rank, Path(d + ev), Path(d + "memory.arrow"), Path(d + "meta.arrow"))


def valid_entry(e: RankParquet) -> bool:
    """Cheap check (footers only): all three files exist and carry the expected schemas."""
    for part in PARTS:
        try:
            if not _schema_of(getattr(e, part)).equals(SCHEMAS[part]):
                return False
        except (OSError, pa.ArrowException, ValueError):
            return False
    return True


def _schema_of(p: Path) -> pa.Schema:
    """The schema in a cached file's footer (Parquet or Arrow IPC, by its suffix)."""
    return ipc_schema(p) if p.suffix == ".arrow" else pq.read_schema(p)


# ------------------------------------------------------------------------------------------ reading
def read_parquet(p: Path) -> pa.Table:
    """A whole Parquet file (raises OSError / ArrowException when missing or damaged)."""
    with pq.ParquetFile(p) as f:
        return f.read()


def read_small(p: Path) -> pa.Table:
    """A whole small Arrow IPC file, read into memory (no mapping kept: a 1,024-rank run has a metadata
    file per rank); raises OSError / ArrowException when missing or damaged."""
    with pa.OSFile(str(p)) as f:
        return pa.ipc.open_file(f).read_all()


def read_ipc(p: Path) -> pa.Table:
    """A whole Arrow IPC file, memory-mapped (raises OSError / ArrowException when missing or damaged); its
    resident pages can be given back between uses (`store.pages.release`)."""
    from tracelens.store import pages

    with pa.memory_map(str(p)) as src:
        return pages.track(pa.ipc.open_file(src).read_all(), src)


def ipc_schema(p: Path) -> pa.Schema:
    """The schema of an Arrow IPC file (its footer only)."""
    with pa.memory_map(str(p)) as src:
        return pa.ipc.open_file(src).schema


def read_checked(p: Path, part: str, columns: list[str] | None = None) -> pa.Table | None:
    """A cached table (only `columns`, in that order, when given), or None when missing, unreadable or of
    another schema (then it is rebuilt).

    Columns that the file's statistics say are entirely null (the collective fields of most events) are not
    decoded: they are built as null arrays over one shared zero buffer, which saves decoding them and, in a
    fresh process, faulting in their memory (a quarter of a cached reload)."""
    if p.suffix == ".arrow":  # (the small parts, and a scratch entry's events: Arrow IPC)
        try:
            t = read_ipc(p) if part == "events" else read_small(p)
        except (OSError, pa.ArrowException, ValueError):
            return None
        if not t.schema.equals(SCHEMAS[part]):
            return None
        return t if columns is None else t.select(columns)
    try:
        # a memory-mapped source: no read() copies of the pages, and steadier than a path in a fresh process
        with pa.memory_map(str(p)) as src, pq.ParquetFile(src) as f:  # lighter than pq.read_table
            if not f.schema_arrow.equals(SCHEMAS[part]):
                return None
            sch = f.schema_arrow if columns is None else pa.schema([f.schema_arrow.field(c) for c in columns])
            empty = _all_null_columns(f.metadata) & set(sch.names)
            if not empty:
                return f.read(columns=columns)
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


def concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    """Tables of one schema as one, dictionaries unified (the schema's empty table when none)."""
    if not tables:
        return sch.empty_table()
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return t.unify_dictionaries().combine_chunks()


def read_part(entries: Iterable[RankParquet], part: str, columns: list[str] | None = None) -> pa.Table:
    """One part ("events", "memory" or "meta") of these entries as one table (only `columns`, when given);
    several files are read concurrently (the Parquet reader releases the GIL). OSError when one is missing
    or corrupt."""
    paths = [getattr(e, part) for e in entries]
    if len(paths) <= 1:
        tabs = [read_checked(p, part, columns) for p in paths]
    else:
        with ThreadPoolExecutor(min(4, len(paths))) as ex:
            tabs = list(ex.map(lambda p: read_checked(p, part, columns), paths))
    for p, t in zip(paths, tabs):
        if t is None:
            raise OSError(f"cache entry {p} vanished or is corrupt")
    sch = SCHEMAS[part] if columns is None else pa.schema([SCHEMAS[part].field(c) for c in columns])
    return concat([t for t in tabs if t is not None], sch)


# ---------------------------------------------------------------------------------- discovery memo
def _memo_path(root: Path, run_dir: Path) -> Path:
    return root / "memo" / (hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:20] + ".json")


def load_memo(root: Path | None, run_dir: Path) -> dict[str, Any]:
    """What discovery read from each trace of `run_dir` on an earlier load, or an empty memo."""
    if root is None:
        return {}
    try:
        doc = json.loads(_memo_path(root, run_dir).read_bytes())
    except (OSError, ValueError):
        return {}
    if isinstance(doc, dict) and doc.get("version") == __version__ and isinstance(doc.get("files"), dict):
        files: dict[str, Any] = doc["files"]
        return files
    return {}


def save_memo(root: Path, run_dir: Path, memo: dict[str, Any]) -> None:
    """Write the memo back (a cache that cannot take it: discovery just reads the files again next time)."""
    with contextlib.suppress(OSError):
        write_text(_memo_path(root, run_dir), json.dumps({"version": __version__, "files": memo}))


# ------------------------------------------------------------------------------------------ LRU
def touch(entries: Iterable[RankParquet]) -> None:
    """Stamp entries as just used (their folder's mtime: what eviction orders by)."""
    now = time.time()
    for e in entries:
        with contextlib.suppress(OSError):
            os.utime(e.folder, (now, now))


def max_bytes() -> int:
    """The cache's size bound: `$TRACELENS_CACHE_MAX_BYTES`, else DEFAULT_MAX_BYTES."""
    try:
        return int(os.environ.get("TRACELENS_CACHE_MAX_BYTES", "") or DEFAULT_MAX_BYTES)
    except ValueError:
        return DEFAULT_MAX_BYTES


def _size(d: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(d):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, n)).st_size
    return total


def evict(root: Path, limit: int | None = None, keep: Iterable[Path] = ()) -> list[Path]:
    """Remove least recently used entries until the entries under `root` take at most `limit` bytes
    (default `max_bytes()`); the folders in `keep` (the run just loaded) stay. Returns what was removed."""
    limit = max_bytes() if limit is None else limit
    base = root / "entries"
    try:
        dirs = [d for d in base.iterdir() if d.is_dir()]
    except OSError:
        return []
    stamped = []
    for d in dirs:
        try:
            stamped.append((d.stat().st_mtime, d, _size(d)))
        except OSError:
            continue
    total = sum(s for _, _, s in stamped)
    kept = {Path(k).resolve() for k in keep}
    removed = []
    for _, d, s in sorted(stamped, key=lambda t: t[0]):
        if total <= limit:
            break
        if d.resolve() in kept:
            continue
        shutil.rmtree(d, ignore_errors=True)
        total -= s
        removed.append(d)
    return removed


__all__ = [
    "DEFAULT_MAX_BYTES",
    "PARTS",
    "SCHEMAS",
    "RankParquet",
    "cache_key",
    "concat",
    "default_cache_dir",
    "entry",
    "evict",
    "existing_cache",
    "file_identity",
    "load_memo",
    "max_bytes",
    "open_cache",
    "ipc_schema",
    "read_checked",
    "read_ipc",
    "read_parquet",
    "read_small",
    "read_part",
    "real_path",
    "save_memo",
    "touch",
    "valid_entry",
    "writable_dir",
]
