"""The per-rank cache: where it lives, its keys, its entries, reading them back, LRU eviction.

Default place: the user cache directory (`$TRACELENS_CACHE_DIR`, else `$XDG_CACHE_HOME/tracelens`, else
`~/.cache/tracelens`), never the run folder; `--cache-dir` chooses another (shared storage for a Dask
cluster). Layout under the cache root:

    entries/<key>/rank<r>.events.arrow                    one rank's ingested events (Arrow IPC, LZ4 frames)
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

from tracelens import schema
from tracelens._version import __version__
from tracelens.store.atomic import write_ipc, write_text

PARTS = ("events", "memory", "meta")
SCHEMAS = {"events": schema.EVENTS, "memory": schema.MEMORY, "meta": schema.METADATA}
#: Default bound on the cache's size in bytes (override with $TRACELENS_CACHE_MAX_BYTES).
DEFAULT_MAX_BYTES = 10 * 2**30
#: Buffer compression of a cached events table (Arrow IPC). LZ4 frames against Parquet with dictionary and
#: delta encodings: a 9,100-event rank ~1.1 ms to write instead of ~3.1 ms and ~1.1 ms to read instead of
#: ~2.7 ms, 169 KB instead of 130 KB; a 123,000-event trace 7-8 ms to write instead of 20-26 ms, as fast to
#: read, 1.7 MB instead of 0.9 MB.
EVENTS_COMPRESSION = "lz4"


@dataclass(frozen=True)
class RankEntry:
    """Where one rank's cached tables are (all Arrow IPC files). `compressed`: the events are written with
    EVENTS_COMPRESSION (a cache entry); a scratch entry's are not (written once, read back memory-mapped,
    removed with the run)."""

    rank: int
    events: Path
    memory: Path
    meta: Path
    compressed: bool = True

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


#: The rules a salvaged entry's content follows (which steps of a cut trace are complete,
#: docs/bad-input.md): another value is another key, so an entry made under other rules is not read.
SALVAGE_RULES = "2"


def cache_key(path: Path, rank: int, salvage: bool = False) -> str:
    """Key of one trace file's cache entry (see the module docstring)."""
    text = "|".join(
        [
            file_identity(path),
            str(rank),
            __version__,
            f"{salvage}{SALVAGE_RULES if salvage else ''}",
            f"names<={schema.NAME_MAX_CHARS}",  # another bound is other names in the entry
        ]
    )
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


def entry(root: Path, path: Path, rank: int, salvage: bool = False, scratch: bool = False) -> RankEntry:
    """The cache entry of one rank's trace under `root` (nothing is created). `scratch`: an entry of a
    load without cache (a temporary folder, removed with the run): its events are not compressed."""
    d = os.path.join(root, "entries", cache_key(path, rank, salvage), f"rank{rank}.")
    # (joined as text, one Path each: pathlib's `/` parses both sides, ~4 Paths per rank). Arrow IPC: a
    # quarter of the cost of a Parquet file to write and to open for the small tables (two per rank of a
    # 1,024-rank run), a third for the events (compressed: ~4% of the JSON; uncompressed in a scratch folder,
    # ~30%, read back memory-mapped).
    return RankEntry(
        rank, Path(d + "events.arrow"), Path(d + "memory.arrow"), Path(d + "meta.arrow"), not scratch
    )


def valid_entry(e: RankEntry) -> bool:
    """Cheap check (footers only): all three files exist and carry the expected schemas."""
    for part in PARTS:
        try:
            if not _schema_of(getattr(e, part)).equals(SCHEMAS[part]):
                return False
        except (OSError, pa.ArrowException, ValueError):
            return False
    return True


def _schema_of(p: Path) -> pa.Schema:
    """The schema in a cached file's footer."""
    return ipc_schema(p)


# ------------------------------------------------------------------------------------------ writing
#: Key of a cached events file's schema metadata: its columns that are entirely null (comma-separated).
_ALL_NULL = b"tracelens.all_null"


def write_events(e: RankEntry, events: pa.Table) -> None:
    """Write a rank's events into its entry atomically (compressed unless a scratch entry), noting in the
    file's schema metadata the flat columns that are entirely null (the collective fields of most events):
    `read_checked` builds those instead of decompressing them."""
    n = events.num_rows
    empty = [
        f.name
        for f, col in zip(events.schema, events.columns)
        if n and col.null_count == n and not pa.types.is_nested(f.type)
    ]
    if empty:
        events = events.replace_schema_metadata({_ALL_NULL: ",".join(empty).encode()})
    write_ipc(e.events, events, EVENTS_COMPRESSION if e.compressed else None)


# ------------------------------------------------------------------------------------------ reading
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


