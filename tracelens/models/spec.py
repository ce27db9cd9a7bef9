"""One model description (ModelSpec) shared by MFU, the layout audit and the simulator.

Built from a Hugging Face style `config.json` (dense Llama/Qwen, GQA, attention output gate, SwiGLU,
tied or untied embeddings, MoE with active experts, hybrid `layer_types` where `linear_attention` is a
Gated DeltaNet layer as in Qwen3-Next / Qwen3.5) or from a built-in preset. Parameter counts follow the
Hugging Face module shapes; see docs/mfu.md.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tracelens.errors import BadConfigError

FULL = "full_attention"
LINEAR = "linear_attention"
LAYER_TYPES = (FULL, LINEAR)

# model_type values whose MLP is not gated (two matrices instead of SwiGLU's three).
_UNGATED_MLP = {"gpt2", "gpt_neox", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2", "gptj"}
# model_type values whose q/k/v projections carry a bias even without an `attention_bias` key.
_QKV_BIAS = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}


@dataclass(frozen=True)
class ModelSpec:
    """Text backbone shapes needed for parameter counts, FLOPs and partitioning checks.

    MoE fields are 0 for dense models; linear-attention (Gated DeltaNet) fields are 0 when no layer
    is `linear_attention`. `layer_types[i]` is "full_attention" or "linear_attention".
    """

    name: str
    num_layers: int
    layer_types: tuple[str, ...]
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 0
    gated_mlp: bool = True
    qk_norm: bool = False
    attention_bias: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    model_type: str = ""

    def __post_init__(self) -> None:
        _check(
            len(self.layer_types) == self.num_layers,
            f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_layers}",
        )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        _check(not bad, f"unsupported layer type(s) {bad}; supported: {', '.join(LAYER_TYPES)}")
        for key in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        ):
            _check(getattr(self, key) > 0, f"{key} must be positive, got {getattr(self, key)}")
        _check(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
            f"{self.num_key_value_heads}",
        )
        if LINEAR in self.layer_types:
            for key in (
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
            ):
                _check(getattr(self, key) > 0, f"linear_attention layers need a positive {key}")
            _check(
                self.linear_num_value_heads % self.linear_num_key_heads == 0,
                f"linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads {self.linear_num_key_heads}",
            )
        if self.num_experts:
            _check(
                0 < self.num_experts_per_tok <= self.num_experts,
                f"num_experts_per_tok must be in 1..{self.num_experts}, got {self.num_experts_per_tok}",
            )
            _check(self.moe_intermediate_size > 0, "MoE models need a positive moe_intermediate_size")
        if any(not self.is_moe_layer(i) for i in range(self.num_layers)):
            _check(self.intermediate_size > 0, "dense MLP layers need a positive intermediate_size")

    # ----- shapes -------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the attention output (Q heads x head_dim), before the output projection."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): KV heads x head_dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def linear_key_dim(self) -> int:
        """Gated DeltaNet Q/K width: QK heads x key head dim."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        """Gated DeltaNet V width: V heads x value head dim."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    def is_moe_layer(self, index: int) -> bool:
        """True when layer `index` uses routed experts (HF Qwen-MoE rule: sparse step, mlp_only_layers)."""
        if not self.num_experts or index in self.mlp_only_layers:
            return False
        step = max(1, self.decoder_sparse_step)
        return (index + 1) % step == 0

    def layer_kind(self, index: int) -> tuple[str, str]:
        """(attention type, MLP kind 'dense'|'moe') of one layer; the unit of the repeating block."""
        return self.layer_types[index], "moe" if self.is_moe_layer(index) else "dense"

    @property
    def block_size(self) -> int:
        """Length of the shortest repeating pattern of layer kinds (4 for 3 DeltaNet + 1 attention)."""
        kinds = [self.layer_kind(i) for i in range(self.num_layers)]
        for p in range(1, self.num_layers + 1):
            if self.num_layers % p == 0 and all(kinds[i] == kinds[i % p] for i in range(self.num_layers)):
                return p
        return self.num_layers

    @property
    def num_blocks(self) -> int:
        """Number of repeating blocks (super-blocks) in the stack."""
        return self.num_layers // self.block_size

    def layer_type_counts(self, layers: range | None = None) -> dict[str, int]:
        """Count of layers per attention type over `layers` (default: all), every type present keyed."""
        idx = range(self.num_layers) if layers is None else layers
        counts = Counter(self.layer_types[i] for i in idx)
        return {t: counts.get(t, 0) for t in LAYER_TYPES if t in self.layer_types}

    # ----- parameters ---------------------------------------------------------------------------
    def attention_layer_params(self) -> int:
        """Parameters of one full-attention block (q incl. output gate, k, v, o, biases, q/k norms)."""
        h = self.hidden_size
        q_out = self.q_dim * (2 if self.attn_output_gate else 1)
        n = h * q_out + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            n += q_out + 2 * self.kv_dim
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def linear_attention_layer_params(self) -> int:
        """Parameters of one Gated DeltaNet block (HF Qwen3-Next/Qwen3.5 shapes).

        in_proj_qkvz h x (2*key_dim + 2*value_dim), in_proj_ba h x (2*V heads), depthwise conv over
        (2*key_dim + value_dim) channels x kernel, dt_bias and A_log (V heads each), gated RMSNorm
        (value head dim), out_proj value_dim x h.
        """
        h, kd, vd, hv = (
            self.hidden_size,
            self.linear_key_dim,
            self.linear_value_dim,
            self.linear_num_value_heads,
        )
        return (
            h * (2 * kd + 2 * vd)
            + h * 2 * hv
            + (2 * kd + vd) * self.linear_conv_kernel_dim
            + 2 * hv
            + self.linear_value_head_dim
            + vd * h
        )

    def dense_mlp_params(self) -> int:
        """Parameters of one dense MLP (SwiGLU: gate, up, down; ungated: up, down)."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    def moe_params(self, active: bool = False) -> dict[str, int]:
        """Parameters of one MoE MLP: routed experts (all, or the active top-k), router, shared expert."""
        h = self.hidden_size
        mult = 3 if self.gated_mlp else 2
        n_exp = self.num_experts_per_tok if active else self.num_experts
        shared = mult * h * self.shared_expert_intermediate_size
        return {
            "moe_experts": n_exp * mult * h * self.moe_intermediate_size,
            "moe_router": h * self.num_experts,
            "moe_shared_expert": shared + (h if self.shared_expert_intermediate_size else 0),
        }

    def params_by_component(self, active: bool = False) -> dict[str, int]:
        """Text-backbone parameters by component; `active=True` counts only top-k routed experts.

        Keys: embedding, lm_head (0 when tied), attention, linear_attention, mlp, moe_experts,
        moe_router, moe_shared_expert, norms (two per layer plus the final norm).
        """
        h = self.hidden_size
        counts = self.layer_type_counts()
        out = {
            "embedding": self.vocab_size * h,
            "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h,
            "attention": counts.get(FULL, 0) * self.attention_layer_params(),
            "linear_attention": counts.get(LINEAR, 0) * self.linear_attention_layer_params(),
            "mlp": 0,
            "moe_experts": 0,
            "moe_router": 0,
            "moe_shared_expert": 0,
            "norms": (2 * self.num_layers + 1) * h,
        }
        for i in range(self.num_layers):
            if self.is_moe_layer(i):
                for key, val in self.moe_params(active).items():
                    out[key] += val
            else:
                out["mlp"] += self.dense_mlp_params()
        return out

    @property
    def num_params(self) -> int:
        """Total text-backbone parameters (embeddings counted once when tied)."""
        return sum(self.params_by_component().values())

    @property
    def num_active_params(self) -> int:
        """Parameters touched per token (top-k experts only); equals num_params for dense models."""
        return sum(self.params_by_component(active=True).values())

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (for JSON output)."""
        return {
            "name": self.name,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "layer_type_counts": self.layer_type_counts(),
            "block_size": self.block_size,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "attn_output_gate": self.attn_output_gate,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_params": self.num_params,
            "num_active_params": self.num_active_params,
        }


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BadConfigError(f"invalid model config: {message}")


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    val = cfg.get(key, default)
    if val is None:
        raise BadConfigError(f"invalid model config: missing '{key}'")
    if isinstance(val, bool) or not isinstance(val, (int, float)) or int(val) != val:
        raise BadConfigError(f"invalid model config: '{key}' must be an integer, got {val!r}")
    return int(val)


