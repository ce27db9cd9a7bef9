"""Collective sizes for gloo runs, and communication per layer type (which layers exchange, how much).

Sizes. Gloo runs have no `record_param_comms`; their sizes come from the trace itself first: ingest reads
the `c10d::*` ops' and `gloo:*` annotations' `Input Dims` / `Input type` (comm_families.sizes_from_shapes:
a `Tensor[]` argument counts all its tensors, its dtype `TensorList` is unknown) and collectives pairs each
c10d call with its gloo work annotation, which names the dtype. Rows still unsized (no shapes recorded, or
a tensor list with no annotation dtype) take the Flight Recorder's: it records every collective with its
`input_sizes` and dtype, on the same wall clock as the profiler: the profiled calls of one rank and op are a
contiguous run of its records, placed where the enqueue times agree best (median gap within
`TOLERANCE_NS`), and call k takes the size of record offset + k. Neither: null (`size_source` None).

Layer types. A collective called inside a layer annotation (`layers.N.<type>`) on its rank serves that
layer type. Calls outside every span (the backward exchanges run from autograd, outside the forward
annotations) go to a layer type when, on that rank, every in-span call of the same op and size lies in
that one type: Ulysses' all-to-alls are all inside full-attention layers, so their backward twins are too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

#: Largest gap between a profiled call and the Flight Recorder record matched to it.
TOLERANCE_NS = 2_000_000

#: {layer type: {op: {calls_per_step, bytes_per_step, ms_per_step, in_span_calls, inferred_calls}}}
LayerComm = dict[str, dict[str, dict[str, float | int | None]]]


#: Collectives columns read by `comm_by_layer_type` and `summary.collectives_dict`, and those filled here.
SIZED_COLUMNS = (
    "rank",
    "op",
    "enqueue_ns",
    "step",
    "bytes",
    "start_ns",
    "end_ns",
    "busbw_gbps",
    "bus_n",
    "bus_n_from",
    "arrival_skew_ns",
    "n_participants",
    "in_nelems",
    "out_nelems",
    "dtype",
    "pg_name",
    "pg_desc",
)


def sizes_from_flight_recorder(coll: pd.DataFrame, fr: pa.Table | None) -> pd.DataFrame:
    """`coll` (collectives rows: rank, op, enqueue_ns, bytes...) with null sizes, dtype and group filled
    from the nearest Flight Recorder record of the same rank and op; a `size_source` column says which."""
    out = coll.copy(deep=False)  # (copy-on-write: the columns set here do not touch `coll`)
    out["size_source"] = _trace_or_null(out["bytes"].notna().to_numpy(bool)) if len(out) else []
    if fr is None or fr.num_rows == 0 or not len(out):
        return out
    f = fr.select(
        [
            c
            for c in (
                "rank",
                "op",
                "enqueue_ns",
                "bytes",
                "in_nelems",
                "out_nelems",
                "dtype",
                "pg_name",
                "pg_desc",
            )
            if c in fr.column_names
        ]
    ).to_pandas()
    f = f[f["enqueue_ns"].notna() & f["bytes"].notna()]
    todo = out["bytes"].isna() & out["enqueue_ns"].notna()
    if not len(f) or not todo.any():
        return out
    left = out.loc[todo, ["rank", "op", "enqueue_ns"]].copy()
    left["_i"] = left.index
    left["rank"] = left["rank"].astype("int64")
    left["op"] = left["op"].astype(str)
    left["enqueue_ns"] = left["enqueue_ns"].astype("int64")
    f["rank"] = f["rank"].astype("int64")
    f["op"] = f["op"].astype(str)
    f["enqueue_ns"] = f["enqueue_ns"].astype("int64")
    # the profiled calls are a contiguous run of the recorder's calls (same rank, op): the offset whose
    # enqueue times agree best (median gap) maps call k to record offset + k
    fr_cols = [c for c in f.columns if c not in ("rank", "op", "enqueue_ns")]
    parts = []
    fgroups = {k: g.sort_values("enqueue_ns", kind="stable") for k, g in f.groupby(["rank", "op"])}
    for k, g in left.sort_values("enqueue_ns", kind="stable").groupby(["rank", "op"]):
        fg = fgroups.get(k)
        if fg is None or len(fg) < len(g):
            continue
        kt, ft = g["enqueue_ns"].to_numpy(np.int64), fg["enqueue_ns"].to_numpy(np.int64)
        n = len(kt)
        costs = [float(np.median(np.abs(ft[o : o + n] - kt))) for o in range(len(ft) - n + 1)]
        best = int(np.argmin(costs))
        if costs[best] > TOLERANCE_NS:
            continue
        sel = fg.iloc[best : best + n]
        parts.append(
            pd.DataFrame({"_i": g["_i"].to_numpy(), **{f"fr_{c}": sel[c].to_numpy() for c in fr_cols}})
        )
    if not parts:
        return out
    m = pd.concat(parts, ignore_index=True)
    m = m[m["fr_bytes"].notna()].set_index("_i")
    for c in ("bytes", "in_nelems", "out_nelems", "dtype", "pg_name", "pg_desc"):
        if f"fr_{c}" in m.columns and c in out.columns:
            col = out[c].astype(object)
            col.loc[m.index] = col.loc[m.index].where(col.loc[m.index].notna(), m[f"fr_{c}"])
            out[c] = col
    out.loc[m.index, "size_source"] = "flight_recorder"
    return out


def _trace_or_null(known: np.ndarray) -> Any:
    """The size sources before the Flight Recorder: "trace" where `known`, else null, as the column that
    `np.where(known, "trace", None)` becomes (pandas' default string dtype, object before pandas 3), built
    from an Arrow array where that dtype is Arrow's (no Python string per row: ~0.18 s for the 590 k calls
    of 1,024 ranks)."""
    dtype = pd.Series(["trace"]).dtype
    if not isinstance(dtype, pd.StringDtype) or dtype.storage != "pyarrow":
        return np.where(known, "trace", np.array(None))
    return pd.array(
        pc.if_else(pa.array(known), pa.scalar("trace"), pa.scalar(None, pa.string())), dtype=dtype
    )


def _enclosing_type(
    c_rank: np.ndarray,
    t: np.ndarray,
    s_rank: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    mods: np.ndarray,
) -> np.ndarray:
    """Module of the innermost span enclosing each call (rank `c_rank`, time `t`): the latest-starting span
    of the rank that starts at or before t and ends at or after it, looking back over at most 9 spans
    (few overlap); None for none. Spans are ordered by start within each rank, the way a per-rank
    `sort_values` orders them (ties included), and searched for all ranks at once."""
    # spans grouped by rank (stable), then by start within the rank
    o = np.lexsort((starts, s_rank))
    sr, ss = s_rank[o], starts[o]
    tie = np.flatnonzero((sr[1:] == sr[:-1]) & (ss[1:] == ss[:-1]))
    if tie.size:  # equal starts: order them as numpy's default (quicksort) argsort of the rank's spans does
        grp = np.argsort(s_rank, kind="stable")
        g_r = s_rank[grp]
        for r in np.unique(sr[tie]):
            lo, hi = np.searchsorted(g_r, r, "left"), np.searchsorted(g_r, r, "right")
            rows = grp[lo:hi]  # the rank's spans in their original order
            a, b = np.searchsorted(sr, r, "left"), np.searchsorted(sr, r, "right")
            o[a:b] = rows[np.argsort(starts[rows])]
    codes, names = pd.factorize(mods[o])  # (modules as integer codes: -1 for a missing one, as None)
    sr, ss, se = s_rank[o], starts[o], ends[o]
    # i: the last span of the call's rank starting at or before t, -1 below the rank's first span
    rank_lo = np.searchsorted(sr, c_rank, "left")  # the rank's first span
    i = _last_at_or_before(sr, ss, c_rank, t)
    found = np.full(t.size, -1, np.int64)  # module code of the enclosing span; -1: none (or no module)
    todo = np.ones(t.size, bool)
    for back in range(9):  # short walk back over (few) overlapping spans per call
        j = i - back
        ok = todo & (j >= rank_lo)
        ok[ok] = se[j[ok]] >= t[ok]
        found[ok] = codes[j[ok]]
        todo &= ~ok
    typ = np.full(t.size, None, dtype=object)
    has = found >= 0
    typ[has] = np.asarray(names, dtype=object)[found[has]]
    return typ


def _last_at_or_before(sr: np.ndarray, ss: np.ndarray, c_rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per call (rank `c_rank`, time `t`): index of the last span (sorted by rank, then start `ss`) of the
    same rank that starts at or before t; the index before the rank's first span when there is none."""
    lo = min(int(ss.min()), int(t.min()))
    width = max(int(ss.max()), int(t.max())) - lo + 1
    r_min = min(int(sr.min()), int(c_rank.min()))
    n_r = max(int(sr.max()), int(c_rank.max())) - r_min + 1
    if n_r * width < 2**62:  # one int64 key (rank, time): a single sorted search
        s_key = (sr - r_min) * width + (ss - lo)
        c_key = (c_rank - r_min) * width + (t - lo)
        out: np.ndarray = np.searchsorted(s_key, c_key, "right") - 1
        return out
    # a merge of spans and calls by (rank, time), spans first on equal times
    n_s = sr.size
    is_call = np.concatenate([np.zeros(n_s, np.int64), np.ones(t.size, np.int64)])
    m = np.lexsort((is_call, np.concatenate([ss, t]), np.concatenate([sr, c_rank])))
    spans_before = np.cumsum(is_call[m] == 0)
    out = np.empty(t.size, np.int64)
    out[m[is_call[m] == 1] - n_s] = spans_before[is_call[m] == 1] - 1
    return out


