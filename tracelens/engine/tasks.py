"""Per-rank tasks: plain module-level functions that any executor can run (a local worker, a Dask worker).

`process_rank` ingests one trace into its cache entry unless a valid entry exists, then computes and
writes the rank's stage files unless complete ones exist (always after a fresh ingest). `stage_rank` is the
stage alone, for a run loaded with its stages deferred (`tracelens.run.LoadOptions.defer_stages`).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tracelens.engine.stage import compute_and_write, rank_stage
from tracelens.ingest import kineto
from tracelens.store import pages, runs
from tracelens.store.atomic import write_ipc, write_parquet
from tracelens.store.cache import EVENTS_WRITE_OPTIONS, RankParquet, read_ipc, read_part, valid_entry
from tracelens.store.stages import stage_complete, write_stage


def ingest_rank(path: str, rank: int, entry: RankParquet, salvage: bool = False) -> pa.Table:
    """Read one Kineto file and write its three Parquet files atomically; returns the rank's events."""
    tr = kineto.read(path, rank=rank, salvage=salvage)
    write_parquet(entry.events, tr.events, **EVENTS_WRITE_OPTIONS)
    write_parquet(entry.memory, tr.memory)
    write_parquet(entry.meta, kineto.metadata_table([tr.metadata]))  # last: marks the entry complete
    return tr.events


def process_rank(
    path: str, rank: int, entry: RankParquet, salvage: bool, use_cache: bool, stage: bool = True
) -> int:
    """One rank's task: ingest (unless cached) and, with `stage`, the per-rank stage (unless cached);
    returns the rank. After a fresh ingest the stage is computed from the events just read."""
    events = None
    fresh = not (use_cache and valid_entry(entry))
    if fresh:
        events = ingest_rank(path, rank, entry, salvage)
    if stage and (fresh or not stage_complete(entry.events, rank)):
        if events is None:
            compute_and_write(str(entry.events), rank)
        else:
            write_stage(rank_stage(events, rank), entry.events)
    del events
    pages.trim_heap()  # hand freed memory back before the next rank (Arrow's pool and malloc's)
    return rank


def stage_rank(entry: RankParquet) -> int:
    """The per-rank stage of an ingested rank, unless complete stage files exist; returns the rank."""
    if not stage_complete(entry.events, entry.rank):
        compute_and_write(str(entry.events), entry.rank)
        pages.trim_heap()
    return entry.rank


def derive_rows(memo: str, lo: int, n: int, tag: str) -> dict[str, str | None]:
    """The run memo's derived tables (`store.runs.DERIVED`) of rows [lo, lo + n) of its cross-rank events (a
    slice of whole ranks), each written to `<memo>/<tag>.<name>.arrow`; name -> that path, or None for a table
    whose computation failed on these events (the memo then goes without it)."""
    x = read_ipc(Path(memo) / "xevents.arrow").slice(lo, n)
    out: dict[str, str | None] = {}
    for name in runs.DERIVED:
        try:
            t = runs.derive(name, x)
        except Exception:  # noqa: BLE001 (the memo goes without it; the analysis reports it)
            out[name] = None
            continue
        path = Path(memo) / f"{tag}.{name}.arrow"
        write_ipc(path, t)
        out[name] = str(path)
        del t
    del x
    pages.trim_heap()
    return out


def gather_memory(entries: list[RankParquet], out: str) -> str | None:
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


def needs_work(entry: RankParquet, use_cache: bool, stage: bool = True) -> bool:
    """True when `process_rank` (with this `stage`) has something to do for this entry."""
    if not (use_cache and valid_entry(entry)):
        return True
    return stage and not stage_complete(entry.events, entry.rank)


__all__ = ["derive_rows", "gather_memory", "ingest_rank", "needs_work", "process_rank", "stage_rank"]
