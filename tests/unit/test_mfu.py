"""compute_mfu and stage_tflops against hand-computed values; unknown inputs give nulls."""

from __future__ import annotations

import pytest

from tracelens.analyze.efficiency.mfu import compute_mfu, stage_tflops
from tracelens.errors import BadInputError
from tracelens.models import get_model, model_from_config

# Tiny dense Llama (see test_models.py): Megatron training FLOPs per token at s=32 is
# 2 layers x 3 x (16,384 + 4,096 + 8,192 + 49,152) + 6 x 64 x 1000 = 466,944 + 384,000 = 850,944.
TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
FPT = 850_944


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY, name="tiny")


def test_mfu_by_hand(tiny):
    # 8 sequences of 32 tokens per step, 1 ms per step on 2 GPUs of 1 TFLOP/s each
    out = compute_mfu(tiny, 32, 256, 0.001, 2, 1e12)
    flops_step = FPT * 256  # 217,841,664
    assert out["flops_per_token"] == FPT
    assert out["flops_per_step"] == flops_step
    assert out["value"] == pytest.approx(flops_step / (0.001 * 2 * 1e12))  # 0.108920832
    assert out["value"] == pytest.approx(0.108920832)
    assert out["hfu"] == out["value"]  # no recompute
    assert out["achieved_tflops_per_gpu"] == pytest.approx(flops_step / 0.001 / 2 / 1e12)
    assert out["convention"] == "megatron"
    assert out["tokens_per_step"] == 256
    assert out["peak_flops_per_gpu"] == 1e12
    assert out["per_step"] == []
    assert out["without_bubbles_and_exposed_comm"] is None


def test_per_step_and_what_is_at_stake(tiny):
    out = compute_mfu(
        tiny,
        32,
        256,
        0.001,
        2,
        1e12,
        step_times_s={3: 0.0008, 4: 0.0012},
        lost_time_s={"bubble": 0.0002, "exposed_comm": 0.0001},
    )
    base = FPT * 256 / (2 * 1e12)
    assert [p["step"] for p in out["per_step"]] == [3, 4]
    assert out["per_step"][0]["mfu"] == pytest.approx(base / 0.0008)
    assert out["per_step"][1]["mfu"] == pytest.approx(base / 0.0012)
    assert out["per_step"][0]["step_time_ms"] == pytest.approx(0.8)
    # without 0.3 ms of bubble + exposed comm the step would take 0.7 ms
    assert out["without_bubbles_and_exposed_comm"] == pytest.approx(base / 0.0007)
    assert out["lost_time_ms"] == pytest.approx({"bubble": 0.2, "exposed_comm": 0.1})
    # a list of step times is numbered from 0
    out = compute_mfu(tiny, 32, 256, 0.001, 2, 1e12, step_times_s=[0.001, None])
    assert out["per_step"][0]["mfu"] == pytest.approx(base / 0.001)
    assert out["per_step"][1]["mfu"] is None


def test_hfu_with_recompute(tiny):
    full = compute_mfu(tiny, 32, 256, 0.001, 2, 1e12, recompute="full")
    # full recompute: + one forward of both layers = 466,944 / 3
    assert full["hardware_flops_per_token"] == FPT + 466_944 / 3
    assert full["hfu"] == pytest.approx(full["value"] * (FPT + 466_944 / 3) / FPT)
    sel = compute_mfu(tiny, 32, 256, 0.001, 2, 1e12, recompute="selective")
    assert sel["hardware_flops_per_token"] == FPT + 2 * 4096
    with pytest.raises(BadInputError):
        compute_mfu(tiny, 32, 256, 0.001, 2, 1e12, recompute="half")
    with pytest.raises(BadInputError):
        compute_mfu(None, 32, 256, 0.001, 2, 1e12, convention="kaplan")


def test_unknown_inputs_give_nulls(tiny):
    no_model = compute_mfu(None, 32, 256, 0.001, 2, 1e12)
    assert no_model["value"] is None and no_model["flops_per_token"] is None and no_model["hfu"] is None
    no_peak = compute_mfu(tiny, 32, 256, 0.001, 2, None)
    assert no_peak["value"] is None and no_peak["achieved_tflops_per_gpu"] is not None
    no_tokens = compute_mfu(tiny, 32, None, 0.001, 2, 1e12)
    assert no_tokens["value"] is None and no_tokens["flops_per_token"] == FPT
    no_seq = compute_mfu(tiny, None, 256, 0.001, 2, 1e12)
    assert no_seq["value"] is None and no_seq["flops_per_token"] is None
    no_time = compute_mfu(tiny, 32, 256, None, 2, 1e12)
    assert no_time["value"] is None and no_time["step_time_ms"] is None
    # lost time that exceeds the step cannot give an MFU
    over = compute_mfu(tiny, 32, 256, 0.001, 2, 1e12, lost_time_s={"bubble": 0.002})
    assert over["without_bubbles_and_exposed_comm"] is None


def test_qwen_mfu_at_4096():
    qwen = get_model("qwen3.5-27b")
    # 256 sequences of 4,096 tokens on 64 H100s (989 TFLOP/s) in 10 s
    out = compute_mfu(qwen, 4096, 256 * 4096, 10.0, 64, 989e12)
    assert out["value"] == pytest.approx(157.065412608e9 * 256 * 4096 / (10.0 * 64 * 989e12))
    palm = compute_mfu(qwen, 4096, 256 * 4096, 10.0, 64, 989e12, convention="palm")
    assert palm["convention"] == "palm" and palm["value"] > out["value"]


def test_stage_tflops(tiny):
    # 2 stages, one layer each; dp=2 replicas share 256 tokens; tp=2 GPUs per stage
    per_layer = 3 * (16_384 + 4_096 + 8_192 + 49_152)
    rows = stage_tflops(tiny, 32, [1, 1], 256, [0.0005, 0.001], dp=2, tp=2, peak_flops_per_gpu=1e12)
    assert rows[0]["flops_per_token"] == per_layer
    assert rows[1]["flops_per_token"] == per_layer + 384_000
    assert rows[0]["achieved_tflops_per_gpu"] == pytest.approx(per_layer * 128 / 2 / 0.0005 / 1e12)
    assert rows[1]["achieved_tflops_per_gpu"] == pytest.approx((per_layer + 384_000) * 128 / 2 / 0.001 / 1e12)
    assert rows[1]["mfu_of_compute"] == pytest.approx(rows[1]["achieved_tflops_per_gpu"])
    unknown = stage_tflops(tiny, 32, None, 256, [0.001, None])
    assert all(r["achieved_tflops_per_gpu"] is None for r in unknown)
    with pytest.raises(BadInputError):
        stage_tflops(tiny, 32, [2], 256, [0.001, 0.001])
