"""Layout audit: divisibility, KV replication numbers, clean degrees, stage composition, balanced split."""

from __future__ import annotations

import itertools

import pytest

from tracelens.errors import BadConfigError, BadInputError
from tracelens.findings import CODES
from tracelens.models import FULL, LINEAR, get_model, model_from_config
from tracelens.models.audit import audit_layout, balanced_split
from tracelens.models.flops import layer_training_flops, logits_flops_per_token


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen3.5-27b")


def _codes(result) -> list[str]:
    return [f["code"] for f in result.findings]


def _row(result, dim):
    return next(r for r in result.dimensions if r["dimension"] == dim)


def test_tp8_pp4_kv_replication(qwen):
    r = audit_layout(qwen, tp=8, pp=4)
    assert _codes(r) == ["KV_HEAD_REPLICATION", "STAGE_IMBALANCE"]  # pp4: the LM head on stage 3
    assert all(f["code"] in CODES for f in r.findings)
    kv = r.kv_replication
    assert kv["factor"] == 2
    # 4 extra copies (8 ranks - 4 heads) of one head's K and V (2 x 5120 x 256) in 16 layers, bf16
    assert kv["replicated_kv_params"] == (8 - 4) * 2 * 5120 * 256 * 16 == 167_772_160
    assert kv["replicated_kv_weight_bytes"] == 167_772_160 * 2
    # per GPU: 4 full-attention layers per stage, one head's K/V grads in bf16, ring all-reduce of 2 ranks
    buffer = 2 * 5120 * 256 * 4 * 2
    assert kv["extra_grad_allreduce_bytes_per_gpu_per_step"] == 2 * (2 - 1) / 2 * buffer
    assert kv["assumptions"]
    assert _row(r, "kv_heads")["replicated"] == 2
    # the DeltaNet limit: 16 QK heads (TP must divide 16), 48 V heads
    assert r.deltanet["max_tp"] == 16 and r.deltanet["qk_heads_per_rank"] == 2
    assert r.deltanet["v_heads_per_rank"] == 6
    assert _row(r, "deltanet_qk_heads")["divides"] and _row(r, "deltanet_v_heads")["divides"]
    limits = {lim["dimension"]: lim["max_degree"] for lim in r.limits["tp"]}
    assert limits == {"q_heads": 24, "kv_heads": 4, "deltanet_qk_heads": 16, "deltanet_v_heads": 48}
    assert not r.clean


def test_tp4_pp4_is_clean_but_for_the_lm_head(qwen):
    r = audit_layout(qwen, tp=4, pp=4)
    assert [f["code"] for f in r.findings] == ["STAGE_IMBALANCE"] and not r.clean
    assert audit_layout(qwen, tp=4, pp=2).clean
    assert r.kv_replication is None
    assert all(row["divides"] for row in r.dimensions)
    assert [st["layers"] for st in r.stages] == [{FULL: 4, LINEAR: 12}] * 4
    assert r.layer_split == [16, 16, 16, 16]
    assert r.to_dict()["clean"] is False


def test_clean_degrees(qwen):
    r = audit_layout(qwen, tp=1, pp=1, cp=2, seq_len=4096)
    # gcd of vocab 248320, FFN 17408, heads 24 / 4 / 16 / 48 is 4
    assert r.clean_degrees["tp"] == [1, 2, 4]
    # 8 divides 24, 16, 48 and is a multiple of the 4 KV heads
    assert r.clean_degrees["tp_with_kv_replication"] == [8]
    assert r.clean_degrees["pp"] == [1, 2, 4, 8, 16]
    assert r.clean_degrees["cp"] == [1, 2, 4, 8, 16, 32, 64]  # 4096 % (2 * cp) == 0
    assert _row(r, "sequence")["per_rank"] == 2048


def test_pp3_unequal_composition(qwen):
    r = audit_layout(qwen, tp=4, pp=3)
    assert r.layer_split == [22, 21, 21]  # as even as possible, extra layer first
    # full-attention layers are 3, 7, ..., 63: stage 0 (0-21) has 5, stage 1 (22-42) 5, stage 2 (43-63) 6
    assert [st["layers"][FULL] for st in r.stages] == [5, 5, 6]
    assert [st["layers"][LINEAR] for st in r.stages] == [17, 16, 15]
    unequal = [f for f in r.findings if f["code"] == "UNEQUAL_STAGE_COMPOSITION"]
    assert len(unequal) == 1 and unequal[0]["stages"] == [2]
    assert "stage 2 holds 6 full-attention layers" in unequal[0]["message"]
    assert "INDIVISIBLE_DIMENSION" in _codes(r)  # 64 layers over 3 stages


