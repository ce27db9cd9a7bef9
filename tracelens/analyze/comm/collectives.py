"""Collective instances across ranks: extraction, matching, clock alignment.

One row per (rank, collective call) comes out of `collectives_from_events` (schema.COLLECTIVES):
NCCL/RCCL kernels on GPU ranks (start/end = the kernel, enqueue = the linked `record_param_comms` cpu op),
`c10d::*` cpu ops paired with `gloo:*` annotations on CPU-only ranks. `match` gives each row the id of the
instance it belongs to (the same call seen from every participant), `clock_offsets` estimates each rank's
clock offset from the end times of matched instances, and `tracelens.analyze.comm.wait_transfer` splits each
row's duration into time spent waiting for the last participant and time moving data. See
docs/stragglers.md.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens import schema
from tracelens.analyze.comm.clock import ClockResult as ClockResult
from tracelens.analyze.comm.clock import clock_domains as clock_domains
from tracelens.analyze.comm.clock import clock_findings as clock_findings
from tracelens.analyze.comm.clock import clock_offsets as clock_offsets
from tracelens.analyze.comm.coll_order import _cumcount as _cumcount
from tracelens.analyze.comm.coll_order import _group_key as _group_key
from tracelens.analyze.comm.coll_order import _order as _order
from tracelens.analyze.comm.coll_order import _order_base as _order_base
from tracelens.analyze.comm.coll_order import _order_cols as _order_cols
from tracelens.analyze.comm.wait_split import EXPOSED_SPLIT as EXPOSED_SPLIT
from tracelens.analyze.comm.wait_split import exposed_split as exposed_split
from tracelens.analyze.core.dictcol import columns, sharing
from tracelens.analyze.core.frame_cells import (
    factorize_objects as _factorize_objects,
)
from tracelens.analyze.core.frame_cells import (
    first_rows as _first_rows,
)
from tracelens.analyze.core.frame_cells import (
    int64_array as _int64_array,
)
from tracelens.analyze.core.frame_cells import (
    is_strings as _is_strings,
)
from tracelens.analyze.core.frame_cells import (
    isnull as _isnull,
)
from tracelens.analyze.core.frame_cells import (
    list_tuples as _list_tuples,
)
from tracelens.analyze.core.frame_cells import (
    nullable_ints as _nullable_ints,
)
from tracelens.analyze.core.frame_cells import (
    per_distinct as _per_distinct,
)
from tracelens.analyze.core.frame_cells import (
    per_distinct_codes as _per_distinct_codes,
)
from tracelens.analyze.core.frame_cells import (
    ranks_list_array as _ranks_list_array,
)
from tracelens.analyze.core.frame_cells import (
    ranks_tuples as _ranks_tuples,
)
from tracelens.analyze.core.frame_cells import (
    row_codes as _row_codes,
)
from tracelens.analyze.core.frame_cells import (
    rows_frame as _rows,
)
from tracelens.analyze.core.frame_cells import (
    str_objects as _str_objects,
)
from tracelens.analyze.core.frame_cells import (
    string_series as _string_series,
)
from tracelens.analyze.core.frame_cells import (
    unique_inverse as _unique_inverse,
)
from tracelens.analyze.layout.groups import pg_config_distinct
from tracelens.analyze.rank.classify import _dict_lookup, comm_launched, gpu_ranks
from tracelens.findings import finding
from tracelens.ingest.comm_families import family_of_kernel, is_comm_cpu_op

if TYPE_CHECKING:
    pass

#: Canonical op names (schema.COLLECTIVES `op`), checked in this order against the squashed raw name.
_OP_PATTERNS = (
    ("sendrecv", "sendrecv"),
    ("allreduce", "allreduce"),
    ("allgather", "allgather"),
    ("reducescatter", "reducescatter"),
    ("alltoall", "alltoall"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
)
P2P_OPS = ("send", "recv", "sendrecv")

#: Bytes per element of the `dtype` strings PyTorch writes (c10 ScalarType names).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip

_PREFIX = re.compile(
    r"^(nccl(Dev)?Kernel_|ncclSymk_?|ncclDevFunc_?|rccl_?|c10d::|gloo:|nccl:)", re.IGNORECASE
)


@lru_cache(maxsize=8192)
def normalize_op(name: str | None) -> str | None:
    """Canonical op for a `Collective name`, an NCCL kernel name, a `c10d::` op or a `gloo:` annotation."""
    if not name:
        return None
    raw = str(name)
    is_kernel = bool(re.match(r"^(nccl(Dev)?Kernel_|ncclSymk|ncclDevFunc)", raw, re.IGNORECASE))
    s = _PREFIX.sub("", raw)
    if is_kernel:
        s = s.split("(")[0].split("_")[0]  # ncclDevKernel_AllReduce_Sum_bf16_RING_LL -> AllReduce
    s = re.sub(r"[^a-z]", "", s.lower())
    for pat, op in _OP_PATTERNS:
        if pat in s:
            return op
    return None


def busbw_factor(op: str | None, n: float) -> float:
    """nccl-tests busbw factor: allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n; else 1."""
    if not n or n < 1:
        return float("nan")
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


# ----------------------------------------------------------------------------------------------------
# extraction
# ----------------------------------------------------------------------------------------------------
_FIELDS = ("collective", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq", "in_nelems", "out_nelems",
           "dtype", "src_rank", "dst_rank")  # fmt: skip


def _empty_coll() -> pa.Table:
    return schema.COLLECTIVES.empty_table()


def _to_coll_table(df: pd.DataFrame) -> pa.Table:
    """DataFrame with COLLECTIVES columns (missing ones null) -> table with exactly that schema."""
    cols = {}
    n = len(df)
    for f in schema.COLLECTIVES:
        if f.name not in df:
            cols[f.name] = pa.nulls(n, f.type)
            continue
        vals = df[f.name]
        if pa.types.is_dictionary(f.type):
            # once per distinct value (the column repeats a few names over every call): codes in order of
            # first appearance, as Arrow's dictionary_encode gives them; missing values null, never "nan"
            # (a pandas string column as it is: the same codes and values as its Python str objects get)
            if _string_series(vals):
                codes, uniq = pd.factorize(vals)
            else:  # (grouped by object first: cells of one value mostly share one str object)
                codes, uniq = _factorize_objects(vals.astype(object).to_numpy())
            uniq = np.asarray(uniq, dtype=object)
            codes = np.asarray(codes, dtype=np.int32)
            null = codes < 0
            if pd.api.types.infer_dtype(uniq, skipna=True) in ("string", "empty"):
                words = pa.array(np.asarray(uniq, dtype=object), pa.string())
            else:  # mixed values (a key on only some kernels): their text; equal texts share one entry
                text = np.asarray(uniq, dtype=object).astype(str)
                first_of, words_np = pd.factorize(text)
                codes = np.where(null, -1, np.asarray(first_of, dtype=np.int32)[codes]).astype(np.int32)
                words = pa.array(np.asarray(words_np, dtype=object), pa.string())
            arr = pa.DictionaryArray.from_arrays(
                pa.array(np.where(null, 0, codes), pa.int32(), mask=null), words
            )
            cols[f.name] = arr.cast(f.type)
        elif pa.types.is_list(f.type):
            cols[f.name] = _ranks_list_array(vals, f.type)
        elif pa.types.is_boolean(f.type):
            cols[f.name] = pa.array(vals.astype("boolean"), f.type)
        else:
            cols[f.name] = pa.array(vals.astype("Int64"), f.type)
    return pa.table(cols, schema=schema.COLLECTIVES)


def _nbytes(df: pd.DataFrame) -> pd.Series:
    """nccl-tests message size: the larger of the input and output buffers, in bytes (null when unknown)."""
    size = pd.Series(
        _per_distinct(lambda d: DTYPE_BYTES.get(str(d).lower()) if isinstance(d, str) else None, df["dtype"]),
        index=df.index,
    )
    nel = pd.concat([df["in_nelems"].astype("Float64"), df["out_nelems"].astype("Float64")], axis=1).max(
        axis=1
    )
    out = nel * size.astype("Float64")
    return out.round().astype("Int64")


def _parent_fields(events: pa.Table, kmask: np.ndarray, need: np.ndarray | None = None) -> pd.DataFrame:
    """For the kernels of `kmask` (in row order): op, sizes, dtype and start of the CPU ops around their
    launch (launch_link): the op from the innermost communication op that names one (`record_param_comms`
    with its `Collective name`, `nccl:all_to_all`, `c10d::alltoall_base_`), the sizes from the innermost one
    that carries them (`In msg nelems`, or its `Input Dims` read at ingest). `need` (aligned with the
    kernels): only those kernels are looked up, the others read as having no such op (null)."""
    from tracelens.analyze.rank.launch_link import _enclosing, _queries

    if need is not None and not need.any():  # nothing to look up: every kernel reads as having no such op
        n = int(kmask.sum())

        def no_ints() -> pd.api.extensions.ExtensionArray:  # all <NA> (without a Python list to convert)
            return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))

        return pd.DataFrame(
            {
                "parent_op": pd.Series([None] * n, dtype=object),
                "parent_in_nelems": no_ints(),
                "parent_out_nelems": no_ints(),
                "parent_dtype": pd.Series([None] * n, dtype=object),
                "parent_ts_ns": no_ints(),
            }
        )
    q = _queries(events)  # the launch queries once for the lookups below
    only = None
    if need is not None:
        only = np.zeros(kmask.size, dtype=bool)
        only[np.flatnonzero(kmask)[need]] = True

    def enclosing_ops(_events: pa.Table, mask: np.ndarray) -> np.ndarray:
        found: np.ndarray = _enclosing(q, mask, only)
        return found

    name = events.column("name")
    coll = events.column("collective")
    names_op = _dict_lookup(name, lambda v: int(is_comm_cpu_op(v) and normalize_op(v) is not None)).astype(
        bool
    )
    rpc_named = _dict_lookup(name, lambda v: int(v == "record_param_comms")).astype(
        bool
    ) & coll.is_valid().to_numpy(zero_copy_only=False)
    comm_op = _dict_lookup(name, lambda v: int(is_comm_cpu_op(v))).astype(bool)
    has_in = events.column("in_nelems").is_valid().to_numpy(zero_copy_only=False)
    has_out = events.column("out_nelems").is_valid().to_numpy(zero_copy_only=False)
    has_dt = events.column("dtype").is_valid().to_numpy(zero_copy_only=False)
    op_row = enclosing_ops(events, names_op | rpc_named)[kmask]
    # an op that gives both buffers (`c10d::_allgather_base_`: output, input) beats one that gives the input;
    # one with a dtype beats one without (a c10d tensor list, `TensorList`, has none: `nccl:all_to_all` has)
    sized = comm_op & (has_in | has_out)
    both = enclosing_ops(events, sized & has_in & has_out & has_dt)[kmask]
    size_row = np.where(both >= 0, both, enclosing_ops(events, sized & has_dt)[kmask])
    if (sized & ~has_dt).any():
        size_row = np.where(size_row >= 0, size_row, enclosing_ops(events, sized)[kmask])
    n = int(kmask.sum())
    out = pd.DataFrame(index=range(n))

    def take(col: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
        taken: pa.Array = col.take(pa.array(np.where(rows >= 0, rows, 0), mask=rows < 0)).combine_chunks()
        return taken

    def objects(col: pa.ChunkedArray, rows: np.ndarray) -> np.ndarray:
        """The taken cells as an object array (str or None), as `to_pylist` gives them."""
        arr = take(col, rows)
        arr = arr.cast(pa.string()) if pa.types.is_dictionary(arr.type) else arr  # (the taken rows only)
        vals: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return vals.astype(object)

    p_name, p_coll = objects(name, op_row), objects(coll, op_row)
    out["parent_op"] = _per_distinct(
        lambda c, nm: (normalize_op(c) or "other") if isinstance(c, str) else normalize_op(nm),
        p_coll,
        p_name,
    ).tolist()
    dt = events.column("dtype")
    out["parent_in_nelems"] = _nullable_ints(take(events.column("in_nelems"), size_row))
    out["parent_out_nelems"] = _nullable_ints(take(events.column("out_nelems"), size_row))
    out["parent_dtype"] = pd.Series(objects(dt, size_row), dtype=object)
    enq = np.where(op_row >= 0, op_row, size_row)
    out["parent_ts_ns"] = _nullable_ints(take(events.column("ts_ns"), enq))
    return out


def _gpu_rows(
    events: pa.Table, ranks: np.ndarray, name_is_comm: np.ndarray, kind: dict[str, np.ndarray]
) -> pd.DataFrame:
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    on = np.isin(rank, ranks)
    has_coll = events.column("collective").is_valid().to_numpy(zero_copy_only=False)
    kmask = on & kind["kernel"] & (name_is_comm | has_coll | comm_launched(events))
    cols = ("rank", "name", "ts_ns", "dur_ns", "step", "external_id", "correlation") + _FIELDS
    k = _rows(events, kmask, cols)
    if k.empty:
        return k
    rmask = on & kind["rpc"]
    r = _rows(events, rmask, ("rank", "ts_ns", "external_id") + _FIELDS)
    r = r.dropna(subset=["external_id"]).drop_duplicates(["rank", "external_id"])
    r = r.rename(columns={c: f"{c}_cpu" for c in r.columns if c not in ("rank", "external_id")})
    k = k.merge(r, on=["rank", "external_id"], how="left")
    for c in _FIELDS:
        cpu = k[f"{c}_cpu"]
        if c != "pg_ranks":
            k[c] = k[c].where(~k[c].isna(), cpu)
        else:
            a, b = k[c].to_numpy(dtype=object), cpu.to_numpy(dtype=object)
            none = np.array([x is None for x in a], dtype=bool) if len(a) else np.zeros(0, dtype=bool)
            picked: np.ndarray = np.where(none, b, a)
            k[c] = picked.tolist()
    # sizes: the kernel's / record_param_comms's args, else the CPU ops around the launch (old PyTorch)
    no_size = k["in_nelems"].isna() & k["out_nelems"].isna()
    # the CPU ops around the launch are read only where they can decide something: no size, no enqueue
    # (no record_param_comms), or no op named by `Collective name` (see `_kernel_op`)
    named = _per_distinct(lambda c: isinstance(c, str) and normalize_op(c) is not None, k["collective"])
    need = (no_size | k["ts_ns_cpu"].isna()).to_numpy(dtype=bool) | ~named.astype(bool)
    parent = _parent_fields(events, kmask, need)
    for c in parent.columns:
        k[c] = parent[c].to_numpy() if c == "parent_op" else parent[c].array
    k["in_nelems"] = k["in_nelems"].astype("Int64").where(~no_size, k["parent_in_nelems"])
    k["out_nelems"] = k["out_nelems"].astype("Int64").where(~no_size, k["parent_out_nelems"])
    k["dtype"] = k["dtype"].where(~(no_size & k["dtype"].isna()), k["parent_dtype"])
    k["enqueue_ns"] = k["ts_ns_cpu"].astype("Int64").fillna(k["parent_ts_ns"])
    # `Collective name` first, then the CPU ops around the launch (old NCCL names every kernel of an
    # all-to-all `ncclKernel_SendRecv`), then the kernel name ("coalesced" -> ncclDevKernel_SendRecv ->
    # sendrecv); a kernel that names no known op but carries collective args is kept as "other"
    k["op"] = _per_distinct(_kernel_op, k["collective"], k["parent_op"], k["name"]).tolist()
    k["start_ns"] = k["ts_ns"]
    k["end_ns"] = k["ts_ns"] + k["dur_ns"]
    return k


def _kernel_op(c: Any, p: Any, n: Any) -> str | None:
    return (
        normalize_op(c if isinstance(c, str) else None)
        or (p if isinstance(p, str) else None)
        or normalize_op(n)
        or ("other" if isinstance(c, str) else None)
    )


def _cpu_rows(
    events: pa.Table, ranks: np.ndarray, kind: dict[str, np.ndarray], name: pa.ChunkedArray
) -> pd.DataFrame:
    """CPU-only ranks: `c10d::X` cpu op (the call: arrival, enqueue) paired by order with `gloo:X` (work)."""
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    on = np.isin(rank, ranks)
    is_c10d = _dict_lookup(
        name, lambda v: int(v.startswith("c10d::") and normalize_op(v) is not None)
    ).astype(bool)
    is_gloo = _dict_lookup(
        name, lambda v: int(v.startswith(("gloo:", "nccl:")) and normalize_op(v) is not None)
    ).astype(bool)
    cols = ("rank", "name", "ts_ns", "dur_ns", "step", "tid") + _FIELDS
    c = _rows(events, on & kind["cpu_op"] & is_c10d, cols)
    g = _rows(events, on & kind["user_annotation"] & is_gloo, cols)
    if c.empty and g.empty:
        return c

    def numbered(df: pd.DataFrame) -> pd.DataFrame:
        df = df.assign(op=[normalize_op(v) for v in df["name"]]).sort_values(["rank", "ts_ns"], kind="stable")
        return df.assign(_k=df.groupby(["rank", "op"]).cumcount())

    c, g = numbered(c), numbered(g)
    g = g.rename(columns={x: f"{x}_w" for x in g.columns if x not in ("rank", "op", "_k")})
    m = c.merge(g, on=["rank", "op", "_k"], how="outer")
    has_c = ~m["ts_ns"].isna()
    c_end = m["ts_ns"] + m["dur_ns"]
    w_end = m["ts_ns_w"] + m["dur_ns_w"]
    m["enqueue_ns"] = m["ts_ns"].where(has_c, m["ts_ns_w"])
    m["start_ns"] = m["enqueue_ns"]
    m["end_ns"] = pd.concat([c_end, w_end], axis=1).max(axis=1).astype("Int64")
    m["step"] = m["step"].where(has_c & ~m["step"].isna(), m["step_w"])
    for f in _FIELDS:
        if f != "pg_ranks":
            m[f] = m[f].where(~m[f].isna(), m[f"{f}_w"])
    m["name"] = m["name"].where(has_c, m["name_w"])
    return m


def _is_rpc(v: str) -> int:
    return int(v == "record_param_comms")


def _is_comm_kernel(v: str) -> int:
    return int(family_of_kernel(v) is not None)


def collectives_from_events(events: pa.Table) -> pa.Table:
    """One schema.COLLECTIVES row per (rank, collective call) found in an events table (source = "kineto")."""
    if events.num_rows == 0:
        return _empty_coll()
    if columns(events) is columns(events):  # (already shared by the caller)
        return _from_events(events)
    with sharing(events):  # the kind and name columns decoded once (here, in `gpu_ranks`, the launch links)
        return _from_events(events)


def _from_events(events: pa.Table) -> pa.Table:
    name = events.column("name")
    cols = columns(events)
    kind = {k: cols.kinds(k) for k in ("kernel", "cpu_op", "user_annotation")}
    kind["rpc"] = kind["cpu_op"] & cols.flag("name", _is_rpc)
    name_is_comm = cols.flag("name", _is_comm_kernel)
    all_ranks = np.unique(events.column("rank").to_numpy(zero_copy_only=False))
    g_ranks = np.array(sorted(gpu_ranks(events)), dtype=all_ranks.dtype)
    c_ranks = np.setdiff1d(all_ranks, g_ranks)
    parts = []
    if g_ranks.size:
        parts.append(_gpu_rows(events, g_ranks, name_is_comm, kind))
    if c_ranks.size:
        parts.append(_cpu_rows(events, c_ranks, kind, name))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return _empty_coll()
    df = pd.concat(parts, ignore_index=True)
    keep = ~df["op"].isna() & ~df["start_ns"].isna()
    if not keep.all():  # (copy-on-write: the columns set below do not touch `parts`)
        df = df[keep]
    df["pg_ranks"] = _ranks_tuples(df["pg_ranks"]).tolist() if "pg_ranks" in df else None
    if df.empty:
        return _empty_coll()
    df["source"] = "kineto"
    df["state"] = "completed"
    df["op"] = _directed(df)
    df["is_p2p"] = df["op"].isin(P2P_OPS)
    dst, src = df["dst_rank"], df["src_rank"]
    if isinstance(dst.dtype, pd.Int64Dtype) and isinstance(src.dtype, pd.Int64Dtype):
        # (the values below as nullable ints, without an object a row: what they convert to in the table)
        none = pd.Series(pd.arrays.IntegerArray(np.zeros(len(df), np.int64), np.ones(len(df), bool)))
        none.index = df.index
        df["peer"] = dst.where(df["op"] == "send", src.where(df["op"] == "recv", none))
    else:
        df["peer"] = np.where(df["op"] == "send", dst, np.where(df["op"] == "recv", src, None))
    df["bytes"] = _nbytes(df)
    df["group_size"] = df["group_size"].where(
        ~df["group_size"].isna(),
        _per_distinct(lambda v: len(v) if v is not None else None, df["pg_ranks"]).tolist(),
    )
    df = df.reset_index(drop=True)
    if not _sorted_by_rank_start(df):  # (a stable sort of rows already in that order leaves them as they are)
        df = df.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    df["order"] = _order(df)
    return _to_coll_table(df)


def _directed(df: pd.DataFrame) -> pd.Series:
    """`op` with a SendRecv kernel that names no collective read as the send or the receive it is from its
    peers (`Src Rank` / `Dst Rank` are global): the rank's own rank is the source of a send, the destination
    of a receive."""
    op = df["op"]
    if "src_rank" not in df or "dst_rank" not in df:
        return op
    und = (op == "sendrecv").to_numpy(dtype=bool)
    if not und.any():
        return op
    rank = df["rank"].to_numpy(dtype=np.int64)
    src = pd.to_numeric(df["src_rank"], errors="coerce").to_numpy(dtype=float)
    dst = pd.to_numeric(df["dst_rank"], errors="coerce").to_numpy(dtype=float)
    out = op.to_numpy(dtype=object).copy()
    out[und & (src == rank) & (dst != rank)] = "send"
    out[und & (dst == rank) & (src != rank)] = "recv"
    return pd.Series(out, index=df.index, dtype=op.dtype)


# ----------------------------------------------------------------------------------------------------
# matching
# ----------------------------------------------------------------------------------------------------
MATCHED_EXTRA = ("instance", "group_key", "n_expected", "bus_n", "bus_n_from")


def coll_frame(coll: pa.Table) -> pd.DataFrame:
    """COLLECTIVES table -> DataFrame with plain values (strings, Int64, tuples for pg_ranks). (Every
    column is a new array made here: the frame takes them as they are, without copying them again.)"""
    out = {}
    for f in coll.schema:
        col = coll.column(f.name)
        if pa.types.is_dictionary(col.type) and _is_strings(col.type):
            out[f.name] = pd.Series(_str_objects(col), dtype=object, copy=False)
        elif pa.types.is_dictionary(col.type):
            out[f.name] = pd.Series(
                col.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object, copy=False
            )
        elif pa.types.is_list(col.type):
            out[f.name] = pd.Series(_list_tuples(col), dtype=object, copy=False)
        elif pa.types.is_string(col.type):
            out[f.name] = pd.Series(col.to_numpy(zero_copy_only=False), dtype=object, copy=False)
        elif pa.types.is_boolean(col.type):
            b = col.combine_chunks()
            out[f.name] = pd.Series(
                pd.arrays.BooleanArray(
                    b.fill_null(False).to_numpy(zero_copy_only=False).astype(bool),
                    b.is_null().to_numpy(zero_copy_only=False).astype(bool),
                )
            )
        elif pa.types.is_floating(col.type):
            out[f.name] = pd.Series(np.array(col.to_numpy(zero_copy_only=False)))  # (a writable copy)
        elif pa.types.is_integer(col.type):
            out[f.name] = pd.Series(_int64_array(col))
        else:
            out[f.name] = pd.Series(col.to_pylist(), dtype="Int64")
    return pd.DataFrame(out, copy=False)


def _pg_candidates(metadata: pa.Table | None) -> list[tuple[int, ...]]:
    """Distinct process-group rank lists that the traces' distributedInfo.pg_config declare."""
    seen: set[tuple[int, ...]] = set()
    taken: set[Any] = set()  # raw values already taken (every rank declares the default group again)
    for g in pg_config_distinct(metadata)[0]:  # (each distinct entry once: a set is collected)
        ranks: Any = g.get("ranks")  # JSON: a list of ints, a string of them, or damaged
        raw = tuple(ranks) if isinstance(ranks, list) else ranks
        try:  # (a value equal to a taken one is taken already, or damaged: skipped either way)
            if raw in taken:
                continue
        except TypeError:  # (an unhashable element: judged below)
            raw = None
        if isinstance(ranks, str):
            ranks = [int(x) for x in re.findall(r"-?\d+", ranks)]
        plain = isinstance(ranks, list) and set(map(type, ranks)) <= {int}  # else: damaged, skipped
        if plain and len(ranks) >= 2:
            seen.add(tuple(sorted(ranks)))
            if raw is not None:
                taken.add(raw)
    return sorted(seen, key=lambda t: (len(t), t))


