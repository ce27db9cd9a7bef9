"""`np.unique` and `np.isin` over integer arrays, without sorting or hashing when the values' range is small.

The per-rank stage asks for the distinct values of a rank's rank column (one value), of its threads, streams or
steps (a few) and of small integer codes over and over, on arrays of ~10,000 rows: numpy's hash or sort costs
~50-100 µs a call there, a presence table over the value range ~10 µs. The results are numpy's own (same
values, order and dtype); other inputs go to numpy.
"""

from __future__ import annotations

import numpy as np

#: A presence table is used when the values' range is at most this many slots beyond the array's length.
_SLACK = 1 << 16


def _int_range(a: np.ndarray, b: np.ndarray | None = None) -> tuple[int, int] | None:
    """(min, max) over the integer arrays `a` (and `b`), when a presence table over that range is cheap."""
    if a.dtype.kind != "i" or a.ndim != 1 or a.size == 0:
        return None
    lo, hi = int(a.min()), int(a.max())
    size = a.size
    if b is not None:
        if b.dtype.kind != "i" or b.ndim != 1 or b.size == 0:
            return None
        lo, hi = min(lo, int(b.min())), max(hi, int(b.max()))
        size += b.size
    if hi - lo > 4 * size + _SLACK:
        return None
    return lo, hi


def distinct(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` of a 1-D integer array."""
    a = np.asarray(a)
    rng = _int_range(a)
    if rng is None:
        out: np.ndarray = np.unique(a)
        return out
    lo, hi = rng
    if lo == hi:
        one: np.ndarray = a[:1].copy()
        return one
    present = np.zeros(hi - lo + 1, bool)
    present[a.astype(np.int64, copy=False) - lo] = True
    return (np.flatnonzero(present) + lo).astype(a.dtype, copy=False)


def member(a: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`np.isin(a, values)` of 1-D integer arrays."""
    a = np.asarray(a)
    values = np.asarray(values)
    rng = _int_range(a, values) if values.size else None
    if rng is None:
        out: np.ndarray = np.isin(a, values)
        return out
    lo, hi = rng
    lut = np.zeros(hi - lo + 1, bool)
    lut[values.astype(np.int64, copy=False) - lo] = True
    found: np.ndarray = lut[a.astype(np.int64, copy=False) - lo]
    return found


__all__ = ["distinct", "member"]
