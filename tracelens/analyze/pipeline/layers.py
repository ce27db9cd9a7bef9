"""Layer-annotation conventions: which span names are layers, of which type, and which rule said so.

Training code names its module spans in a handful of ways; each convention is one named rule (a regex
with groups `layer`, the index, and `module`, the part). The first rule that matches a name wins, so a
user pattern (`[model] layer_pattern` in tracelens.toml) is tried before the built-in ones:

* `layer.N.<type>`  tracelens' own layer-type names: `layer.12.linear_attention`, `layer.15.full_attention`
* `hf`              Hugging Face module paths: `model.layers.12.self_attn`, `model.layers.12.linear_attn`
* `megatron`        Megatron-Core: `decoder.layers.12.self_attention`, `decoder.layers.12.mixer`, `.mlp`
* `torchtitan`      `layers.12.attention`, `layers.12.feed_forward`
* `module-path`     any other `layers.N.<part>` path (`layers.3.attn`, `h.layers.3.moe`)
* `module-class`    class names as `with_modules` writes them: `nn.Module: Qwen3_5GatedDeltaNet_4`,
                    `Qwen3_5Attention_7`, `Qwen3_5MLP_4` (`_K` is the instance, `DecoderLayer` spans frame)
* `head`            `lm_head`, `output_layer`, `embed_tokens` (no index)

See docs/pipeline.md ("Layer annotations").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tracelens.errors import BadConfigError

_B = r"(?:^|[.\s/:#])"  # a name boundary before the path
_E = r"(?![A-Za-z0-9_])"
#: tracelens' layer type names (ModelSpec) accepted as the part of `layer.N.<type>`
LAYER_TYPE_NAMES = ("linear_attention", "full_attention", "sliding_attention", "mamba", "moe", "dense")

RULES: tuple[tuple[str, str], ...] = (
    ("layer.N.<type>", _B + r"layers?\.(?P<layer>\d+)\.(?P<module>" + "|".join(LAYER_TYPE_NAMES) + ")" + _E),
    (
        "hf",
        _B
        + r"model\.layers\.(?P<layer>\d+)\.(?P<module>self_attn|linear_attn|mlp|block_sparse_moe|mixer)"
        + _E,
    ),
    (
        "megatron",
        _B + r"decoder\.layers\.(?P<layer>\d+)\.(?P<module>self_attention|linear_attention|mixer|mlp)" + _E,
    ),
    ("torchtitan", _B + r"layers\.(?P<layer>\d+)\.(?P<module>attention|feed_forward|moe)" + _E),
    (
        "module-path",
        _B + r"layers?\.(?P<layer>\d+)\.(?P<module>linear_attn|self_attn|self_attention|attention|attn"
        r"|mixer|mlp|moe|experts|feed_forward|ffn)" + _E,
    ),
    (
        "module-class",
        r"(?:^|nn\.Module: )[A-Z][A-Za-z0-9_]*?(?P<module>GatedDeltaNet|LinearAttention|Mamba2?Mixer|"
        r"SelfAttention|Attention|SparseMoeBlock|MoE|MLP)_(?P<layer>\d+)$",
    ),
    ("head", _B + r"(?P<module>lm_head|output_layer|embed_tokens|word_embeddings|embedding)" + _E),
)

#: rule part -> canonical type (mixers use ModelSpec's layer type names)
MODULE_TYPES = {
    "linear_attn": "linear_attention",
    "linear_attention": "linear_attention",
    "gateddeltanet": "linear_attention",
    "linearattention": "linear_attention",
    "mambamixer": "mamba",
    "mamba2mixer": "mamba",
    "self_attn": "full_attention",
    "self_attention": "full_attention",
    "selfattention": "full_attention",
    "attention": "full_attention",
    "attn": "full_attention",
    "full_attention": "full_attention",
    "mixer": "mixer",
    "mlp": "mlp",
    "moe": "mlp",
    "sparsemoeblock": "mlp",
    "block_sparse_moe": "mlp",
    "experts": "mlp",
    "feed_forward": "mlp",
    "ffn": "mlp",
    "dense": "mlp",
    "lm_head": "lm_head",
    "output_layer": "lm_head",
    "embed_tokens": "embedding",
    "word_embeddings": "embedding",
    "embedding": "embedding",
}

USER_RULE = "layer_pattern"


def compile_rules(user_pattern: str | None = None) -> list[tuple[str, re.Pattern[str]]]:
    """The rules in match order, a user pattern first; a bad pattern is a BadConfigError."""
    out = []
    if user_pattern:
        try:
            p = re.compile(user_pattern)
        except re.error as exc:
            raise BadConfigError(f"[model] layer_pattern is not a valid regex: {exc}") from None
        if "module" not in p.groupindex:
            raise BadConfigError(
                "[model] layer_pattern needs a named group (?P<module>...) (and optionally (?P<layer>\\d+))"
            )
        out.append((USER_RULE, p))
    out += [(name, re.compile(rx)) for name, rx in RULES]
    return out


def patterns(user_pattern: str | None = None) -> list[str]:
    """The rule regexes in match order (for `composition.module_spans`)."""
    return [p.pattern for _, p in compile_rules(user_pattern)]


def canonical(part: str) -> str:
    """Canonical type of a matched part (`self_attn` -> full_attention)."""
    low = part.lower()
    return MODULE_TYPES.get(low, low)


def matched_rule(names: Iterable[str], user_pattern: str | None = None) -> dict[str, Any]:
    """Which rule matched the run's span names: {"rule", "example", "names"} for the rule with the most
    distinct mixer names (types other than mlp / heads), or None fields when none matched."""
    rules = compile_rules(user_pattern)
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    # each distinct name is matched once, weighted by how often it occurs (names repeat on every rank);
    # Counter keeps first-occurrence order, so examples and ties come out as in one pass over `names`
    for n, times in Counter(names).items():
        if not n:
            continue
        for rname, p in rules:
            m = p.search(n)
            if m:
                t = canonical(m.group("module"))
                w = 2 if t not in ("mlp", "lm_head", "embedding") else 1
                counts[rname] = counts.get(rname, 0) + w * times
                example.setdefault(rname, n)
                break
    if not counts:
        return {"rule": None, "example": None, "names": 0}
    best = max(counts, key=lambda k: counts[k])
    return {"rule": best, "example": example[best], "names": counts[best]}


def rule_names() -> Sequence[str]:
    return [n for n, _ in RULES]