def _end_matrix(
    df: pd.DataFrame, ranks: tuple[int, ...], n: int, ends_by_rank: dict[int, np.ndarray]
) -> np.ndarray:
    return np.stack([ends_by_rank[r][:n] for r in ranks])


def _infer_groups(df: pd.DataFrame, candidates: list[tuple[int, ...]]) -> pd.Series:
    """Group keys for rows without process-group info (gloo): per op, pick the declared groups whose members'
    k-th calls end together (smallest median end spread first); ranks left over share one default group."""
    key = pd.Series([""] * len(df), index=df.index, dtype=object)
    unknown = (df["group_key"] == "") & ~df["is_p2p"].astype(bool)
    for _op, sub in df[unknown].groupby("op"):
        sub = sub[sub["end_ns"].notna()].sort_values(
            "start_ns", kind="stable"
        )  # no end (no duration): no group
        ends = {int(r): s["end_ns"].astype("int64").to_numpy() for r, s in sub.groupby("rank")}
        counts = {r: len(v) for r, v in ends.items()}
        scored = []
        for g in candidates:
            if not all(r in ends for r in g) or len({counts[r] for r in g}) != 1:
                continue
            m = _end_matrix(sub, g, counts[g[0]], ends)
            scored.append((float(np.median(m.max(axis=0) - m.min(axis=0))), len(g), g))
        taken: set[int] = set()
        assign: dict[int, str] = {}
        for _spread, _n, g in sorted(scored):
            if taken.isdisjoint(g):
                taken.update(g)
                for r in g:
                    assign[r] = "r:" + ",".join(map(str, g))
        rest = sorted(set(ends) - taken)
        for r in rest:
            assign[r] = "r:" + ",".join(map(str, rest)) if len(rest) > 1 else f"r:{r}"
        idx = sub.index
        key.loc[idx] = [assign[int(r)] for r in sub["rank"]]
    return key


