"""Per-operator performance: FLOPs and bytes of each op (tracelens.models.op_flops) against the time of
its GPU kernels, achieved TFLOP/s and TB/s, and the roofline bound; kernel tables; launch statistics; the
allocator timeline. Pure functions: tables in, DataFrames out (docs/ops.md explains every column).

An op instance is a CPU operator that launched kernels: every kernel is linked to the innermost CPU op
active at its launch (its `External id`, else its launch's through `correlation`), so nested ops
(`aten::linear` -> `aten::mm`) are never counted twice. On ranks without kernels (CPU-only runs) the
instances are the leaf CPU ops and their time is their CPU duration.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.models.hardware import hbm_bandwidth, roofline_peak_flops
from tracelens.models.op_flops import OpContext, OpCost, op_cost, op_family
from tracelens.schema import KERNEL_NAME_COMM

#: Columns of the op table (one row per rank, op, shapes, main kernel and layer type).
OP_COLUMNS = [
    "rank",
    "stage",
    "op",
    "kernel",
    "shapes",
    "layer_type",
    "model",
    "calls",
    "ms_per_step",
    "flops",
    "bytes",
    "tflops",
    "tbps",
    "bound",
    "roofline_pct",
]
#: The summary's `ops` keys, in order.
SUMMARY_KEYS = [
    "op",
    "kernel",
    "stage",
    "rank",
    "layer_type",
    "shapes",
    "calls",
    "ms_per_step",
    "flops",
    "bytes",
    "tflops",
    "tbps",
    "bound",
    "roofline_pct",
    "model",
]
#: `shapes` longer than this are cut (with "…") in summary rows (a fused optimizer step over thousands of
#: tensors records them all); the API's tables keep them whole.
SHAPES_MAX_CHARS = 256
#: Kernels shorter than this count as short in the launch statistics.
SHORT_KERNEL_NS = 10_000
_COMM = re.compile(KERNEL_NAME_COMM)
_NULL_KEY = "<tracelens:null>"  # stands for a null in group keys (pandas drops or mangles nulls there)


# ------------------------------------------------------------------------------------------- kernel names
def _fold_templates(s: str) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _strip_args(s: str) -> str:
    """Drop a trailing argument list `(...)` (balanced from the end)."""
    s = s.rstrip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i].rstrip() if i > 0 else s
    return s


@lru_cache(maxsize=8192)
def short_kernel_name(name: str | None) -> str | None:
    """A readable kernel name: return type, argument list and namespaces dropped, template arguments folded
    to `<…>`, the functor of PyTorch's elementwise/reduce kernels kept in brackets
    (`vectorized_elementwise_kernel<…>[CUDAFunctor_add]`). Names without C++ syntax are kept as they are."""
    if not name:
        return name
    s = name.strip()
    tensile = re.match(r"(Cijk_\w+?_MT\d+x\d+x\d+)", s)  # AMD Tensile/hipBLASLt: up to the tile shape
    if tensile:
        return tensile.group(1)
    if "(" not in s and "<" not in s and "::" not in s:
        return s if len(s) <= 96 else s[:95] + "…"
    functor = None
    m = re.search(
        r"at::native::(?:[\w:]*::)?((?:CUDAFunctor_|BinaryFunctor|AUnaryFunctor|FillFunctor|"
        r"[A-Z]\w*Functor|\w+_functor|\w+_kernel_cuda|MulFunctor|AddFunctor)\w*)",
        s,
    )
    if m and ("elementwise_kernel" in s or "reduce_kernel" in s):
        functor = m.group(1)
        inner = re.search(r"binary_internal::(\w+Functor)", s)
        if inner:
            functor = inner.group(1)
    s = re.sub(r"^void\s+", "", s)
    s = _strip_args(s)
    s = _fold_templates(s)
    s = re.sub(r"\(anonymous namespace\)::", "", s)
    base = s.split("::")[-1] if "::" in s else s
    base = base.strip() or s
    return f"{base}[{functor}]" if functor else base


#: The events columns `op_instances` and `launch_stats` read (the per-op view reads only these).
EVENT_COLUMNS = ["rank", "kind", "name", "tid", "ts_ns", "dur_ns", "correlation", "external_id", "step"]


# ------------------------------------------------------------------------------------------- helpers
def _col(t: pa.Table, name: str, fill: object = None) -> np.ndarray:
    c = t.column(name)
    if fill is not None:
        c = c.fill_null(fill)
    out: np.ndarray = c.to_numpy(zero_copy_only=False)
    return out


def _kind_mask(events: pa.Table, kinds: tuple[str, ...]) -> np.ndarray:
    """bool per row: its kind is one of `kinds` (one test per distinct kind, not a string a row)."""
    from tracelens.analyze.core.dictcol import dict_lookup

    wanted = frozenset(kinds)
    out: np.ndarray = dict_lookup(events.column("kind"), lambda v: int(v in wanted)).astype(bool)
    return out


def _frame(events: pa.Table, mask: np.ndarray, cols: list[str]) -> pd.DataFrame:
    """The rows of `mask`, `cols` only. String (dictionary) columns become object columns of the
    dictionary's own str objects (one per distinct value, None for null): 8 bytes a row, and merges, sorts
    and group-bys move pointers, where a copy of every row's text would cost its length a row."""
    sub = events.select(cols).filter(pa.array(mask))
    data = {}
    for c in cols:
        col = sub.column(c)
        data[c] = (
            pd.Series(_objects(col), dtype=object) if pa.types.is_dictionary(col.type) else col.to_pandas()
        )
    return pd.DataFrame(data)