def test_imbalance_grows_with_sequence(qwen):
    r = audit_layout(qwen, tp=4, pp=3)
    assert r.seq_lens_evaluated == [4096, 262_144]
    spread = {}
    for s in r.seq_lens_evaluated:
        fl = [st["flops_per_token"][str(s)] for st in r.stages]
        spread[s] = max(fl) / min(fl)
    assert spread[262_144] > spread[4096]


def test_indivisible_tp(qwen):
    r = audit_layout(qwen, tp=3, pp=1)
    bad = {f["dimension"]: f["severity"] for f in r.findings if f["code"] == "INDIVISIBLE_DIMENSION"}
    # 24 Q heads and 48 V heads divide by 3; 4 KV heads, 16 QK heads, FFN 17408 do not; vocab is padded
    assert bad == {"kv_heads": "error", "deltanet_qk_heads": "error", "ffn": "error", "vocab": "warning"}
    assert r.kv_replication is None


def test_cp_sequence_check(qwen):
    ok = audit_layout(qwen, tp=1, pp=1, cp=2, seq_len=4096)
    assert ok.findings == []
    bad = audit_layout(qwen, tp=1, pp=1, cp=3, seq_len=4096)
    assert [(f["code"], f["dimension"]) for f in bad.findings] == [("INDIVISIBLE_DIMENSION", "sequence")]


def _brute_force_best_max(model, pp, seq_len):
    """Smallest possible heaviest-stage FLOPs over every block-boundary split (independent check)."""
    per_layer = layer_training_flops(model, seq_len)
    bs = model.block_size
    blocks = [sum(per_layer[i : i + bs]) for i in range(0, model.num_layers, bs)]
    n, best = len(blocks), float("inf")
    for cuts in itertools.combinations(range(1, n), pp - 1):
        edges = (0, *cuts, n)
        costs = [sum(blocks[a:b]) for a, b in itertools.pairwise(edges)]
        costs[-1] += logits_flops_per_token(model)
        best = min(best, max(costs))
    return best


def _max_stage(model, split, seq_len):
    per_layer = layer_training_flops(model, seq_len)
    out, start = [], 0
    for n in split:
        out.append(sum(per_layer[start : start + n]))
        start += n
    out[-1] += logits_flops_per_token(model)
    return max(out)


@pytest.mark.parametrize(("pp", "seq_len"), [(2, 4096), (3, 4096), (3, 262_144), (5, 4096), (4, 262_144)])
def test_balanced_split_is_optimal_on_blocks(qwen, pp, seq_len):
    split = balanced_split(qwen, pp, seq_len)
    assert sum(split) == 64 and len(split) == pp and all(n % 4 == 0 and n > 0 for n in split)
    assert _max_stage(qwen, split, seq_len) == pytest.approx(_brute_force_best_max(qwen, pp, seq_len))


def test_balanced_split_unloads_lm_head_stage():
    # 8 identical layers and an LM head costing ~3 layers: the last stage should get fewer layers
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 4000,
    }
    m = model_from_config(cfg)
    split = balanced_split(m, 2, 64)
    assert split[1] < split[0]
    assert _max_stage(m, split, 64) == pytest.approx(_brute_force_best_max(m, 2, 64))


def test_given_split_and_bad_inputs(qwen):
    r = audit_layout(qwen, tp=4, pp=3, layer_split=[24, 20, 20])
    assert r.split_source == "given"
    assert [st["layers"][FULL] for st in r.stages] == [6, 5, 5]
    assert all(st["block_aligned"] for st in r.stages)
    with pytest.raises(BadConfigError):
        audit_layout(qwen, tp=4, pp=3, layer_split=[30, 30])
    with pytest.raises(BadInputError):
        audit_layout(qwen, tp=4, pp=2, layer_split=[20, 20, 24])
    with pytest.raises(BadInputError):
        audit_layout(qwen, tp=0, pp=1)
    with pytest.raises(BadInputError):
        audit_layout(qwen, tp=1, pp=65)


def test_dense_model_has_no_composition_finding():
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    r = audit_layout(model_from_config(cfg), tp=2, pp=4)
    assert "UNEQUAL_STAGE_COMPOSITION" not in _codes(r)
    assert r.deltanet is None
    assert r.layer_split == [2, 2, 1, 1]
