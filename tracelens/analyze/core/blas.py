"""Small LAPACK calls on one BLAS thread (`one_blas_thread`).

numpy's OpenBLAS starts a thread per core for a least-squares fit of a few hundred rows: on a busy 2-core
machine its threads spin waiting for each other and a 343 x 128 `lstsq` (the clock fit of 1,024 ranks on
128 hosts) takes 0.05-1.3 s of wall and CPU time, against ~3 ms on one thread. One thread gives the same
bits (the same kernels, the same summation order per element). The thread count is found and set through
the OpenBLAS library numpy loaded (as threadpoolctl does); where there is none (another BLAS, another
system) the block runs unchanged.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: OpenBLAS' thread-count functions as numpy's wheels (scipy-openblas, ILP64 or not) and others export them.
_SYMBOLS = (
    "scipy_openblas_{}_num_threads64_",
    "scipy_openblas_{}_num_threads",
    "openblas_{}_num_threads64_",
    "openblas_{}_num_threads",
)


@functools.lru_cache(maxsize=1)
def _openblas() -> tuple[Any, Any] | None:
    """(get, set) of the loaded OpenBLAS' thread count, or None when no OpenBLAS is loaded (or not Linux)."""
    import numpy  # noqa: F401  (its BLAS is what is looked for: loaded with it)

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = sorted(
        {
            p
            for line in lines
            if len(parts := line.split(maxsplit=5)) == 6 and "openblas" in (p := parts[5]).lower()
        }
    )
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in _SYMBOLS:
            get, put = getattr(lib, sym.format("get"), None), getattr(lib, sym.format("set"), None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return get, put
    return None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Within this block numpy's OpenBLAS runs on one thread (restored after; a no-op without OpenBLAS)."""
    fns = _openblas()
    if fns is None:
        yield
        return
    get, put = fns
    before = int(get())
    if before <= 1:
        yield
        return
    put(1)
    try:
        yield
    finally:
        put(before)
