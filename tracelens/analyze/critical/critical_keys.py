"""Keys and lookups of the critical-path graph build (`tracelens.analyze.critical.critical_path`): integer columns as a
DataFrame would hold them, per-rank tables, the matched collective row of each communication kernel, the
kernels' stream order and their sync epochs, each as one sort or search over packed int64 keys where the
values fit; string columns per kernel as small integer codes (`Cells`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core.frame_cells import (
    unique_inverse,  # (re-exported: critical_path uses it from here)
)
from tracelens.analyze.critical.critical_nodes import SYNC_TOL_NS


def code_type(n: int) -> type[np.signedinteger[Any]]:
    """The smallest signed integer type holding 0 .. n - 1."""
    return np.int8 if n <= 2**7 else np.int16 if n <= 2**15 else np.int32 if n <= 2**31 else np.int64


@dataclass(frozen=True)
class Cells:
    """A string column per kernel as small integer codes into its distinct cells (`values`: str, or None for a
    null): `cells[rows]` gives the cells an object array of them would (one byte or two a row instead of
    eight)."""

    codes: np.ndarray
    values: np.ndarray  # object

    def __getitem__(self, rows: Any) -> Any:
        return self.values[self.codes[rows]]

    @property
    def size(self) -> int:
        return int(self.codes.size)

    def mask(self, value: str) -> np.ndarray:
        """Per row: the cell equals `value` (compared once per distinct cell, looked up per row by its code)."""
        hit = np.array([v == value for v in self.values], dtype=bool)
        out: np.ndarray = hit[self.codes]
        return out


def cells(
    col: pa.ChunkedArray | pa.Array, rows: np.ndarray | None = None, extra: tuple[str, ...] = ()
) -> Cells:
    """A string column's cells (of `rows`, when given) as `Cells`: the same cells as
    `frame_cells.str_objects(col, rows)`; `extra` values are appended after the null (codes for a caller's
    default cells)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()  # (all rows: encoding before taking moves indices, not strings)
    n_dict = len(arr.dictionary)
    values = np.empty(n_dict + 1 + len(extra), dtype=object)
    values[:n_dict] = arr.dictionary.to_pylist()
    values[n_dict + 1 :] = list(extra)  # (values[n_dict] stays None: the null cell)
    idx = arr.indices.fill_null(n_dict).to_numpy(zero_copy_only=False)
    if rows is not None:
        idx = idx[rows]
    return Cells(idx.astype(code_type(values.size)), values)


