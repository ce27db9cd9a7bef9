"""The run memo: a cached run's metadata and reduced per-rank stages (`Staged`) kept together, so that
opening the run again reads a handful of files instead of seven per rank (at 1,024 ranks that is ~7,000
file opens and ~4 ms of footers and schema checks per rank).

The memo of a set of cache entries lives in the folder of its first entry, `<entry>/run-<key>/`, where
`key` hashes every entry's folder name (each one already keys its trace's identity and read options) and
`STAGE_VERSION`. A changed, added or removed trace is another set of entries, so another key; an evicted
entry takes the memos kept in its folder with it, and a memo whose other entries are gone is not used.
`manifest.json`, written last, marks a memo complete and records the size and modification time of every
entry file; a memo whose entries changed since (rebuilt, damaged, evicted) or that is damaged itself is
not used (`read_run` returns None): the run is opened from its entries, which writes the memo again.

Beside its tables a memo keeps the critical path's dependency graph of its last analysis (`write_graph`,
`read_graph`: `graph-<key>.bin`, see `graph_key`), the one analysis result the cache holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tracelens import schema
from tracelens.analyze.breakdown import BREAKDOWN, RankSets
from tracelens.analyze.classify import comm_launched, keep_comm_launched
from tracelens.analyze.layout.groups import pg_rows_schema
from tracelens.store.arrays import read_arrays, text_digest, write_arrays
from tracelens.store.atomic import write_ipc, write_later, write_text
from tracelens.store.cache import RankEntry, code_digest, ipc_schema, read_ipc
from tracelens.store.stages import (
    OPS,
    SETS,
    STAGE_VERSION,
    STORED_NODES,
    Staged,
    by_rank_chunks,
    rank_sets,
    sets_rows,
)

if TYPE_CHECKING:
    from tracelens.analyze.critical_path import Graph
    from tracelens.analyze.critical_replay import ReplayPlan

#: Bump when what a memo holds changes (with STAGE_VERSION it is part of the key).
RUN_MEMO_VERSION = "6"
_TIME_RANGES = pa.schema([("rank", pa.int32()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64())])
#: Per row of the cross-rank events: `classify.comm_launched` (the launch links' verdict, one lookup a row).
_XFLAGS = pa.schema([("comm_launched", pa.bool_())])


def run_key(entries: Sequence[RankEntry]) -> str:
    text = "\n".join(
        [f"v{STAGE_VERSION}.{RUN_MEMO_VERSION}"] + [f"{e.rank} {e.folder.name}" for e in entries]
    )
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def memo_dir(entries: Sequence[RankEntry]) -> Path:
    return entries[0].folder / f"run-{run_key(entries)}"


def _schemas() -> dict[str, pa.Schema]:
    from tracelens.analyze.composition import SPANS
    from tracelens.analyze.critical_nodes import SYNCS
    from tracelens.analyze.idle import IDLE

    return {
        "meta": schema.METADATA,
        "xevents": schema.EVENTS,
        "breakdown": BREAKDOWN,
        "spans": SPANS,
        "ops": OPS.append(pa.field("rank", pa.int32())),
        "idle": IDLE,
        "time_ranges": _TIME_RANGES,
        "sets": SETS,
        "nodes": STORED_NODES,
        "syncs": SYNCS,
        "collectives": schema.COLLECTIVES,
        "xflags": _XFLAGS,
        "pg": pg_rows_schema(),
        "memory": schema.MEMORY,
    }


def sets_table(sets: dict[int, RankSets]) -> pa.Table:
    """All ranks' interval sets as SETS rows, in rank order."""
    if not sets:
        return SETS.empty_table()
    return pa.concat_tables([sets_rows(rs) for _, rs in sorted(sets.items())])


def _stamps(entries: Sequence[RankEntry]) -> list[list[int]]:
    """(size, mtime_ns) of every entry's three files: what tells that an entry was not changed since
    (an entry is written once, atomically; any rewrite or damage changes its stamps). OSError when one
    is gone."""
    out = []
    for e in entries:
        for p in (e.events, e.memory, e.meta):
            st = p.stat()
            out.append([st.st_size, st.st_mtime_ns])
    return out