def comm_by_layer_type(
    coll: pd.DataFrame, spans: pa.Table | None, n_steps: dict[int, int]
) -> LayerComm | None:
    """{layer type: {op: {calls_per_step, bytes_per_step, ms_per_step, in_span_calls, inferred_calls}}},
    means over ranks and analysed steps; None when no collective falls in a layer span."""
    if spans is None or spans.num_rows == 0 or not len(coll):
        return None
    sp = spans.select(["rank", "module", "backward", "gpu_start_ns", "gpu_end_ns"]).to_pandas()
    sp = sp[~sp["backward"].astype(bool)]
    # only the columns read below (the rows' other columns, e.g. pg_ranks lists, are not copied)
    need = [
        k for k in ("rank", "op", "enqueue_ns", "step", "bytes", "start_ns", "end_ns") if k in coll.columns
    ]
    c = coll[need][coll["enqueue_ns"].notna() & (coll["step"].fillna(-1).astype(int) >= 0)]
    if not len(c) or not len(sp):
        return None
    c["rank"] = c["rank"].astype("int64")
    c["t"] = c["enqueue_ns"].astype("int64")
    typ = _enclosing_type(
        c["rank"].to_numpy(np.int64),
        c["t"].to_numpy(np.int64),
        sp["rank"].to_numpy(np.int64),
        sp["gpu_start_ns"].to_numpy(np.int64),
        sp["gpu_end_ns"].to_numpy(np.int64),
        sp["module"].to_numpy(object),
    )
    c["type"] = pd.Series(typ, index=c.index, dtype=object)
    c["in_span"] = c["type"].notna()
    if not c["in_span"].any():
        return None
    # calls outside spans: the type that holds every in-span call of the same (rank, op, bytes)
    c["bytes_k"] = c["bytes"].fillna(-1)
    agg = c[c["in_span"]].groupby(["rank", "op", "bytes_k"])["type"].agg(["first", "nunique"])
    held = agg["first"].where(agg["nunique"] == 1, None)
    out_mask = ~c["in_span"]
    if out_mask.any():
        j = c.loc[out_mask, ["rank", "op", "bytes_k"]].join(held.rename("held"), on=["rank", "op", "bytes_k"])
        c.loc[out_mask, "type"] = j["held"]
    c = c[c["type"].notna()]
    begin = (
        c["start_ns"].where(c["start_ns"].notna(), c["enqueue_ns"]) if "start_ns" in c else c["enqueue_ns"]
    )
    c["dur"] = (c["end_ns"].astype("float64") - begin.astype("float64")).clip(lower=0)  # kernel/work time
    c["bytes0"] = pd.to_numeric(c["bytes"].fillna(0)).astype("float64")
    c["sized"] = c["bytes"].notna()
    # one group-by over (type, op, rank), then a short loop over the (type, op) pairs
    ranks, t_code, o_code, typ_op, calls, byt, dur, inspan, sized = _per_type_op_rank(c)
    div = np.array([max(n_steps.get(int(r), 1), 1) for r in np.unique(ranks)], np.float64)
    div = div[np.searchsorted(np.unique(ranks), ranks)]
    # the group-by's (type, op, rank) order: each (type, op) pair is one run, in the order a group-by on
    # (type, op) alone iterates them, its ranks ascending
    new = np.ones(ranks.size, bool)
    new[1:] = (t_code[1:] != t_code[:-1]) | (o_code[1:] != o_code[:-1])
    bounds = np.append(np.flatnonzero(new), ranks.size)
    res: LayerComm = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        g = slice(a, b)
        typ, op = typ_op[a]
        res.setdefault(str(typ), {})[str(op)] = {
            "calls_per_step": float(np.mean(calls[g] / div[g])),
            "bytes_per_step": float(np.mean(byt[g] / div[g])) if bool(sized[g].all()) else None,
            "ms_per_step": float(np.mean(dur[g] / div[g])) / 1e6,
            "in_span_calls": int(inspan[g].sum()),
            "inferred_calls": int(calls[g].sum() - inspan[g].sum()),
        }
    return res or None


