"""Grid inference, pipeline bubbles and stage composition on simulated runs with known truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.analyze.layout import infer_grid
from tracelens.analyze.pipeline.composition import analyze_composition
from tracelens.analyze.pipeline.pipeline import analyze_pipeline
from tracelens.run import load_tables
from tracelens.simulate import SimConfig, resolve_model, simulate


def small_hybrid(n_blocks: int) -> dict:
    """A small Qwen3.5-style hybrid: blocks of 3 Gated DeltaNet layers + 1 full-attention layer."""
    return {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 4 * n_blocks,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * n_blocks,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "attn_output_gate": True,
        "intermediate_size": 3072,
        "vocab_size": 8192,
        "tie_word_embeddings": False,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 262144,
    }


UNEQUAL = [3, 5, 4]  # stage 0: 3 DeltaNet; stage 1: 3 DeltaNet + 2 attention; stage 2: 3 + 1 + LM head
RUNS = {
    "1f1b_tp2_pp4": dict(model=small_hybrid(4), seq_len=4096, tp=2, pp=4, microbatches=4, steps=2),
    "1f1b_pp4_dp2_m8": dict(model=small_hybrid(4), seq_len=4096, pp=4, dp=2, microbatches=8, steps=2),
    "gpipe_pp2_dp2_cp2": dict(
        model=small_hybrid(4), seq_len=4096, pp=2, dp=2, cp=2, microbatches=4, steps=2, schedule="gpipe"
    ),
    "unequal_4k": dict(model=small_hybrid(3), seq_len=4096, pp=3, microbatches=4, steps=2, split=UNEQUAL),
    "unequal_256k": dict(model=small_hybrid(3), seq_len=262144, pp=3, microbatches=4, steps=2, split=UNEQUAL),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (truth, tables, grid, grid findings), simulated once per module."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            truth = simulate(SimConfig(seed=0, gzip=False, **RUNS[name]), out)
            tables = load_tables(out, no_cache=True)
            grid, findings = infer_grid(tables.events, tables.metadata)
            cache[name] = (truth, tables, grid, findings)
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["1f1b_tp2_pp4", "1f1b_pp4_dp2_m8", "gpipe_pp2_dp2_cp2"])
def test_grid_inferred_without_layout_equals_simulator_layout(runs, name):
    truth, _, grid, findings = runs(name)
    lay = truth["layout"]
    assert findings == []
    assert grid.source == "inferred"
    assert (grid.tp, grid.pp, grid.dp, grid.cp) == (lay["tp"], lay["pp"], lay["dp"], lay["cp"])
    assert grid.order == lay["order"]
    assert grid.coords == {g["rank"]: (g["dp"], g["pp"], g["tp"], g["cp"]) for g in lay["grid"]}


@pytest.mark.parametrize("name", ["1f1b_tp2_pp4", "1f1b_pp4_dp2_m8", "gpipe_pp2_dp2_cp2"])
def test_bubble_fractions_match_truth(runs, name):
    truth, tables, grid, _ = runs(name)
    res = analyze_pipeline(tables.events, grid)
    cfg = RUNS[name]
    assert res.microbatches == cfg["microbatches"]
    assert res.schedule == cfg.get("schedule", "1f1b")
    assert res.expected_bubble_fraction == pytest.approx(truth["stages"][0]["expected_bubble_fraction"])
    assert len(res.stages) == cfg["pp"]
    for mine, want in zip(res.stages, truth["stages"]):
        assert mine["stage"] == want["stage"] and mine["ranks"] == want["ranks"]
        assert mine["bubble_fraction"] == pytest.approx(want["bubble_fraction"], rel=0.10)
        want_ms = sum(s["bubble_ns"] for s in want["steps"]) / len(want["steps"]) / 1e6
        assert mine["bubble_ms"] == pytest.approx(want_ms, rel=0.10)
    # per (rank, step) rows cover every rank and analysed step
    assert res.per_rank_step.num_rows == sum(len(r["steps"]) for r in truth["ranks"])


def test_unequal_split_names_heavy_stage_and_grows_with_sequence(runs):
    results = {}
    for name in ("unequal_4k", "unequal_256k"):
        truth, tables, grid, _ = runs(name)
        model = resolve_model(RUNS[name]["model"])
        comp = analyze_composition(tables.events, grid, model=model, seq_len=RUNS[name]["seq_len"])
        # layer counts per stage from the trace's module annotations equal the simulator's
        assert comp.source == "annotations"
        for s in truth["stages"]:
            want = {t: s["layer_types"].get(t, 0) for t in ("full_attention", "linear_attention")}
            assert comp.stages[s["stage"]] == want
        assert comp.layer_split == [3, 5, 4]
        # the heavy stage is the one with the most compute in the truth
        heavy = max(truth["stages"], key=lambda s: sum(x["compute_ns"] for x in s["steps"]))["stage"]
        codes = [f["code"] for f in comp.findings]
        assert "UNEQUAL_STAGE_COMPOSITION" in codes and "STAGE_IMBALANCE" in codes
        imb = next(f for f in comp.findings if f["code"] == "STAGE_IMBALANCE")
        assert imb["stages"] == [heavy] and f"stage {heavy}" in imb["message"]
        assert comp.suggested_split and all(n % 4 == 0 for n in comp.suggested_split)
        pipe = analyze_pipeline(tables.events, grid)
        assert pipe.cause_stage == heavy
        results[name] = comp
    assert results["unequal_256k"].imbalance > results["unequal_4k"].imbalance
    # attention's share of the step grows with the sequence (s^2 cost)
    short, long = results["unequal_4k"].time_share, results["unequal_256k"].time_share
    assert long["full_attention"] > short["full_attention"]
    assert short["full_attention"] == pytest.approx(runs("unequal_4k")[0]["attention_share"], rel=0.10)


HTA = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"


@pytest.mark.skipif(not HTA.is_dir(), reason=f"real traces not present at {HTA}")
def test_real_traces_partial_ranks():
    # gloo rank 34 of 300, only the default group, no sends: pure data parallel, one stage
    t = load_tables(HTA / "cpu_only", no_cache=True)
    grid, findings = infer_grid(t.events, t.metadata)
    assert findings == []
    assert (grid.tp, grid.pp, grid.dp, grid.cp, grid.world_size) == (1, 1, 300, 1, 300)
    assert grid.coords == {34: (34, 0, 0, 0)} and grid.stage_of(34) == 0
    # NCCL rank 0 of 2 with allreduce kernels: dp=2
    t = load_tables(HTA / "nccl_parser_config", no_cache=True)
    grid, findings = infer_grid(t.events, t.metadata)
    assert findings == [] and (grid.pp, grid.dp) == (1, 2)
    res = analyze_pipeline(t.events, grid)
    assert [s["stage"] for s in res.stages] == [0]
    assert res.stages[0]["bubble_ms"] == 0 and res.findings == []
    # 2 sampled ranks of a 128-rank job without process-group metadata: nothing to infer
    t = load_tables(HTA / "trace_filter", no_cache=True)
    grid, findings = infer_grid(t.events, t.metadata)
    assert grid.source == "none" and grid.pp is None
    assert analyze_pipeline(t.events, grid).stages == []


GLOO = Path(__file__).resolve().parents[2] / "sample_traces" / "cpu-gloo-4rank"


@pytest.mark.skipif(not (GLOO / "truth.json").is_file(), reason=f"sample run not present at {GLOO}")
def test_real_gloo_pipeline_run():
    """A real torch 2.13 gloo run, pp=2 x dp=2, GPipe m=3, rank 1 (stage 0) slowed on purpose."""
    import json

    truth = json.loads((GLOO / "truth.json").read_text())
    t = load_tables(GLOO, no_cache=True)
    grid, findings = infer_grid(t.events, t.metadata)
    assert findings == []
    lay = truth["layout"]
    assert (grid.tp, grid.pp, grid.dp, grid.cp, grid.order) == (
        lay["tp"],
        lay["pp"],
        lay["dp"],
        lay["cp"],
        lay["order"],
    )
    for s, rec in truth["stages"].items():
        assert grid.ranks_of_stage(int(s)) == rec["ranks"]
    res = analyze_pipeline(t.events, grid)
    assert res.microbatches == truth["schedule"]["microbatches"]
    assert res.schedule == truth["schedule"]["kind"]
    assert res.expected_bubble_fraction == pytest.approx(truth["schedule"]["expected_bubble_fraction"])
    # the straggler's stage holds the others up
    straggler = truth["straggler"]["rank"]
    assert res.cause_stage == next(r["stage"] for r in truth["ranks"] if r["rank"] == straggler)
    comp = analyze_composition(t.events, grid)
    for s, rec in truth["stages"].items():
        mixers = [n.split(".")[-1] for n in rec["layers"] if not n.endswith(".mlp")]
        assert comp.stages[int(s)] == {
            "full_attention": mixers.count("self_attn"),
            "linear_attention": mixers.count("linear_attn"),
        }