def _objects(col: pa.ChunkedArray) -> np.ndarray:
    """A dictionary column as an object array of its dictionaries' str objects (None for null)."""
    parts = []
    for ch in col.chunks:
        values = np.empty(len(ch.dictionary) + 1, dtype=object)
        values[:-1] = ch.dictionary.to_pylist()
        parts.append(values[ch.indices.fill_null(len(ch.dictionary)).to_numpy(zero_copy_only=False)])
    return np.concatenate(parts) if parts else np.empty(0, dtype=object)


def _in_steps(step: pd.Series, steps: list[int] | None) -> pd.Series:
    """Rows in the analyzed steps; every row when the run has no steps (no ProfilerStep annotations)."""
    if not steps:
        return pd.Series(True, index=step.index)
    return step.isin(list(steps))


def _layer_of(ranks: np.ndarray, ts: np.ndarray, spans: pa.Table | None) -> np.ndarray:
    """Module name of the module span (layers.N.<module>) holding each (rank, ts), else None."""
    out = np.full(len(ts), None, dtype=object)
    if spans is None or spans.num_rows == 0 or len(ts) == 0:
        return out
    sp = spans.to_pandas()
    sp = sp[sp["gpu_start_ns"].notna() & sp["gpu_end_ns"].notna()]
    for r, g in sp.groupby("rank"):
        g = g.sort_values("gpu_start_ns")
        st = g["gpu_start_ns"].to_numpy(np.int64)
        en = g["gpu_end_ns"].to_numpy(np.int64)
        mod = g["module"].to_numpy(object)
        sel = np.flatnonzero(ranks == r)
        if not sel.size:
            continue
        i = np.searchsorted(st, ts[sel], side="right") - 1
        ok = i >= 0
        ok[ok] &= ts[sel][ok] < en[i[ok]]
        out[sel[ok]] = mod[i[ok]]
    return out


def _leaf_cpu_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """The CPU op instances of a rank without kernels (per thread): every modelled op with no modelled op
    around it (its inner calls, `aten::mm` -> `aten::resolve_conj`, `aten::empty`, are implementation
    details of its time), and every op without a model that has no op nested inside it and no modelled op
    around it. So no time is counted twice."""
    if ops.empty:
        return ops
    o = ops.sort_values(["rank", "tid", "ts_ns", "dur_ns"], ascending=[True, True, True, False])
    start = o["ts_ns"].to_numpy(np.int64)
    end = start + o["dur_ns"].fillna(0).to_numpy(np.int64)
    grp = (o["rank"].astype(str) + ":" + o["tid"].astype(str)).to_numpy()
    names = o["name"].to_numpy(object)
    fam = {n: op_family(n) is not None for n in set(names) if isinstance(n, str)}
    modelled = np.array([fam.get(n, False) for n in names], dtype=bool)
    n = len(o)
    nxt_same = np.zeros(n, dtype=bool)
    nxt_same[:-1] = grp[1:] == grp[:-1]
    nxt_ts = np.empty(n, dtype=np.int64)
    nxt_ts[:-1] = start[1:]
    nxt_ts[-1] = np.iinfo(np.int64).max
    leaf = ~nxt_same | (nxt_ts >= end)
    under = np.zeros(n, dtype=bool)
    stack: list[tuple[int, bool]] = []  # (row, a modelled op is this op or around it)
    for i in range(n):  # one pass over one CPU-only rank's ops (such traces are small)
        while stack and (grp[stack[-1][0]] != grp[i] or end[stack[-1][0]] <= start[i]):
            stack.pop()
        under[i] = bool(stack) and stack[-1][1]
        stack.append((i, under[i] or modelled[i]))
    keep = (modelled & ~under) | (~modelled & leaf & ~under)
    return o[keep]


