"""The split read: one large file decoded by two processes (a forked child hands its columns back
as Arrow IPC in shared memory). Behind one function, `_scan_split`; None when it does not apply.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from tracelens.errors import BadTraceError
from tracelens.ingest.kineto.columns import _Chunk, _merge_chunks
from tracelens.ingest.kineto.scan import _Scan, _scan_blocks
from tracelens.ingest.kineto.stream import _READ_BYTES, _reused_blocks, _SplitFailed

#: Decompressed size from which one file may be decoded by two processes (opt-in, see _can_split).
SPLIT_MIN_BYTES = 32 * 1024**2
#: Share of the decompressed bytes this process decodes in a split read (the child decodes the rest). The
#: child first inflates and skips this share (~5 ms per 25 MB) and this process assembles the table after
#: (~10 ms), while Kineto writes the small, dense CPU events first (more events per byte in the first
#: half): on df_index_resolver both parts end within a few ms of each other at 0.5 (0.42-0.50 measured).
SPLIT_SHARE = 0.5


def _split_point(path: Path) -> int | None:
    """Where a split read cuts the decompressed stream of a file worth splitting (SPLIT_SHARE of its size),
    else None. For gzip the size is the trailer's ISIZE (exact for one member under 4 GiB; when it is wrong
    the split is uneven but still correct)."""
    from tracelens.ingest.kineto.stream import _utf16

    if _utf16(path) is not None:  # (transcoded as it streams: no byte offset to split at)
        return None
    size = path.stat().st_size
    raw = size
    with open(path, "rb") as fh:
        if fh.read(2) == b"\x1f\x8b":
            fh.seek(-4, os.SEEK_END)
            raw = int.from_bytes(fh.read(4), "little")
            if raw < size:  # more than 4 GiB, several members or not a gzip trailer
                return None
    return int(raw * SPLIT_SHARE) if raw >= SPLIT_MIN_BYTES else None


def _can_split() -> bool:
    """Whether to fork a helper process. TRACELENS_SPLIT: `auto` (the default: only when a CPU is idle,
    1-minute load average below CPUs - 0.5), `1` (always when applicable) or `0` (never). A split read costs
    more CPU in total, so it pays only with an idle core (docs/performance.md); pool workers (the loader's
    one rank per worker) run with TRACELENS_SPLIT=0.
    Also required: Linux, (for `auto`) at least 2 usable CPUs, not inside a worker process of a pool (the loader already
    runs one rank per worker), no other Python thread in this process. (numpy's BLAS and Arrow start idle
    native pool threads at import; both libraries re-initialise them in a forked child, as for
    multiprocessing's fork start method.)"""
    mode = os.environ.get("TRACELENS_SPLIT", "auto").strip().lower()
    if mode not in ("1", "yes", "on", "true", "auto") or not sys.platform.startswith("linux"):
        return False  # fork is only used where it is the platform's norm
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    if threading.active_count() != 1:
        return False
    if mode == "auto":
        if cpus < 2:
            return False  # nothing to gain on one CPU; TRACELENS_SPLIT=1 still splits (correct, not faster)
        try:
            if os.getloadavg()[0] > cpus - 0.5:
                return False
        except OSError:
            return False
    # a pool's worker process has imported multiprocessing (importing it here would cost ~1 ms)
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None


#: Bytes of the shared memory through which the child hands its columns back, beyond its share of the JSON
#: (only the pages written are allocated; larger columns go through the pipe).
_SHM_SLACK = 16 * 1024**2
_EV_COLS = (
    "kind",
    "name",
    "pid",
    "tid",
    "device",
    "stream",
    "ts",
    "ts_valid",
    "dur",
    "dur_valid",
    "correlation",
    "external_id",
    "sequence_nr",
)
_MEM_COLS = ("ts", "valid", "device", "bytes", "total_allocated", "total_reserved")
_NP_COLS = frozenset({"kind", "ts", "ts_valid", "dur", "dur_valid", "valid"})  # numpy in a _Chunk
_HDR = (
    41  # message header: kind byte, then 5 int64 (extra length, events offset/length, memory offset/length)
)


def _part_message(sc: _Scan, shm: Any) -> bytes:
    """The second part of a split read as the child's message to the parent: its columns (merged into one
    chunk) as Arrow IPC streams written into the shared mapping `shm` (kind `M`), or after the header when
    they do not fit (kind `P`); everything else (metadata, collective args) as msgpack (JSON values only,
    so exact). No pickle: the parent reads plain data."""
    c = _merge_chunks(sc.chunks)
    sc.chunks = []  # the per-chunk columns are copies now: freed (and returned) before the IPC copy
    pa.default_memory_pool().release_unused()

    def arrow(v: Any) -> pa.Array:
        return pa.array(v.view(np.uint8) if v.dtype == bool else v) if isinstance(v, np.ndarray) else v

    batches = [pa.RecordBatch.from_arrays([arrow(getattr(c, f)) for f in _EV_COLS], names=list(_EV_COLS))]
    if c.mem is not None:
        batches.append(
            pa.RecordBatch.from_arrays([arrow(c.mem[f]) for f in _MEM_COLS], names=list(_MEM_COLS))
        )
    extra = msgspec.msgpack.encode(
        {
            "meta": sc.meta,
            "n": c.n,
            "coll_rows": c.coll_rows.tolist(),
            "coll": c.coll,
            "bytes_total": sc.bytes_total,
            "split_at": sc.split_at,
        }
    )
    spans = [0, 0, 0, 0]
    try:
        kind, sink = b"M", pa.FixedSizeBufferWriter(pa.py_buffer(shm))
        for i, batch in enumerate(batches):
            spans[2 * i] = sink.tell()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            spans[2 * i + 1] = sink.tell() - spans[2 * i]
        body = b""
    except OSError:  # larger than the mapping
        kind, sink = b"P", pa.BufferOutputStream()
        for i, batch in enumerate(batches):
            spans[2 * i] = sink.tell()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            spans[2 * i + 1] = sink.tell() - spans[2 * i]
        body = sink.getvalue().to_pybytes()
    return kind + np.array([len(extra), *spans], dtype=np.int64).tobytes() + extra + body


def _part_from_message(msg: bytes, shm: Any) -> _Scan | None:
    """The child's message (_part_message) -> its _Scan with one chunk; the columns read from the shared
    mapping are not copied (they are copied once, when the parts are concatenated). None when malformed."""
    if len(msg) < _HDR or msg[:1] not in (b"M", b"P"):
        return None
    n_extra, ev_off, ev_len, mem_off, mem_len = np.frombuffer(msg, dtype=np.int64, count=5, offset=1).tolist()
    extra = msgspec.msgpack.decode(msg[_HDR : _HDR + n_extra])
    src = pa.py_buffer(shm) if msg[:1] == b"M" else pa.py_buffer(msg).slice(_HDR + n_extra)

    def columns(off: int, length: int) -> dict:
        batch = pa.ipc.open_stream(src.slice(off, length)).read_next_batch()
        out: dict = {}
        for name, col in zip(batch.schema.names, batch.columns):
            if name in _NP_COLS:
                arr = col.to_numpy()
                out[name] = arr.view(bool) if name in ("ts_valid", "dur_valid", "valid") else arr
            else:
                out[name] = col
        return out

    ev = columns(ev_off, ev_len)
    chunk = _Chunk(
        n=extra["n"],
        coll_rows=np.array(extra["coll_rows"], dtype=np.int64),
        coll=extra["coll"],
        mem=columns(mem_off, mem_len) if mem_len else None,
        **ev,
    )
    return _Scan(extra["meta"], [chunk], extra["bytes_total"], extra["bytes_total"], False, extra["split_at"])


def _scan_split(path: Path, chunk_bytes: int) -> _Scan | None:
    """Decode one large file with two processes: this one decodes the events of the first part of the
    decompressed stream (SPLIT_SHARE), a forked child those of the rest (it decompresses the first part
    again and skips it) and hands its columns back as Arrow IPC in an anonymous shared mapping (the pipe
    carries a small message: _part_message). None when not applicable or when anything went wrong (the
    caller then reads serially). On success the child may still be exiting: its pid is in `_Scan.helper`,
    for _reap once the table is built."""
    try:
        cut = _split_point(path)
    except OSError:
        return None
    if cut is None or not _can_split():
        return None
    import mmap
    import select

    t0 = time.perf_counter()
    try:
        shm = mmap.mmap(-1, max(4096, int(cut / SPLIT_SHARE) - cut + _SHM_SLACK))
        r, w = os.pipe()
    except (OSError, ValueError, OverflowError):
        return None
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about forking while native threads exist (the idle BLAS/Arrow pools, see
            # _can_split); the child only decodes and writes to the pipe, and the parent bounds its wait.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid: int | None = os.fork()  # None once the child is handed to the caller
    except OSError:  # e.g. a process limit: read serially
        os.close(r)
        os.close(w)
        shm.close()
        return None
    if pid == 0:  # child: never returns
        try:
            os.close(r)
            try:
                blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
                try:
                    found: list[int] = []
                    sc = _scan_blocks(path, blocks, False, chunk_bytes, start_at=cut, found=found)
                    sc.split_at = found[0]
                finally:
                    blocks.close()
                msg = _part_message(sc, shm)
            except BaseException:  # noqa: BLE001 (reported as an empty message; the parent reads serially)
                msg = b""
            with os.fdopen(w, "wb") as fh:
                fh.write(msg)
        finally:
            os._exit(0)
    os.close(w)
    done = False
    try:
        with os.fdopen(r, "rb") as fh:
            # inflated inline, as in the child: with both cores decoding, a third (inflating) thread only
            # adds GIL hand-offs
            blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
            try:
                mine = _scan_blocks(path, blocks, False, chunk_bytes, stop_at=cut)
            except (_SplitFailed, BadTraceError, msgspec.DecodeError):
                return None
            finally:
                blocks.close()
            if mine.split_at is None:  # the file was shorter than its trailer said: all read here
                return mine
            # the child does about as much as this process did; a child that hangs is given up on
            if not select.select([fh], [], [], max(60.0, 20 * (time.perf_counter() - t0)))[0]:
                return None
            msg = fh.read()  # up to the child closing its end
        done = True
        theirs = _part_from_message(msg, shm)
        if theirs is None or theirs.split_at != mine.split_at:  # both parts must agree on the boundary
            return None
        meta = dict(mine.meta)
        meta.update(theirs.meta)
        sc = _Scan(
            meta, mine.chunks + theirs.chunks, theirs.bytes_total, theirs.bytes_total, False, helper=pid
        )
        pid = None  # reaped by the caller, after the assembly (the child is exiting meanwhile)
        return sc
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException, msgspec.DecodeError):
        return None
    finally:
        # the mapping stays while columns read from it live (they are copied when the parts are joined)
        with contextlib.suppress(BufferError):
            shm.close()
        if pid is not None:
            if not done:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            _reap(pid)


def _reap(pid: int | None) -> None:
    """Wait for a split read's child (it has sent its columns and is exiting)."""
    if pid is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
