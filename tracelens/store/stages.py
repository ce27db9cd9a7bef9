"""Stage files: one rank's per-rank stage results (`RankStage`) in two files beside its ingest cache entry
(`<entry>/stage-<STAGE_VERSION>/`), read on every cold run: `rank<r>.xevents.arrow`, the cross-rank events (an
Arrow IPC file), and `rank<r>.stage`, the seven other tables in one file.

The stage file holds its tables (`_PARTS`) as Arrow IPC file images, each kept as a byte array in the cache's
array file (`store.arrays`: a JSON header, then each array at an offset aligned to 64 bytes). It is read
memory-mapped (read only: its pages can be given back, `store.pages`), each table a zero-copy view of its
image: two files to open a rank instead of eight (at 1,024 ranks 2,048 instead of 8,192; opening a file costs
~0.14 ms, reading a table from a mapped image ~0.02 ms). The cross-rank events stay a file of their own: the
reduction reads that table of every rank at once, and reading a page of a mapped file maps the cached pages
around it too (the page cache's large folios), so in a shared file the other tables' pages would count as well
(at 1,024 ranks ~250 MiB more file pages resident while concatenating the events, ~110 MiB more at the cold
run's peak). Each file is written atomically (`store.atomic`), the stage file last: a stage file that exists marks
a complete stage; `STAGE_VERSION` in the folder name retires old ones.

Written by the per-rank task (`tracelens.engine.tasks`), read back by `tracelens.run.load_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracelens import schema
from tracelens.schema import BREAKDOWN, IDLE, NODES, SPANS, SYNCS, RankSets
from tracelens.store import pages
from tracelens.store.arrays import layout, write_arrays
from tracelens.store.atomic import write_ipc
from tracelens.store.cache import read_ipc

#: Bump when what a stage file holds changes: old stage files are then ignored (and rebuilt).
STAGE_VERSION = "10"

#: Interval-set table: one row per interval of one class of one rank.
SETS = pa.schema([("rank", pa.int32()), ("cls", pa.int8()), ("start_ns", pa.int64()), ("end_ns", pa.int64())])
SET_CLASSES = {"compute": 0, "comm": 1, "memory": 2}
#: Per-rank totals of kernels and cpu ops by name (the report's "top operations" without all events).
OPS = pa.schema([("kind", pa.string()), ("name", pa.string()), ("calls", pa.int64()), ("dur_ns", pa.int64())])
#: The critical path's device nodes as stored (critical_nodes.NODES with the label dictionary-encoded).
STORED_NODES = pa.schema(
    [f if f.name != "label" else pa.field("label", pa.dictionary(pa.int32(), pa.string())) for f in NODES]
)
_PARTS = ("nodes", "syncs", "spans", "breakdown", "ops", "idle", "sets")


@dataclass
class RankStage:
    """Per-rank results (see the module docstring). `path` is "gpu" or "cpu" (None: no events);
    `has_steps`: the rank has `ProfilerStep#N` windows; `spans_error`: why module_spans failed, if it did;
    `time_range`: for `tracelens.run.check_time_ranges` (traces of different runs in one folder)."""

    rank: int
    breakdown: pa.Table
    sets: RankSets | None
    spans: pa.Table | None
    xevents: pa.Table
    has_steps: bool
    spans_error: str | None = None
    time_range: tuple[int, int] | None = None  # (first event start, last event end), ns; None: no events
    ops: pa.Table | None = None  # OPS: calls and total duration per (kind, name), kernels and cpu ops
    idle: pa.Table | None = None  # analyze.rank.idle.IDLE rows (empty on CPU-timeline ranks)
    idle_error: str | None = None  # why idle_breakdown failed on this rank, if it did
    nodes: pa.Table | None = (
        None  # STORED_NODES: the critical path's device nodes (critical_nodes.rank_nodes)
    )
    syncs: pa.Table | None = None  # critical_nodes.SYNCS: the CPU calls that may have blocked on the GPU
    nodes_stepped: bool = False  # some device work of the rank has a step (see critical_nodes.select_nodes)


@dataclass
class Staged:
    """The reduced per-rank results of a whole run (what `Analysis` reads instead of the events table).

    `sets`: rank -> RankSets; `breakdown`: BREAKDOWN rows of all ranks; `spans`: SPANS rows of all ranks,
    or None with `spans_error` when a rank's module_spans failed; `xevents`: the cross-rank event rows of
    all ranks (events schema, rank order, trace order within a rank); `idle`: IDLE rows of the ranks whose
    breakdown rows are kept (what `idle_breakdown` gives over all events and `breakdown`), or the first
    failure in `idle_error`; `nodes` / `syncs`: the critical path's inputs of all ranks (STORED_NODES, SYNCS),
    `nodes_stepped`: the ranks whose device work has steps; `collectives`: the COLLECTIVES rows of `xevents`
    (`engine.kept.cross_collectives`); `pg`: what the grid inference reads of them (`engine.kept.grid_rows`)."""

    sets: dict[int, RankSets]
    breakdown: pa.Table
    spans: pa.Table | None
    xevents: pa.Table
    spans_error: str | None = None
    time_ranges: pa.Table | None = None  # rank, ts_ns (first start), dur_ns (to the last end)
    ops: pa.Table | None = None  # stage.OPS of all ranks plus their "rank" column
    idle: pa.Table | None = None
    idle_error: str | None = None
    nodes: pa.Table | None = None
    syncs: pa.Table | None = None
    nodes_stepped: tuple[int, ...] = ()
    # (nodes, syncs) read on each call instead of kept (the run memo's: `critical_inputs`)
    load_critical: Callable[[], tuple[pa.Table, pa.Table]] | None = field(default=None, repr=False)
    collectives: pa.Table | None = field(default=None, repr=False)
    pg: pa.Table | None = field(default=None, repr=False)  # `engine.kept.grid_rows`
    # the memo's launch flags of the cross-rank events, one a row (`engine.kept.apply_flags` takes them)
    xflags: np.ndarray | None = field(default=None, repr=False)
    # the run memo these stages were read from, and a digest of its manifest (None / "": not from a memo)
    memo: Path | None = field(default=None, repr=False)
    memo_id: str = field(default="", repr=False)

    def release_pages(self) -> None:
        """Give back the resident pages of the memory-mapped cross-rank events, their collectives and the
        other tables of a run memo (`store.pages`) while a phase that reads none of them runs; they are read
        again from the file when next used. Freed heap memory is given back too (`pages.trim_heap`)."""
        for t in (self.xevents, self.collectives, self.pg, self.spans, self.breakdown, self.ops, self.idle):
            pages.release(t)
        pages.trim_heap()  # (and the heap freed by the phase before)

    def critical_inputs(self) -> tuple[pa.Table, pa.Table]:
        """(nodes, syncs): kept in memory, or read from the run memo at each call (memory-mapped and not kept:
        at 1,024 ranks the nodes are ~180 MB, needed only while the critical path's graph is built)."""
        if self.nodes is not None and self.syncs is not None:
            return self.nodes, self.syncs
        if self.load_critical is not None:
            return self.load_critical()
        return STORED_NODES.empty_table(), SYNCS.empty_table()


#: Rows of the cross-rank events a per-rank derivation takes at once (`by_rank_chunks`).
CHUNK_ROWS = 250_000


def rank_bounds(events: pa.Table, rows: int = CHUNK_ROWS) -> list[tuple[int, int]] | None:
    """(first row, row count) of the slices of whole ranks `rank_slices` cuts `events` into."""
    n = events.num_rows
    if n <= rows:
        return None
    r = events.column("rank").to_numpy(zero_copy_only=False)
    if (r[1:] < r[:-1]).any():
        return None
    bounds = [0]
    for s in np.flatnonzero(r[1:] != r[:-1]) + 1:  # (each rank's first row)
        if s - bounds[-1] >= rows:
            bounds.append(int(s))
    bounds.append(n)
    return [(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def rank_slices(events: pa.Table, rows: int = CHUNK_ROWS) -> list[pa.Table] | None:
    """`events` cut into slices of whole ranks of about `rows` rows each (zero-copy), in order; None when the
    table is small enough as it is or its ranks are not in blocks in ascending order."""
    bounds = rank_bounds(events, rows)
    return None if bounds is None else [events.slice(a, n) for a, n in bounds]


def by_rank_chunks(fn: Callable[[pa.Table], pa.Table], events: pa.Table, rows: int = CHUNK_ROWS) -> pa.Table:
    """`fn(events)` for an `fn` whose rows of each rank come from that rank's events alone (the cross-rank
    events' collectives, process-group rows), computed over slices of whole ranks (`rank_slices`) and put
    together (dictionaries unified, chunks combined): the same table, at the memory of one slice's work
    (at 1,024 ranks the whole table's took ~1 GB)."""
    parts = rank_slices(events, rows)
    if parts is None:
        return fn(events)
    got = [fn(p) for p in parts]
    if any(not g.schema.equals(got[0].schema) for g in got):  # (an empty part's schema differs: as one)
        return fn(events)
    return pa.concat_tables(got).unify_dictionaries().combine_chunks()


def stored_nodes(nodes: pa.Table) -> pa.Table:
    """Device nodes (critical_nodes.NODES) as stored (STORED_NODES: the label dictionary-encoded, a few
    distinct layer types over thousands of kernels a rank)."""
    i = nodes.column_names.index("label")
    return nodes.set_column(i, STORED_NODES.field("label"), nodes.column("label").dictionary_encode())


# ------------------------------------------------------------------------------------------- files
def stage_dir(events_file: Path) -> Path:
    """Folder of a rank's stage files: beside its ingest cache entry."""
    return Path(events_file).parent / f"stage-{STAGE_VERSION}"


def stage_file(events_file: Path, rank: int) -> Path:
    """A rank's stage file (module docstring): all its stage tables but the cross-rank events."""
    return stage_dir(events_file) / f"rank{rank}.stage"


def xevents_file(events_file: Path, rank: int) -> Path:
    """A rank's cross-rank events (module docstring)."""
    return stage_dir(events_file) / f"rank{rank}.xevents.arrow"


def _ipc_image(t: pa.Table) -> np.ndarray:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    return np.frombuffer(sink.getvalue(), dtype=np.uint8)


def read_stage_parts(path: Path, names: Iterable[str] = _PARTS) -> dict[str, pa.Table]:
    """Tables of a stage file by part name, zero-copy views of its read-only memory map (each tracked by
    `store.pages`: releasing one gives back the pages of the whole file). OSError when the file is missing,
    is not a stage file or is cut short; ArrowException when an image is damaged."""
    with pa.memory_map(str(path)) as src:
        size = src.size()
        whole = src.read_buffer(size)
    try:
        spans, _ = layout(lambda lo, hi: whole[lo:hi].to_pybytes(), size, path)
        where = {name: spans[name] for name in names}
    except (ValueError, KeyError) as err:
        raise OSError(f"{path}: not a whole stage file ({err})") from err
    out: dict[str, pa.Table] = {}
    for name, (_, _, start, length) in where.items():
        t = pa.ipc.open_file(whole.slice(start, length)).read_all()
        out[name] = pages.track_mapping(t, whole)
    return out


def _sets_table(st: RankStage) -> pa.Table:
    rs = st.sets
    meta = {
        b"path": (rs.path if rs is not None else "").encode(),
        b"has_steps": b"1" if st.has_steps else b"0",
        b"spans": b"1" if st.spans is not None else b"0",
        b"spans_error": (st.spans_error or "").encode(),
        b"time_range": ",".join(map(str, st.time_range or ())).encode(),
        b"idle_error": (st.idle_error or "").encode(),
        b"nodes_stepped": b"1" if st.nodes_stepped else b"0",
    }
    if rs is None:
        return SETS.empty_table().replace_schema_metadata(meta)
    return sets_rows(rs).replace_schema_metadata(meta)


def sets_rows(rs: RankSets) -> pa.Table:
    """SETS rows of one rank's interval sets: its compute, then comm, then memory intervals."""
    parts = [(SET_CLASSES[k], getattr(rs, k)) for k in ("compute", "comm", "memory")]
    starts = np.concatenate([p[1][0] for p in parts]).astype(np.int64)
    ends = np.concatenate([p[1][1] for p in parts]).astype(np.int64)
    cls = np.concatenate([np.full(p[1][0].size, p[0], np.int8) for p in parts])
    return pa.table(
        {
            "rank": pa.array(np.full(starts.size, rs.rank, np.int32)),
            "cls": pa.array(cls),
            "start_ns": pa.array(starts),
            "end_ns": pa.array(ends),
        },
        schema=SETS,
    )


def rank_sets(rank: int, path: str, rows: pa.Table) -> RankSets:
    """A rank's interval sets back from its SETS rows (`sets_rows`)."""
    cls = rows.column("cls").to_numpy()
    s = rows.column("start_ns").to_numpy()
    e = rows.column("end_ns").to_numpy()
    part = {k: (s[cls == c].copy(), e[cls == c].copy()) for k, c in SET_CLASSES.items()}
    return RankSets(rank, path, part["compute"], part["comm"], part["memory"])


def write_stage(st: RankStage, events_file: Path) -> None:
    """Write a rank's stage files atomically, the stage file (the completion mark) last."""
    write_ipc(xevents_file(events_file, st.rank), st.xevents)
    tables = {
        "nodes": st.nodes if st.nodes is not None else STORED_NODES.empty_table(),
        "syncs": st.syncs if st.syncs is not None else SYNCS.empty_table(),
        "spans": st.spans if st.spans is not None else SPANS.empty_table(),
        "breakdown": st.breakdown,
        "ops": st.ops if st.ops is not None else OPS.empty_table(),
        "idle": st.idle if st.idle is not None else IDLE.empty_table(),
        "sets": _sets_table(st),
    }
    write_arrays(stage_file(events_file, st.rank), {name: _ipc_image(tables[name]) for name in _PARTS})


def read_stage(events_file: Path, rank: int) -> RankStage:
    """Read a rank's stage files back (raises OSError / ArrowException when missing or damaged)."""
    parts = read_stage_parts(stage_file(events_file, rank))
    xev = read_ipc(xevents_file(events_file, rank))
    sets_raw = parts["sets"]
    meta = sets_raw.schema.metadata or {}
    sets_t = sets_raw.replace_schema_metadata(None)
    spans, bd, ops = parts["spans"], parts["breakdown"], parts["ops"]
    idle, nodes, syncs = parts["idle"], parts["nodes"], parts["syncs"]
    if not (nodes.schema.equals(STORED_NODES) and syncs.schema.equals(SYNCS)):
        raise OSError(f"stage files of rank {rank} have another schema")
    if not (xev.schema.equals(schema.EVENTS) and spans.schema.equals(SPANS) and bd.schema.equals(BREAKDOWN)):
        raise OSError(f"stage files of rank {rank} have another schema")
    if not (sets_t.schema.equals(SETS) and ops.schema.equals(OPS) and idle.schema.equals(IDLE)):
        raise OSError(f"stage files of rank {rank} have another schema")
    path = meta.get(b"path", b"").decode()
    rs = rank_sets(rank, path, sets_t) if path else None
    # reading them faulted their pages in: given back until the tables are read (at 1,024 ranks ~0.3 GB of the
    # stage files' pages; one table's release gives back its whole file)
    pages.release(sets_raw)
    pages.release(xev)
    err = meta.get(b"spans_error", b"").decode() or None
    tr = meta.get(b"time_range", b"").decode()
    lo_hi = tuple(int(v) for v in tr.split(",")) if tr else None
    return RankStage(
        rank,
        bd,
        rs,
        spans if meta.get(b"spans") == b"1" else None,
        xev,
        meta.get(b"has_steps") == b"1",
        err,
        lo_hi,  # type: ignore[arg-type]
        ops,
        idle,
        meta.get(b"idle_error", b"").decode() or None,
        nodes,
        syncs,
        meta.get(b"nodes_stepped") == b"1",
    )


def stage_complete(events_file: Path, rank: int) -> bool:
    """Cheap check (the header and one part): the rank's stage files were written by this STAGE_VERSION."""
    try:
        sets = read_stage_parts(stage_file(events_file, rank), ("sets",))["sets"]
        return bool(sets.schema.remove_metadata().equals(SETS))
    except (OSError, pa.ArrowException, ValueError):
        return False


__all__ = [
    "CHUNK_ROWS",
    "OPS",
    "SETS",
    "SET_CLASSES",
    "STAGE_VERSION",
    "STORED_NODES",
    "RankStage",
    "Staged",
    "by_rank_chunks",
    "rank_bounds",
    "rank_sets",
    "rank_slices",
    "read_stage",
    "sets_rows",
    "stage_complete",
    "read_stage_parts",
    "stage_dir",
    "stage_file",
    "xevents_file",
    "stored_nodes",
    "write_stage",
]