def _enclosing_ops(cpu: pd.DataFrame, points: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(external_id, name) of the innermost CPU op on the same rank and thread holding each point
    (columns rank, rt_tid, rt_ts), else (nan, None). The latest op starting before the point is found with
    merge_asof, then its parents are walked until one ends after the point."""
    n = len(points)
    out_ext = np.full(n, np.nan)
    out_op = np.full(n, None, dtype=object)
    c = cpu.dropna(subset=["tid", "ts_ns"]).sort_values(
        ["rank", "tid", "ts_ns", "dur_ns"], ascending=[True, True, True, False]
    )
    if c.empty or n == 0:
        return out_ext, out_op
    c = c.reset_index(drop=True)
    start = c["ts_ns"].to_numpy(np.int64)
    end = start + c["dur_ns"].fillna(0).to_numpy(np.int64)
    parent = np.full(len(c), -1, dtype=np.int64)
    grp = (c["rank"].astype(str) + ":" + c["tid"].astype(str)).to_numpy()
    stack: list[int] = []
    for i in range(len(c)):  # one pass over one rank's CPU ops (only for traces without op ids)
        while stack and (grp[stack[-1]] != grp[i] or end[stack[-1]] <= start[i]):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    c["row"] = np.arange(len(c))
    p = (
        points.reset_index(drop=True)
        .assign(pos=np.arange(n))
        .rename(columns={"rt_tid": "tid", "rt_ts": "ts_ns"})
    )
    p["ts_ns"] = p["ts_ns"].astype(np.int64)
    p["tid"] = p["tid"].astype(c["tid"].dtype)
    p = p.sort_values("ts_ns")
    m = pd.merge_asof(
        p,
        c[["rank", "tid", "ts_ns", "row"]].sort_values("ts_ns"),
        on="ts_ns",
        by=["rank", "tid"],
        direction="backward",
    )
    row = m["row"].fillna(-1).to_numpy(np.int64).copy()
    t = m["ts_ns"].to_numpy(np.int64)
    for _ in range(64):  # nesting depth
        bad = (row >= 0) & (end[np.maximum(row, 0)] <= t)
        if not bad.any():
            break
        row[bad] = parent[row[bad]]
    ok = row >= 0
    pos = m["pos"].to_numpy(np.int64)
    out_ext[pos[ok]] = c["external_id"].to_numpy(float)[row[ok]]
    out_op[pos[ok]] = c["name"].to_numpy(object)[row[ok]]
    return out_ext, out_op


# ------------------------------------------------------------------------------------------- op instances
def op_instances(
    events: pa.Table,
    shapes: pa.Table | None = None,
    steps: list[int] | None = None,
    spans: pa.Table | None = None,
) -> pd.DataFrame:
    """One row per op instance: rank, step, external_id, op, kernel (its longest kernel, short name),
    n_kernels, time_ns (sum of its kernels; CPU duration on kernel-less ranks), start_ns, layer_type, and
    its recorded shapes (input_dims, input_types, concrete_inputs: JSON text or None). `shapes`: OP_SHAPES
    rows with a `rank` column (tracelens.ingest.op_shapes)."""
    cols = ["rank", "name", "ts_ns", "dur_ns", "external_id", "correlation", "step"]
    empty = pd.DataFrame(
        columns=[
            "rank",
            "step",
            "external_id",
            "op",
            "kernel",
            "n_kernels",
            "time_ns",
            "start_ns",
            "layer_type",
            "input_dims",
            "input_types",
            "concrete_inputs",
        ]
    )
    if events.num_rows == 0:
        return empty
    k = _frame(events, _kind_mask(events, ("kernel",)), cols)
    if not k.empty:  # communication kernels are no op's: the name test once per distinct name
        codes, uniq = pd.factorize(k["name"].to_numpy(object))
        is_comm = np.array([bool(_COMM.search(n)) for n in uniq] + [False], dtype=bool)
        k = k[~is_comm[codes]]
    cpu = _frame(events, _kind_mask(events, ("cpu_op",)), cols + ["tid"])
    parts = []
    moe_ops = cpu[cpu["name"].isin([*MOE_LAYERS, *MOE_ROUTING])]  # (all `_moe_top_k` reads of the CPU ops)
    gpu_ranks = set(k["rank"].unique()) if not k.empty else set()
    if not k.empty:
        k = k[_in_steps(k["step"], steps)]
        rt = _frame(
            events,
            _kind_mask(events, ("cuda_runtime", "cuda_driver")),
            ["rank", "correlation", "external_id", "ts_ns", "tid"],
        )
        rt = rt.dropna(subset=["correlation"]).drop_duplicates(["rank", "correlation"])
        rt = rt.rename(columns={"external_id": "rt_ext", "ts_ns": "rt_ts", "tid": "rt_tid"})
        k = k.merge(rt, on=["rank", "correlation"], how="left")
        del rt
        k["ext"] = k["external_id"].fillna(k["rt_ext"])
        names = cpu.dropna(subset=["external_id"]).drop_duplicates(["rank", "external_id"])
        names = names[["rank", "external_id", "name"]].rename(columns={"external_id": "ext", "name": "op"})
        k = k.merge(names, on=["rank", "ext"], how="left")
        del names
        miss = k["op"].isna() & k["rt_ts"].notna() & k["rt_tid"].notna()
        if miss.any():  # older traces: ids are per launch; the op is the innermost one around the launch
            ops_only = cpu[~cpu["name"].fillna("").str.startswith("ProfilerStep")]  # (a step is no op)
            ext, op = _enclosing_ops(ops_only, k.loc[miss, ["rank", "rt_tid", "rt_ts"]])
            found = np.array([o is not None for o in op], dtype=bool)
            rows = k.index[miss][
                found
            ]  # (kernels still unlinked keep their id: it groups one launch's kernels)
            k.loc[rows, "ext"] = ext[found]
            k.loc[rows, "op"] = op[found]
        cpu = cpu[~cpu["rank"].isin(gpu_ranks)]  # (what is read of the CPU ops below: let the rest go)
        # (only what the instances are made of, before the sort copies the frame)
        k = k[["rank", "name", "ts_ns", "dur_ns", "step", "ext", "op"]]
        k["kernel"] = pd.Series(_map_distinct(k["name"], short_kernel_name), index=k.index, dtype=object)
        k = k.drop(columns=["name"])
        k = k.sort_values("dur_ns", ascending=False)
        # kernels not linked to a CPU op stay one instance each (an id no CPU op carries may be an
        # annotation's, which spans a whole layer: it does not make its kernels one op)
        # group key: the op's id, or the row's own label (its index) for a kernel linked to no op
        linked = (k["ext"].notna() & k["op"].notna()).to_numpy(bool)
        ext = k["ext"].to_numpy(np.float64)
        k["linked"] = linked
        k["key"] = np.where(linked, np.nan_to_num(ext).astype(np.int64), k.index.to_numpy(np.int64))
        g = k.groupby(["rank", "linked", "key"], sort=False)
        inst = (
            g.agg(
                step=("step", "first"),
                external_id=("ext", "first"),
                op=("op", "first"),
                kernel=("kernel", "first"),
                n_kernels=("dur_ns", "size"),
                time_ns=("dur_ns", "sum"),
                start_ns=("ts_ns", "min"),
            )
            .reset_index()
            .drop(columns=["linked", "key"])
        )
        parts.append(inst)
    if not cpu.empty:
        c = cpu[~cpu["rank"].isin(gpu_ranks)]
        c = c[_in_steps(c["step"], steps)]
        c = c[~c["name"].str.startswith("ProfilerStep")]
        if not c.empty:
            leaf = _leaf_cpu_ops(c)
            parts.append(
                pd.DataFrame(
                    {
                        "rank": leaf["rank"],
                        "step": leaf["step"],
                        "external_id": leaf["external_id"],
                        "op": leaf["name"],
                        "kernel": None,
                        "n_kernels": 0,
                        "time_ns": leaf["dur_ns"],
                        "start_ns": leaf["ts_ns"],
                    }
                )
            )
    if not parts:
        return empty
    inst = pd.concat(parts, ignore_index=True)
    inst["layer_type"] = _layer_of(
        inst["rank"].to_numpy(np.int64), inst["start_ns"].to_numpy(np.int64), spans
    )
    if shapes is not None and shapes.num_rows:
        sh = (
            shapes.to_pandas()
            .drop_duplicates(["rank", "external_id"])
            .drop(columns=["name"], errors="ignore")
        )
        inst = inst.merge(sh, on=["rank", "external_id"], how="left")
        if inst["op"].isin(MOE_LAYERS).any():
            inst["moe_top_k"] = _moe_top_k(moe_ops, shapes.to_pandas(), inst)
    else:
        inst["input_dims"] = inst["input_types"] = inst["concrete_inputs"] = None
    return inst


@lru_cache(maxsize=65536)
def _cost(
    op: str, dims: str | None, types: str | None, concrete: str | None, ctx: OpContext | None = None
) -> OpCost | None:
    if not isinstance(op, str) or not isinstance(dims, str):
        return None
    try:
        d = json.loads(dims)
        t = json.loads(types) if isinstance(types, str) else None
        c = json.loads(concrete) if isinstance(concrete, str) else None
    except ValueError:
        return None
    return op_cost(op, d, t, c, ctx)


def instance_contexts(
    inst: pd.DataFrame,
    contexts: dict[tuple[int, int], OpContext] | None,
    model_context: OpContext | None = None,
) -> np.ndarray:
    """Per instance: the OpContext its model reads (None for every op whose model reads none): the iteration
    context of its (rank, step) for attention ops, the MoE top-k of a routing op nested in it (column
    `moe_top_k`, op_instances) or else the model's, with the model's expert size, for MoE layers."""
    out = np.full(len(inst), None, dtype=object)
    if inst.empty or (not contexts and model_context is None and "moe_top_k" not in inst):
        return out
    fam = _map_distinct(inst["op"], lambda o: op_family(o) if isinstance(o, str) else None)
    steps = inst["step"].to_numpy(object) if "step" in inst else np.full(len(inst), None, dtype=object)
    ranks = inst["rank"].to_numpy(object)
    ks = inst["moe_top_k"].to_numpy(object) if "moe_top_k" in inst else np.full(len(inst), None, dtype=object)
    for i in np.flatnonzero((fam == "attention") | (fam == "moe")):
        if fam[i] == "attention":
            if contexts and steps[i] is not None and not pd.isna(steps[i]):
                out[i] = contexts.get((int(ranks[i]), int(steps[i])))
            continue
        k = ks[i] if ks[i] is not None and not pd.isna(ks[i]) else None
        base = model_context or OpContext()
        if k is not None:
            base = OpContext(
                moe_top_k=int(k), moe_intermediate=base.moe_intermediate, moe_gated=base.moe_gated
            )
        out[i] = base if base.moe_top_k or base.moe_intermediate else None
    return out


#: Routing ops a fused MoE layer runs inside it, and where each says the top-k: ("dims", i) the second dim
#: of its i-th input (the top-k ids / weights [tokens, k]), ("concrete", i) its i-th scalar argument.
MOE_ROUTING = {
    "_moe_C::topk_softmax": ("dims", 0),
    "aiter::topk_softmax": ("dims", 0),
    "aiter::topk_softmax_asm": ("dims", 0),
    "aiter::biased_grouped_topk": ("dims", 2),
    "aiter::grouped_topk": ("dims", 1),
    "TopK": ("concrete", 1),
    "aten::topk": ("concrete", 1),
}
#: MoE layers rated from the routing nested in them (op_flops._moe_layer).
MOE_LAYERS = ("vllm::moe_forward", "vllm::moe_forward_shared")


def _moe_top_k(cpu: pd.DataFrame, shapes: pd.DataFrame | None, inst: pd.DataFrame) -> pd.Series:
    """Per instance of a MoE layer: the top-k of the first routing op (MOE_ROUTING) nested in its CPU op on
    the same thread, from that op's recorded shapes; else null."""
    out = pd.Series([None] * len(inst), index=inst.index, dtype=object)
    moe = inst["op"].isin(MOE_LAYERS) & inst["external_id"].notna()
    if not moe.any() or shapes is None or shapes.empty or cpu.empty:
        return out
    sh = shapes.drop_duplicates(["rank", "external_id"]).set_index(["rank", "external_id"])
    c = cpu.dropna(subset=["external_id", "tid", "ts_ns"])
    layers = c[c["name"].isin(MOE_LAYERS)].drop_duplicates(["rank", "external_id"])
    routing = c[c["name"].isin(list(MOE_ROUTING))]
    if layers.empty or routing.empty:
        return out
    found: dict[tuple[int, int], int] = {}
    for lay in layers.itertuples(index=False):  # (a MoE layer per layer and step: a few hundred at most)
        end = lay.ts_ns + (lay.dur_ns or 0)
        inner = routing[
            (routing["rank"] == lay.rank)
            & (routing["tid"] == lay.tid)
            & (routing["ts_ns"] >= lay.ts_ns)
            & (routing["ts_ns"] < end)
        ].sort_values("ts_ns")
        for r in inner.itertuples(index=False):
            k = _routing_k(r.name, sh, int(r.rank), int(r.external_id))
            if k:
                found[(int(lay.rank), int(lay.external_id))] = k
                break
    keys = list(zip(inst["rank"].astype(int), inst["external_id"].fillna(-1).astype(int)))
    return pd.Series([found.get(k) for k in keys], index=inst.index, dtype=object)


def _routing_k(name: str, sh: pd.DataFrame, rank: int, ext: int) -> int | None:
    where, i = MOE_ROUTING[name]
    try:
        row = sh.loc[(rank, ext)]
        text = row["input_dims"] if where == "dims" else row["concrete_inputs"]
        vals = json.loads(text) if isinstance(text, str) else None
    except (KeyError, ValueError, TypeError):
        return None
    if not isinstance(vals, list) or i >= len(vals):
        return None
    v = vals[i]
    if where == "dims":
        return (
            int(v[1]) if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int) and v[1] > 0 else None
        )
    try:
        k = int(str(v))
    except ValueError:
        return None
    return k if k > 0 else None


