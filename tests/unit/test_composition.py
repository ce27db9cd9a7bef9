"""Stage composition from module annotations or the model config; imbalance findings."""

from __future__ import annotations

import pytest
from pipeline_tables import events_table

from tracelens.analyze.composition import analyze_composition, module_spans
from tracelens.models import get_model
from tracelens.topology import grid_from_layout

# stage 0: layers 0,1,2 DeltaNet (10 us each) ; stage 1: layer 3 attention (40 us) + layer 4 DeltaNet
LAYERS = {
    0: [(0, "linear_attn", 10), (1, "linear_attn", 10), (2, "linear_attn", 10)],
    1: [(3, "self_attn", 40), (4, "linear_attn", 10)],
}
MLP_US = 5


def _rows(m=2, steps=1, gpu_annotations=True):
    rows = []
    for rank, layers in LAYERS.items():
        t = 0
        for st in range(steps):
            start = t
            for _mb in range(m):
                for bwd in (False, True):
                    for li, mod, us in layers if not bwd else layers[::-1]:
                        for name, d in (
                            (f"layers.{li}.{mod}", us * 1000),
                            (f"layers.{li}.mlp", MLP_US * 1000),
                        ):
                            name += ".backward" if bwd else ""
                            d *= 2 if bwd else 1
                            corr = len(rows) + 1
                            if gpu_annotations:
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "gpu_user_annotation",
                                        "name": name,
                                        "ts_ns": t,
                                        "dur_ns": d,
                                        "step": st,
                                    }
                                )
                            else:
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "user_annotation",
                                        "name": name,
                                        "ts_ns": t,
                                        "dur_ns": 100,
                                        "tid": 2 if bwd else 1,
                                        "step": st,
                                    }
                                )
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "cuda_runtime",
                                        "name": "cudaLaunchKernel",
                                        "ts_ns": t + 10,
                                        "dur_ns": 5,
                                        "tid": 2 if bwd else 1,
                                        "correlation": corr,
                                        "step": st,
                                    }
                                )
                            rows.append(
                                {
                                    "rank": rank,
                                    "kind": "kernel",
                                    "name": "gemm",
                                    "ts_ns": t,
                                    "dur_ns": d,
                                    "correlation": corr,
                                    "step": st,
                                    "stream": 7,
                                }
                            )
                            t += d
            rows.append(
                {
                    "rank": rank,
                    "kind": "user_annotation",
                    "name": f"ProfilerStep#{st}",
                    "ts_ns": start,
                    "dur_ns": t - start + 10_000,
                    "tid": 1,
                }
            )
            t += 10_000
    return rows


@pytest.mark.parametrize("gpu_annotations", [True, False])
def test_counts_costs_and_shares(gpu_annotations):
    ev = events_table(_rows(gpu_annotations=gpu_annotations))
    grid = grid_from_layout(2, pp=2)
    res = analyze_composition(ev, grid)
    assert res.source == "annotations"
    assert res.stages == {
        0: {"full_attention": 0, "linear_attention": 3},
        1: {"full_attention": 1, "linear_attention": 1},
    }
    assert res.layer_split == [3, 2]
    # per microbatch, forward + backward (x2) = 3x the forward time
    assert res.per_stage_type_ms[0] == pytest.approx({"linear_attention": 0.090, "mlp": 0.045})
    assert res.per_stage_type_ms[1] == pytest.approx(
        {"full_attention": 0.120, "linear_attention": 0.030, "mlp": 0.030}
    )
    # compute per step: stage 0 = 2 mb * 135 us, stage 1 = 2 mb * 180 us
    assert res.per_stage_compute == pytest.approx({0: 0.270, 1: 0.360})
    assert res.heavy_stage == 1 and res.imbalance == pytest.approx(0.360 / 0.315)
    codes = [f["code"] for f in res.findings]
    assert codes == ["UNEQUAL_STAGE_COMPOSITION", "STAGE_IMBALANCE"]
    unequal, imb = res.findings
    assert unequal["stages"] == [0, 1]  # stage 1 holds the attention layer, stage 0 the most DeltaNet
    assert "stage 1 holds the most full_attention" in unequal["message"]
    assert imb["stages"] == [1] and imb["ranks"] == [1] and "stage 1" in imb["message"]
    # time shares over both ranks' step time (270 + 360 us compute + 2 x 10 us tail each)
    total = (270 + 10 + 360 + 10) / 1000
    assert res.time_share == pytest.approx(
        {
            "linear_attention": (180 + 60) / 1000 / total,
            "full_attention": 240 / 1000 / total,
            "mlp": (90 + 60) / 1000 / total,
        }
    )


