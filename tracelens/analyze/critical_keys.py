"""Keys and lookups of the critical-path graph build (`tracelens.analyze.critical_path`): integer columns as a
DataFrame would hold them, per-rank tables, the matched collective row of each communication kernel, and the
kernels' stream order, each as one sort or search over packed int64 keys where the values fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.frame_cells import str_objects


def as_pandas_ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as `to_pandas` gives it: int64 without nulls, else float64 with NaN (values rounded
    there are rounded here too, so keys and times match what a DataFrame of the table would hold)."""
    if col.null_count:
        vals: np.ndarray = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        vals[col.is_null().to_numpy(zero_copy_only=False)] = np.nan
        return vals
    out: np.ndarray = col.to_numpy(zero_copy_only=False).astype(np.int64)
    return out


def per_rank(rank: np.ndarray, table: dict[int, int]) -> np.ndarray:
    """table[rank] per row (0 for ranks not in it), looked up once per distinct rank."""
    u, inv = np.unique(rank, return_inverse=True)
    return np.array([table.get(int(r), 0) for r in u], dtype=np.int64)[inv.reshape(-1)]


def coll_lookup(
    collectives: pa.Table, rank: np.ndarray, raw_start: np.ndarray, raw_end: np.ndarray, s: np.ndarray,
    e: np.ndarray, q: np.ndarray, inst: np.ndarray, transfer: np.ndarray, op: np.ndarray, group: np.ndarray,
    nbytes: np.ndarray,
) -> None:  # fmt: skip
    """For the kernels `q` (communication kernels): the matched collective row with the same rank, start and
    end (the first such row), its instance, transfer (at most the kernel's duration), op, group and bytes."""
    names = collectives.column_names
    c_start = as_pandas_ints(collectives.column("start_ns"))
    c_inst = as_pandas_ints(collectives.column("instance"))
    keep = ~np.isnan(c_start.astype(float)) & (c_inst >= 0)
    if "n_participants" in names:
        npart = as_pandas_ints(collectives.column("n_participants")).astype(float)
        keep &= np.where(np.isnan(npart), 1.0, npart) >= 2
    c_end = as_pandas_ints(collectives.column("end_ns"))
    keep &= ~np.isnan(c_end.astype(float))
    rows = np.flatnonzero(keep)
    if rows.size == 0 or q.size == 0:
        return
    ea = as_pandas_ints(collectives.column("end_aligned_ns"))[rows]
    ls = as_pandas_ints(collectives.column("latest_start_ns"))[rows]
    tr = np.clip(ea - ls, 0, None).astype(float)
    c_rank = collectives.column("rank").to_numpy(zero_copy_only=False)[rows].astype(np.int64)
    r_start, r_end = c_start[rows].astype(np.int64), c_end[rows].astype(np.int64)
    # (rank, start) as one int64 key when it fits; when that key is unique no row repeats (rank, start, end)
    # and a kernel matches the row of its (rank, start) whose end is its end
    lo = min(int(r_start.min()), int(raw_start[q].min()))
    hi = max(int(r_start.max()), int(raw_start[q].max()))
    r_lo = min(int(c_rank.min()), int(rank[q].min()))
    r_span = max(int(c_rank.max()), int(rank[q].max())) - r_lo + 1
    right: list[np.ndarray] = [c_rank, r_start, r_end]
    left: list[np.ndarray] = [rank[q], raw_start[q], raw_end[q]]
    pos = None
    if hi - lo < 2**40 and r_span < 2**22:
        k_right = ((c_rank - r_lo) << 40) + (r_start - lo)
        k_left = ((rank[q] - r_lo) << 40) + (raw_start[q] - lo)
        pos = pair_lookup(k_right, r_end, k_left, raw_end[q])
        first = np.ones(rows.size, dtype=bool)
        right, left = [k_right, r_end], [k_left, raw_end[q]]
    if pos is None:
        key = pd.MultiIndex.from_arrays(right)
        first = ~key.duplicated(keep="first")
        pos = key[first].get_indexer(pd.MultiIndex.from_arrays(left))
    sel = rows[first]
    hit, p = q[pos >= 0], pos[pos >= 0]
    if hit.size == 0:
        return
    src = sel[p]
    inst[hit] = c_inst[src].astype(np.int64)
    transfer[hit] = np.minimum(tr[first][p], (e - s)[hit])
    op[hit] = str_objects(collectives.column("op"), src) if "op" in names else "nan"
    group[hit] = str_objects(collectives.column("group_key"), src) if "group_key" in names else "nan"
    if "bytes" in names:
        nbytes[hit] = as_pandas_ints(collectives.column("bytes")).astype(float)[src]


def pair_lookup(ka: np.ndarray, kb: np.ndarray, qa: np.ndarray, qb: np.ndarray) -> np.ndarray | None:
    """For each query (qa, qb): the first row i (in row order) with (ka[i], kb[i]) == (qa, qb), else -1; None
    when some ka value repeats more than 8 times (the caller then takes the general path)."""
    o = np.lexsort((kb, ka))  # stable: rows equal in both keys stay in row order, the first leads
    sa, sb = ka[o], kb[o]
    starts = np.flatnonzero(np.r_[True, sa[1:] != sa[:-1]])
    run = int(np.diff(np.r_[starts, sa.size]).max()) if sa.size else 0
    if run > 8:
        return None
    lo = np.searchsorted(sa, qa, side="left")
    out = np.full(qa.size, -1, dtype=np.int64)
    for d in range(run):  # the rows of the query's ka value, ends in order: the first equal end is the hit
        i = np.minimum(lo + d, sa.size - 1)
        hit = (out < 0) & (lo + d < sa.size) & (sa[i] == qa) & (sb[i] == qb)
        out[hit] = o[i[hit]]
    return out


def sort_order(step: np.ndarray, rank: np.ndarray, stream: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The stable order of the kernels by (step, rank, stream, start): one int64 key when the codes and the
    start (whole ns from the earliest, below 2**40) fit into it, else `np.lexsort` (the same order)."""
    if not s.size:
        return np.zeros(0, dtype=np.int64)
    # each key's offset from its smallest value (order-preserving) when its range is small
    codes = [(k - k.min(), int(k.max() - k.min()) + 1) for k in (step, rank, stream)]
    span = codes[0][1] * codes[1][1] * codes[2][1]
    if span < 2**22 and float(s.max()) < 2**40 and float(s.min()) >= 0:
        key = (codes[0][0] * codes[1][1] + codes[1][0]) * codes[2][1] + codes[2][0]
        key = (key.astype(np.int64) << 40) + s.astype(np.int64)
        out: np.ndarray = np.argsort(key, kind="stable")
        return out
    return np.lexsort((s, stream, rank, step))


__all__ = ["as_pandas_ints", "coll_lookup", "pair_lookup", "per_rank", "sort_order"]