def read_checked(
    p: Path, part: str, columns: list[str] | None = None, mapped: bool = False
) -> pa.Table | None:
    """A cached table (only `columns`, in that order, when given), or None when missing, unreadable or of
    another schema (then it is rebuilt). `mapped`: an uncompressed events file (a scratch entry's), read
    memory-mapped.

    Of a compressed events file only the wanted columns are decompressed, and not those that `write_events`
    noted entirely null (the collective fields of most events): they are built as null arrays over one
    shared zero buffer, which saves decompressing them and, in a fresh process, faulting in their memory."""
    try:
        if part != "events":
            t = read_small(p)
            if not t.schema.equals(SCHEMAS[part]):
                return None
            return t if columns is None else t.select(columns)
        if mapped:
            t = read_ipc(p)
            if not t.schema.equals(SCHEMAS[part]):
                return None
            t = t.replace_schema_metadata(None)
            return t if columns is None else t.select(columns)
        with pa.OSFile(str(p)) as f:
            full = pa.ipc.open_file(f).schema
            if not full.equals(SCHEMAS[part]):
                return None
            names = full.names if columns is None else columns
            empty = set((full.metadata or {}).get(_ALL_NULL, b"").decode().split(",")) & set(names)
            if not empty and columns is None:
                f.seek(0)
                return pa.ipc.open_file(f).read_all().replace_schema_metadata(None)
            keep = [full.get_field_index(c) for c in names if c not in empty]
            f.seek(0)
            t = pa.ipc.open_file(f, options=pa.ipc.IpcReadOptions(included_fields=keep)).read_all()
    except (OSError, pa.ArrowException, ValueError, KeyError):
        return None
    sch = pa.schema([full.field(c) for c in names])
    n = t.num_rows
    zero = pa.py_buffer(bytes(8 * (n + 1)))  # zero-filled lazily by the OS: no page is touched
    cols = [t.column(c) if c not in empty else _null_array(sch.field(c).type, n, zero) for c in names]
    return pa.Table.from_arrays(cols, schema=sch)


def _null_array(tp: pa.DataType, n: int, zero: pa.Buffer) -> pa.Array:
    """n nulls of type `tp` over the shared zero buffer (validity bits 0, values / offsets / indices 0)."""
    if pa.types.is_dictionary(tp):
        idx = pa.Array.from_buffers(tp.index_type, n, [zero, zero], null_count=n)
        return pa.DictionaryArray.from_arrays(idx, pa.array([], tp.value_type))
    if pa.types.is_primitive(tp) and tp.bit_width <= 64:
        return pa.Array.from_buffers(tp, n, [zero, zero], null_count=n)
    return pa.nulls(n, tp)


def concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    """Tables of one schema as one, dictionaries unified (the schema's empty table when none)."""
    if not tables:
        return sch.empty_table()
    t = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return t.unify_dictionaries().combine_chunks()


def read_part(entries: Iterable[RankEntry], part: str, columns: list[str] | None = None) -> pa.Table:
    """One part ("events", "memory" or "meta") of these entries as one table (only `columns`, when given);
    several files are read concurrently (decompression releases the GIL). OSError when one is missing or
    corrupt."""
    entries = list(entries)
    paths = [getattr(e, part) for e in entries]
    mapped = [part == "events" and not e.compressed for e in entries]
    if len(paths) <= 1:
        tabs = [read_checked(p, part, columns, m) for p, m in zip(paths, mapped)]
    else:
        with ThreadPoolExecutor(min(4, len(paths))) as ex:
            tabs = list(ex.map(lambda pm: read_checked(pm[0], part, columns, pm[1]), zip(paths, mapped)))
    for p, t in zip(paths, tabs):
        if t is None:
            raise OSError(f"cache entry {p} vanished or is corrupt")
    sch = SCHEMAS[part] if columns is None else pa.schema([SCHEMAS[part].field(c) for c in columns])
    return concat([t for t in tabs if t is not None], sch)


def remove_incomplete(root: Path, files: Iterable[Any], salvage: bool) -> None:
    """Remove the entries of these trace files that are not complete (no metadata file: a load stopped while
    writing them, e.g. on a full disk), so that nothing half-written stays in the cache."""
    for f in files:
        if getattr(f, "rank", None) is None:
            continue
        with contextlib.suppress(OSError):
            e = entry(root, Path(f.path), int(f.rank), salvage)
            if os.path.isdir(e.folder) and not os.path.exists(e.meta):
                shutil.rmtree(e.folder, ignore_errors=True)


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
def touch(entries: Iterable[RankEntry]) -> None:
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
    "RankEntry",
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
    "read_small",
    "read_part",
    "real_path",
    "save_memo",
    "touch",
    "valid_entry",
    "writable_dir",
]
