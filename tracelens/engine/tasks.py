"""Per-rank tasks: plain module-level functions that any executor can run (a local worker, a Dask worker).

`process_rank` ingests one trace into its cache entry unless a valid entry exists, then computes and
writes the rank's stage files unless complete ones exist (always after a fresh ingest). `stage_rank` is the
stage alone, for a run loaded with its stages deferred (`tracelens.run.LoadOptions.defer_stages`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from tracelens import schema
from tracelens.engine import kept
from tracelens.ingest import kineto
from tracelens.store import pages, runs
from tracelens.store.atomic import write_ipc
from tracelens.store.cache import RankEntry, concat, read_ipc, read_part, valid_entry, write_events
from tracelens.store.stages import CHUNK_ROWS, stage_complete, write_stage, xevents_file

#: Resident memory of a process above which `process_rank` hands freed memory back after a rank (Arrow's pool
#: and malloc's, `pages.trim_heap`); below it, the next rank reuses it (a worker of the pool is ~140 MiB
#: between ranks of the 1,024-rank benchmark run: trimming after each cost ~2.5 ms a rank, in page faults).
KEEP_BYTES = 384 * 1024 * 1024


def ingest_rank(path: str, rank: int, entry: RankEntry, salvage: bool = False) -> pa.Table:
    """Read one Kineto file and write its three cache files atomically (events, allocator samples, metadata:
    Arrow IPC); returns the rank's events."""
    tr = kineto.read(path, rank=rank, salvage=salvage)
    pages.trim_heap_over(KEEP_BYTES)  # (the read's chunks, freed: handed back before the stage's arrays)
    write_events(entry, tr.events)
    write_ipc(entry.memory, tr.memory)
    write_ipc(entry.meta, kineto.metadata_table([tr.metadata]))  # last: marks the entry complete
    pages.trim_heap_over(KEEP_BYTES)  # (what compressing the events freed: ~0.08x the JSON, before the stage)
    return tr.events


def process_rank(
    path: str, rank: int, entry: RankEntry, salvage: bool, use_cache: bool, stage: bool = True
) -> int:
    """One rank's task: ingest (unless cached) and, with `stage`, the per-rank stage (unless cached);
    returns the rank. After a fresh ingest the stage is computed from the events just read."""
    events = None
    fresh = not (use_cache and valid_entry(entry))
    if fresh:
        events = ingest_rank(path, rank, entry, salvage)
    if stage and (fresh or not stage_complete(entry.events, rank)):
        from tracelens.engine.stage import compute_and_write, rank_stage  # (not for an ingest alone)

        if events is None:
            compute_and_write(str(entry.events), rank)
        else:
            write_stage(rank_stage(events, rank), entry.events)
    del events
    pages.trim_heap_over(KEEP_BYTES)  # (freed memory handed back before the next rank when it is much)
    return rank


def stage_rank(entry: RankEntry) -> int:
    """The per-rank stage of an ingested rank, unless complete stage files exist; returns the rank."""
    if not stage_complete(entry.events, entry.rank):
        from tracelens.engine.stage import compute_and_write

        compute_and_write(str(entry.events), entry.rank)
        pages.trim_heap_over(KEEP_BYTES)
    return entry.rank


def derive_rows(memo: str, lo: int, n: int, tag: str) -> dict[str, str | None]:
    """The run memo's derived tables (`store.runs.DERIVED`) of rows [lo, lo + n) of its cross-rank events (a
    slice of whole ranks), each written to `<memo>/<tag>.<name>.arrow`; name -> that path, or None for a table
    whose computation failed on these events (the memo then goes without it)."""
    x = read_ipc(Path(memo) / "xevents.arrow").slice(lo, n)
    out = _derive_slice(x, memo, tag)
    del x
    pages.trim_heap()
    return out


def derive_stages(
    entries: list[RankEntry], folder: str, tag: str, rows: int = CHUNK_ROWS
) -> list[dict[str, str | None]]:
    """The run memo's derived tables (`store.runs.DERIVED`) of these ranks, from their stage files' cross-rank
    events (what the memo's `xevents` holds of them): the ranks taken in order, in slices of whole ranks of
    at least `rows` rows (the last one shorter), each slice's tables written as `derive_rows` writes them
    (`<folder>/<tag>-<k>.<name>.arrow`). One dict a slice, in order. Raises OSError / ArrowException when a
    stage file is missing or damaged (the parts already written removed)."""
    out: list[dict[str, str | None]] = []
    group: list[pa.Table] = []
    held = 0

    def flush() -> None:
        x = concat(group, schema.EVENTS)
        for t in group:
            pages.release(t)
        group.clear()
        out.append(_derive_slice(x, folder, f"{tag}-{len(out)}"))

    try:
        for e in entries:
            t = read_ipc(xevents_file(e.events, e.rank))
            if not t.schema.equals(schema.EVENTS):
                raise OSError(f"stage files of rank {e.rank} have another schema")
            group.append(t)
            held += t.num_rows
            if held >= rows:
                flush()
                held = 0
        if group or not out:
            flush()
    except BaseException:  # (the parts written so far removed: the caller gets none of them)
        remove_parts(out)
        raise
    pages.trim_heap()
    return out


def _derive_slice(x: pa.Table, folder: str, tag: str) -> dict[str, str | None]:
    """Each derived table of the cross-rank events `x` (whole ranks) written to `<folder>/<tag>.<name>.arrow`;
    name -> that path, or None for a table whose computation failed on these events."""
    out: dict[str, str | None] = {}
    for name in runs.DERIVED:
        try:
            t = kept.derive(name, x)
        except Exception:  # noqa: BLE001 (the memo goes without it; the analysis reports it)
            out[name] = None
            continue
        path = Path(folder) / f"{tag}.{name}.arrow"
        write_ipc(path, t)
        out[name] = str(path)
        del t
    return out


def remove_parts(parts: Iterable[dict[str, str | None] | None]) -> None:
    """Remove the part files that `derive_rows` / `derive_stages` wrote (name -> path, per slice)."""
    for part in parts:
        for path in (part or {}).values():
            if path is not None:
                with contextlib.suppress(OSError):
                    Path(path).unlink()


def gather_memory(entries: list[RankEntry], out: str) -> str | None:
    """The allocator samples of these entries (schema.MEMORY, in their order) written to `out` (an Arrow IPC
    file); `out`, or None when one cannot be read."""
    try:
        t = read_part(entries, "memory")
    except (OSError, pa.ArrowException, ValueError):
        return None
    write_ipc(out, t)
    del t
    pages.trim_heap()
    return out


def needs_work(entry: RankEntry, use_cache: bool, stage: bool = True) -> bool:
    """True when `process_rank` (with this `stage`) has something to do for this entry."""
    if not (use_cache and valid_entry(entry)):
        return True
    return stage and not stage_complete(entry.events, entry.rank)


__all__ = [
    "derive_rows",
    "derive_stages",
    "gather_memory",
    "ingest_rank",
    "needs_work",
    "process_rank",
    "remove_parts",
    "stage_rank",
]
