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

import numpy as np
import pandas as pd
import pyarrow as pa

#: Largest gap between a profiled call and the Flight Recorder record matched to it.
TOLERANCE_NS = 2_000_000

#: {layer type: {op: {calls_per_step, bytes_per_step, ms_per_step, in_span_calls, inferred_calls}}}
LayerComm = dict[str, dict[str, dict[str, float | int | None]]]


def sizes_from_flight_recorder(coll: pd.DataFrame, fr: pa.Table | None) -> pd.DataFrame:
    """`coll` (collectives rows: rank, op, enqueue_ns, bytes...) with null sizes, dtype and group filled
    from the nearest Flight Recorder record of the same rank and op; a `size_source` column says which."""
    out = coll.copy()
    out["size_source"] = np.where(out["bytes"].notna(), "trace", np.array(None)) if len(out) else []
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


def comm_by_layer_type(
    coll: pd.DataFrame, spans: pa.Table | None, n_steps: dict[int, int]
) -> LayerComm | None:
    """{layer type: {op: {calls_per_step, bytes_per_step, ms_per_step, in_span_calls, inferred_calls}}},
    means over ranks and analysed steps; None when no collective falls in a layer span."""
    if spans is None or spans.num_rows == 0 or not len(coll):
        return None
    sp = spans.select(["rank", "module", "backward", "gpu_start_ns", "gpu_end_ns"]).to_pandas()
    sp = sp[~sp["backward"].astype(bool)]
    c = coll[coll["enqueue_ns"].notna() & (coll["step"].fillna(-1).astype(int) >= 0)].copy()
    if not len(c) or not len(sp):
        return None
    c["rank"] = c["rank"].astype("int64")
    c["t"] = c["enqueue_ns"].astype("int64")
    c["type"] = None
    for r, g in c.groupby("rank"):
        s = sp[sp["rank"] == r].sort_values("gpu_start_ns")
        if not len(s):
            continue
        starts = s["gpu_start_ns"].to_numpy(np.int64)
        ends = s["gpu_end_ns"].to_numpy(np.int64)
        mods = s["module"].to_numpy(object)
        t = g["t"].to_numpy(np.int64)
        # innermost enclosing span: the latest-starting span that starts before t and ends after it
        i = np.searchsorted(starts, t, side="right") - 1
        typ = np.full(len(t), None, dtype=object)
        for k in range(len(t)):  # short walk back over (few) overlapping spans per call
            j = i[k]
            while j >= 0 and j >= i[k] - 8:
                if ends[j] >= t[k]:
                    typ[k] = mods[j]
                    break
                j -= 1
        c.loc[g.index, "type"] = typ
    c["in_span"] = c["type"].notna()
    if not c["in_span"].any():
        return None
    # calls outside spans: the type that holds every in-span call of the same (rank, op, bytes)
    c["bytes_k"] = c["bytes"].fillna(-1)
    held = (
        c[c["in_span"]]
        .groupby(["rank", "op", "bytes_k"])["type"]
        .agg(lambda s: s.iloc[0] if s.nunique() == 1 else None)
    )
    out_mask = ~c["in_span"]
    if out_mask.any():
        j = c.loc[out_mask, ["rank", "op", "bytes_k"]].join(held.rename("held"), on=["rank", "op", "bytes_k"])
        c.loc[out_mask, "type"] = j["held"]
    c = c[c["type"].notna()]
    begin = (
        c["start_ns"].where(c["start_ns"].notna(), c["enqueue_ns"]) if "start_ns" in c else c["enqueue_ns"]
    )
    c["dur"] = (c["end_ns"].astype("float64") - begin.astype("float64")).clip(lower=0)  # kernel/work time
    res: LayerComm = {}
    ranks = sorted(c["rank"].unique())
    steps = {r: max(n_steps.get(int(r), 1), 1) for r in ranks}
    for (typ, op), g in c.groupby(["type", "op"]):
        per = g.groupby("rank").agg(
            calls=("t", "size"),
            bytes=("bytes", lambda s: float(s.fillna(0).sum())),
            dur=("dur", "sum"),
            inspan=("in_span", "sum"),
        )
        div = per.index.map(lambda r: steps[r]).to_numpy(np.float64)
        sized = bool(g["bytes"].notna().all())
        res.setdefault(str(typ), {})[str(op)] = {
            "calls_per_step": float(np.mean(per["calls"].to_numpy() / div)),
            "bytes_per_step": float(np.mean(per["bytes"].to_numpy() / div)) if sized else None,
            "ms_per_step": float(np.mean(per["dur"].to_numpy() / div)) / 1e6,
            "in_span_calls": int(per["inspan"].sum()),
            "inferred_calls": int(per["calls"].sum() - per["inspan"].sum()),
        }
    return res or None
