"""Read one PyTorch profiler (Kineto) Chrome-trace JSON file into Arrow tables (schema.EVENTS, schema.MEMORY).

How and why:
- The file is decompressed as a stream and the `traceEvents` array is cut into chunks at event boundaries,
  each decoded with msgspec typed Structs (only the fields we use; unknown keys are skipped by the decoder).
  Memory stays bounded by one chunk plus the finished columns; we never hold the Python objects of a whole
  trace.
- `ts`/`dur` are decoded as raw JSON text and converted to integer nanoseconds by an exact decimal parse
  (Arrow's decimal cast), so 3-decimal microsecond timestamps at epoch scale (1.7e18 ns > 2**53) stay exact.
- Columns are built per chunk with C-level `map`/`attrgetter` passes and numpy/Arrow, never a Python loop per
  event.
- Speed (docs/performance.md): a chunk is decoded by the compiled decoder when it was built (native.py), by
  msgspec otherwise or when it hands the chunk back; gzip is inflated inline into one reused buffer; the garbage collector is paused
  while reading; `args` decode into a lean struct in chunks that name no collective; on an idle multi-core machine
  a large file is decoded by two processes (_scan_split), the child's columns coming back as Arrow IPC in
  shared memory. Every fast path falls back to the careful one, with identical results.

Modules (each imports only those above it): `stream` (inflate, block readers, event boundaries), `decode`
(the msgspec structs and chunk decoders), `columns` (kinds, exact timestamps, a chunk's columns), `native`
(the compiled chunk decoder, `_native.c`: a chunk's columns without Python objects, or None), `steps`
(step assignment, incomplete steps of a salvaged trace), `scan` (the streaming scan with salvage), `split`
(the two-process read behind `_scan_split`), `peek` (rank metadata without decoding), `reader` (`read`).
"""

from __future__ import annotations

from tracelens.ingest.kineto.columns import (
    GPU_KINDS,
    normalise_kind,
    parse_pg_ranks,
    parse_us_to_ns,
    parse_us_to_ns_numpy,
)
from tracelens.ingest.kineto.peek import peek, rank_from_name
from tracelens.ingest.kineto.reader import CHUNK_BYTES, KinetoTrace, metadata_table, read
from tracelens.ingest.kineto.steps import assign_steps, drop_incomplete_steps, incomplete_steps, step_of_name
from tracelens.ingest.kineto.stream import MAX_RATIO, RATIO_MIN_BYTES, max_decompressed_bytes

__all__ = [
    "CHUNK_BYTES",
    "GPU_KINDS",
    "MAX_RATIO",
    "RATIO_MIN_BYTES",
    "KinetoTrace",
    "assign_steps",
    "drop_incomplete_steps",
    "incomplete_steps",
    "max_decompressed_bytes",
    "metadata_table",
    "normalise_kind",
    "parse_pg_ranks",
    "parse_us_to_ns",
    "parse_us_to_ns_numpy",
    "peek",
    "rank_from_name",
    "read",
    "step_of_name",
]