def as_pandas_ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as `to_pandas` gives it: int64 without nulls, else float64 with NaN (values rounded
    there are rounded here too, so keys and times match what a DataFrame of the table would hold)."""
    if col.null_count:
        vals: np.ndarray = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        vals[col.is_null().to_numpy(zero_copy_only=False)] = np.nan
        return vals
    out: np.ndarray = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return out


def per_rank(rank: np.ndarray, table: dict[int, int]) -> np.ndarray:
    """table[rank] per row (0 for ranks not in it), looked up once per distinct rank (per rank of their span,
    by a table, when the span is small)."""
    if rank.size and rank.dtype.kind in "iu":
        lo, hi = int(rank.min()), int(rank.max())
        if hi - lo < 1 << 16:
            lut = np.array([table.get(r, 0) for r in range(lo, hi + 1)], dtype=np.int64)
            looked: np.ndarray = lut[rank - lo]
            return looked
    u, inv = unique_inverse(rank)
    out: np.ndarray = np.array([table.get(int(r), 0) for r in u], dtype=np.int64)[inv]
    return out


#: The columns of the matched collectives that the graph's build reads (`coll_lookup`, `coll_cells`,
#: `coll_bytes`): what the key of a kept graph digests of them (`Analysis._graph_key`).
COLL_COLUMNS = (
    "rank", "start_ns", "end_ns", "instance", "n_participants", "end_aligned_ns", "latest_start_ns", "bytes",
    "op", "group_key",
)  # fmt: skip


def coll_lookup(
    collectives: pa.Table, rank: np.ndarray, raw_start: np.ndarray, raw_end: np.ndarray, s: np.ndarray,
    e: np.ndarray, q: np.ndarray, inst: np.ndarray, transfer: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """For the kernels `q` (communication kernels): the matched collective row with the same rank, start and
    end (the first such row), its instance and transfer (at most the kernel's duration). Returns the kernels
    matched (ascending) and their rows in `collectives` (for `coll_cells` and the bytes)."""
    none = np.zeros(0, dtype=np.int64)
    names = collectives.column_names
    c_start = as_pandas_ints(collectives.column("start_ns"))
    c_inst = as_pandas_ints(collectives.column("instance"))
    keep = (c_inst >= 0) if c_start.dtype.kind != "f" else ~np.isnan(c_start) & (c_inst >= 0)
    if "n_participants" in names:
        npart = as_pandas_ints(collectives.column("n_participants")).astype(float)
        keep &= np.where(np.isnan(npart), 1.0, npart) >= 2
    c_end = as_pandas_ints(collectives.column("end_ns"))
    if c_end.dtype.kind == "f":
        keep &= ~np.isnan(c_end)
    rows = np.flatnonzero(keep)
    if rows.size == 0 or q.size == 0:
        return none, none
    ea = as_pandas_ints(collectives.column("end_aligned_ns"))[rows]
    ls = as_pandas_ints(collectives.column("latest_start_ns"))[rows]
    tr = np.clip(ea - ls, 0, None).astype(float)
    c_rank = collectives.column("rank").to_numpy(zero_copy_only=False)[rows].astype(np.int64)
    r_start, r_end = c_start[rows].astype(np.int64, copy=False), c_end[rows].astype(np.int64, copy=False)
    # (rank, start) as one int64 key when it fits; when that key is unique no row repeats (rank, start, end)
    # and a kernel matches the row of its (rank, start) whose end is its end
    lo = min(int(r_start.min()), int(raw_start[q].min()))
    hi = max(int(r_start.max()), int(raw_start[q].max()))
    r_lo = min(int(c_rank.min()), int(rank[q].min()))
    r_span = max(int(c_rank.max()), int(rank[q].max())) - r_lo + 1
    q_rank = rank[q].astype(np.int64)
    right: list[np.ndarray] = [c_rank, r_start, r_end]
    left: list[np.ndarray] = [q_rank, raw_start[q], raw_end[q]]
    pos = None
    if hi - lo < 2**40 and r_span < 2**22:
        k_right = ((c_rank - r_lo) << 40) + (r_start - lo)
        k_left = ((q_rank - r_lo) << 40) + (raw_start[q] - lo)
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
        return none, none
    src = sel[p]
    inst[hit] = c_inst[src].astype(np.int64)
    transfer[hit] = np.minimum(tr[first][p], e[hit] - s[hit])
    return hit, src


def launch_latency(rank: np.ndarray, step: np.ndarray, s: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Per kernel, its rank's launch latency: the smallest start - launch over the rank's kernels with a launch
    (`L` not NaN), at least 0; 0 for a rank without one. The smallest of each run of one (step, rank) first
    (one reduction, NaN skipped: few runs when the kernels are sorted by step and rank, as the graph's are),
    then of each rank's runs: what `np.minimum.at` over the kernels with a launch gives (a min is exact in
    any order)."""
    u_rank, r_inv = unique_inverse(rank)
    lat_r = np.full(u_rank.size, np.inf)
    if rank.size:
        runs = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
        np.fmin.at(lat_r, r_inv[runs], np.fmin.reduceat(s - L, runs))
    lat_r = np.where(np.isinf(lat_r) | np.isnan(lat_r), 0.0, np.maximum(lat_r, 0.0))
    out: np.ndarray = lat_r[r_inv]
    return out


def coll_cells(collectives: pa.Table | None, name: str, hit: np.ndarray, src: np.ndarray, n: int) -> Cells:
    """Per kernel: the `name` cell of its matched collective row (`coll_lookup`'s hit, src), "" for the
    kernels without one, "nan" for all matched ones when the table has no such column."""
    if collectives is None or name not in collectives.column_names:
        values = np.array(["", "nan"], dtype=object)
        codes = np.zeros(n, dtype=np.int8)
        codes[hit] = 1
        return Cells(codes, values)
    c = cells(collectives.column(name), src, extra=("",))
    out = np.full(n, c.values.size - 1, dtype=c.codes.dtype)
    out[hit] = c.codes
    return Cells(out, c.values)


def coll_bytes(collectives: pa.Table | None, hit: np.ndarray, src: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The bytes of the matched collective row of each kernel `k` (a subset of `hit`; NaN without a column)."""
    if collectives is None or "bytes" not in collectives.column_names or k.size == 0:
        return np.full(k.size, np.nan)
    vals: np.ndarray = as_pandas_ints(collectives.column("bytes"))[src[np.searchsorted(hit, k)]].astype(float)
    return vals


def pair_lookup(ka: np.ndarray, kb: np.ndarray, qa: np.ndarray, qb: np.ndarray) -> np.ndarray | None:
    """For each query (qa, qb): the first row i (in row order) with (ka[i], kb[i]) == (qa, qb), else -1; None
    when some ka value repeats more than 8 times (the caller then takes the general path)."""
    # stable: rows equal in both keys stay in row order, the first leads (`np.lexsort((kb, ka))`'s order: by ka,
    # a timsort of runs, then by kb within the runs of a repeated ka value only)
    o = np.argsort(ka, kind="stable")
    sa = ka[o]
    rep = np.flatnonzero(sa[1:] == sa[:-1])
    if rep.size:
        at = np.unique(np.r_[rep, rep + 1])  # the places of every row of a repeated ka value
        sub = o[at]
        o[at] = sub[np.lexsort((kb[sub], sa[at]))]
        del at, sub
    del rep
    sb = kb[o]
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


def sync_epochs(
    syncs: pa.Table | None,
    off: dict[int, int],
    origin: int,
    rank: np.ndarray,
    step: np.ndarray,
    e: np.ndarray,
    L: np.ndarray,
    tid: np.ndarray,
    lat: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Per kernel (graph order): the kernel X that the last blocking sync of its launching thread before its
    launch waited for (-1: none, or X is in another step), that sync's return plus the rank's launch latency
    (NaN: none), and the number of blocking sync calls found.

    A call blocked when some device work of its rank ended inside it and the call returned at most
    SYNC_TOL_NS after the latest such end; X is the work with that end. (`tid` is not read without sync calls:
    the caller may pass an empty array then.)"""
    n = rank.size
    x_of = np.full(n, -1, dtype=np.int64)
    ret = np.full(n, np.nan)
    if syncs is None or syncs.num_rows == 0 or n == 0:
        return x_of, ret, 0
    sy = syncs.select(["rank", "tid", "start_ns", "end_ns"]).to_pandas()
    sy = sy[sy["rank"].isin(np.unique(rank)) & sy["tid"].notna()]
    if sy.empty:
        return x_of, ret, 0
    o = sy["rank"].map(off).fillna(0).astype("int64")
    cs = (sy["start_ns"] - o - origin).to_numpy(dtype=np.int64)
    ce = (sy["end_ns"] - o - origin).to_numpy(dtype=np.int64)
    sr = sy["rank"].to_numpy(dtype=np.int64)
    # the latest device end of the rank at or before the call's end: one sorted key (rank, end)
    SH, HALF = np.int64(2**44), np.int64(2**43)
    dkey = rank * SH + (np.round(e).astype(np.int64) + HALF)
    order = np.argsort(dkey, kind="stable")
    j = np.searchsorted(dkey[order], sr * SH + (ce + HALF), side="right") - 1
    xi = order[np.maximum(j, 0)]
    ok = (j >= 0) & (rank[xi] == sr) & (e[xi] > cs) & (ce - e[xi] <= SYNC_TOL_NS)
    if not ok.any():
        return x_of, ret, 0
    right = pd.DataFrame(
        {
            "rank": sr[ok],
            "tid": sy["tid"].to_numpy(dtype=np.int64)[ok],
            "ce": ce[ok].astype(float),
            "x": xi[ok],
        }
    ).sort_values("ce", kind="stable")
    has = ~np.isnan(L) & ~np.isnan(tid)
    left = pd.DataFrame(
        {
            "k": np.flatnonzero(has),
            "rank": rank[has].astype(np.int64),
            "tid": tid[has].astype(np.int64),
            "L": L[has],
        }
    ).sort_values("L", kind="stable")
    m = pd.merge_asof(left, right, left_on="L", right_on="ce", by=["rank", "tid"], direction="backward")
    m = m[m["x"].notna()]
    k = m["k"].to_numpy(dtype=np.int64)
    x = m["x"].to_numpy(dtype=np.int64)
    keep = (step[x] == step[k]) & (x != k)
    k, x = k[keep], x[keep]
    x_of[k] = x
    ret[k] = m["ce"].to_numpy()[keep] + lat[k]
    return x_of, ret, int(ok.sum())


__all__ = [
    "Cells",
    "as_pandas_ints",
    "cells",
    "code_type",
    "coll_bytes",
    "coll_cells",
    "coll_lookup",
    "launch_latency",
    "pair_lookup",
    "per_rank",
    "sort_order",
    "sync_epochs",
    "unique_inverse",
]