class MemoWriter:
    """Writes the memo of these entries part by part (`put`: each table written as soon as it is made, then
    dropped by the caller; at 1,024 ranks the parts are ~0.8 GB, never all held at once), `finish` last
    (the manifest: the memo is complete). A previous manifest is removed first, so a half-rewritten memo is
    never taken for a complete one. OSError / ArrowException when the cache cannot take it."""

    def __init__(self, entries: Sequence[RankEntry]):
        self.entries = list(entries)
        self.dir = memo_dir(self.entries)
        self.parts: list[str] = []
        self.dir.mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "manifest.json").unlink()
        _remove_graphs(self.dir)  # (kept of the memo's previous contents: their key can no longer match)

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.arrow"

    def put(self, name: str, table: pa.Table | None) -> None:
        """Write one part (None: the part is left out, e.g. a derived table whose computation failed)."""
        if table is not None:
            write_ipc(self.path(name), table)
            self.parts.append(name)

    def finish(
        self,
        paths: dict[int, str],
        spans_error: str | None,
        idle_error: str | None,
        nodes_stepped: Sequence[int],
    ) -> None:
        manifest = {
            "ranks": [e.rank for e in self.entries],
            "files": _stamps(self.entries),
            "paths": {str(r): path for r, path in paths.items()},
            "parts": sorted(self.parts),
            "spans_error": spans_error,
            "idle_error": idle_error,
            "nodes_stepped": list(nodes_stepped),
        }
        write_text(self.dir / "manifest.json", json.dumps(manifest))  # last: the memo is complete


def read_memory(entries: Sequence[RankEntry]) -> pa.Table | None:
    """The allocator samples of these entries (schema.MEMORY) from their run memo, memory-mapped (one file
    instead of one file per rank), or None when the memo has none, is incomplete or is stale."""
    if not entries:
        return None
    d = memo_dir(entries)
    try:
        manifest = json.loads((d / "manifest.json").read_bytes())
        if "memory" not in manifest.get("parts", ()) or manifest.get("ranks") != [e.rank for e in entries]:
            return None
        if manifest.get("files") != _stamps(entries):
            return None
        t = read_ipc(d / "memory.arrow")
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return t if t.schema.equals(schema.MEMORY) else None


def read_run(entries: Sequence[RankEntry]) -> tuple[pa.Table, Staged] | None:
    """(metadata, reduced stages) of these entries from their memo, or None when there is no complete,
    readable memo of them or an entry file changed since it was written."""
    if not entries:
        return None
    d = memo_dir(entries)
    try:
        raw = (d / "manifest.json").read_bytes()
        manifest = json.loads(raw)
        if manifest.get("ranks") != [e.rank for e in entries]:
            return None
        if manifest.get("files") != _stamps(entries):  # evicted, rebuilt or damaged since
            return None
        sch = _schemas()
        t = {}
        for name in manifest["parts"]:
            if name in _LAZY:
                continue
            if name in _ON_DEMAND:  # (only their schemas now: `_critical_loader`)
                if not ipc_schema(d / f"{name}.arrow").equals(sch[name]):
                    return None
                continue
            t[name] = read_ipc(d / f"{name}.arrow")
            if not t[name].schema.equals(sch[name]):
                return None
        if not set(_ON_DEMAND) <= set(manifest["parts"]):
            return None
        if "xflags" in t:  # (one row per cross-rank event)
            keep_comm_launched(t["xevents"], t["xflags"].column("comm_launched").to_numpy())
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return (
        t["meta"],
        Staged(
            sets=_rank_sets(t["sets"], {int(k): v for k, v in manifest["paths"].items()}),
            breakdown=t["breakdown"],
            spans=t.get("spans"),
            xevents=t["xevents"],
            spans_error=manifest.get("spans_error"),
            time_ranges=t.get("time_ranges"),
            ops=t.get("ops"),
            idle=t.get("idle"),
            idle_error=manifest.get("idle_error"),
            nodes_stepped=tuple(int(r) for r in manifest.get("nodes_stepped", ())),
            load_critical=_critical_loader(d),
            collectives=t.get("collectives"),  # (absent: computing them failed; the analysis tries again)
            pg=t.get("pg"),
            memo=d,
            memo_id=hashlib.sha1(raw).hexdigest()[:20],
        ),
    )


# ------------------------------------------------------------------------------- the critical path's graph
#: The graph a run memo keeps: `graph-<key>.bin` in its folder (`store.arrays`), one at a time.
_GRAPH_GLOB = "graph-*.bin"


def graph_key(memo_id: str, *inputs: str) -> str:
    """Key of the graph built from a memo's tables (`memo_id`: `Staged.memo_id`) with these other inputs
    (the analysis' rank selection, layer rule, stage map, clock offsets, matched collectives, as text), by
    this code (`cache.code_digest`)."""
    return text_digest([code_digest(), memo_id, *inputs])[:20]


def read_graph(memo: Path, key: str) -> Graph | None:
    """The graph `write_graph` kept under `key` in the run memo `memo`, memory-mapped, its replay plan kept with
    it when the file has one (`critical_path.plan_of` takes it); None when there is none or it cannot be read
    (damaged, cut short, of another layout)."""
    from tracelens.analyze.dictcol import per_object  # (the graph's modules: only for the analysis)
    from tracelens.analyze.graph_state import graph_from_state, is_plan_array, plan_from_state

    try:
        # (the plan's arrays in memory of their own: the what-if drops the plan, and its ~70 MB are handed
        # back then, where touched pages of the mapping would stay resident as long as the graph)
        arrays, meta = read_arrays(memo / f"graph-{key}.bin", own=is_plan_array)
        g = graph_from_state(arrays, meta)
        plan = plan_from_state(arrays)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if plan is not None:
        per_object(g)["replay_plan"] = plan
    return g