def _per_type_op_rank(c: pd.DataFrame) -> tuple[Any, ...]:
    """Per (type, op, rank) group, in `c.groupby(["type", "op", "rank"])` order (types sorted, ops in their
    categories' order, ranks ascending): ranks, type codes, op codes, (type, op) per group, calls, bytes0
    sum, dur sum, in_span count, all sized. One lexsort and `reduceat` when `op` is categorical and the
    types are strings (the collectives table's); the group-by otherwise. Sums are of whole numbers (bytes,
    differences of float64 ns), so they are exact either way."""
    typ = c["type"].to_numpy(object)
    if (
        not isinstance(c["op"].dtype, pd.CategoricalDtype)
        or pd.api.types.infer_dtype(typ, skipna=False) != "string"
    ):
        per = c.groupby(["type", "op", "rank"]).agg(
            calls=("t", "size"),
            bytes=("bytes0", "sum"),
            dur=("dur", "sum"),
            inspan=("in_span", "sum"),
            sized=("sized", "all"),
        )
        return (
            per.index.get_level_values("rank").to_numpy(np.int64),
            np.asarray(per.index.codes[0]),
            np.asarray(per.index.codes[1]),
            per.index.droplevel("rank"),
            per["calls"].to_numpy(),
            per["bytes"].to_numpy(np.float64),
            per["dur"].to_numpy(np.float64),
            per["inspan"].to_numpy(),
            per["sized"].to_numpy(bool),
        )
    t_names, t_code = np.unique(typ, return_inverse=True)
    t_code = t_code.ravel()
    o_code = c["op"].cat.codes.to_numpy().astype(np.int64)
    o_names = c["op"].cat.categories
    rank = c["rank"].to_numpy(np.int64)
    keep = np.flatnonzero(o_code >= 0)  # (a null op is in no group)
    o = keep[np.lexsort((rank[keep], o_code[keep], t_code[keep]))]
    r, t, op = rank[o], t_code[o], o_code[o]
    new = np.ones(o.size, bool)
    new[1:] = (r[1:] != r[:-1]) | (t[1:] != t[:-1]) | (op[1:] != op[:-1])
    st = np.flatnonzero(new)
    if not st.size:
        empty = np.zeros(0, np.int64)
        return (
            empty,
            empty,
            empty,
            [],
            empty,
            empty.astype(float),
            empty.astype(float),
            empty,
            empty.astype(bool),
        )
    calls = np.diff(np.append(st, o.size))
    byt = np.add.reduceat(c["bytes0"].to_numpy(np.float64)[o], st)
    dur = np.add.reduceat(np.nan_to_num(c["dur"].to_numpy(np.float64), nan=0.0)[o], st)  # (sum skips NaN)
    inspan = np.add.reduceat(c["in_span"].to_numpy(bool)[o].astype(np.int64), st)
    sized = np.logical_and.reduceat(c["sized"].to_numpy(bool)[o], st)
    o_list = list(o_names)  # (the categories as plain values once: no Index lookup per group)
    typ_op = [(t_names[a], o_list[b]) for a, b in zip(t[st].tolist(), op[st].tolist())]
    return r[st], t[st], op[st], typ_op, calls, byt, dur, inspan, sized
