"""Model FLOPs per token: per layer and component, per layer type, per pipeline stage, per convention.

Megatron convention (default) follows Megatron-LM's `num_floating_point_operations`: every GEMM counted
3 times (forward, weight-gradient, data-gradient) at 2 FLOPs per multiply-add; core attention with the
causal halving (2 * q_dim * s per token and layer, forward); the Gated DeltaNet core term
(4 * V heads * key dim * value dim per token, forward); logits 2 * h * V forward. Embedding lookups,
norms, activations, softmax and the MoE router are not counted. PaLM convention: 6 * N + 12 * L * H * Q * T
with N the parameters that multiply activations and L the full-attention layers. docs/mfu.md derives both.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracelens.errors import BadConfigError, BadInputError
from tracelens.models.spec import FULL, LINEAR, ModelSpec

CONVENTIONS = ("megatron", "palm")
RECOMPUTE = (None, "selective", "full")
# Components counted by the Megatron convention (layer_forward_flops without `extras`).
MODEL_COMPONENTS = (
    "qkv_proj",
    "gate",
    "attn_core",
    "out_proj",
    "deltanet_proj",
    "conv",
    "deltanet_core",
    "mlp",
)


def _check_seq(seq_len: int) -> int:
    if seq_len is None or int(seq_len) != seq_len or seq_len <= 0:
        raise BadInputError(f"sequence length must be a positive integer, got {seq_len!r}")
    return int(seq_len)


def _check_convention(convention: str) -> str:
    if convention not in CONVENTIONS:
        raise BadInputError(f"unknown FLOPs convention '{convention}' (known: {', '.join(CONVENTIONS)})")
    return convention


def _first_layer(model: ModelSpec, layer_type: str) -> int:
    try:
        return model.layer_types.index(layer_type)
    except ValueError:
        raise BadInputError(f"model {model.name} has no '{layer_type}' layer") from None


def mlp_forward_flops(model: ModelSpec, layer_index: int) -> float:
    """Forward FLOPs per token of the MLP of one layer (dense, or active experts plus shared expert)."""
    h = model.hidden_size
    mult = 3 if model.gated_mlp else 2
    if model.is_moe_layer(layer_index):
        routed = model.num_experts_per_tok * model.moe_intermediate_size
        return 2.0 * h * mult * (routed + model.shared_expert_intermediate_size)
    return 2.0 * h * mult * model.intermediate_size


def layer_forward_flops(
    model: ModelSpec,
    layer_type: str,
    seq_len: int,
    *,
    layer_index: int | None = None,
    extras: bool = False,
) -> dict[str, float]:
    """Forward FLOPs PER TOKEN of ONE layer of `layer_type`, by component.

    full_attention: qkv_proj, gate (the output-gate half of q_proj), attn_core (QK^T and AV with the
    causal halving: 2 * 2 * s * q_dim / 2), out_proj. linear_attention: deltanet_proj (q, k, v, z, b, a),
    conv (depthwise, kernel x channels), deltanet_core (4 * V heads * dk * dv), out_proj. Both: mlp.
    `layer_index` picks the layer (matters for MoE stacks with dense layers); default the first layer of
    that type. `extras=True` adds terms no convention counts: norm (RMSNorm ~4 FLOPs/element) and
    router (MoE gate GEMM).
    """
    s = _check_seq(seq_len)
    idx = _first_layer(model, layer_type) if layer_index is None else int(layer_index)
    if not 0 <= idx < model.num_layers or model.layer_types[idx] != layer_type:
        raise BadInputError(f"layer {layer_index} of {model.name} is not a {layer_type} layer")
    h = model.hidden_size
    out: dict[str, float] = {}
    if layer_type == FULL:
        q = model.q_dim
        out["qkv_proj"] = 2.0 * h * (q + 2 * model.kv_dim)
        out["gate"] = 2.0 * h * q if model.attn_output_gate else 0.0
        out["attn_core"] = 2.0 * 2.0 * s * q / 2.0
        out["out_proj"] = 2.0 * q * h
    else:
        kd, vd, hv = model.linear_key_dim, model.linear_value_dim, model.linear_num_value_heads
        out["deltanet_proj"] = 2.0 * h * (2 * kd + 2 * vd + 2 * hv)
        out["conv"] = 2.0 * model.linear_conv_kernel_dim * (2 * kd + vd)
        out["deltanet_core"] = 2.0 * 4 * hv * model.linear_key_head_dim * model.linear_value_head_dim
        out["out_proj"] = 2.0 * vd * h
    out["mlp"] = mlp_forward_flops(model, idx)
    if extras:
        norm = 2 * 4.0 * h
        if layer_type == FULL and model.qk_norm:
            norm += 4.0 * (model.num_attention_heads + model.num_key_value_heads) * model.head_dim
        out["norm"] = norm
        out["router"] = 2.0 * h * model.num_experts if model.is_moe_layer(idx) else 0.0
    return out


def logits_flops_per_token(model: ModelSpec) -> float:
    """Training FLOPs per token of the LM head (forward 2*h*V, times 3)."""
    return 6.0 * model.hidden_size * model.vocab_size


def layer_training_flops(model: ModelSpec, seq_len: int) -> list[float]:
    """Megatron-convention training FLOPs per token of every layer, in layer order (3 x forward)."""
    _check_seq(seq_len)
    cache: dict[tuple[str, str], float] = {}
    out = []
    for i in range(model.num_layers):
        kind = model.layer_kind(i)
        if kind not in cache:
            cache[kind] = 3.0 * sum(layer_forward_flops(model, kind[0], seq_len, layer_index=i).values())
        out.append(cache[kind])
    return out


def matmul_params(model: ModelSpec) -> int:
    """PaLM's N: active parameters that multiply activations (input embedding lookup excluded; a tied
    embedding counts once, as the LM head)."""
    comp = model.params_by_component(active=True)
    n = sum(comp.values()) - comp["embedding"]
    return n + (comp["embedding"] if model.tie_word_embeddings else 0)


def training_flops_per_token(model: ModelSpec, seq_len: int, convention: str = "megatron") -> float:
    """Model (not hardware) training FLOPs per token at sequence length `seq_len`.

    megatron: sum over layers of 3 x forward components + 6*h*V (logits).
    palm: 6*N + 12 * L_full * H * Q * T (no causal halving; DeltaNet layers add only their 6N share).
    """
    s = _check_seq(seq_len)
    if _check_convention(convention) == "palm":
        n_full = model.layer_type_counts().get(FULL, 0)
        return 6.0 * matmul_params(model) + 12.0 * n_full * model.num_attention_heads * model.head_dim * s
    return float(sum(layer_training_flops(model, s))) + logits_flops_per_token(model)


def hardware_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: str | None = None, convention: str = "megatron"
) -> float:
    """FLOPs the GPUs actually execute per token, counting activation recomputation (for HFU).

    selective: Megatron's default selective recompute re-runs the core attention forward of every
    full-attention layer (+1 x attn_core). full: every transformer layer's forward runs again
    (layers x 4/3); the LM head is not recomputed.
    """
    if recompute not in RECOMPUTE:
        raise BadInputError(f"unknown recompute mode '{recompute}' (known: selective, full)")
    base = training_flops_per_token(model, seq_len, convention)
    if recompute is None:
        return base
    if recompute == "selective":
        n_full = model.layer_type_counts().get(FULL, 0)
        core = layer_forward_flops(model, FULL, seq_len)["attn_core"] if n_full else 0.0
        return base + n_full * core
    layers = base - logits_flops_per_token(model)  # both conventions count the LM head as 6*h*V
    return base + layers / 3.0


def flops_per_token_by_layer_type(model: ModelSpec, seq_len: int) -> dict[str, float]:
    """Megatron training FLOPs per token for ONE layer of each type present (mean over layers of that
    type, which differ only in MoE stacks with dense layers), plus "logits" (the LM head, once)."""
    per_layer = layer_training_flops(model, seq_len)
    out: dict[str, float] = {}
    for t in (LINEAR, FULL):
        vals = [f for f, lt in zip(per_layer, model.layer_types) if lt == t]
        if vals:
            out[t] = sum(vals) / len(vals)
    out["logits"] = logits_flops_per_token(model)
    return out


def default_split(num_layers: int, pp: int) -> list[int]:
    """As even as possible: every stage gets num_layers // pp layers, the first num_layers % pp get one more."""
    if pp <= 0:
        raise BadInputError(f"pipeline size must be positive, got {pp}")
    base, rem = divmod(num_layers, pp)
    return [base + (1 if i < rem else 0) for i in range(pp)]


def check_split(model: ModelSpec, layer_split: Sequence[int]) -> list[int]:
    """Validate a per-stage layer count list (non-negative, sums to num_layers)."""
    split = [int(x) for x in layer_split]
    if not split or any(x < 0 for x in split) or sum(split) != model.num_layers:
        raise BadConfigError(f"layer split {split} must be non-negative counts summing to {model.num_layers}")
    return split


def stage_flops_per_token(model: ModelSpec, seq_len: int, layer_split: Sequence[int]) -> list[float]:
    """Megatron training FLOPs per token of each pipeline stage: its layers, plus the LM head (logits) on
    the last stage. The embedding lookup on the first stage is a gather (0 model FLOPs)."""
    split = check_split(model, layer_split)
    per_layer = layer_training_flops(model, seq_len)
    out, start = [], 0
    for n in split:
        out.append(float(sum(per_layer[start : start + n])))
        start += n
    out[-1] += logits_flops_per_token(model)
    return out
