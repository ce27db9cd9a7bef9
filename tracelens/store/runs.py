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
from typing import Any

import numpy as np
import pyarrow as pa

from tracelens import schema
from tracelens.schema import BREAKDOWN, RankSets
from tracelens.store.arrays import read_arrays, text_digest, write_arrays
from tracelens.store.atomic import write_ipc, write_later, write_text
from tracelens.store.cache import RankEntry, code_digest, ipc_schema, read_ipc
from tracelens.store.stages import (
    OPS,
    SETS,
    STAGE_VERSION,
    STORED_NODES,
    Staged,
    rank_sets,
    sets_rows,
)

#: Bump when what a memo holds changes (with STAGE_VERSION it is part of the key).
RUN_MEMO_VERSION = "6"
_TIME_RANGES = pa.schema([("rank", pa.int32()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64())])
#: Per row of the cross-rank events: `classify.comm_launched` (the launch links' verdict, one lookup a row).
XFLAGS = pa.schema([("comm_launched", pa.bool_())])


def run_key(entries: Sequence[RankEntry]) -> str:
    text = "\n".join(
        [f"v{STAGE_VERSION}.{RUN_MEMO_VERSION}"] + [f"{e.rank} {e.folder.name}" for e in entries]
    )
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def memo_dir(entries: Sequence[RankEntry]) -> Path:
    return entries[0].folder / f"run-{run_key(entries)}"


def _schemas() -> dict[str, pa.Schema]:
    return {
        "meta": schema.METADATA,
        "xevents": schema.EVENTS,
        "breakdown": BREAKDOWN,
        "spans": schema.SPANS,
        "ops": OPS.append(pa.field("rank", pa.int32())),
        "idle": schema.IDLE,
        "time_ranges": _TIME_RANGES,
        "sets": SETS,
        "nodes": STORED_NODES,
        "syncs": schema.SYNCS,
        "collectives": schema.COLLECTIVES,
        "xflags": XFLAGS,
        "pg": schema.PG_ROWS,
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
        flags = t["xflags"].column("comm_launched").to_numpy() if "xflags" in t else None
        if flags is not None and flags.shape != (t["xevents"].num_rows,):  # (one row per cross-rank event)
            return None
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
            xflags=flags,
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


def read_graph_arrays(
    memo: Path, key: str, own: Callable[[str], bool] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays and metadata `write_graph_state` kept under `key` in the run memo `memo`, memory-mapped but
    those `own` names (read into memory of their own); None when there are none or they cannot be read."""
    try:
        return read_arrays(memo / f"graph-{key}.bin", own=own)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def write_graph_state(memo: Path, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Keep a graph's arrays and metadata in the run memo `memo` under `key`, in place of any graph kept before.
    OSError when the cache cannot take it."""
    _write_graph_state(memo, key, arrays, meta)


def write_graph_state_later(
    memo: Path, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]
) -> Future[None]:
    """`write_graph_state` in a thread of its own, started here (`atomic.write_later`)."""
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


#: The tables derived from the cross-rank events that the memo keeps (computed by `engine.kept.derive`).
DERIVED = ("collectives", "xflags", "pg")


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
    "XFLAGS",
    "read_graph_arrays",
    "write_graph_state",
    "write_graph_state_later",
    "sets_table",
    "memo_dir",
    "read_memory",
    "read_run",
    "run_key",
]