def _map_distinct(col: pd.Series, fn: Any) -> np.ndarray:
    """fn of each value of `col` (an object array), called once per distinct value; nulls give fn(None)."""
    codes, uniq = pd.factorize(col.to_numpy(object), use_na_sentinel=True)
    vals = np.empty(len(uniq) + 1, dtype=object)
    vals[:-1] = [fn(u) for u in uniq]
    vals[-1] = fn(None)
    out: np.ndarray = vals[codes]  # code -1 (a null) takes the last slot
    return out


def _costs(inst: pd.DataFrame) -> list[OpCost | None]:
    """_cost of each instance's (op, dims, types, concrete), computed once per distinct combination (a
    null of any kind, None or NaN, is one value: _cost treats every non-string alike)."""
    cols = ["op", "input_dims", "input_types", "concrete_inputs", "context"]
    if "context" not in inst:
        inst = inst.assign(context=None)
    key = np.zeros(len(inst), np.int64)
    uniqs = []
    for c in cols:
        codes, u = pd.factorize(inst[c].to_numpy(object), use_na_sentinel=True)
        # dense combined code (below n after each column's step: no overflow)
        key = np.unique(key * (len(u) + 1) + (codes + 1), return_inverse=True)[1].ravel().astype(np.int64)
        uniqs.append((codes, u))
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)

    def val(j: int, i: int) -> Any:
        codes, u = uniqs[j]
        return u[codes[i]] if codes[i] >= 0 else None

    per = [_cost(val(0, i), val(1, i), val(2, i), val(3, i), val(4, i)) for i in first.tolist()]
    return [per[i] for i in inv.ravel().tolist()]


