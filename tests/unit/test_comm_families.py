"""Communication recognised from kernel families and from the CPU ops around a kernel's launch (old PyTorch,
old NCCL names, RCCL), sizes from Input Dims, unknown sizes null."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tracelens._testing import events_table
from tracelens.analyze.comm.collectives import collectives_from_events, match_with_findings
from tracelens.analyze.comm.wait_transfer import wait_transfer
from tracelens.analyze.rank.classify import COMM, COMPUTE, MEMORY, classify, comm_launched
from tracelens.analyze.rank.launch_link import innermost_enclosing, link_launches
from tracelens.ingest import kineto
from tracelens.ingest.comm_families import FAMILIES, family_of_kernel, sizes_from_shapes
from tracelens.summary import collectives_dict


def op(rank, name, ts, dur, kind="cpu_op", tid=1, **kw):
    return {"rank": rank, "kind": kind, "name": name, "ts_ns": ts, "dur_ns": dur, "tid": tid, "pid": 1, **kw}


def launch(rank, ts, corr, tid=1):
    return {"rank": rank, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": ts, "dur_ns": 5,
            "tid": tid, "pid": 1, "correlation": corr, "external_id": corr}  # fmt: skip


def kern(rank, name, ts, dur, corr, **kw):
    return {"rank": rank, "kind": "kernel", "name": name, "ts_ns": ts, "dur_ns": dur, "correlation": corr,
            "external_id": corr, "pid": 0, "tid": 7, "device": 0, "stream": 7, **kw}  # fmt: skip


OLD_A2A = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def old_alltoall(rank, t0, k_start, k_dur, corr=1):
    """PyTorch ~2.0 all-to-all: no collective args on the kernel; c10d::alltoall_base_ > record_param_comms >
    nccl:all_to_all (user annotation, its Input Dims [[384]] long read at ingest as in_nelems / dtype)."""
    return [
        op(rank, "c10d::alltoall_base_", t0, 300, in_nelems=384, out_nelems=384, dtype="long"),
        op(rank, "record_param_comms", t0 + 10, 280),
        op(rank, "nccl:all_to_all", t0 + 20, 250, kind="user_annotation", in_nelems=384, dtype="long"),
        launch(rank, t0 + 100, corr),
        kern(rank, OLD_A2A, k_start, k_dur, corr),
    ]


def test_innermost_enclosing_nested_and_siblings():
    # thread 1: A [0,100) > B [10,50) , C [60,90); thread 2: D [0,100)
    g = np.array([1, 1, 1, 2])
    s = np.array([0, 10, 60, 0])
    e = np.array([100, 50, 90, 100])
    q_g = np.array([1, 1, 1, 1, 2, 3])
    q_t = np.array([20, 55, 70, 100, 5, 5])
    assert innermost_enclosing(g, s, e, q_g, q_t).tolist() == [1, 0, 2, 0, 3, -1]


def test_old_nccl_alltoall_is_an_alltoall_with_bytes():
    ev = events_table(old_alltoall(0, 1000, 2000, 500))
    c = collectives_from_events(ev).to_pylist()
    assert [(r["op"], r["in_nelems"], r["bytes"], r["is_p2p"]) for r in c] == [
        ("alltoall", 384, 384 * 8, False)
    ]
    assert c[0]["enqueue_ns"] == 1020  # the innermost op naming the collective
    cls = classify(ev)
    assert cls[4] == COMM


def test_old_nccl_collectives_match_across_ranks_and_the_early_rank_waits():
    # rank 1 arrives 400 ns late; both kernels end together at 3000
    ev = events_table(old_alltoall(0, 1000, 2000, 1000) + old_alltoall(1, 1000, 2400, 600))
    coll = collectives_from_events(ev)
    df = wait_transfer(match_with_findings(coll)[0], {})
    assert df["instance"].nunique() == 1
    w = dict(zip(df["rank"].astype(int), df["wait_ns"].astype(int)))
    assert w == {0: 400, 1: 0}


def test_sizes_from_shapes():
    assert sizes_from_shapes("nccl:all_reduce", [[394241]], ["float"]) == (394241, None, "float")
    assert sizes_from_shapes("c10d::_allgather_base_", [[1024], [16], []], ["signed char", "signed char", ""]) == (
        16, 1024, "char")  # fmt: skip
    assert sizes_from_shapes("c10d::allreduce_", [[], [], [], []], ["TensorList", "", "", "Scalar"]) == (
        None, None, None)  # fmt: skip
    assert sizes_from_shapes("nccl:all_reduce", [[2, 3]], ["c10::BFloat16"]) == (6, None, "bfloat16")


def test_ingest_reads_sizes_from_input_dims(tmp_path):
    evs = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::_allgather_base_", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
         "args": {"External id": 1, "Input Dims": [[1024], [16], []], "Input type": ["float", "float", ""]}},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:_all_gather_base", "pid": 1, "tid": 1, "ts": 12,
         "dur": 40, "args": {"External id": 2, "Input Dims": [[16]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 70, "dur": 5,
         "args": {"External id": 3, "Input Dims": [[4, 4], [4, 4]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 2,
         "args": {"correlation": 9, "External id": 2}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "pid": 0,
         "tid": 7, "ts": 30, "dur": 20, "args": {"correlation": 9, "External id": 2, "device": 0, "stream": 7}},
    ]  # fmt: skip
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": evs, "distributedInfo": {"rank": 0}}).encode()))
    ev = kineto.read(p).events
    rows = {r["name"]: r for r in ev.to_pylist()}
    assert (rows["c10d::_allgather_base_"]["in_nelems"], rows["c10d::_allgather_base_"]["out_nelems"]) == (
        16,
        1024,
    )
    assert (rows["nccl:_all_gather_base"]["in_nelems"], rows["nccl:_all_gather_base"]["dtype"]) == (
        16,
        "float",
    )
    assert rows["aten::mm"]["in_nelems"] is None  # not a communication op: shapes are not sizes
    (c,) = collectives_from_events(ev).to_pylist()
    assert (c["op"], c["in_nelems"], c["out_nelems"], c["bytes"]) == ("allgather", 16, 1024, 4096)


@pytest.mark.parametrize(
    "name,family",
    [
        ("multimem_all_reduce_kernel<bfloat16, 16>", "symm_mem"),
        ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float>", "symm_mem"),
        ("two_shot_all_reduce_kernel", "symm_mem"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, ...)", "custom_allreduce"),
        ("void sglang::cross_device_reduce_1stage<half, 4>", "custom_allreduce"),
        ("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", "deepep"),
        ("void dpsk::ep::combine<8>", "deepep"),
        ("nvshmemi_transfer_rma_kernel", "nvshmem"),
        ("void mscclpp::allreduce6<float>", "mscclpp"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl"),
        ("rcclGenericKernel", "rccl"),
    ],
)
def test_kernel_families(name, family):
    assert family_of_kernel(name) == family
    ev = events_table([op(0, "x", 0, 10), kern(0, name, 0, 10, 1)])
    assert classify(ev)[1] == COMM


@pytest.mark.parametrize("name", ["ampere_bf16_s16816gemm", "triton_poi_fused_add_0", "flash_fwd_kernel",
                                  "void at::native::elementwise_kernel<128, 2>"])  # fmt: skip
def test_compute_kernels_are_not_communication(name):
    assert family_of_kernel(name) is None


def test_families_table_is_one_documented_place():
    assert len({f.name for f in FAMILIES}) == len(FAMILIES) and all(f.what for f in FAMILIES)


def test_parent_op_marks_communication_only_when_it_launched_the_kernel():
    ev = events_table(
        [
            op(0, "symm_mem::one_shot_all_reduce", 0, 100),
            launch(0, 10, 1),
            op(0, "c10d::allgather_", 200, 100),
            op(0, "aten::copy_", 210, 20),
            launch(0, 215, 2),
            launch(0, 250, 3),
            kern(0, "some_custom_reduce_kernel", 20, 30, 1),
            kern(0, "CatArrayBatchedCopy", 230, 10, 2),
            kern(0, "my_comm_kernel", 260, 10, 3),
            kern(0, "dma_request", 300, 10, 4),
        ]
    )
    cls = classify(ev)
    assert cls[6] == COMM  # launched directly by symm_mem::
    assert cls[7] == COMPUTE  # launched by aten::copy_ nested in c10d::allgather_
    assert cls[8] == COMM  # launched directly inside c10d::allgather_
    assert cls[9] == MEMORY  # MTIA DMA
    ln = link_launches(ev)
    assert ln.parent[6] == 0 and ln.parent[7] == 3 and ln.comm_parent[7] == 2
    # comm_launched reads the innermost op only: the same as "innermost op == innermost communication op"
    has = ln.parent >= 0
    assert comm_launched(ev).tolist() == (has & (ln.parent == ln.comm_parent)).tolist()
    assert comm_launched(ev).tolist() == [False] * 6 + [True, False, True, False]
    assert comm_launched(ev) is comm_launched(ev)  # once per table


def test_external_id_links_when_the_launch_is_missing():
    ev = events_table(
        [
            op(
                0,
                "record_param_comms",
                0,
                100,
                external_id=55,
                collective="allreduce",
                in_nelems=10,
                dtype="float",
            ),  # fmt: skip
            {**kern(0, "ncclDevKernel_Generic", 50, 10, 9), "external_id": 55},
        ]
    )
    (c,) = collectives_from_events(ev).to_pylist()
    assert (c["op"], c["bytes"]) == ("allreduce", 40)


def test_unknown_sizes_are_null_not_zero():
    ev = events_table([kern(0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 10, 1),
                       kern(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 10, 1)])  # fmt: skip
    coll = collectives_from_events(ev)
    assert coll.column("bytes").to_pylist() == [None, None]
    df = wait_transfer(match_with_findings(coll)[0], {})
    d = collectives_dict(SimpleNamespace(collectives=_table(df)), {})
    (rec,) = d["by_op"]
    assert rec["bytes"] is None and rec["calls_bytes_unknown"] == 2


def test_skew_is_null_without_a_second_participant():
    ev = events_table([kern(0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 10, 1, pg_name="0",
                            group_size=2, in_nelems=4, dtype="float")])  # fmt: skip
    df = wait_transfer(match_with_findings(collectives_from_events(ev))[0], {})
    (rec,) = collectives_dict(SimpleNamespace(collectives=_table(df)), {})["by_op"]
    assert rec["skew_ms_median"] is None and rec["bytes"] == 16


def _table(df):
    from tracelens.analyze.comm.wait_transfer import to_table

    return to_table(df)


def test_one_traced_rank_of_a_group_has_no_wait_transfer_split():
    from tracelens.analyze.comm.collectives import exposed_split
    from tracelens.analyze.rank.breakdown import breakdown, class_sets

    def run(ranks):
        rows = []
        for r in ranks:
            rows += [op(r, "ProfilerStep#1", 0, 100, kind="user_annotation"),
                     kern(r, "gemm", 0, 40, 1),
                     kern(r, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40 + 10 * r, 50 - 10 * r, 2,
                          pg_name="0", group_size=2, seq=1, in_nelems=4, dtype="float")]  # fmt: skip
        ev = events_table(rows)
        sets = class_sets(ev)
        df = wait_transfer(match_with_findings(collectives_from_events(ev))[0], {})
        return exposed_split(df, breakdown(ev, sets=sets), sets).to_pylist()

    (alone,) = run([0])  # rank 1 not traced: waiting for it cannot be told from moving data
    assert alone["exposed_comm_ns"] == 50 and alone["exposed_wait_ns"] is None
    assert alone["exposed_transfer_ns"] is None
    both = {r["rank"]: r for r in run([0, 1])}
    assert (both[0]["exposed_wait_ns"], both[0]["exposed_transfer_ns"]) == (10, 40)  # rank 1 arrives 10 late
    assert (both[1]["exposed_wait_ns"], both[1]["exposed_transfer_ns"]) == (0, 40)
