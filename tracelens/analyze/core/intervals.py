"""Vectorised interval algebra on half-open int64 intervals [start, end).

A *set* is a pair of numpy int64 arrays (starts, ends). `union` turns any pairs into a canonical set:
sorted, disjoint, non-touching, non-empty. Every other operation takes and returns canonical sets.
No Python loop runs over intervals.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tracelens.schema import Intervals as Intervals  # (one definition: the cache keeps them)

_EMPTY = np.empty(0, dtype=np.int64)


def empty() -> Intervals:
    return _EMPTY.copy(), _EMPTY.copy()


def union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> Intervals:
    """Canonical union of arbitrary intervals (unsorted, overlapping, empty ones dropped)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval starts where the start lies beyond everything seen before it.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], run_end[last]


def total(a: Intervals) -> int:
    """Covered length of a canonical set."""
    return int((a[1] - a[0]).sum())


def _boundaries(a: Intervals) -> np.ndarray:
    return np.column_stack(a).ravel()


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b for canonical sets: the overlap of every overlapping pair of their intervals. The pairs come
    from two binary searches (no sort of all boundaries); their overlaps are canonical as they are: sorted,
    non-empty, and never touching (two intervals of one set never touch)."""
    sa, ea = a
    sb, eb = b
    if sa.size == 0 or sb.size == 0:
        return empty()
    lo = np.searchsorted(eb, sa, side="right")  # the first interval of b ending after a's start
    hi = np.searchsorted(sb, ea, side="left")  # past the last one of b starting before a's end
    count = np.maximum(hi - lo, 0)
    total = int(count.sum())
    if total == 0:
        return empty()
    ia = np.repeat(np.arange(sa.size), count)
    ib = np.arange(total) - (np.cumsum(count) - count)[ia] + lo[ia]
    starts = np.maximum(sa[ia], sb[ib]).astype(np.int64, copy=False)
    return starts, np.minimum(ea[ia], eb[ib]).astype(np.int64, copy=False)


def union2(a: Intervals, b: Intervals) -> Intervals:
    """a ∪ b for canonical sets."""
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def complement(a: Intervals, lo: int, hi: int) -> Intervals:
    """[lo, hi) minus a."""
    a = clip(a, lo, hi)
    starts = np.concatenate([[lo], a[1]]).astype(np.int64)
    ends = np.concatenate([a[0], [hi]]).astype(np.int64)
    return union(starts, ends)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b for canonical sets."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    lo = int(min(a[0][0], b[0][0]))
    hi = int(max(a[1][-1], b[1][-1]))
    return intersect(a, complement(b, lo, hi))


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """a ∩ [lo, hi)."""
    s = np.maximum(a[0], lo)
    e = np.minimum(a[1], hi)
    keep = e > s
    return s[keep], e[keep]


def measure_in_windows(a: Intervals, lo: npt.ArrayLike, hi: npt.ArrayLike) -> np.ndarray:
    """Covered length of canonical set `a` inside each window [lo[i], hi[i]), vectorised over windows."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if a[0].size == 0:
        return np.zeros(lo.shape, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(a[1] - a[0])])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # length of a ∩ (-inf, t)
        i = np.searchsorted(a[0], t, side="right")  # intervals starting before or at t
        full = cum[np.maximum(i - 1, 0)]
        j = np.maximum(i - 1, 0)
        partial = np.clip(t - a[0][j], 0, a[1][j] - a[0][j])
        return np.where(i > 0, full + partial, 0)

    out: np.ndarray = np.maximum(covered_before(hi) - covered_before(lo), 0)
    return out


def assign_windows(ts: npt.ArrayLike, lo: npt.ArrayLike, hi: npt.ArrayLike) -> np.ndarray:
    """Index of the window [lo[k], hi[k]) holding each point of `ts` (windows sorted, disjoint); -1 for none."""
    ts = np.asarray(ts, dtype=np.int64)
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if lo.size == 0:
        return np.full(ts.shape, -1, dtype=np.int64)
    k = np.searchsorted(lo, ts, side="right") - 1
    ok = (k >= 0) & (ts < hi[np.maximum(k, 0)])
    return np.where(ok, k, -1)