def _infer_peers(df: pd.DataFrame, candidates: list[tuple[int, ...]]) -> pd.Series:
    """Peers of send/recv rows that carry none (gloo): pair a sender's k-th send with a receiver's k-th
    recv for the (sender, receiver) pairs whose calls end together; candidates: declared 2-rank groups."""
    peer = df["peer"].copy()
    todo = df["is_p2p"].astype(bool) & peer.isna() & df["op"].isin(("send", "recv"))
    if not todo.any():
        return peer
    sub = df[todo].sort_values("start_ns", kind="stable")
    sends = {
        int(r): s["end_ns"].astype("int64").to_numpy() for r, s in sub[sub["op"] == "send"].groupby("rank")
    }
    recvs = {
        int(r): s["end_ns"].astype("int64").to_numpy() for r, s in sub[sub["op"] == "recv"].groupby("rank")
    }
    pairs = {tuple(g) for g in candidates if len(g) == 2}
    scored = []
    for a, ea in sends.items():
        for b, eb in recvs.items():
            if a == b or len(ea) != len(eb) or (pairs and tuple(sorted((a, b))) not in pairs):
                continue
            scored.append((float(np.median(np.abs(ea - eb))), a, b))
    used_s: set[int] = set()
    used_r: set[int] = set()
    for _spread, a, b in sorted(scored):
        if a in used_s or b in used_r:
            continue
        used_s.add(a)
        used_r.add(b)
        peer.loc[sub.index[(sub["op"] == "send").to_numpy() & (sub["rank"] == a).to_numpy()]] = b
        peer.loc[sub.index[(sub["op"] == "recv").to_numpy() & (sub["rank"] == b).to_numpy()]] = a
    return peer


