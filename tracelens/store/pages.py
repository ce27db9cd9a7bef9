"""Resident pages of memory-mapped tables, given back between analysis phases.

A table read from an Arrow IPC file by `cache.read_ipc` lives in a read-only mapping of that file: its pages
count in the process' resident memory once touched, although the kernel can read them again from the file
(the page cache) at any time. At 1,024 ranks the run memo's cross-rank events are ~0.4 GB of such pages,
touched by the cross-rank analysis and not read again while the critical path builds its graph, the
analysis' memory peak. `release(table)` tells the kernel that the pages of a table's file mapping are not
needed now (`madvise(MADV_DONTNEED)`): they leave the resident set and are faulted in again, unchanged, from
the file when the table is next read.

Only mappings registered by `track` (read-only file mappings that this module knows the bounds of) are ever
advised, so memory that is not file-backed is never touched: on anonymous memory MADV_DONTNEED would zero it.
Linux only; elsewhere `release` does nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import weakref
from typing import Any

import pyarrow as pa

# id(table) -> the whole-file buffer of its read-only mapping (held: the range stays mapped while it is
# here), removed when the table is collected (tables are not hashable: no WeakKeyDictionary)
_MAPS: dict[int, pa.Buffer] = {}
_MADV_DONTNEED = 4  # (Linux)


def track(table: pa.Table, src: pa.MemoryMappedFile) -> pa.Table:
    """Remember that `table` was read from the read-only memory map `src` (its buffers point into it)."""
    if sys.platform.startswith("linux") and src.mode == "rb":
        size = src.size()
        if size >= mmap.PAGESIZE:
            pos = src.tell()
            src.seek(0)
            _keep(table, src.read_buffer(size))  # zero-copy: the mapping itself, from its first byte
            src.seek(pos)
    return table


def track_mapping(table: pa.Table, whole: pa.Buffer) -> pa.Table:
    """`track` for a table read from part of a file: `whole` is the whole-file buffer of the file's read-only
    memory map (`src.read_buffer(src.size())` of a `pa.memory_map` opened for reading), which the table's
    buffers point into. Releasing the table gives back the pages of the whole file."""
    if sys.platform.startswith("linux") and whole.size >= mmap.PAGESIZE:
        _keep(table, whole)
    return table


def _keep(table: pa.Table, whole: pa.Buffer) -> None:
    _MAPS[id(table)] = whole
    weakref.finalize(table, _MAPS.pop, id(table), None)


def release(table: pa.Table | None) -> int:
    """Drop the resident pages of `table`'s file mapping (when `track` saw it; else nothing); returns the
    bytes advised. The table stays valid: its pages are read again from the file when next used."""
    buf = _MAPS.get(id(table)) if table is not None else None
    if buf is None:
        return 0
    page = mmap.PAGESIZE
    lo: int = buf.address // page * page  # (a mapping starts on a page)
    n: int = (buf.address + buf.size - lo) // page * page
    if n <= 0 or _madvise(lo, n) != 0:
        return 0
    return n


def trim_heap() -> None:
    """Give freed heap memory back to the OS after a large table is released: Arrow's pool
    (`release_unused`) and glibc's malloc arenas (`malloc_trim(0)`, where NumPy's buffers and Python's
    large objects live; freed memory otherwise stays resident in the process). A no-op where malloc_trim
    does not exist (not glibc)."""
    pa.default_memory_pool().release_unused()
    fn = _malloc_trim()
    if fn is not None:
        fn(0)


def resident_bytes() -> int:
    """This process' resident memory (Linux: /proc/self/statm; 0 elsewhere or when it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap_over(limit: int) -> bool:
    """`trim_heap()` when this process' resident memory is above `limit` bytes (or cannot be read); True when
    it trimmed. Between the ranks of a worker: freed memory kept below the limit is reused by the next rank
    instead of being handed back and faulted in again."""
    rss = resident_bytes()
    if rss and rss <= limit:
        return False
    trim_heap()
    return True


#: `cap_mmap_threshold`'s default: arrays of this size and up get their own mapping, returned when freed.
MMAP_THRESHOLD = 16 * 1024 * 1024
_M_MMAP_THRESHOLD = -3  # (glibc's mallopt parameter)


def cap_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `nbytes` for this process (`mallopt(M_MMAP_THRESHOLD)`): each
    allocation of at least that size (the large NumPy arrays of a big run's analysis) gets a mapping of its
    own, handed back to the system when it is freed. glibc's default threshold is dynamic: the first such
    array freed raises it to that array's size (up to 32 MiB), after which arrays below it come from the heap
    and their pages stay resident once freed, and the peak resident memory grows with each phase of the
    analysis. On a cached 1,024-rank analysis: peak RSS ~20-30 MiB lower at no cost in time (a 4 MiB
    threshold saves ~70 MiB but adds 1.5-3 s of system time in page faults). For a command's process,
    not a library call (it changes the allocator for the whole process); False where it is not glibc."""
    return _mallopt((_M_MMAP_THRESHOLD, nbytes))


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's `mallopt(param, value)` for each setting, in order; False where there is none (not Linux, not
    glibc) or one is refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return all(fn(param, value) for param, value in settings)


_M_TRIM_THRESHOLD = -1  # (glibc's mallopt parameter)
#: `worker_allocator`'s thresholds: a worker keeps up to this much freed heap, and allocations below the
#: mmap threshold come from the heap (reused from rank to rank) rather than fresh mappings.
WORKER_MMAP_THRESHOLD = 64 * 1024 * 1024
WORKER_TRIM_THRESHOLD = 256 * 1024 * 1024


def worker_allocator() -> bool:
    """glibc's thresholds for a worker interpreter of the local pool, which reads one rank after another:
    allocations up to `WORKER_MMAP_THRESHOLD` from the heap and up to `WORKER_TRIM_THRESHOLD` of freed heap
    kept (not handed back at each free), so that a rank reuses the pages the previous one freed. With
    `trim_heap_over` between ranks: ~250 page faults a rank of the 1,024-rank benchmark run instead of ~1,700
    (~2.5 ms less CPU), at the same resident memory (~140 MiB a worker). False where it is not glibc."""
    return _mallopt((_M_MMAP_THRESHOLD, WORKER_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, WORKER_TRIM_THRESHOLD))


_TRIM: list[Any] = []


def _malloc_trim() -> Any:
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim  # (glibc; musl and others have none)
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _TRIM.append(fn)
    return _TRIM[0]


def _madvise(addr: int, length: int) -> int:
    fn = _libc_madvise()
    if fn is None:
        return -1
    out: int = fn(addr, length, _MADV_DONTNEED)
    return out


_MADVISE: list[Any] = []


def _libc_madvise() -> Any:
    """libc's madvise, looked up once (a CDLL per call cost ~80 us: seconds over the 1,024 ranks' files)."""
    if not _MADVISE:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _MADVISE.append(fn)
    return _MADVISE[0]


__all__ = [
    "MMAP_THRESHOLD",
    "WORKER_MMAP_THRESHOLD",
    "WORKER_TRIM_THRESHOLD",
    "cap_mmap_threshold",
    "release",
    "resident_bytes",
    "track",
    "track_mapping",
    "trim_heap",
    "trim_heap_over",
    "worker_allocator",
]