def _none(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and not np.isfinite(v)) else v


def op_table(
    instances: pd.DataFrame,
    gpu_name: str | None,
    n_steps: int | dict[int, int] | None = None,
    stage_of: dict[int, int] | None = None,
    contexts: dict[tuple[int, int], OpContext] | None = None,
    model_context: OpContext | None = None,
) -> pd.DataFrame:
    """Op instances grouped by (rank, op, shapes, kernel, layer type) with per-step time, FLOPs and
    bytes, achieved TFLOP/s and TB/s, and the roofline (OP_COLUMNS), longest first. `n_steps`: steps the
    instances span (per rank as a dict; default: distinct steps seen per rank). `contexts`: per (rank, step)
    what the engine iteration's annotation says (attention over a paged cache, docs/ops.md);
    `model_context`: the model config's MoE top-k and expert size, for fused MoE layers whose trace does not
    say them."""
    if instances.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    inst = instances.copy(deep=False)  # (columns are replaced or added, never written into)
    for c in ("input_dims", "input_types", "concrete_inputs"):
        if c not in inst:
            inst[c] = None
    inst["context"] = instance_contexts(inst, contexts, model_context)
    costs = _costs(inst)
    inst["flops"] = [None if x is None else x.flops for x in costs]
    inst["bytes"] = [None if x is None else x.bytes for x in costs]
    inst["dtype_class"] = [None if x is None else x.dtype for x in costs]
    inst["model"] = _map_distinct(inst["op"], lambda o: op_family(o) if isinstance(o, str) else None)
    inst["shapes"] = inst["input_dims"]
    key = ["rank", "op", "shapes", "kernel", "layer_type"]
    for c in key[1:]:
        inst[c] = inst[c].astype(object).where(inst[c].notna(), _NULL_KEY)
    g = inst.groupby(key, sort=False, dropna=False)
    agg = g.agg(
        calls=("time_ns", "size"),
        time_ns=("time_ns", "sum"),
        model=("model", "first"),
        dtype_class=("dtype_class", "first"),
        flops_n=("flops", "count"),
        flops=("flops", "sum"),
        bytes_n=("bytes", "count"),
        bytes=("bytes", "sum"),
    ).reset_index()
    for c in key[1:]:
        agg[c] = agg[c].where(agg[c] != _NULL_KEY, None)
    if isinstance(n_steps, dict):
        steps = agg["rank"].map(lambda r: n_steps.get(int(r)) or 1)
    elif n_steps:
        steps = pd.Series(float(n_steps), index=agg.index)
    else:
        per = instances.groupby("rank")["step"].nunique()
        steps = agg["rank"].map(lambda r: max(int(per.get(r, 1) or 1), 1))
    steps = steps.astype(float)
    known = agg["flops_n"] == agg["calls"]  # every call has a cost: else the group's cost is unknown
    agg["flops"] = (agg["flops"] / steps).where(known)
    known_b = agg["bytes_n"] == agg["calls"]
    agg["bytes"] = (agg["bytes"] / steps).where(known_b)
    agg["calls"] = agg["calls"] / steps
    agg["ms_per_step"] = agg["time_ns"] / steps / 1e6
    secs = agg["ms_per_step"] / 1e3
    pos = secs > 0
    agg["tflops"] = (agg["flops"] / secs / 1e12).where(pos & known)
    agg["tbps"] = (agg["bytes"] / secs / 1e12).where(pos & known_b)
    bw = hbm_bandwidth(gpu_name)
    bound: list[str | None] = []
    pct: list[float | None] = []
    for f, b, dc, tf, tb in zip(agg["flops"], agg["bytes"], agg["dtype_class"], agg["tflops"], agg["tbps"]):
        if (
            f is None
            or not np.isfinite(f)
            or not np.isfinite(tf if tf is not None else np.nan)
            or b is None
            or not np.isfinite(b)
        ):
            bound.append(None)
            pct.append(None)
            continue
        peak = roofline_peak_flops(gpu_name, dc) if f > 0 else None
        if f == 0 and bw is not None or (peak is not None and bw is not None and b > 0 and f / b < peak / bw):
            bound.append("memory")  # attainable = intensity x bandwidth: % of roofline = TB/s / peak TB/s
            pct.append(100.0 * tb * 1e12 / bw)
        elif f > 0 and peak is not None and bw is not None:
            bound.append("compute")
            pct.append(100.0 * tf * 1e12 / peak)
        else:
            bound.append(None)
            pct.append(None)
    agg["bound"] = bound
    agg["roofline_pct"] = pct
    agg["stage"] = agg["rank"].map(lambda r: None if stage_of is None else stage_of.get(int(r)))
    agg = agg.sort_values(["ms_per_step", "op"], ascending=[False, True], na_position="last")
    return agg[OP_COLUMNS].reset_index(drop=True)


