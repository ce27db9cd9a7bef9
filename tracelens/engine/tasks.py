"""Per-rank tasks: plain module-level functions that any executor can run (a local worker, a Dask worker).

`process_rank` ingests one trace into its cache entry unless a valid entry exists, then computes and
writes the rank's stage files unless complete ones exist (always after a fresh ingest).
"""

from __future__ import annotations

import pyarrow as pa

from tracelens.engine.stage import compute_and_write
from tracelens.ingest import kineto
from tracelens.store.atomic import write_parquet
from tracelens.store.cache import RankParquet, valid_entry
from tracelens.store.stages import stage_complete


def ingest_rank(path: str, rank: int, entry: RankParquet, salvage: bool = False) -> int:
    """Read one Kineto file and write its three Parquet files atomically; returns the rank."""
    tr = kineto.read(path, rank=rank, salvage=salvage)
    write_parquet(entry.events, tr.events)
    write_parquet(entry.memory, tr.memory)
    write_parquet(entry.meta, kineto.metadata_table([tr.metadata]))  # last: marks the entry complete
    del tr
    pa.default_memory_pool().release_unused()  # hand freed Arrow memory back before the next rank
    return rank


def process_rank(path: str, rank: int, entry: RankParquet, salvage: bool, use_cache: bool) -> int:
    """One rank's task: ingest (unless cached) and per-rank stage (unless cached); returns the rank."""
    fresh = not (use_cache and valid_entry(entry))
    if fresh:
        ingest_rank(path, rank, entry, salvage)
    if fresh or not stage_complete(entry.events, rank):
        compute_and_write(str(entry.events), rank)
    return rank


def needs_work(entry: RankParquet, use_cache: bool) -> bool:
    """True when `process_rank` has something to do for this entry."""
    return not (use_cache and valid_entry(entry) and stage_complete(entry.events, entry.rank))


__all__ = ["ingest_rank", "needs_work", "process_rank"]
