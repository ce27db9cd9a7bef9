"""A heavy pipeline stage (more layers on one stage) in simulated runs: the stage is named, and no rank
straggler or slow group comes out of it (issue 17, item 2).

In 1F1B with one stage holding 1.5x the layers, every other stage waits for it: the ranks of the light
stages show larger exposed waits than in the clean twin. None of that is a rank's own excess over its
stage peers, nor a slow transfer, so the heavy stage explains it and nothing else is reported. The controls plant a real straggler and a real slow group beside the heavy
stage and check that they are still found (the heavy stage explains extra work, not slow links)."""

from __future__ import annotations

import pytest

from tracelens.run_analysis import Options, analyze_run
from tracelens.simulate import SimConfig, simulate


def llama(layers: int) -> dict:
    return {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": 1024, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 4096, "vocab_size": 1000,
    }  # fmt: skip


HEAVY = 2  # stage 2 holds 6 layers, the others 4
SPLIT = [4, 4, 6, 4]
BASE = {"seq_len": 2048, "microbatches": 4, "steps": 4, "seed": 0, "gzip": False, "pp": 4, "dp": 2}
RUNS = {
    "clean": {"model": llama(16)},  # the twin: the same layout, every stage 4 layers
    "heavy": {"model": llama(18), "split": SPLIT},
    "heavy+straggler": {"model": llama(18), "split": SPLIT, "stragglers": [(1, 1.3, None)]},
    "heavy+slow-group": {"model": llama(18), "split": SPLIT, "slow_links": [(4, 3.0), (5, 3.0)]},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("heavy-stage")
    cache: dict[str, tuple[dict, dict, object]] = {}

    def get(name: str):
        if name not in cache:
            out = root / name.replace("+", "_")
            truth = simulate(SimConfig(**BASE, **RUNS[name]), out)
            a = analyze_run(out, Options(no_cache=True))
            cache[name] = (a.summary(), truth, a)
        return cache[name]

    return get


def _codes(s: dict) -> list[str]:
    return [f["code"] for f in s["findings"]]


def _stage_ranks(truth: dict, stage: int) -> list[int]:
    return sorted(truth["stages"][stage]["ranks"])


def test_heavy_stage_named_with_its_layers(runs):
    s, truth, _ = runs("heavy")
    # the heaviest stage in the truth (compute per step), and the planted one
    heaviest = max(truth["stages"], key=lambda st: sum(x["compute_ns"] for x in st["steps"]))["stage"]
    assert heaviest == HEAVY
    imb = next(f for f in s["findings"] if f["code"] == "STAGE_IMBALANCE")
    assert imb["stages"] == [HEAVY] and f"stage {HEAVY}" in imb["message"]
    assert sorted(imb["ranks"]) == _stage_ranks(truth, HEAVY)
    comp = s["composition"]
    assert comp["heavy_stage"] == HEAVY
    assert comp["layer_split"] == SPLIT
    assert comp["stages"] == {str(st["stage"]): st["layer_types"] for st in truth["stages"]}
    unequal = next(f for f in s["findings"] if f["code"] == "UNEQUAL_STAGE_COMPOSITION")
    assert unequal["stages"] == [HEAVY]


def test_no_rank_straggler_or_slow_group_from_a_heavy_stage(runs):
    s, truth, _ = runs("heavy")
    clean, _, _ = runs("clean")
    # the situation of the issue: the light stages wait for the heavy one ...
    wait = {r["rank"]: r["exposed_wait_ms"] for r in s["ranks"]}
    wait_clean = {r["rank"]: r["exposed_wait_ms"] for r in clean["ranks"]}
    for st in range(4):
        if st != HEAVY:
            for r in _stage_ranks(truth, st):
                assert wait[r] > wait_clean[r] + 1.5, (r, wait[r], wait_clean[r])
    # yet no rank is a straggler and no group is slow: the heavy stage explains it
    assert s["stragglers"] == []
    assert not {"STRAGGLER", "SLOW_GROUP"} & set(_codes(s)), _codes(s)


def test_clean_twin_has_no_finding(runs):
    s, _, _ = runs("clean")
    # the schedule's own bubble is the one finding a clean pipeline has (PIPELINE_BUBBLE, issue 41)
    assert _codes(s) == ["PIPELINE_BUBBLE"], _codes(s)
    assert s["stragglers"] == []


def test_a_real_straggler_beside_the_heavy_stage_is_still_named(runs):
    s, truth, _ = runs("heavy+straggler")
    planted = truth["faults"]["stragglers"]
    assert [(x["rank"], x["cause"]) for x in s["stragglers"]] == [(p["rank"], "compute") for p in planted]
    assert [f["ranks"] for f in s["findings"] if f["code"] == "STRAGGLER"] == [[1]]
    assert next(f for f in s["findings"] if f["code"] == "STAGE_IMBALANCE")["stages"] == [HEAVY]


def test_a_slow_link_on_the_heavy_stage_is_a_slow_group_not_explained_away(runs):
    s, truth, _ = runs("heavy+slow-group")
    slow = sorted(x["rank"] for x in truth["faults"]["slow_links"])
    groups = [f for f in s["findings"] if f["code"] == "SLOW_GROUP"]
    assert [f["ranks"] for f in groups] == [slow]
    assert groups[0]["transfer_ratio"] >= 2.0  # planted 3x on both members
    assert s["stragglers"] == [] and "STRAGGLER" not in _codes(s)
    assert next(f for f in s["findings"] if f["code"] == "STAGE_IMBALANCE")["stages"] == [HEAVY]