def model_from_config(config: dict, name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from an HF config dict; a `text_config` sub-dict (multimodal configs) wins."""
    if not isinstance(config, dict):
        raise BadConfigError("invalid model config: expected a JSON object")
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        if "tie_word_embeddings" not in text and "tie_word_embeddings" in cfg:
            text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        cfg = text
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("kv_lora_rank") or cfg.get("q_lora_rank"):
        raise BadConfigError(
            f"model_type '{model_type}' uses multi-latent attention, which tracelens does not model yet"
        )
    n_layers = _int(cfg, "num_hidden_layers")
    hidden = _int(cfg, "hidden_size")
    n_heads = _int(cfg, "num_attention_heads")
    n_kv = _int(cfg, "num_key_value_heads", n_heads)
    head_dim = _int(cfg, "head_dim", hidden // n_heads if n_heads else None)
    if "layer_types" in cfg and cfg["layer_types"] is not None:
        layer_types = tuple(str(t) for t in cfg["layer_types"])
    elif cfg.get("full_attention_interval") and cfg.get("linear_num_value_heads"):
        k = _int(cfg, "full_attention_interval")
        layer_types = tuple(FULL if (i + 1) % k == 0 else LINEAR for i in range(n_layers))
    else:
        layer_types = (FULL,) * n_layers
    num_experts = _int(cfg, "num_experts", cfg.get("num_local_experts") or 0)
    spec = ModelSpec(
        name=name or str(cfg.get("_name_or_path") or model_type or "model"),
        num_layers=n_layers,
        layer_types=layer_types,
        hidden_size=hidden,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        intermediate_size=_int(cfg, "intermediate_size", 0),
        vocab_size=_int(cfg, "vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        linear_num_key_heads=_int(cfg, "linear_num_key_heads", 0),
        linear_num_value_heads=_int(cfg, "linear_num_value_heads", 0),
        linear_key_head_dim=_int(cfg, "linear_key_head_dim", 0),
        linear_value_head_dim=_int(cfg, "linear_value_head_dim", 0),
        linear_conv_kernel_dim=_int(cfg, "linear_conv_kernel_dim", 0),
        num_experts=num_experts,
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", 0) if num_experts else 0,
        moe_intermediate_size=(
            _int(cfg, "moe_intermediate_size", cfg.get("intermediate_size")) if num_experts else 0
        ),
        shared_expert_intermediate_size=_int(cfg, "shared_expert_intermediate_size", 0) if num_experts else 0,
        max_position_embeddings=_int(cfg, "max_position_embeddings", 0),
        gated_mlp=model_type not in _UNGATED_MLP,
        qk_norm=bool(cfg.get("qk_norm", cfg.get("use_qk_norm", model_type.startswith("qwen3")))),
        attention_bias=bool(cfg.get("attention_bias", model_type in _QKV_BIAS)),
        decoder_sparse_step=_int(cfg, "decoder_sparse_step", 1),
        mlp_only_layers=tuple(int(i) for i in (cfg.get("mlp_only_layers") or ())),
        model_type=model_type,
    )
    return spec


# ----- presets and loading ----------------------------------------------------------------------
_PRESETS = {"qwen3527b": "qwen3.5-27b.json"}


def _preset_key(name: str) -> str:
    base = name.strip().lower().rsplit("/", 1)[-1]
    return "".join(ch for ch in base if ch.isalnum())


def preset_names() -> list[str]:
    """Names of the built-in presets."""
    return sorted(p.removesuffix(".json") for p in _PRESETS.values())


def load_preset(name: str) -> ModelSpec:
    """Load a built-in preset by name (case and punctuation insensitive: qwen3.5-27b == Qwen35-27B)."""
    fname = _PRESETS.get(_preset_key(name))
    if fname is None:
        raise BadConfigError(f"unknown model preset '{name}' (known: {', '.join(preset_names())})")
    text = resources.files("tracelens.models").joinpath("presets").joinpath(fname).read_text(encoding="utf-8")
    return model_from_config(json.loads(text), name=fname.removesuffix(".json"))


def get_model(name_or_path: str | Path) -> ModelSpec:
    """ModelSpec from a preset name or a path to an HF config.json (or a folder holding one)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BadConfigError(f"cannot read model config {path}: {err}") from None
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return model_from_config(
            cfg, name=str(cfg.get("_name_or_path") or name) if isinstance(cfg, dict) else name
        )
    if _preset_key(str(name_or_path)) in _PRESETS:
        return load_preset(str(name_or_path))
    raise BadConfigError(
        f"unknown model '{name_or_path}': not a config file and not a preset "
        f"(known presets: {', '.join(preset_names())})"
    )
