"""`tracelens check` on simulated runs with planted faults (the acceptance scenarios of issue 8).

Runs are simulated with a small dense model, analysed blind by `tracelens.summary.summarize`, and
compared with a baseline of the same configuration. The planted faults' size is read from truth.json.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracelens.report.check_renderers import render
from tracelens.run_analysis import summary_of as summarize
from tracelens.simulate import SimConfig, simulate
from tracelens.summaries import regress

# Dense, small enough to simulate in a fraction of a second; compute is a large part of the step.
MODEL = {
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 1000,
}  # fmt: skip
# 4 ranks (tp 2 x dp 2 on two hosts), 6 profiled steps: enough for the Mann-Whitney test at 0.05.
BASE = {
    "model": MODEL, "seq_len": 4096, "tp": 2, "pp": 1, "dp": 2, "ranks_per_host": 2, "microbatches": 1,
    "steps": 6, "gzip": False,
}  # fmt: skip
RUNS = {
    "baseline": {"seed": 0},
    "noise": {"seed": 1},  # same configuration, another seed
    "straggler": {"seed": 2, "stragglers": [(1, 1.3, None)]},  # rank 1 computes 30% slower
    "slow-link": {"seed": 3, "slow_links": [(2, 1.25)]},  # rank 2's transfers 25% slower
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """name -> (truth.json dict, summary dict)."""
    root = tmp_path_factory.mktemp("check-sim")
    out = {}
    for name, kw in RUNS.items():
        truth = simulate(SimConfig(**BASE, **kw), root / name)
        out[name] = (truth, summarize(root / name, no_cache=True))
    return out


def _rules(report: regress.CheckReport) -> dict[str, regress.RuleResult]:
    return {r.rule: r for r in report.results}


def _true_exposed_ms(truth: dict) -> float:
    """Mean over ranks and steps of the simulator's exposed communication (ground truth)."""
    return float(np.mean([s["exposed_comm_ns"] for r in truth["ranks"] for s in r["steps"]])) / 1e6


def test_same_configuration_other_seed_passes(runs):
    report = regress.check(runs["baseline"][1], runs["noise"][1])
    assert not report.regressed, render(report, "text")
    assert report.exit_code == 0
    res = _rules(report)
    assert res["step_time"].status == "pass" and abs(res["step_time"].delta) < 2.0
    assert res["exposed_comm"].status == "pass"


def test_planted_straggler_fails_step_time_and_straggler_rules(runs):
    report = regress.check(runs["baseline"][1], runs["straggler"][1])
    res = _rules(report)
    assert report.exit_code == 1
    assert res["step_time"].status == "fail", res["step_time"].message
    assert res["step_time"].p_value < 0.05
    assert res["stragglers"].status == "fail", res["stragglers"].message
    assert res["stragglers"].delta == ["+rank 1"]
    assert "step_time" in report.headline() and "stragglers" in report.headline()


def test_more_exposed_communication_fails_that_rule(runs):
    base_truth, base = runs["baseline"]
    cur_truth, cur = runs["slow-link"]
    ratio = _true_exposed_ms(cur_truth) / _true_exposed_ms(base_truth)
    assert 1.1 < ratio < 1.35  # the planted fault: about 20% more exposed communication
    res = _rules(regress.check(base, cur))["exposed_comm"]
    assert res.status == "fail", res.message
    assert res.p_value < 0.05 and res.delta > 2.0


def test_summary_json_round_trip_gives_the_same_verdict(runs, tmp_path):
    """A stored baseline summary.json is enough: the per-step samples travel with it."""
    from tracelens.summary import write_summary

    write_summary(runs["baseline"][1], tmp_path / "summary.json")
    stored = summarize(tmp_path)
    direct = regress.check(runs["baseline"][1], runs["slow-link"][1])
    again = regress.check(stored, runs["slow-link"][1])
    assert [(r.rule, r.status, r.p_value) for r in again.results] == [
        (r.rule, r.status, r.p_value) for r in direct.results
    ]
    assert Path(tmp_path / "summary.json").stat().st_size > 0


def test_larger_pipeline_bubble_fails_the_bubble_rule(tmp_path):
    """pp=2 with 8 microbatches vs 2: 1F1B's bubble (p-1)/(m+p-1) grows from ~11% to ~33% of the step."""
    pipe = {**BASE, "tp": 1, "dp": 1, "pp": 2}
    truths, summaries = [], []
    for name, m in (("m8", 8), ("m2", 2)):
        truths.append(simulate(SimConfig(**{**pipe, "microbatches": m, "seed": m}), tmp_path / name))
        summaries.append(summarize(tmp_path / name, no_cache=True))
    res = _rules(regress.check(*summaries))["bubble"]
    assert res.status == "fail", res.message
    true_pct = [100 * float(np.mean([s["bubble_fraction"] for s in t["stages"]])) for t in truths]
    assert res.baseline == pytest.approx(true_pct[0], abs=1.5)
    assert res.current == pytest.approx(true_pct[1], abs=1.5)
    assert res.p_value < 0.05
