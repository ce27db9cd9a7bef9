"""The per-op view (tracelens.analyze.efficiency.ops) on hand-built event tables: kernel -> op linking, time per step,
achieved TFLOP/s and TB/s, the roofline, kernel names, launch statistics and the memory peak."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens.analyze.efficiency import ops as O

H100 = "NVIDIA H100 80GB HBM3"  # 989 TFLOP/s bf16, 67 TFLOP/s fp32, 3.35 TB/s


def _events() -> pa.Table:
    rows = []
    for step, base in ((1, 0), (2, 10_000_000)):
        rows += [
            dict(
                rank=0,
                kind="cpu_op",
                name=f"ProfilerStep#{step}",
                ts_ns=base,
                dur_ns=9_000_000,
                tid=1,
                step=step,
            ),
            dict(
                rank=0,
                kind="cpu_op",
                name="aten::linear",
                ts_ns=base + 5,
                dur_ns=200,
                external_id=9 + 100 * step,
                tid=1,
                step=step,
            ),
            dict(
                rank=0,
                kind="cpu_op",
                name="aten::mm",
                ts_ns=base + 10,
                dur_ns=100,
                external_id=10 + 100 * step,
                tid=1,
                step=step,
            ),
            dict(
                rank=0,
                kind="cuda_runtime",
                name="cudaLaunchKernel",
                ts_ns=base + 20,
                dur_ns=5,
                correlation=1 + 10 * step,
                external_id=10 + 100 * step,
                step=step,
            ),
            dict(
                rank=0,
                kind="cuda_runtime",
                name="cudaLaunchKernel",
                ts_ns=base + 40,
                dur_ns=5,
                correlation=2 + 10 * step,
                external_id=10 + 100 * step,
                step=step,
            ),
            # a GEMM and its split-K reduction: one op instance, 1.5 ms
            dict(
                rank=0,
                kind="kernel",
                name="void cutlass::Kernel<cutlass_80_gemm<float, 128> >(Params)",
                ts_ns=base + 1_000,
                dur_ns=1_000_000,
                correlation=1 + 10 * step,
                external_id=10 + 100 * step,
                step=step,
                device=0,
                stream=7,
            ),
            dict(
                rank=0,
                kind="kernel",
                name="splitKreduce_kernel",
                ts_ns=base + 1_002_000,
                dur_ns=500_000,
                correlation=2 + 10 * step,
                external_id=10 + 100 * step,
                step=step,
                device=0,
                stream=7,
            ),
            dict(
                rank=0,
                kind="cpu_op",
                name="aten::add",
                ts_ns=base + 300,
                dur_ns=50,
                external_id=11 + 100 * step,
                tid=1,
                step=step,
            ),
            dict(
                rank=0,
                kind="cuda_runtime",
                name="cudaLaunchKernel",
                ts_ns=base + 310,
                dur_ns=5,
                correlation=3 + 10 * step,
                external_id=11 + 100 * step,
                step=step,
            ),
            # no External id on the kernel: linked through its launch's correlation
            dict(
                rank=0,
                kind="kernel",
                name="void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
                ts_ns=base + 2_000_000,
                dur_ns=8_000,
                correlation=3 + 10 * step,
                step=step,
                device=0,
                stream=7,
            ),
            dict(
                rank=0,
                kind="kernel",
                name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                ts_ns=base + 3_000_000,
                dur_ns=2_000_000,
                correlation=4 + 10 * step,
                step=step,
                device=0,
                stream=9,
            ),
        ]
    return schema.table_from_rows(rows, schema.EVENTS)


def _shapes() -> pa.Table:
    rows = []
    for step in (1, 2):
        rows.append(
            dict(
                rank=0,
                external_id=10 + 100 * step,
                name="aten::mm",
                input_dims=json.dumps([[1024, 1024], [1024, 1024]]),
                input_types=json.dumps(["c10::BFloat16", "c10::BFloat16"]),
                concrete_inputs=None,
            )
        )
        rows.append(
            dict(
                rank=0,
                external_id=11 + 100 * step,
                name="aten::add",
                input_dims=json.dumps([[1024], [1024], []]),
                input_types=json.dumps(["float", "float", "Scalar"]),
                concrete_inputs=None,
            )
        )
    t = pa.Table.from_pylist(rows)
    return t.select(["external_id", "name", "input_dims", "input_types", "concrete_inputs", "rank"])


def test_kernels_link_to_the_innermost_op_and_comm_kernels_are_left_out():
    inst = O.op_instances(_events(), _shapes(), [1, 2])
    assert sorted(inst["op"]) == ["aten::add", "aten::add", "aten::mm", "aten::mm"]
    mm = inst[inst["op"] == "aten::mm"]
    assert list(mm["n_kernels"]) == [2, 2] and list(mm["time_ns"]) == [1_500_000, 1_500_000]
    assert set(mm["kernel"]) == {"Kernel<…>"}  # the longest kernel, templates folded


def test_op_table_tflops_and_roofline():
    inst = O.op_instances(_events(), _shapes(), [1, 2])
    t = O.op_table(inst, H100, n_steps=2, stage_of={0: 3}).set_index("op")
    mm, add = t.loc["aten::mm"], t.loc["aten::add"]
    assert mm["calls"] == 1 and mm["ms_per_step"] == pytest.approx(1.5)
    flops = 2.0 * 1024**3
    assert mm["flops"] == flops and mm["bytes"] == 3 * 1024 * 1024 * 2
    assert mm["tflops"] == pytest.approx(flops / 1.5e-3 / 1e12)
    # intensity 2*1024^3 / 6 MiB = 341 FLOP/B > ridge 989/3.35 = 295: compute-bound, % of 989 TFLOP/s
    assert mm["bound"] == "compute" and mm["roofline_pct"] == pytest.approx(100 * flops / 1.5e-3 / 989e12)
    assert mm["stage"] == 3 and mm["model"] == "gemm"
    # add: 1024 FLOPs, 4*(1024 + 1024) + 4096 bytes in 8 µs: memory-bound, % of 3.35 TB/s
    assert add["flops"] == 1024 and add["bytes"] == 12288
    assert add["bound"] == "memory"
    assert add["roofline_pct"] == pytest.approx(100 * 12288 / 8e-6 / 3.35e12)
    assert add["kernel"] == "vectorized_elementwise_kernel<…>[CUDAFunctor_add]"


def test_unknown_gpu_or_missing_shapes_give_nulls():
    inst = O.op_instances(_events(), None, [1, 2])
    t = O.op_table(inst, H100, n_steps=2)
    assert t["flops"].isna().all() and t["bound"].isna().all() and t["roofline_pct"].isna().all()
    assert t["ms_per_step"].sum() == pytest.approx(1.5 + 0.008)
    t = O.op_table(O.op_instances(_events(), _shapes(), [1, 2]), "Some Unknown GPU", n_steps=2)
    assert t["tflops"].notna().all() and t["bound"].isna().all()


def test_summary_rows_keys_and_bounds():
    inst = O.op_instances(_events(), _shapes(), [1, 2])
    rows = O.summary_rows(O.op_table(inst, H100, n_steps=2, stage_of={0: 0}), per_stage=1)
    assert len(rows) == 1 and rows[0]["op"] == "aten::mm"
    for k in (
        "op",
        "kernel",
        "stage",
        "layer_type",
        "calls",
        "ms_per_step",
        "flops",
        "bytes",
        "tflops",
        "tbps",
        "bound",
        "roofline_pct",
    ):
        assert k in rows[0]
    assert rows[0]["layer_type"] is None and rows[0]["flops"] == 2.0 * 1024**3


def test_launch_stats():
    ls = O.launch_stats(_events(), [1, 2]).iloc[0]
    # delays: 1000-20, 1_002_000-40, 2_000_000-310 ns (x2 steps); the NCCL kernel has no launch
    delays = sorted([0.98, 1001.96, 1999.69] * 2)
    assert ls["kernels"] == 8
    assert ls["launch_delay_median_us"] == pytest.approx(1001.96)
    assert ls["launch_delay_mean_us"] == pytest.approx(sum(delays) / 6)
    assert ls["short_kernel_share"] == pytest.approx(2 / 8)  # the two 8 µs adds
    assert ls["short_kernel_time_share"] == pytest.approx(16_000 / (2 * (1_500_000 + 8_000 + 2_000_000)))


@pytest.mark.parametrize(
    "raw,short",
    [
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
            "unsigned int, float, 4, 4> >(at::native::ReduceOp<float>)",
            "reduce_kernel<…>[sum_functor]",
        ),
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT"),
        (
            "void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>, "
            "false, true>(Flash_fwd_params)",
            "flash_fwd_kernel<…>",
        ),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
    ],
)
def test_short_kernel_names(raw, short):
    assert O.short_kernel_name(raw) == short


def test_memory_peak_and_op_at_peak():
    mem = schema.table_from_rows(
        [
            dict(rank=0, ts_ns=t, device=0, bytes=b, total_allocated=a, total_reserved=r)
            for t, b, a, r in ((100, 10, 10, 64), (1_000_100, 90, 100, 128), (3_000_000, -50, 50, 128))
        ]
        + [dict(rank=0, ts_ns=50, device=-1, bytes=999, total_allocated=999, total_reserved=999)],
        schema.MEMORY,
    )
    pk = O.memory_peaks(mem, _events(), {0: 1}).iloc[0]
    assert pk["peak_allocated"] == 100 and pk["peak_reserved"] == 128 and pk["peak_ts_ns"] == 1_000_100
    assert pk["stage"] == 1
    assert pk["op_at_peak"] == "ProfilerStep#1"  # the only CPU op covering t = 1_000_100
    tl = O.memory_timeline(mem, max_points=2)
    assert list(tl["allocated"]) == [10, 100, 50]  # GPU samples only; the peak kept when thinning
    assert list(O.memory_timeline(mem, max_points=1)["allocated"]) == [10, 100]


def test_cpu_only_rank_counts_outermost_modelled_ops_and_bare_leaves():
    rows = [
        dict(rank=0, kind="cpu_op", name="ProfilerStep#1", ts_ns=0, dur_ns=1000, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::linear", ts_ns=10, dur_ns=500, external_id=1, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::mm", ts_ns=20, dur_ns=400, external_id=2, tid=1, step=1),
        dict(
            rank=0, kind="cpu_op", name="aten::resolve_conj", ts_ns=30, dur_ns=5, external_id=5, tid=1, step=1
        ),
        dict(rank=0, kind="cpu_op", name="aten::relu", ts_ns=600, dur_ns=100, external_id=3, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::zeros", ts_ns=800, dur_ns=60, external_id=6, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::empty", ts_ns=805, dur_ns=20, external_id=7, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::mm", ts_ns=100, dur_ns=50, external_id=4, tid=2, step=1),
    ]
    inst = O.op_instances(schema.table_from_rows(rows, schema.EVENTS), None, [1])
    # linear (with its mm and resolve_conj inside) once; relu; empty (a leaf without a model, under zeros,
    # which has none either); the other thread's mm
    assert sorted(zip(inst["op"], inst["time_ns"])) == [
        ("aten::empty", 20),
        ("aten::linear", 500),
        ("aten::mm", 50),
        ("aten::relu", 100),
    ]


def test_older_traces_link_kernels_to_the_op_around_their_launch():
    """Older Kineto writes the launch's correlation as every `External id`: no CPU op carries it, so the
    kernel belongs to the innermost CPU op on the launching thread that holds the launch."""
    rows = [
        dict(rank=0, kind="cpu_op", name="ProfilerStep#1", ts_ns=0, dur_ns=10_000, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::linear", ts_ns=10, dur_ns=500, external_id=1, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::t", ts_ns=20, dur_ns=10, external_id=2, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::mm", ts_ns=40, dur_ns=400, external_id=3, tid=1, step=1),
        dict(rank=0, kind="cpu_op", name="aten::relu", ts_ns=600, dur_ns=100, external_id=4, tid=1, step=1),
        dict(
            rank=0,
            kind="cuda_runtime",
            name="cudaLaunchKernel",
            ts_ns=100,
            dur_ns=5,
            correlation=77,
            external_id=77,
            tid=1,
            step=1,
        ),
        dict(
            rank=0,
            kind="cuda_runtime",
            name="cudaLaunchKernel",
            ts_ns=650,
            dur_ns=5,
            correlation=78,
            external_id=78,
            tid=1,
            step=1,
        ),
        dict(
            rank=0,
            kind="cuda_runtime",
            name="cudaLaunchKernel",
            ts_ns=5_000,
            dur_ns=5,
            correlation=79,
            external_id=79,
            tid=1,
            step=1,
        ),  # outside every op but the step: no op
        dict(
            rank=0,
            kind="kernel",
            name="gemm",
            ts_ns=1_000,
            dur_ns=300,
            correlation=77,
            external_id=77,
            step=1,
            device=0,
            stream=7,
        ),
        dict(
            rank=0,
            kind="kernel",
            name="relu_kernel",
            ts_ns=2_000,
            dur_ns=50,
            correlation=78,
            external_id=78,
            step=1,
            device=0,
            stream=7,
        ),
        dict(
            rank=0,
            kind="kernel",
            name="k3",
            ts_ns=6_000,
            dur_ns=5,
            correlation=79,
            external_id=79,
            step=1,
            device=0,
            stream=7,
        ),
    ]
    inst = O.op_instances(schema.table_from_rows(rows, schema.EVENTS), None, [1])
    got = dict(zip(inst["kernel"], inst["op"]))
    assert got["gemm"] == "aten::mm" and got["relu_kernel"] == "aten::relu" and pd.isna(got["k3"])
    ext = inst.set_index("kernel")["external_id"]
    assert ext["gemm"] == 3 and ext["relu_kernel"] == 4  # the op's own id: its shapes join on it


def test_unknown_bytes_keep_flops_but_no_bound_and_stepless_traces_count_everything():
    rows = [
        dict(rank=0, kind="cpu_op", name="aten::_foreach_add_", ts_ns=0, dur_ns=100, external_id=1, tid=1),
        dict(
            rank=0,
            kind="cuda_runtime",
            name="cudaLaunchKernel",
            ts_ns=10,
            dur_ns=5,
            correlation=5,
            external_id=1,
            tid=1,
        ),
        dict(
            rank=0,
            kind="kernel",
            name="multi_tensor_apply_kernel",
            ts_ns=1_000,
            dur_ns=1_000,
            correlation=5,
            external_id=1,
            device=0,
            stream=7,
        ),
    ]
    shapes = pa.table(
        {
            "external_id": [1],
            "name": ["aten::_foreach_add_"],
            "input_dims": [json.dumps([[[1000], [1000]], [[1000], [1000]]])],
            "input_types": [json.dumps(["TensorList", "TensorList"])],
            "concrete_inputs": [None],
            "rank": pa.array([0], pa.int32()),
        }
    )
    inst = O.op_instances(schema.table_from_rows(rows, schema.EVENTS), shapes, None)  # no ProfilerStep
    t = O.op_table(inst, H100).iloc[0]
    assert t["calls"] == 1 and t["ms_per_step"] == pytest.approx(0.001)
    assert t["flops"] == 2000 and t["tflops"] == pytest.approx(2000 / 1e-6 / 1e12)
    assert pd.isna(t["bytes"]) and pd.isna(t["tbps"]) and t["bound"] is None and t["roofline_pct"] is None


def test_moe_layer_rated_from_its_nested_routing_and_the_model_expert_size():
    """vllm::moe_forward (hidden [32, 64], router logits [32, 8]) launches the expert kernels itself; a TopK
    op nested in it says k = 2; the model config gives the expert size I = 16 (SwiGLU): 2*32*2*64*16*3."""
    from tracelens.models.op_flops import OpContext

    rows = [
        dict(rank=0, kind="cpu_op", name="vllm::moe_forward", ts_ns=100, dur_ns=1000, external_id=5, tid=1),
        dict(rank=0, kind="cpu_op", name="TopK", ts_ns=200, dur_ns=50, external_id=6, tid=1),
        dict(
            rank=0,
            kind="cuda_runtime",
            name="cudaLaunchKernel",
            ts_ns=400,
            dur_ns=5,
            correlation=1,
            external_id=5,
        ),  # fmt: skip
        dict(
            rank=0,
            kind="kernel",
            name="fused_moe_kernel",
            ts_ns=500,
            dur_ns=4000,
            correlation=1,
            external_id=5,
            device=0,
            stream=7,
        ),  # fmt: skip
    ]
    ev = schema.table_from_rows(rows, schema.EVENTS)
    shapes = pa.Table.from_pylist(
        [
            dict(
                external_id=5,
                name="vllm::moe_forward",
                input_dims=json.dumps([[32, 64], [32, 8], [], []]),
                input_types=json.dumps(["c10::BFloat16"] * 2 + ["", ""]),
                concrete_inputs=None,
                rank=0,
            ),
            dict(
                external_id=6,
                name="TopK",
                input_dims=json.dumps([[32, 8], [], []]),
                input_types=json.dumps(["c10::BFloat16", "Scalar", "Scalar"]),
                concrete_inputs=json.dumps(["", "2", "True"]),
                rank=0,
            ),
        ]  # fmt: skip
    )
    inst = O.op_instances(ev, shapes)
    assert inst.loc[inst["op"] == "vllm::moe_forward", "moe_top_k"].tolist() == [2]
    # without the expert size (no model): unknown
    assert O.op_table(inst, H100)["flops"].isna().all()
    t = O.op_table(inst, H100, model_context=OpContext(moe_top_k=4, moe_intermediate=16))
    row = t[t["op"] == "vllm::moe_forward"].iloc[0]
    assert (
        row["model"] == "moe" and row["flops"] == 2.0 * 32 * 2 * 64 * 16 * 3
    )  # the trace's k, not the model's
    # experts touched: min(8, 64 routed rows) = 8, each 3 x 64 x 16 bf16 weights; hidden read, output written
    assert row["bytes"] == 2 * 32 * 64 * 2 + 8 * 64 * 16 * 3 * 2
