"""Layer-annotation rules (tracelens.analyze.pipeline.layers) and the composition they feed."""

from __future__ import annotations

import pytest

from tracelens.analyze.pipeline import composition, layers
from tracelens.errors import BadConfigError


@pytest.mark.parametrize(
    "name,rule,layer,module",
    [
        ("layer.12.linear_attention", "layer.N.<type>", 12, "linear_attention"),
        ("layer.15.full_attention", "layer.N.<type>", 15, "full_attention"),
        ("model.layers.3.self_attn", "hf", 3, "full_attention"),
        ("model.layers.3.linear_attn", "hf", 3, "linear_attention"),
        ("decoder.layers.7.self_attention", "megatron", 7, "full_attention"),
        ("decoder.layers.7.mlp", "megatron", 7, "mlp"),
        ("layers.2.attention", "torchtitan", 2, "full_attention"),
        ("layers.2.feed_forward", "torchtitan", 2, "mlp"),
        ("nn.Module: Qwen3_5GatedDeltaNet_4", "module-class", 4, "linear_attention"),
        ("nn.Module: Qwen3_5Attention_7", "module-class", 7, "full_attention"),
        ("Qwen3_5MLP_7", "module-class", 7, "mlp"),
    ],
)
def test_each_convention_matches_its_rule(name, rule, layer, module):
    assert layers.matched_rule([name])["rule"] == rule
    pats = composition._compile(None)
    ok, lay, mod, _ = composition._match_names([name], pats)
    assert ok[0] and lay[0] == layer and mod[0] == module


def test_non_layer_names_do_not_match():
    names = ["aten::mm", "forward_mb0", "ProfilerStep#3", "nn.Module: Qwen3_5DecoderLayer_2", "relayers.1.x"]
    assert layers.matched_rule(names)["rule"] is None


def test_user_pattern_first_and_validated():
    pat = r"blk(?P<layer>\d+)/(?P<module>attn|ffn)"
    assert layers.matched_rule(["blk3/attn", "blk3/ffn"], pat)["rule"] == "layer_pattern"
    with pytest.raises(BadConfigError):
        layers.compile_rules("blk(\\d+")
    with pytest.raises(BadConfigError):
        layers.compile_rules(r"blk(?P<layer>\d+)")