def write_graph(memo: Path, key: str, g: Graph, plan: ReplayPlan | None = None) -> None:
    """Keep `g` (and its replay plan `plan`, when given) in the run memo `memo` under `key`, in place of any
    graph kept before. OSError when the cache cannot take it."""
    from tracelens.analyze.graph_state import graph_state

    arrays, meta = graph_state(g, plan)
    _write_graph_state(memo, key, arrays, meta)


def write_graph_later(memo: Path, key: str, g: Graph, plan: ReplayPlan | None = None) -> Future[None]:
    """`write_graph` in a thread of its own, started here: the future is done when the file is (its
    exception: what went wrong other than an OSError). The graph's state is taken now (`graph_state`: the
    arrays themselves, not copies), so later changes of what `g` holds by reference (its plan dropped, its
    per-object memo) do not reach the file; nothing the analysis does changes an array in place. The file is
    written while the caller replays the graph: the writes release the GIL, and at 1,024 ranks they take
    ~0.9 s. A cache that cannot take the graph is no error (OSError:
    the future's result is None, as `write_graph`'s callers drop it): it is built again next time."""
    from tracelens.analyze.graph_state import graph_state

    arrays, meta = graph_state(g, plan)
    return write_later("tracelens-graph-write", lambda: _write_graph_state(memo, key, arrays, meta))


def _write_graph_state(memo: Path, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    dest = memo / f"graph-{key}.bin"
    write_arrays(dest, arrays, meta)
    _remove_graphs(memo, keep=dest.name)


def _remove_graphs(memo: Path, keep: str = "") -> None:
    for p in memo.glob(_GRAPH_GLOB):
        if p.name != keep:
            with contextlib.suppress(OSError):
                p.unlink()


#: The tables derived from the cross-rank events that the memo keeps (`derive`).
DERIVED = ("collectives", "xflags", "pg")


def derive(name: str, xevents: pa.Table) -> pa.Table:
    """One derived table (`DERIVED`) of cross-rank events whose rows of each rank come from that rank's events
    alone: `collectives_from_events` (`Staged.cross_collectives`), `_XFLAGS` (`classify.comm_launched`, the
    launch links' verdict per row) or `layout.groups.pg_rows` (`Staged.grid_rows`). Raises what those
    raise on odd events."""
    if name == "collectives":
        from tracelens.analyze.collectives import collectives_from_events

        return collectives_from_events(xevents)
    if name == "pg":
        from tracelens.analyze.layout.groups import pg_rows

        return pg_rows(xevents)
    if name == "xflags":
        return pa.table({"comm_launched": pa.array(comm_launched(xevents), pa.bool_())}, schema=_XFLAGS)
    raise KeyError(name)


def derive_or_none(name: str, xevents: pa.Table) -> pa.Table | None:
    """`derive` over slices of whole ranks (`stages.by_rank_chunks`, at the memory of one slice's work), or
    None when that fails on odd events: then the memo goes without it and the analysis computes it itself,
    where the failure is reported as it would be without a memo."""
    try:
        return by_rank_chunks(lambda part: derive(name, part), xevents)
    except Exception:
        return None


#: Parts read when asked for, not when the memo is opened (`Staged.critical_inputs`).
_ON_DEMAND = ("nodes", "syncs")
#: Optional parts read when asked for (`read_memory`), their schemas checked then.
_LAZY = ("memory",)


def _critical_loader(d: Path) -> Callable[[], tuple[pa.Table, pa.Table]]:
    def load() -> tuple[pa.Table, pa.Table]:
        sch = _schemas()
        nodes, syncs = read_ipc(d / "nodes.arrow"), read_ipc(d / "syncs.arrow")
        if not (nodes.schema.equals(sch["nodes"]) and syncs.schema.equals(sch["syncs"])):
            raise OSError(f"the run memo {d} changed since it was opened")
        return nodes, syncs

    return load


def _rank_sets(sets: pa.Table, paths: dict[int, str]) -> dict[int, RankSets]:
    """rank -> RankSets from SETS rows in rank order (what `stages.read_stage` gives per rank)."""
    rank = sets.column("rank").to_numpy()
    keys = np.array(list(paths), np.int64)
    los, his = np.searchsorted(rank, keys, "left").tolist(), np.searchsorted(rank, keys, "right").tolist()
    return {
        r: rank_sets(r, path, sets.slice(lo, hi - lo)) for (r, path), lo, hi in zip(paths.items(), los, his)
    }


__all__ = [
    "DERIVED",
    "RUN_MEMO_VERSION",
    "MemoWriter",
    "derive",
    "derive_or_none",
    "sets_table",
    "memo_dir",
    "read_memory",
    "read_run",
    "run_key",
]
