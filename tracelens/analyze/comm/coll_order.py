"""Process-group keys and each rank's call order of collective rows (`_order`: the position among the rank's
calls of the same op in the same group), on integer codes of their parts: what
`tracelens.analyze.comm.collectives` matches instances with. Re-exported there."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tracelens.analyze.core.frame_cells import first_rows as _first_rows
from tracelens.analyze.core.frame_cells import isnull as _isnull
from tracelens.analyze.core.frame_cells import per_distinct as _per_distinct
from tracelens.analyze.core.frame_cells import per_distinct_codes as _per_distinct_codes
from tracelens.analyze.core.frame_cells import row_codes as _row_codes
from tracelens.analyze.core.frame_cells import str_series as _str_series


def _group_key(df: pd.DataFrame) -> pd.Series:
    """Process-group identity: pg name when known, else its ranks, else "" (unknown: the default group)."""

    def key(name: Any, ranks: Any) -> str:
        if not _isnull(name) and str(name) != "":
            return "pg:" + str(name)
        text = ",".join(map(str, ranks)) if ranks is not None else ""
        return "r:" + text if text != "" else ""

    # once per distinct (name, ranks), not a string operation over every row
    if len(df) == 0:
        return pd.Series(_per_distinct(key, df["pg_name"], df["pg_ranks"]).astype(str), index=df.index)
    codes, keys = _per_distinct_codes(key, df["pg_name"].astype(object), df["pg_ranks"])
    return _str_series(codes, keys, df.index)


def _order_cols(df: pd.DataFrame) -> list[str]:
    """The columns whose values make `_order`'s key (its step aside)."""
    return ["is_p2p", "op", "peer"] + (["group_key"] if "group_key" in df else ["pg_name", "pg_ranks"])


def _order_base(df: pd.DataFrame) -> np.ndarray:
    """`_order`'s key codes without the step (what both of its variants start from)."""
    return _row_codes(*(df[c] for c in _order_cols(df)))


def _order(df: pd.DataFrame, by_step: bool = False, base: np.ndarray | None = None) -> np.ndarray:
    """0-based position among this rank's calls of the same op in the same group (p2p: with the same peer);
    `by_step`: counted within each profiler step, so a call missing from one rank's trace (cut at the edge
    of the profiling window) shifts the matching of that step only. `base`: `_order_base(df)`, when the
    caller has it (codes of the same tuples: the rows fall into the same keys, in the same order)."""
    # the key strings once per distinct tuple of their parts (first row of each), not for every row
    if base is None:
        base = _order_base(df)
    parts = _row_codes(base, df["step"]) if by_step else base
    f = _first_rows(parts)
    rep = df[_order_cols(df) + (["step"] if by_step else [])].iloc[f]  # (only the key's columns)
    k = np.asarray(_order_key_codes(rep, by_step))[parts]
    rank = df["rank"].astype("Int64")
    t = df["start_ns"].astype("Int64")
    if rank.isna().any() or not df.index.is_unique:  # (groupby leaves null ranks out: the general path)
        tmp = pd.DataFrame({"rank": df["rank"].to_numpy(), "k": k, "t": t.to_numpy()})
        tmp = tmp.sort_values(["rank", "t"], kind="stable")
        out: np.ndarray = tmp.groupby(["rank", "k"]).cumcount().reindex(df.index).to_numpy()
        return out
    return _cumcount(rank.to_numpy(dtype=np.int64), k.astype(np.int64), t)


def _order_key_codes(rep: pd.DataFrame, by_step: bool) -> np.ndarray:
    """Codes (in order of first appearance) of `_order`'s key of the given rows: "p2p|op|peer" for
    send/recv, else "group|op", then "|step|N" when counted per step (N -1 for no step). Built from the
    parts' codes: the strings are one-to-one with the parts (op names hold no "|", groups never start
    with "p2p|"). A null op (not from the extraction, which drops such rows) takes the strings' path."""
    key = rep["group_key"].astype(str) if "group_key" in rep else _group_key(rep)
    op = rep["op"]
    if op.isna().any():
        return _order_key_strings(rep, key, by_step)
    p2p = rep["is_p2p"].astype(bool).to_numpy()
    peer = rep["peer"].astype("Float64").fillna(-1).astype(int).to_numpy()
    cols = [p2p, _row_codes(op), np.where(p2p, peer, 0), np.where(p2p, 0, _row_codes(key))]
    if by_step:
        cols.append(rep["step"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64))
    return _row_codes(*cols)


def _order_key_strings(rep: pd.DataFrame, key: pd.Series, by_step: bool) -> np.ndarray:
    """`_order_key_codes` through the key strings themselves."""
    peer = rep["peer"].astype("Float64").fillna(-1).astype(int).astype(str)
    k = np.where(
        rep["is_p2p"].astype(bool),
        "p2p|" + rep["op"].astype(str) + "|" + peer,
        key + "|" + rep["op"].astype(str),
    )
    if by_step:
        k = np.char.add(
            np.char.add(k.astype(str), "|step|"), rep["step"].astype("Int64").fillna(-1).astype(str)
        )
    return np.asarray(pd.factorize(pd.Series(k))[0])


def _cumcount(rank: np.ndarray, k: np.ndarray, t: pd.Series) -> np.ndarray:
    """Per row: how many rows of the same (rank, k) come before it in (rank, t) order (stable; null t
    last), as pandas' sort_values + groupby(...).cumcount() count them."""
    n = rank.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    na = t.isna().to_numpy(dtype=bool)
    tv = t.to_numpy(dtype=np.int64, na_value=0)
    same = rank[1:] == rank[:-1]
    tied = na[1:] == na[:-1]
    in_order = (rank[1:] > rank[:-1]) | (same & ((na[1:] & ~na[:-1]) | (tied & (tv[1:] >= tv[:-1]))))
    # (the stable sort by (rank, null t, t); the rows are usually in that order already: then no sort)
    o = np.arange(n) if in_order.all() else np.lexsort((tv, na, rank))
    key = (rank - rank.min()) * (int(k.max()) + 1) + k
    s = key[o]
    o2 = np.argsort(s, kind="stable")
    s2 = s[o2]
    pos = np.arange(n)
    first = np.maximum.accumulate(np.where(np.r_[True, s2[1:] != s2[:-1]], pos, 0))
    within = np.empty(n, dtype=np.int64)
    within[o2] = pos - first
    out = np.empty(n, dtype=np.int64)
    out[o] = within
    return out
