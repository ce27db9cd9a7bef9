"""Wait vs transfer of matched collective calls (`wait_transfer`) and their Arrow table (`to_table`).

Given the matched calls of `tracelens.analyze.comm.collectives.match_with_findings` and the clock offsets of
`tracelens.analyze.comm.clock`, each call's time splits into waiting for the last participant to arrive and the
transfer after it; arrival skew, lag, blame and bandwidths come with it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.comm.collectives import busbw_factor, matched_table
from tracelens.analyze.core.frame_cells import per_distinct, unique_inverse


def wait_transfer(df: pd.DataFrame, offsets_ns: dict[int, int]) -> pd.DataFrame:
    """Add aligned times, arrival skew, wait / transfer split, lag, blame and bandwidths to matched rows.

    transfer = own end - latest aligned start of the instance (clipped to [0, duration]); wait = the rest.
    lag = own aligned start - earliest; blame (last arriver only) = latest start - second latest start.
    """
    df = df.copy(deep=False)  # (columns are only added: the caller's frame keeps its own)
    if df.empty:
        for c, _typ in WT_COLUMNS:
            df[c] = pd.Series([], dtype="float64")
        return df
    rk = df["rank"].astype(int).to_numpy()
    u_rank, r_inv = unique_inverse(rk)
    off = np.array([offsets_ns.get(int(r), 0) for r in u_rank], dtype=np.int64)[r_inv.reshape(-1)]
    start = df["start_ns"].astype("int64").to_numpy()
    end = df["end_ns"].astype("int64").to_numpy()
    a_start = start - off
    a_end = end - off
    inst = df["instance"].astype("int64").to_numpy()
    # per instance, sorted by aligned start: latest, second latest, earliest, size, and one last arriver
    order = _by_instance_then_start(inst, a_start)
    si, ss = inst[order], a_start[order]
    first = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
    last = np.r_[first[1:] - 1, si.size - 1]
    size = last - first + 1
    grp = np.repeat(np.arange(first.size), size)
    latest = np.empty_like(a_start)
    earliest = np.empty_like(a_start)
    second = np.empty_like(a_start)
    n = np.empty_like(a_start)
    latest[order] = ss[last][grp]
    earliest[order] = ss[first][grp]
    second[order] = ss[np.maximum(last - 1, first)][grp]
    n[order] = size[grp]
    first_last = np.zeros(a_start.size, dtype=bool)
    first_last[order[last[size > 1]]] = True  # the last arriver (ties: the later row in table order)
    dur = np.maximum(end - start, 0)
    transfer = np.clip(a_end - latest, 0, dur)
    wait = dur - transfer
    df["start_aligned_ns"] = a_start
    df["end_aligned_ns"] = a_end
    df["latest_start_ns"] = latest
    df["arrival_skew_ns"] = latest - earliest
    df["n_participants"] = n
    df["wait_ns"] = wait
    df["transfer_ns"] = transfer
    df["lag_ns"] = a_start - earliest
    df["is_last"] = first_last
    df["blame_ns"] = np.where(first_last, latest - second, 0)
    nbytes = df["bytes"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(
            transfer > 0, nbytes / np.where(transfer > 0, transfer, 1), np.nan
        )  # bytes/ns = GB/s
    nexp = df["n_expected"].astype("Float64").fillna(pd.Series(n, dtype="Float64"))
    if "bus_n" in df:  # the group size the traces state (collectives.bus_sizes), else the expected count
        nexp = df["bus_n"].astype("Float64").fillna(nexp)
    factor = per_distinct(busbw_factor, df["op"], nexp.to_numpy(dtype=float)).astype(float)
    df["algbw_gbps"] = algbw
    df["busbw_gbps"] = algbw * factor
    return df


def _by_instance_then_start(inst: np.ndarray, start: np.ndarray) -> np.ndarray:
    """np.lexsort((np.arange(n), start, inst)): one stable sort of instance x span + start when that fits."""
    if inst.size and inst.min() >= 0:
        lo = int(start.min())
        width = int(start.max()) - lo + 1
        if (int(inst.max()) + 1) * width < 1 << 62:
            out: np.ndarray = np.argsort(inst * width + (start - lo), kind="stable")
            return out
    return np.lexsort((np.arange(inst.size), start, inst))


WT_COLUMNS = (
    ("start_aligned_ns", pa.int64()),
    ("end_aligned_ns", pa.int64()),
    ("latest_start_ns", pa.int64()),
    ("arrival_skew_ns", pa.int64()),
    ("n_participants", pa.int32()),
    ("wait_ns", pa.int64()),
    ("transfer_ns", pa.int64()),
    ("lag_ns", pa.int64()),
    ("is_last", pa.bool_()),
    ("blame_ns", pa.int64()),
    ("algbw_gbps", pa.float64()),
    ("busbw_gbps", pa.float64()),
)


def to_table(df: pd.DataFrame, source: pa.Table | None = None) -> pa.Table:
    """Matched rows with wait/transfer columns -> Arrow (COLLECTIVES columns first, then the extras).
    `source`: the COLLECTIVES table the rows were matched from (`collectives.matched_table`)."""
    t = matched_table(df, source)
    for name, typ in WT_COLUMNS:
        vals = df[name] if name in df else pd.Series([None] * len(df))
        if pa.types.is_floating(typ):
            arr = pa.array(np.asarray(vals, dtype=float), typ, from_pandas=True)
        elif pa.types.is_boolean(typ) and isinstance(vals, pd.Series) and vals.dtype == bool:
            arr = pa.array(vals.to_numpy(), typ)
        elif pa.types.is_boolean(typ):
            arr = pa.array([bool(v) for v in vals], typ)
        else:
            arr = pa.array(np.asarray(vals, dtype=np.int64), typ)
        t = t.append_column(name, arr)
    return t
