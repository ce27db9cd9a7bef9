"""ModelSpec, parameter counts, FLOPs per token and GPU peaks against hand-computed values."""

from __future__ import annotations

import json

import pytest

from tracelens.errors import BadConfigError, BadInputError
from tracelens.models import FULL, LINEAR, get_model, model_from_config
from tracelens.models.flops import (
    default_split,
    flops_per_token_by_layer_type,
    hardware_flops_per_token,
    layer_forward_flops,
    layer_training_flops,
    stage_flops_per_token,
    training_flops_per_token,
)
from tracelens.models.hardware import canonical_gpu, peak_flops

# A tiny dense Llama: h=64, 4 Q heads / 2 KV heads x 16, SwiGLU 128, vocab 1000, 2 layers, untied.
TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
}


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen3.5-27b")


# ----- small dense config ---------------------------------------------------------------------------
def test_tiny_dense_params_by_hand():
    m = model_from_config(TINY, name="tiny")
    comp = m.params_by_component()
    assert comp["embedding"] == 1000 * 64 == 64_000
    assert comp["lm_head"] == 64_000
    # q 64x64 + k 64x32 + v 64x32 + o 64x64 = 4096 + 2048 + 2048 + 4096 = 12288 per layer
    assert comp["attention"] == 2 * 12_288
    # gate, up, down: 3 x 64 x 128 = 24576 per layer
    assert comp["mlp"] == 2 * 24_576
    assert comp["norms"] == (2 * 2 + 1) * 64
    assert comp["linear_attention"] == 0
    assert m.num_params == 64_000 + 64_000 + 24_576 + 49_152 + 320 == 202_048
    assert m.block_size == 1 and m.num_blocks == 2


def test_tiny_dense_flops_by_hand():
    m = model_from_config(TINY, name="tiny")
    s = 32
    fwd = layer_forward_flops(m, FULL, s)
    assert fwd["qkv_proj"] == 2 * 64 * (64 + 2 * 32) == 16_384
    assert fwd["gate"] == 0  # no output gate
    assert fwd["attn_core"] == 2 * 2 * s * 64 / 2 == 4_096  # QK^T and AV, causal half
    assert fwd["out_proj"] == 2 * 64 * 64 == 8_192
    assert fwd["mlp"] == 2 * 64 * 3 * 128 == 49_152
    per_layer = 3 * (16_384 + 4_096 + 8_192 + 49_152)  # 233,472
    logits = 6 * 64 * 1000  # 384,000
    assert layer_training_flops(m, s) == [per_layer, per_layer]
    assert training_flops_per_token(m, s) == 2 * per_layer + logits == 850_944
    # PaLM: N = params without the input embedding (202,048 - 64,000 = 138,048); 12 * L * H * Q * T
    assert training_flops_per_token(m, s, "palm") == 6 * 138_048 + 12 * 2 * 4 * 16 * 32 == 877_440
    # selective recompute re-runs the attention core forward: + 2 layers x 4,096
    assert hardware_flops_per_token(m, s, "selective") == 850_944 + 2 * 4_096
    # full recompute re-runs every layer's forward (layers x 4/3), not the LM head
    assert hardware_flops_per_token(m, s, "full") == 850_944 + 2 * per_layer / 3
    assert flops_per_token_by_layer_type(m, s) == {FULL: per_layer, "logits": logits}
    assert stage_flops_per_token(m, s, [1, 1]) == [per_layer, per_layer + logits]


def test_tied_embeddings_counted_once():
    m = model_from_config({**TINY, "tie_word_embeddings": True})
    assert m.params_by_component()["lm_head"] == 0
    assert m.num_params == 202_048 - 64_000
    # the LM head GEMM still runs; both conventions are unchanged by tying
    assert training_flops_per_token(m, 32) == 850_944
    assert training_flops_per_token(m, 32, "palm") == 877_440


def test_moe_active_params_and_flops():
    cfg = {
        **TINY,
        "model_type": "qwen2_moe",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    }
    m = model_from_config(cfg)
    comp = m.params_by_component()
    assert comp["moe_experts"] == 2 * 8 * 3 * 64 * 32
    assert comp["moe_router"] == 2 * 64 * 8
    assert comp["moe_shared_expert"] == 2 * (3 * 64 * 64 + 64)  # shared expert + its sigmoid gate
    assert comp["mlp"] == 0
    # qwen2 carries q/k/v biases: 64 + 32 + 32 per layer
    assert comp["attention"] == 2 * (12_288 + 128)
    active = m.params_by_component(active=True)
    assert active["moe_experts"] == 2 * 2 * 3 * 64 * 32
    assert m.num_active_params == m.num_params - 2 * 6 * 3 * 64 * 32
    # forward MLP FLOPs: 2 x h x 3 x (top-k x moe_ffn + shared) = 2 x 64 x 3 x (64 + 64)
    assert layer_forward_flops(m, FULL, 32)["mlp"] == 49_152
    assert layer_forward_flops(m, FULL, 32, extras=True)["router"] == 2 * 64 * 8


