"""Breakdown on hand-built timelines with answers worked out by hand."""

from __future__ import annotations

from tracelens._testing import events_table
from tracelens.analyze.rank.breakdown import breakdown


def k(rank, name, ts, dur, kind="kernel", **kw):
    return {"rank": rank, "kind": kind, "name": name, "ts_ns": ts, "dur_ns": dur, **kw}


def step(rank, n, ts, dur):
    return {
        "rank": rank,
        "kind": "user_annotation",
        "name": f"ProfilerStep#{n}",
        "ts_ns": ts,
        "dur_ns": dur,
        "tid": 1,
    }


def test_gpu_breakdown_by_hand():
    # Step 5 on rank 0: [0, 100). compute [10,40) and [30,60) -> union [10,60) = 50.
    # NCCL [50,80): overlapped [50,60) = 10, exposed [60,80) = 20. memcpy [75,90): only [80,90) = 10 counts.
    # gpu_user_annotation ignored. Busy [10,90) = 80 -> idle 20. Step 6 [100,200) on the CPU; its kernel
    # [150,250) started in it, and the last step ends with its device work: window [100,250), compute 100.
    ev = events_table(
        [
            step(0, 5, 0, 100),
            step(0, 6, 100, 100),
            k(0, "gemm", 10, 30),
            k(0, "gemm", 30, 30),
            k(0, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 30),
            k(0, "Memcpy HtoD", 75, 15, kind="gpu_memcpy"),
            k(0, "layers.0.mlp", 0, 100, kind="gpu_user_annotation"),
            k(0, "flash_fwd_kernel", 150, 100),
        ]
    )
    b = breakdown(ev).to_pylist()
    s5, s6 = b
    assert (s5["step"], s5["step_time_ns"], s5["compute_ns"]) == (5, 100, 50)
    assert (s5["overlapped_comm_ns"], s5["exposed_comm_ns"], s5["memcpy_ns"], s5["idle_ns"]) == (
        10,
        20,
        10,
        20,
    )
    assert s5["comm_ns"] == 30 and s5["path"] == "gpu"
    assert (s6["step"], s6["step_time_ns"], s6["compute_ns"], s6["idle_ns"]) == (6, 150, 100, 50)
    for row in b:
        assert (
            row["compute_ns"] + row["exposed_comm_ns"] + row["memcpy_ns"] + row["idle_ns"]
            == row["step_time_ns"]
        )


def test_kernel_with_collective_args_is_comm():
    ev = events_table([step(0, 1, 0, 10), k(0, "custom_allreduce", 0, 4, collective="allreduce")])
    (row,) = breakdown(ev).to_pylist()
    assert row["exposed_comm_ns"] == 4 and row["compute_ns"] == 0


def test_cpu_only_fallback():
    # gloo: main thread tid 1 runs ops; a c10d::recv_ nested inside a cpu op is a wait, not compute.
    ev = events_table(
        [
            step(0, 1, 0, 100),
            k(0, "aten::mm", 0, 40, kind="cpu_op", tid=1),
            k(0, "aten::add", 50, 30, kind="cpu_op", tid=1),
            k(0, "c10d::recv_", 60, 10, kind="cpu_op", tid=1),
            k(0, "gloo:all_reduce", 30, 20, kind="user_annotation", tid=7),
            k(0, "aten::zeros", 0, 100, kind="cpu_op", tid=7),  # another thread: not compute
        ]
    )
    (row,) = breakdown(ev).to_pylist()
    assert row["path"] == "cpu"
    # compute = [0,40) + [50,80) - [60,70) = 60; comm = [30,50) + [60,70) = 30
    assert row["compute_ns"] == 60
    assert row["overlapped_comm_ns"] == 10 and row["exposed_comm_ns"] == 20
    assert row["idle_ns"] == 100 - 60 - 20


def test_no_profiler_step_is_one_window():
    ev = events_table([k(0, "gemm", 100, 50), k(0, "gemm", 200, 50)])
    (row,) = breakdown(ev).to_pylist()
    assert row["step"] is None and row["step_time_ns"] == 150 and row["idle_ns"] == 50


def test_multi_rank():
    ev = events_table([step(1, 1, 0, 10), k(1, "gemm", 0, 5), step(0, 1, 0, 10), k(0, "gemm", 0, 2)])
    rows = {r["rank"]: r for r in breakdown(ev).to_pylist()}
    assert rows[0]["compute_ns"] == 2 and rows[1]["compute_ns"] == 5


def test_async_gloo_send_lifetime_is_not_a_wait():
    # isend at 0: its gloo:send annotation lives until the send completes (500) while the host computes
    # (an mm starts inside it): that is overlapped communication, not a wait. A blocking recv [600, 800)
    # with nothing started inside it is a wait (exposed).
    ev = events_table(
        [
            step(0, 1, 0, 1000),
            k(0, "c10d::send", 0, 5, kind="cpu_op", tid=1),
            k(0, "gloo:send", 0, 500, kind="user_annotation", tid=1),
            k(0, "aten::mm", 100, 200, kind="cpu_op", tid=1),
            k(0, "c10d::recv_", 590, 5, kind="cpu_op", tid=1),
            k(0, "gloo:recv", 600, 200, kind="user_annotation", tid=1),
        ]
    )
    (row,) = breakdown(ev).to_pylist()
    assert row["compute_ns"] == 200
    assert row["overlapped_comm_ns"] == 200
    # exposed: send [0,100) + [300,500) minus nothing, recv [590,595) + [600,800)
    assert row["exposed_comm_ns"] == 100 + 200 + 5 + 200
