"""Gloo collective sizes from the trace itself (issue 23): the `c10d::*` ops' `Input Dims` / `Input type`
(torch 2.x records a `Tensor[]` argument as the list of its tensors' shapes, and its type as `TensorList`)
and the `gloo:*` annotations, with no Flight Recorder dump. Unknown stays null, never 0.

The `Input Dims` / `Input type` values below are the ones torch 2.13 wrote for a (6, 5) float tensor `x`
and a (3,) double `y` on a gloo world of one (all_reduce(x), all_reduce_coalesced([x, y.float()]),
broadcast(y), all_gather, all_gather_into_tensor, all_to_all_single, all_to_all, reduce, gather, scatter,
barrier, reduce_scatter_tensor, reduce_scatter)."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pytest

from tracelens._testing import events_table
from tracelens.analyze.comm.collectives import collectives_from_events
from tracelens.ingest import kineto
from tracelens.ingest.comm_families import sizes_from_shapes
from tracelens.summary import collectives_dict

X = [6, 5]  # 30 float elements

#: (op, Input Dims, Input type) as recorded by torch 2.13 -> (in_nelems, out_nelems, dtype)
RECORDED = [
    ("c10d::allreduce_", [[X], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"], (30, None, None)),
    ("c10d::allreduce_coalesced_", [[X, [3]], [], [], [], []], ["TensorList", "", "", "Scalar", "Scalar"],
     (33, None, None)),
    ("c10d::broadcast_", [[[3]], [], [], [], [], []], ["TensorList", "", "Scalar", "Scalar", "Scalar", "Scalar"],
     (3, None, None)),
    # allgather_(Tensor[][] output_tensors, Tensor[] input_tensors): the output list of lists is recorded []
    ("c10d::allgather_", [[], [X], [], [], []], ["", "TensorList", "", "Scalar", "Scalar"], (30, None, None)),
    ("c10d::_allgather_base_", [X, X, [], [], []], ["float", "float", "", "Scalar", "Scalar"], (30, 30, "float")),
    ("c10d::alltoall_base_", [X, X, [], [], [], [], []],
     ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"], (30, 30, "float")),
    ("c10d::alltoall_", [[X], [X], [], [], []], ["TensorList", "TensorList", "", "Scalar", "Scalar"], (30, 30, None)),
    ("c10d::reduce_", [[X], [], [], [], [], [], []], ["TensorList", "", "", "Scalar", "Scalar", "Scalar", "Scalar"],
     (30, None, None)),
    ("c10d::gather_", [[], [X], [], [], [], []], ["", "TensorList", "", "Scalar", "Scalar", "Scalar"],
     (30, None, None)),
    # scatter_(Tensor[] output_tensors, Tensor[][] input_tensors): only the output is known
    ("c10d::scatter_", [[X], [], [], [], [], []], ["TensorList", "", "", "Scalar", "Scalar", "Scalar"],
     (None, 30, None)),
    ("c10d::barrier", [[1], [], [], [], []], ["unsigned char", "", "ScalarList", "Scalar", "Scalar"], (1, None, "byte")),
    ("c10d::_reduce_scatter_base_", [X, X, [], [], [], []], ["float", "float", "", "", "Scalar", "Scalar"],
     (30, 30, "float")),
    ("c10d::reduce_scatter_", [[X], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"],
     (None, 30, None)),
    ("c10d::send", [[[1, 32, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"], (2048, None, None)),
    ("c10d::recv_", [[[1, 32, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"], (2048, None, None)),
    ("gloo:all_reduce", [X], ["float"], (30, None, "float")),
    ("gloo:broadcast", [[3]], ["double"], (3, None, "double")),
    ("gloo:barrier", None, None, (None, None, None)),
]  # fmt: skip


@pytest.mark.parametrize("name,dims,types,expected", RECORDED, ids=[r[0] for r in RECORDED])
def test_sizes_of_each_c10d_op_as_torch_records_it(name, dims, types, expected):
    assert sizes_from_shapes(name, dims, types) == expected


def test_nothing_invented_from_lists_that_are_not_shapes():
    # empty tensor lists, a list of lists of lists (Tensor[][] written out), negative or float dims: unknown
    assert sizes_from_shapes("c10d::allreduce_", [[], [], []], ["TensorList", "", ""]) == (None, None, None)
    assert sizes_from_shapes("c10d::allgather_", [[[X, X]], [X]], ["", "TensorList"]) == (30, None, None)
    assert sizes_from_shapes("c10d::allreduce_", [[[2, -1]]], ["TensorList"]) == (None, None, None)
    assert sizes_from_shapes("c10d::send", [[[2.5]]], ["TensorList"]) == (None, None, None)
    # an annotation's list of lists is not a tensor list (annotations list tensors): nothing
    assert sizes_from_shapes("gloo:all_reduce", [[X]], ["float"]) == (None, None, None)


def _cpu(name, ts, dur, dims, types, tid=1, cat="cpu_op", ext=0):
    args = {"External id": ext}
    if dims is not None:
        args["Input Dims"], args["Input type"] = dims, types
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace(tmp_path, evs, rank=0):
    p = tmp_path / f"rank{rank}.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": evs, "distributedInfo": {"rank": rank}}).encode()))
    return kineto.read(p).events


def _gloo_step(with_annotation_dims: bool):
    """One step of a CPU-only gloo rank: a DDP bucket all-reduce (TensorList of one (53504,) float tensor),
    a Ulysses all-to-all (1024 floats), a P2P send (1, 32, 64) float; the gloo work annotations on the
    worker thread (tid 2) carry the input tensor's dims and dtype in torch 2.13 (`with_annotation_dims`)."""
    ad = (lambda d, t: (d, t)) if with_annotation_dims else (lambda d, t: (None, None))
    return [
        _cpu("ProfilerStep#2", 0, 10_000, None, None),
        _cpu("c10d::allreduce_", 100, 50, [[[53504]], [], [], [], [], []],
             ["TensorList", "", "", "", "Scalar", "Scalar"], ext=1),
        _cpu("gloo:all_reduce", 120, 900, *ad([[53504]], ["float"]), tid=2, cat="user_annotation", ext=2),
        _cpu("c10d::alltoall_base_", 2000, 300, [[2, 1, 16, 2, 16], [2, 1, 16, 2, 16], [], [], [], [], []],
             ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"], ext=3),
        _cpu("gloo:all_to_all", 2010, 280, *ad([[2, 1, 16, 2, 16]], ["float"]), tid=2, cat="user_annotation",
             ext=4),
        _cpu("c10d::send", 5000, 40, [[[1, 32, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"], ext=5),
        _cpu("gloo:send", 5010, 100, *ad([[1, 32, 64]], ["float"]), tid=2, cat="user_annotation", ext=6),
    ]  # fmt: skip


def test_gloo_sizes_from_the_trace_without_a_flight_recorder_dump(tmp_path):
    ev = _trace(tmp_path, _gloo_step(with_annotation_dims=True))
    rows = {r["op"]: r for r in collectives_from_events(ev).to_pylist()}
    assert set(rows) == {"allreduce", "alltoall", "send"}
    # c10d's element count, the annotation's dtype (a TensorList has none): 53504 x 4 bytes
    assert (rows["allreduce"]["in_nelems"], rows["allreduce"]["dtype"], rows["allreduce"]["bytes"]) == (
        53504, "float", 214016)  # fmt: skip
    assert (rows["alltoall"]["in_nelems"], rows["alltoall"]["out_nelems"], rows["alltoall"]["bytes"]) == (
        1024, 1024, 4096)  # fmt: skip
    assert (rows["send"]["in_nelems"], rows["send"]["bytes"]) == (2048, 8192)


def test_c10d_ops_alone_give_counts_and_leave_unknown_dtypes_null(tmp_path):
    # no sizes on the gloo annotations (the c10d ops are the only shapes): the tensor lists' element counts
    # are known, their dtype is not, so their bytes are null (never 0); alltoall_base_'s tensors name theirs
    ev = _trace(tmp_path, _gloo_step(with_annotation_dims=False))
    coll = collectives_from_events(ev)
    rows = {r["op"]: r for r in coll.to_pylist()}
    assert (rows["allreduce"]["in_nelems"], rows["allreduce"]["dtype"], rows["allreduce"]["bytes"]) == (
        53504, None, None)  # fmt: skip
    assert (rows["send"]["in_nelems"], rows["send"]["bytes"]) == (2048, None)
    assert rows["alltoall"]["bytes"] == 4096
    by_op = {r["op"]: r for r in collectives_dict(SimpleNamespace(collectives=coll), {})["by_op"]}
    assert by_op["allreduce"]["bytes"] is None and by_op["allreduce"]["calls_bytes_unknown"] == 1
    assert by_op["alltoall"]["bytes"] == 4096 and "calls_bytes_unknown" not in by_op["alltoall"]


def test_gpu_tensor_list_op_without_dtype_does_not_hide_the_annotation_that_has_one():
    # PyTorch ~2.0 GPU all-to-all: c10d::alltoall_ (tensor lists: counts, no dtype) > nccl:all_to_all
    # (dtype long); the kernel carries no collective args. Bytes from the one that names a dtype.
    ev = events_table(
        [
            {"rank": 0, "kind": "cpu_op", "name": "c10d::alltoall_", "ts_ns": 1000, "dur_ns": 300, "tid": 1,
             "pid": 1, "in_nelems": 384, "out_nelems": 384},
            {"rank": 0, "kind": "user_annotation", "name": "nccl:all_to_all", "ts_ns": 1020, "dur_ns": 250,
             "tid": 1, "pid": 1, "in_nelems": 384, "dtype": "long"},
            {"rank": 0, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": 1100, "dur_ns": 5, "tid": 1,
             "pid": 1, "correlation": 1, "external_id": 1},
            {"rank": 0, "kind": "kernel", "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)",
             "ts_ns": 2000, "dur_ns": 500, "correlation": 1, "external_id": 1, "pid": 0, "tid": 7, "device": 0,
             "stream": 7},
        ]
    )  # fmt: skip
    (c,) = collectives_from_events(ev).to_pylist()
    assert (c["op"], c["in_nelems"], c["dtype"], c["bytes"]) == ("alltoall", 384, "long", 384 * 8)