def test_mlp_only_layers_and_sparse_step():
    cfg = {
        **TINY,
        "num_hidden_layers": 4,
        "model_type": "qwen3_moe",
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "mlp_only_layers": [0],
    }
    m = model_from_config(cfg)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
    assert m.qk_norm  # Qwen3 q_norm/k_norm
    per = layer_training_flops(m, 16)
    assert per[0] != per[1] and per[1] == per[2] == per[3]


# ----- Qwen3.5-27B --------------------------------------------------------------------------------
def test_qwen35_shapes(qwen):
    assert qwen.num_layers == 64
    assert qwen.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 16
    assert qwen.block_size == 4 and qwen.num_blocks == 16
    assert (qwen.hidden_size, qwen.num_attention_heads, qwen.num_key_value_heads, qwen.head_dim) == (
        5120,
        24,
        4,
        256,
    )
    assert qwen.attn_output_gate and not qwen.tie_word_embeddings
    assert (qwen.linear_num_key_heads, qwen.linear_num_value_heads) == (16, 48)
    assert qwen.max_position_embeddings == 262_144


def test_qwen35_params_by_hand(qwen):
    comp = qwen.params_by_component()
    emb = 248_320 * 5_120
    # q_proj 5120 -> 12288 (24 x 256 x 2 with the output gate), k/v 5120 -> 1024, o 6144 -> 5120, q/k norm 256
    attn = 5120 * 12288 + 2 * 5120 * 1024 + 6144 * 5120 + 2 * 256
    # in_proj_qkvz 5120 -> 2*2048 + 2*6144, in_proj_ba 5120 -> 2*48, conv 10240 x 4, dt_bias + A_log 2*48,
    # gated norm 128, out_proj 6144 -> 5120
    lin = 5120 * (2 * 2048 + 2 * 6144) + 5120 * 96 + 10240 * 4 + 96 + 128 + 6144 * 5120
    mlp = 3 * 5120 * 17408
    assert comp["embedding"] == comp["lm_head"] == emb == 1_271_398_400
    assert comp["attention"] == 16 * attn == 1_677_729_792
    assert comp["linear_attention"] == 48 * lin == 5_562_051_072
    assert comp["mlp"] == 64 * mlp
    assert comp["norms"] == 129 * 5120
    assert qwen.num_params == 26_895_998_464
    assert qwen.num_params == pytest.approx(26.9e9, rel=0.002)  # issue 6: about 26.9B


def _qwen_megatron_by_hand(s: int) -> float:
    """Megatron num_floating_point_operations for Qwen3.5-27B, written out term by term."""
    mlp = 64 * 3 * 5120 * 17408
    full = 16 * (5120 * (6144 + 1024 + 1024 + 6144) + 6144 * 5120)  # q, k, v, gate; out
    core = 16 * 6144 * s / 2 * 2  # causal half, QK^T and AV
    lin = 48 * (
        5120 * (2 * 2048 + 2 * 6144 + 2 * 48) + 4 * (2 * 2048 + 6144) + 48 * 128 * 128 * 4 + 5120 * 6144
    )
    logits = 5120 * 248320
    return 3 * 2 * (mlp + full + core + lin + logits)


@pytest.mark.parametrize(("seq_len", "about"), [(4096, 157e9), (262_144, 309e9)])
def test_qwen35_megatron_flops(qwen, seq_len, about):
    got = training_flops_per_token(qwen, seq_len)
    assert got == pytest.approx(_qwen_megatron_by_hand(seq_len), rel=1e-12)
    assert got == pytest.approx(about, rel=0.005)


def test_qwen35_flops_grow_only_through_attention(qwen):
    # Only the 16 full-attention cores depend on s: 6 x 16 x 6144 x (262144 - 4096)
    diff = training_flops_per_token(qwen, 262_144) - training_flops_per_token(qwen, 4096)
    assert diff == 6 * 16 * 6144 * (262_144 - 4096)


def test_qwen35_components_add_up(qwen):
    s = 4096
    by_type = flops_per_token_by_layer_type(qwen, s)
    assert by_type["logits"] == 6 * 5120 * 248320
    lin = layer_forward_flops(qwen, LINEAR, s)
    full = layer_forward_flops(qwen, FULL, s)
    assert set(lin) == {"deltanet_proj", "conv", "deltanet_core", "out_proj", "mlp"}
    assert lin["deltanet_core"] == 2 * 4 * 48 * 128 * 128
    assert full["gate"] == 2 * 5120 * 6144
    assert by_type[LINEAR] == 3 * sum(lin.values())
    assert by_type[FULL] == 3 * sum(full.values())
    total = 48 * by_type[LINEAR] + 16 * by_type[FULL] + by_type["logits"]
    assert total == pytest.approx(training_flops_per_token(qwen, s), rel=1e-12)
    stages = stage_flops_per_token(qwen, s, [16, 16, 16, 16])
    assert sum(stages) == pytest.approx(total, rel=1e-12)
    assert stages[0] == stages[1] == stages[2]
    assert stages[3] == pytest.approx(stages[0] + by_type["logits"], rel=1e-12)
    extras = layer_forward_flops(qwen, FULL, s, extras=True)
    assert extras["norm"] > 0 and extras["router"] == 0