def test_threshold_is_configurable():
    ev = events_table(_rows())
    res = analyze_composition(ev, grid_from_layout(2, pp=2), imbalance_threshold=1.2)
    assert [f["code"] for f in res.findings] == ["UNEQUAL_STAGE_COMPOSITION"]


def test_nested_annotation_counted_once():
    rows = [
        {
            "rank": 0,
            "kind": "gpu_user_annotation",
            "name": "layers.0.self_attn",
            "ts_ns": 0,
            "dur_ns": 100,
            "step": 0,
        },
        {
            "rank": 0,
            "kind": "gpu_user_annotation",
            "name": "layers.0.self_attn.core_attention",
            "ts_ns": 10,
            "dur_ns": 50,
            "step": 0,
        },
        {"rank": 0, "kind": "kernel", "name": "flash_fwd", "ts_ns": 0, "dur_ns": 100, "step": 0},
    ]
    sp = module_spans(events_table(rows))
    assert sp.num_rows == 1 and sp.column("compute_ns").to_pylist() == [100]


def test_from_model_config_and_suggested_split():
    model = get_model("qwen3.5-27b")
    ev = events_table(
        [
            {
                "rank": r,
                "kind": "kernel",
                "name": "gemm",
                "ts_ns": 0,
                "dur_ns": 100 + 50 * (r == 2),
                "step": 0,
            }
            for r in range(3)
        ]
    )
    res = analyze_composition(ev, grid_from_layout(3, pp=3), model=model, seq_len=4096)
    assert res.source == "model" and res.layer_split == [22, 21, 21]
    # 64 layers = 16 x (3 DeltaNet + 1 attention at 3, 7, ..., 63): 0-21 hold 3..19, 22-42 hold 23..39,
    # 43-63 hold 43..63
    assert res.stages[0] == {"linear_attention": 17, "full_attention": 5}
    assert res.stages[1] == {"linear_attention": 16, "full_attention": 5}
    assert res.stages[2] == {"linear_attention": 15, "full_attention": 6}
    assert [f["code"] for f in res.findings] == ["UNEQUAL_STAGE_COMPOSITION", "STAGE_IMBALANCE"]
    assert res.heavy_stage == 2
    assert res.suggested_split and sum(res.suggested_split) == 64
    assert all(n % 4 == 0 for n in res.suggested_split)
    assert "balanced split" in res.findings[1]["message"]


def test_audit_for_run_reuses_the_layout_audit():
    from tracelens.analyze.composition import audit_for_run
    from tracelens.topology import Grid

    model = get_model("qwen3.5-27b")
    audit, findings = audit_for_run(grid_from_layout(32, tp=8, pp=4), model, seq_len=4096)
    assert audit is not None and audit.kv_replication
    assert "KV_HEAD_REPLICATION" in [f["code"] for f in findings]
    # codes already reported by the measured composition are not repeated
    _, again = audit_for_run(
        grid_from_layout(24, tp=8, pp=3), model, 4096, existing=[{"code": "UNEQUAL_STAGE_COMPOSITION"}]
    )
    assert "UNEQUAL_STAGE_COMPOSITION" not in [f["code"] for f in again]
    assert audit_for_run(Grid(pp=4), model) == (None, [])
    assert audit_for_run(grid_from_layout(4, tp=4), None) == (None, [])