def kernel_table(
    instances: pd.DataFrame,
    n_steps: int | dict[int, int] | None = None,
    stage_of: dict[int, int] | None = None,
) -> pd.DataFrame:
    """Kernels (short names) by time per step and rank: calls and ms per step, and the op that launches
    them most (by time). Ranks without kernels give no rows."""
    k = instances[instances["kernel"].notna()] if not instances.empty else instances
    cols = ["rank", "stage", "kernel", "op", "calls", "ms_per_step"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    g = k.groupby(["rank", "kernel"], sort=False)
    agg = g.agg(calls=("time_ns", "size"), time_ns=("time_ns", "sum")).reset_index()
    top_op = (
        k.assign(op=k["op"].fillna(_NULL_KEY))
        .groupby(["rank", "kernel", "op"])["time_ns"]
        .sum()
        .reset_index()
        .sort_values("time_ns", ascending=False)
        .drop_duplicates(["rank", "kernel"])
    )
    agg = agg.merge(top_op[["rank", "kernel", "op"]], on=["rank", "kernel"], how="left")
    agg["op"] = agg["op"].where(agg["op"] != _NULL_KEY, None)
    if isinstance(n_steps, dict):
        steps = agg["rank"].map(lambda r: n_steps.get(int(r)) or 1).astype(float)
    else:
        steps = float(n_steps) if n_steps else 1.0
    agg["calls"] = agg["calls"] / steps
    agg["ms_per_step"] = agg["time_ns"] / steps / 1e6
    agg["stage"] = agg["rank"].map(lambda r: None if stage_of is None else stage_of.get(int(r)))
    return agg.sort_values("ms_per_step", ascending=False)[cols].reset_index(drop=True)


def summary_rows(table: pd.DataFrame, per_stage: int = 15, limit: int = 60) -> list[dict[str, Any]]:
    """The summary's `ops`: the top `per_stage` rows of each stage (or rank, when stages are unknown) by
    time per step, at most `limit` in all; numbers rounded, unknowns null."""
    if table.empty:
        return []
    t = table.copy()
    grp = t["stage"].where(t["stage"].notna(), -1 - t["rank"])
    t = t.assign(_g=grp).sort_values(["_g", "ms_per_step"], ascending=[True, False])
    t = t.groupby("_g", sort=True).head(per_stage).head(limit)
    out = []
    for r in t.to_dict("records"):
        row = {}
        for k in SUMMARY_KEYS:
            v = _none(r.get(k))
            if isinstance(v, (np.integer,)):
                v = int(v)
            elif isinstance(v, (float, np.floating)):
                v = float(v)
                v = round(v, 4) if k in ("ms_per_step", "calls", "tflops", "tbps", "roofline_pct") else v
            if k in ("rank", "stage") and v is not None:
                v = int(v)
            if k == "flops" or k == "bytes":
                v = None if v is None else float(round(v))
            if k == "shapes" and isinstance(v, str) and len(v) > SHAPES_MAX_CHARS:
                v = v[: SHAPES_MAX_CHARS - 1] + "…"
            row[k] = v
        out.append(row)
    return out


#: The summary's `op_totals` keys, in order: every row of the op table, for `compare` (summaries/compare.py).
TOTAL_KEYS = [
    "stage",
    "rank",
    "op",
    "shapes",
    "kernel",
    "layer_type",
    "model",
    "calls",
    "ms_per_step",
    "flops",
]


def total_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary's `op_totals`: every row of the op table (all ops of the ranks measured, not only the
    top ones), the fields `compare` matches and rates ops by; numbers rounded, unknowns null."""
    if table.empty:
        return []
    t = table.sort_values(["stage", "rank", "ms_per_step"], ascending=[True, True, False], na_position="last")
    out = []
    for r in t.to_dict("records"):
        row: dict[str, Any] = {}
        for k in TOTAL_KEYS:
            v = _none(r.get(k))
            if isinstance(v, np.integer):
                v = int(v)
            elif isinstance(v, (float, np.floating)):
                v = float(v)
                v = float(round(v)) if k == "flops" else round(v, 6)
            if k in ("rank", "stage") and v is not None:
                v = int(v)
            if k == "shapes" and isinstance(v, str) and len(v) > SHAPES_MAX_CHARS:
                v = v[: SHAPES_MAX_CHARS - 1] + "…"
            row[k] = v
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------- launches
def launch_stats(events: pa.Table, steps: list[int] | None = None) -> pd.DataFrame:
    """Per rank: kernels, launch delay (kernel start minus its CPU launch's start, through `correlation`)
    median / p90 / mean in µs, and the share of kernels (by count and by time) shorter than 10 µs.
    Evidence for a host-bound rank: long queues mean the GPU waits on nothing, short kernels with small
    delays mean the CPU is what keeps it busy."""
    cols = [
        "rank",
        "kernels",
        "launch_delay_median_us",
        "launch_delay_p90_us",
        "launch_delay_mean_us",
        "short_kernel_share",
        "short_kernel_time_share",
    ]
    if events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    k = _frame(events, _kind_mask(events, ("kernel",)), ["rank", "ts_ns", "dur_ns", "correlation", "step"])
    k = k[_in_steps(k["step"], steps)]
    if k.empty:
        return pd.DataFrame(columns=cols)
    rt = _frame(events, _kind_mask(events, ("cuda_runtime", "cuda_driver")), ["rank", "ts_ns", "correlation"])
    rt = rt.dropna().drop_duplicates(["rank", "correlation"]).rename(columns={"ts_ns": "launch_ns"})
    k = k.merge(rt, on=["rank", "correlation"], how="left")
    k["delay_us"] = (k["ts_ns"] - k["launch_ns"]) / 1e3
    rows = []
    for r, g in k.groupby("rank"):
        d = g["delay_us"].dropna()
        short = g["dur_ns"] < SHORT_KERNEL_NS
        tot = float(g["dur_ns"].sum())
        rows.append(
            {
                "rank": int(r),
                "kernels": int(len(g)),
                "launch_delay_median_us": float(d.median()) if len(d) else None,
                "launch_delay_p90_us": float(d.quantile(0.9)) if len(d) else None,
                "launch_delay_mean_us": float(d.mean()) if len(d) else None,
                "short_kernel_share": float(short.mean()),
                "short_kernel_time_share": float(g.loc[short, "dur_ns"].sum() / tot) if tot > 0 else None,
            }
        )
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------------------------- memory
def _valid_and_gpu(memory: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    valid: np.ndarray = memory.column("total_allocated").is_valid().to_numpy(zero_copy_only=False)
    gpu: np.ndarray = memory.column("device").fill_null(-1).to_numpy(zero_copy_only=False) >= 0
    return valid, gpu


def uses_gpu_samples(memory: pa.Table) -> bool:
    """Whether the allocator samples read here are the GPUs' (some sample with a total on device >= 0), else
    the CPU's (-1)."""
    valid, gpu = _valid_and_gpu(memory)
    return bool((valid & gpu).any())


def device_sample_mask(memory: pa.Table) -> np.ndarray:
    """Per row of `memory`: an allocator sample that `memory_timeline` and `memory_peaks` read (a total, on the
    GPUs, or on the CPU when no GPU sample has one)."""
    valid, gpu = _valid_and_gpu(memory)
    out: np.ndarray = valid & (gpu if (valid & gpu).any() else ~gpu)
    return out


def _device_samples(memory: pa.Table) -> pd.DataFrame:
    """Allocator samples of the GPUs (device >= 0), or of the CPU (-1) when the trace has no GPU ones."""
    return memory.to_pandas()[device_sample_mask(memory)]


def memory_timeline(memory: pa.Table, max_points: int = 2000) -> pd.DataFrame:
    """Allocator samples per rank on the GPU (device >= 0; the CPU's when there are none): ts_ns, allocated
    and reserved bytes, thinned to at most `max_points` per rank (the peak sample always kept)."""
    cols = ["rank", "ts_ns", "allocated", "reserved"]
    if memory is None or memory.num_rows == 0:
        return pd.DataFrame(columns=cols)
    m = _device_samples(memory).sort_values(["rank", "ts_ns"])
    out = []
    for _, g in m.groupby("rank"):
        if len(g) > max_points:
            idx = np.unique(
                np.concatenate(
                    [
                        np.linspace(0, len(g) - 1, max_points).astype(int),
                        [int(np.argmax(g["total_allocated"].to_numpy()))],
                    ]
                )
            )
            g = g.iloc[idx]
        out.append(g)
    if not out:
        return pd.DataFrame(columns=cols)
    m = pd.concat(out)
    return pd.DataFrame(
        {
            "rank": m["rank"].astype(int),
            "ts_ns": m["ts_ns"],
            "allocated": m["total_allocated"],
            "reserved": m["total_reserved"],
        }
    ).reset_index(drop=True)


def memory_peaks(
    memory: pa.Table, events: pa.Table | None = None, stage_of: dict[int, int] | None = None
) -> pd.DataFrame:
    """Per rank: peak allocated / reserved bytes, when, and the innermost CPU op running at the peak
    (from `events`, the same rank's; None when no op covers that instant)."""
    cols = ["rank", "stage", "peak_allocated", "peak_reserved", "peak_ts_ns", "op_at_peak"]
    if memory is None or memory.num_rows == 0:
        return pd.DataFrame(columns=cols)
    m = _device_samples(memory)
    if m.empty:
        return pd.DataFrame(columns=cols)
    i = m.groupby("rank")["total_allocated"].idxmax()
    pk = m.loc[i, ["rank", "total_allocated", "ts_ns"]]
    res = m.groupby("rank")["total_reserved"].max()
    ops_of: dict[int, pd.DataFrame] = {}  # rank -> its cpu ops (only the ranks `events` holds)
    if events is not None and events.num_rows:
        ops = _frame(events, _kind_mask(events, ("cpu_op",)), ["rank", "name", "ts_ns", "dur_ns"])
        ops_of = {int(r): g for r, g in ops.groupby("rank", sort=False)}
    rows = []
    for r, a, t in zip(pk["rank"], pk["total_allocated"], pk["ts_ns"]):
        op = None
        g = ops_of.get(int(r))
        if g is not None:
            o = g[(g["ts_ns"] <= t) & (g["ts_ns"] + g["dur_ns"] >= t)]
            if not o.empty:
                op = str(o.sort_values("dur_ns").iloc[0]["name"])
        rows.append(
            {
                "rank": int(r),
                "stage": None if stage_of is None else stage_of.get(int(r)),
                "peak_allocated": int(a),
                "peak_reserved": _none(float(res.get(r))) if r in res else None,
                "peak_ts_ns": int(t),
                "op_at_peak": op,
            }
        )
    out = pd.DataFrame(rows, columns=cols)
    out["peak_reserved"] = out["peak_reserved"].map(lambda v: None if v is None or pd.isna(v) else int(v))
    return out