def match_with_findings(
    coll: pa.Table, metadata: pa.Table | None = None
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Instance ids for every row, plus COLLECTIVE_MISMATCH findings. Returns a DataFrame (see `match`)."""
    df = coll_frame(coll)
    if df.empty:
        for c in MATCHED_EXTRA:
            df[c] = pd.Series([], dtype=object if c in ("group_key", "bus_n_from") else "Int64")
        return df, []
    df["group_key"] = _group_key(df)
    candidates = _pg_candidates(metadata)
    inferred = _infer_groups(df, candidates)
    df["group_key"] = df["group_key"].where(df["group_key"] != "", inferred)
    df["peer"] = _infer_peers(df, candidates).astype("Int64")
    if not _sorted_by_rank_start(df):  # (the extraction's tables are: no copy then)
        df = df.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    # op and group as codes (in order of first appearance; their words once per code)
    op_c, op_words = _per_distinct_codes(lambda v: v, df["op"])
    gk_c, gk_words = _per_distinct_codes(lambda v: v, df["group_key"].astype(str))
    # `_order_base(df)` from those codes (the same tuples: the same codes); both orders below start from it
    base = _row_codes(df["is_p2p"], op_c, df["peer"], gk_c)
    df["order"] = _order(df, base=base)
    p2p = df["is_p2p"].astype(bool).to_numpy()
    is_send = (op_words == "send")[op_c]
    rank = df["rank"].astype("int64").to_numpy()
    peer = df["peer"].fillna(-1).astype("int64").to_numpy()
    src = np.where(is_send, rank, peer)
    dst = np.where(is_send, peer, rank)
    has_seq = ~df["seq"].isna().to_numpy()
    seq_v = df["seq"].fillna(-1).astype("int64").to_numpy()
    step_v = df["step"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    by_step = _order(df, by_step=True, base=base)
    unmatched_p2p = p2p & ((peer < 0) | ~np.isin(op_words, ("send", "recv"))[op_c])
    solo = np.where(unmatched_p2p, np.arange(len(df)), -1)
    # the key strings once per distinct tuple of their parts (first row of each), not for every row
    # (parts a row's key does not use are left out, -1, so that rows of one key share their tuple: a collective's
    # key has no src / dst, one with Seq no step or order)
    by_seq = ~p2p & has_seq
    parts = _row_codes(
        p2p,
        np.where(p2p, src, -1),
        np.where(p2p, dst, -1),
        np.where(by_seq, -1, step_v),
        np.where(by_seq, -1, by_step),
        has_seq,
        seq_v,
        gk_c,
        op_c,
        solo,
    )
    f = _first_rows(parts)
    # the instance key of each distinct tuple, "p2p|src|dst|step#order", "group|seq|N", "group|op|step#order"
    # or "solo|row", as codes of its parts (one-to-one with the strings: op names hold no "|", group keys
    # start with "pg:" or "r:" or are empty, never with "p2p|" or "solo|"; the last part is a number)
    kind = np.where(unmatched_p2p[f], 3, np.where(p2p[f], 0, np.where(has_seq[f], 1, 2)))
    p2p_f, seq_f, solo_f = kind == 0, kind == 1, kind == 3
    key = _row_codes(
        kind,
        np.where(p2p_f, src[f], np.where(solo_f, f, gk_c[f])),
        np.where(p2p_f, dst[f], np.where(seq_f, seq_v[f], np.where(solo_f, 0, op_c[f]))),
        np.where(seq_f | solo_f, 0, step_v[f]),
        np.where(seq_f | solo_f, 0, by_step[f]),
    )
    codes = key[parts]
    df["instance"] = pd.Series(codes, dtype="Int64")
    expected = df["group_size"].astype("Float64")
    # (a one-rank key is what inference leaves for a rank without traced peers: no evidence of the size)
    size_of = [n if k.startswith("r:") and (n := len(k[2:].split(","))) > 1 else None for k in gk_words]
    known = np.array([v is not None for v in size_of], dtype=bool)
    sizes = np.array([v if v is not None else 0 for v in size_of], dtype=np.float64)
    from_key = pd.Series(pd.arrays.FloatingArray(sizes[gk_c], ~known[gk_c]))
    expected = expected.fillna(from_key)
    expected = expected.where(~pd.Series(p2p), 2.0)
    df["n_expected"] = expected.round().astype("Int64")
    df["bus_n"], df["bus_n_from"] = bus_sizes(df, metadata, gk_words, gk_c, candidates)
    return df, _mismatches(df, (op_c, op_words, gk_c))


#: Where the n of a collective's bus-bandwidth factor comes from, in the order it is looked for
#: (docs/stragglers.md): the call's own `Group size`, the `pg_size` its rank's `pg_config` gives its process
#: group, the world size `distributedInfo` states, else the ranks whose traces hold the call.
BUS_N_SOURCES = ("group_size", "pg_size", "world_size", "traced_ranks")


def _rank_groups(metadata: pa.Table | None) -> tuple[dict[tuple[int, str], int], dict[int, int]]:
    """((rank, pg_name) -> pg_size, rank -> world_size) from the metadata's `distributedInfo`."""
    import json

    pg: dict[tuple[int, str], int] = {}
    world: dict[int, int] = {}
    if metadata is None or metadata.num_rows == 0:
        return pg, world
    cols = set(metadata.column_names)
    ranks = metadata.column("rank").to_pylist()
    ws = metadata.column("world_size").to_pylist() if "world_size" in cols else [None] * len(ranks)
    texts = metadata.column("pg_config_json").to_pylist() if "pg_config_json" in cols else [None] * len(ranks)
    for r, w, text in zip(ranks, ws, texts):
        if r is None:
            continue
        if isinstance(w, int) and w > 0:
            world[int(r)] = w
        try:
            cfg = json.loads(text) if text else None
        except ValueError:
            cfg = None
        entries = cfg.values() if isinstance(cfg, dict) else cfg if isinstance(cfg, list) else []
        for e in entries:
            if not isinstance(e, dict):
                continue
            size, name = e.get("pg_size"), e.get("pg_name")
            if size is None and isinstance(e.get("ranks"), list):
                size = len(e["ranks"])
            if isinstance(size, int) and not isinstance(size, bool) and size > 0 and name is not None:
                pg[(int(r), str(name))] = size
    return pg, world


def bus_sizes(
    df: pd.DataFrame,
    metadata: pa.Table | None,
    gk_words: np.ndarray,
    gk_c: np.ndarray,
    candidates: list[tuple[int, ...]],
) -> tuple[pd.Series, pd.Series]:
    """Per matched row: the n of its bus-bandwidth factor and where it comes from (BUS_N_SOURCES).

    The traces of a sampled job (2 ranks traced of 128) hold a call on fewer ranks than take part in it, so
    the number of traced participants understates n (an all-reduce's 2(n-1)/n is 1 at n = 2, ~2 at 128);
    what the traces state about the group comes first. Send / recv: n = 2 (their factor is 1 anyway)."""
    n = len(df)
    out = np.full(n, np.nan)
    src = np.full(n, None, dtype=object)
    if n == 0:
        return pd.Series(pd.array([], dtype="Int64")), pd.Series([], dtype=object)
    pg, world = _rank_groups(metadata)
    rank = df["rank"].astype("int64").to_numpy()
    gs = df["group_size"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    has = np.isfinite(gs) & (gs > 0)
    out[has], src[has] = gs[has], "group_size"
    # the group's pg_size: by its name in the rank's pg_config, or a declared group the matching inferred
    names = df["pg_name"].to_numpy(dtype=object)
    declared = {tuple(g) for g in candidates}
    key_size = np.array(
        [len(t) if k.startswith("r:") and (t := tuple(int(x) for x in k[2:].split(",") if x)) in declared
         else 0 for k in gk_words] or [0],
        dtype=np.float64,
    )  # fmt: skip
    for i in np.flatnonzero(~has):
        v = pg.get((int(rank[i]), str(names[i]))) if names[i] is not None else None
        if v is None and gk_c.size and key_size[gk_c[i]] > 0:
            v = int(key_size[gk_c[i]])
        if v is not None:
            out[i], src[i] = v, "pg_size"
            continue
        w = world.get(int(rank[i]))
        if w is not None and w > 1:
            out[i], src[i] = w, "world_size"
    rest = np.isnan(out)
    if rest.any():  # the ranks the matching expects, else those whose traces hold the instance
        traced = df["n_expected"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
        inst = df["instance"].astype("Int64").to_numpy(dtype=np.int64, na_value=-1)
        _, inv, counts = np.unique(inst, return_inverse=True, return_counts=True)
        seen = np.where(inst >= 0, counts[inv.reshape(-1)], 1).astype(float)
        traced = np.where(np.isfinite(traced), traced, seen)
        out[rest] = traced[rest]
        src[rest] = "traced_ranks"
    p2p = df["is_p2p"].astype(bool).to_numpy()
    out[p2p], src[p2p] = 2.0, None
    vals = pd.array(np.where(np.isnan(out), 0, out).astype(np.int64), dtype="Int64")
    vals[np.isnan(out)] = pd.NA
    return pd.Series(vals, index=df.index), pd.Series(src, index=df.index, dtype=object)


def _sorted_by_rank_start(df: pd.DataFrame) -> bool:
    """The rows are in (rank, start_ns) order with a RangeIndex and no null rank or start (what a stable
    sort_values + reset_index would leave unchanged)."""
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        return False
    rank, start = df["rank"].astype("Int64"), df["start_ns"].astype("Int64")
    if rank.isna().any() or start.isna().any():
        return False
    r, t = rank.to_numpy(dtype=np.int64), start.to_numpy(dtype=np.int64)
    same = r[1:] == r[:-1]
    return bool(((r[1:] > r[:-1]) | (same & (t[1:] >= t[:-1]))).all())


def _mismatches(df: pd.DataFrame, codes: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """COLLECTIVE_MISMATCH: an instance whose participants disagree on the op, or ranks of one group that
    issued different numbers of the same collective. `codes`: (op codes, op words, group_key codes) of the
    rows of `df` (match_with_findings' `per_distinct_codes`), to decide the usual case without coding the
    op and group strings again."""
    out: list[dict[str, Any]] = []
    keep = ~df["is_p2p"].astype(bool)
    coll = df.loc[keep, ["instance", "op", "rank", "seq", "group_key"]]
    if codes is not None:
        sel = keep.to_numpy(dtype=bool)
        codes = (codes[0][sel], codes[1], codes[2][sel])
    if coll.empty or _agree(coll, codes):
        return out
    nops = coll.groupby("instance")["op"].nunique()
    bad = nops[nops > 1].index
    if len(bad):
        rows = coll[coll["instance"].isin(bad)]
        first = rows[rows["instance"] == bad[0]]
        desc = ", ".join(f"rank {int(r)}: {o}" for r, o in zip(first["rank"], first["op"]))
        out.append(
            finding(
                "COLLECTIVE_MISMATCH",
                "error",
                f"{len(bad)} collective instance(s) where ranks issued different ops (first: {desc})",
                ranks=sorted({int(r) for r in rows["rank"]}),
                instances=len(bad),
            )
        )
    # with Seq, a group's calls are counted together (a type change is the mismatch above); without, per op
    kind = coll["op"].astype(str).where(coll["seq"].isna(), "collectives")
    counts = coll.assign(kind=kind).groupby(["group_key", "kind", "rank"]).size().reset_index(name="n")
    # only the (group, kind) cells whose ranks disagree are looked at one by one
    odd_cells = counts.groupby(["group_key", "kind"])["n"].transform("nunique") > 1
    for (gk, op), sub in counts[odd_cells].groupby(["group_key", "kind"]):
        if sub["n"].nunique() > 1:
            freq = sub["n"].value_counts()  # the most common count; ties: the larger (a call went missing)
            mode = int(max(freq.index, key=lambda v: (freq[v], v)))
            odd = sub[sub["n"] != mode]
            out.append(
                finding(
                    "COLLECTIVE_MISMATCH",
                    "warning",
                    f"{op} on group {gk or 'default'}: "
                    + ", ".join(f"rank {int(r)} issued {int(n)}" for r, n in zip(odd["rank"], odd["n"]))
                    + f" while its peers issued {mode}",
                    ranks=[int(r) for r in odd["rank"]],
                    group=gk,
                    op=op,
                )
            )
    return out


def _agree(coll: pd.DataFrame, codes: tuple[Any, ...] | None = None) -> bool:
    """True when `_mismatches` has nothing to report, decided on integer codes (the usual case, without
    pandas' groupby over the string keys): every instance has one op, and in every (group, kind) cell all
    ranks issued the same number of calls. False (look with pandas) when some key is null.

    `codes`: (op codes, op words, group_key codes) of these rows, codes of the op values themselves and of
    the group keys' text (only the partitions of the rows they make matter below: the op's words are
    used when they are all str, equal to their text, and the group keys are str); None: coded here."""
    op, rank, gk = coll["op"], coll["rank"], coll["group_key"]
    if op.isna().any() or rank.isna().any() or gk.isna().any() or coll["instance"].isna().any():
        return False
    inst = coll["instance"].astype("int64").to_numpy()
    if codes is not None and all(type(w) is str for w in codes[1]):
        op_c, op_words, gk = codes[0], codes[1], codes[2]
    else:
        op_c, op_words = _per_distinct_codes(str, op)
    pair = _row_codes(inst, op_c)  # (instance, op) pairs: one per instance when every instance has one op
    if _n_codes(pair) != _unique_inverse(inst)[0].size:
        return False
    # the kind below: the op's text without Seq, else "collectives" (codes of those texts)
    kind = np.where(coll["seq"].isna().to_numpy(dtype=bool), _row_codes(op_words)[op_c], -1)
    if (op_words == "collectives").any():  # (an op of that name: the texts themselves)
        kind = _row_codes(op.astype(str).where(coll["seq"].isna(), "collectives"))
    cell = _row_codes(gk, kind)  # (group, kind)
    grc = _row_codes(cell, rank.astype("int64").to_numpy())  # (group, kind, rank)
    n = np.bincount(grc)
    first = _first_rows(grc)
    per_cell = _row_codes(cell[first], n)  # (cell, count) pairs: one per cell when its ranks agree
    return bool(_n_codes(per_cell) == _n_codes(cell))


def _n_codes(codes: np.ndarray) -> int:
    """np.unique(codes).size of dense codes 0 .. k - 1 (row_codes'): every code appears, so k."""
    return int(codes.max()) + 1 if codes.size else 0


def match(coll: pa.Table, metadata: pa.Table | None = None) -> pa.Table:
    """COLLECTIVES rows plus `instance` (same id for the same call on every participant), `group_key` and
    `n_expected` (participants the instance should have). Keys: (group, seq) when Seq is known; else
    (group, op, order); send/recv: (src, dst, order)."""
    df, _ = match_with_findings(coll, metadata)
    return matched_table(df)


def matched_table(df: pd.DataFrame, source: pa.Table | None = None) -> pa.Table:
    """Matched rows -> Arrow (COLLECTIVES columns, then instance, group_key, n_expected).

    `source`: the COLLECTIVES table `df` was matched from (`match_with_findings`, which changes only `peer`
    and `order` among its columns): its columns are taken as they are where they are exactly what converting
    the frame's would give (see `_reusable`), when the frame's rows are the source's, in its order."""
    base = _to_coll_table(df) if source is None else _from_source(df, source)
    return (
        base.append_column(
            "instance", pa.array(df["instance"].astype("Int64").to_numpy(na_value=-1), pa.int64())
        )
        .append_column("group_key", _dict_strings(df["group_key"].astype(str)))
        .append_column("n_expected", _int32_array(df["n_expected"]))
        .append_column(
            "bus_n",
            _int32_array(df["bus_n"] if "bus_n" in df else pd.Series([pd.NA] * len(df), dtype="Int64")),
        )
        .append_column(
            "bus_n_from",
            pa.array(df["bus_n_from"].tolist() if "bus_n_from" in df else [None] * len(df), pa.string()),
        )
    )


#: The COLLECTIVES columns `match_with_findings` sets itself (the others are its input's).
_MATCH_SETS = ("peer", "order")


def _from_source(df: pd.DataFrame, source: pa.Table) -> pa.Table:
    """`_to_coll_table(df)` with the unchanged columns taken from `source` where that gives the same."""
    if source.schema != schema.COLLECTIVES or source.num_rows != len(df) or not _same_rows(df, source):
        return _to_coll_table(df)
    cols = {}
    convert = [f.name for f in schema.COLLECTIVES if f.name in _MATCH_SETS]
    for f in schema.COLLECTIVES:
        if f.name in _MATCH_SETS:
            continue
        col = source.column(f.name)
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if _reusable(arr):
            cols[f.name] = arr
        else:
            convert.append(f.name)
    done = _to_coll_table(df[convert]) if convert else None
    return pa.table(
        {f.name: cols[f.name] if f.name in cols else done.column(f.name) for f in schema.COLLECTIVES},  # type: ignore[union-attr]
        schema=schema.COLLECTIVES,
    )


def _same_rows(df: pd.DataFrame, source: pa.Table) -> bool:
    """The frame's ranks and starts are the source's, row by row (nulls as nulls): its rows are the source's
    in their order (the matching sorts only rows out of (rank, start) order, and sorting them changes that
    sequence)."""
    for name in ("rank", "start_ns"):
        a = df[name].astype("Int64")
        b = _int64_array(source.column(name))
        na, nb = a.isna().to_numpy(dtype=bool), np.asarray(b.isna(), dtype=bool)
        if not np.array_equal(na, nb):
            return False
        if not np.array_equal(a.to_numpy(dtype=np.int64, na_value=0), b.to_numpy(dtype=np.int64, na_value=0)):
            return False
    return True


def _reusable(arr: pa.Array) -> bool:
    """What `_to_coll_table` makes of this column's values read into a frame (`coll_frame`) is the column
    itself: any integer, boolean or list column (equal values, equal arrays), and a dictionary column whose
    distinct strings appear in its dictionary once each, all used, in order of first appearance, with its
    nulls in the indices (what that conversion builds)."""
    if not pa.types.is_dictionary(arr.type):
        return True
    words = arr.dictionary
    if words.null_count or not pa.types.is_string(words.type):
        return False
    idx = arr.indices.to_numpy(zero_copy_only=False)
    if arr.indices.null_count:
        idx = idx[arr.indices.is_valid().to_numpy(zero_copy_only=False)]
    if idx.size == 0:
        return len(words) == 0
    idx = idx.astype(np.int64)
    seen = np.maximum.accumulate(idx)  # (each new index the next one: first appearances in order, all used)
    if idx[0] != 0 or (idx[1:] > seen[:-1] + 1).any() or int(seen[-1]) != len(words) - 1:
        return False
    return bool(pd.Series(words.to_pylist(), dtype=object).is_unique)


def _dict_strings(vals: pd.Series) -> pa.Array:
    """A column of strings -> a dictionary array (in order of first appearance, as `dictionary_encode`),
    encoded once per distinct value."""
    if _string_series(vals):  # (as it is: the codes and values its str objects would get)
        codes, uniq = pd.factorize(vals)
        uniq = np.asarray(uniq, dtype=object)
    else:
        codes, uniq = _factorize_objects(vals.to_numpy(dtype=object))
    codes = np.asarray(codes, dtype=np.int32)
    if (codes < 0).any() or pd.api.types.infer_dtype(uniq, skipna=False) not in ("string", "empty"):
        return pa.array(vals.tolist(), pa.string()).dictionary_encode()  # (not plain strings: as before)
    words = pa.array(np.asarray(uniq, dtype=object), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), words)


def _int32_array(vals: pd.Series) -> pa.Array:
    """An integer column (nullable) -> int32 Arrow array, nulls for <NA> / NaN."""
    if isinstance(vals.dtype, pd.Int64Dtype):
        mask = vals.isna().to_numpy(dtype=bool)
        return pa.array(vals.fillna(0).to_numpy(dtype=np.int64), pa.int32(), mask=mask)
    return pa.array([None if _isnull(v) else int(v) for v in vals], pa.int32())