def test_palm_convention_qwen(qwen):
    n = qwen.num_params - 248_320 * 5_120  # everything but the input embedding
    assert training_flops_per_token(qwen, 4096, "palm") == 6 * n + 12 * 16 * 24 * 256 * 4096


def test_default_split():
    assert default_split(64, 3) == [22, 21, 21]
    assert default_split(64, 4) == [16] * 4
    with pytest.raises(BadInputError):
        default_split(64, 0)


def test_bad_split_and_inputs(qwen):
    with pytest.raises(BadConfigError):
        stage_flops_per_token(qwen, 4096, [10, 10])
    with pytest.raises(BadInputError):
        training_flops_per_token(qwen, 0)
    with pytest.raises(BadInputError):
        training_flops_per_token(qwen, 4096, "chinchilla")
    with pytest.raises(BadInputError):
        hardware_flops_per_token(qwen, 4096, "sometimes")
    with pytest.raises(BadInputError):
        layer_forward_flops(model_from_config(TINY), LINEAR, 16)


# ----- loading ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3.5-27b", "Qwen3.5-27B", "qwen35-27b", "Qwen/Qwen3.5-27B"])
def test_preset_aliases(name, qwen):
    assert get_model(name) == qwen


def test_config_file_dir_and_text_config(tmp_path, qwen):
    text = {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "intermediate_size": 17408,
        "vocab_size": 248320,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "max_position_embeddings": 262144,
    }
    folder = tmp_path / "Qwen3.5-27B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": False, "text_config": text}))
    from_dir = get_model(folder)
    from_file = get_model(str(folder / "config.json"))
    assert from_dir.name == "Qwen3.5-27B"
    # layer_types derived from full_attention_interval equal the preset's explicit list
    assert from_dir.layer_types == qwen.layer_types
    assert from_dir.num_params == from_file.num_params == qwen.num_params


def test_bad_configs(tmp_path):
    with pytest.raises(BadConfigError, match="unknown model"):
        get_model("llama-9000")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BadConfigError):
        get_model(bad)
    with pytest.raises(BadConfigError, match="hidden_size"):
        model_from_config({k: v for k, v in TINY.items() if k != "hidden_size"})
    with pytest.raises(BadConfigError, match="multiple"):
        model_from_config({**TINY, "num_key_value_heads": 3})
    with pytest.raises(BadConfigError, match="unsupported layer type"):
        model_from_config({**TINY, "layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(BadConfigError, match="layer_types has"):
        model_from_config({**TINY, "layer_types": ["full_attention"]})
    with pytest.raises(BadConfigError, match="linear_num_key_heads"):
        model_from_config({**TINY, "layer_types": ["linear_attention", "full_attention"]})
    with pytest.raises(BadConfigError, match="integer"):
        model_from_config({**TINY, "vocab_size": "many"})
    with pytest.raises(BadConfigError, match="multi-latent"):
        model_from_config({**TINY, "model_type": "deepseek_v3", "kv_lora_rank": 512})


# ----- hardware ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "canon", "bf16", "fp8"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989, 1979),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756, 1513),
        ("NVIDIA H200", "H200", 989, 1979),
        ("NVIDIA A100-SXM4-80GB", "A100", 312, None),
        ("NVIDIA A100-PG509-200", "A100", 312, None),
        ("NVIDIA B200", "B200", 2250, 4500),
        ("NVIDIA GB200", "GB200", 2500, 5000),
        ("AMD Instinct MI300X", "MI300X", 1307, 2615),
        ("AMD Instinct MI325X", "MI325X", 1307, 2615),
    ],
)
def test_peaks(name, canon, bf16, fp8):
    assert canonical_gpu(name) == canon
    assert peak_flops(name) == bf16 * 1e12
    assert peak_flops(name, "fp16") == bf16 * 1e12
    assert peak_flops(name, "fp8") == (None if fp8 is None else fp8 * 1e12)


def test_peaks_unknown():
    assert peak_flops(None) is None
    assert peak_flops("AMD Radeon Graphics") is None
    assert peak_flops("Tesla V100-SXM2-16GB") is None  # no BF16 on V100
    assert peak_flops("Tesla V100-SXM2-16GB", "fp16") == 125e12
    with pytest.raises(BadInputError):
        peak_flops("NVIDIA H100", "int4")
