"""Critical path and what-if on twin simulated runs: the same seed with and without the planted fault.

The saving measured on the twin (mean step time with the fault minus without, from the analysis's own step
times) is the ground truth for the predicted saving of the fault's what-if entry.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracelens.run_analysis import Options, analyze_run
from tracelens.simulate import SimConfig, simulate

MODEL = {
    "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 4096, "vocab_size": 1000,
}  # fmt: skip
L8 = {"tp": 2, "pp": 2, "dp": 2, "ranks_per_host": 4}  # stage 0 = ranks 0-3, stage 1 = ranks 4-7
P4 = {"tp": 1, "pp": 4, "dp": 2, "ranks_per_host": 4}  # stage s = ranks 2s, 2s+1
RUNS = {
    "clean-8": (L8, {}),
    "compute-r1": (L8, {"stragglers": [(1, 1.3, None)]}),
    "host-r2": (L8, {"host_stalls": [(2, 1.0)]}),
    "link-r6": (L8, {"slow_links": [(6, 3.0)]}),
    "clean-p4": (P4, {}),
    "heavy-stage1": (P4, {"stragglers": [(2, 1.3, None), (3, 1.3, None)]}),
    "clean-1f1b-m8": ({**P4, "dp": 1, "microbatches": 8}, {}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("whatif")
    out = {}
    for name, (layout, faults) in RUNS.items():
        cfg = {"model": MODEL, "seq_len": 2048, "microbatches": 4, "steps": 4, "seed": 0, "gzip": False}
        cfg.update(layout)
        cfg.update(faults)
        simulate(SimConfig(**cfg), root / name)
        out[name] = analyze_run(root / name, Options(no_cache=True)).summary()
    return out


def step_times(summary: dict) -> np.ndarray:
    """Per step, the longest rank's step time (ms), from the breakdown (not from the replay)."""
    per: dict[int, float] = {}
    for r in summary["per_step"]:
        per[r["step"]] = max(per.get(r["step"], 0.0), r["step_time_ms"])
    return np.array([per[k] for k in sorted(per)])


def entry(summary: dict, kind: str, ranks: list[int]) -> dict:
    hits = [w for w in summary["what_if"] if w["kind"] == kind and w["ranks"] == ranks]
    assert hits, summary["what_if"]
    return hits[0]


@pytest.mark.parametrize(
    "fault,clean,kind,ranks",
    [
        ("compute-r1", "clean-8", "compute", [1]),
        ("host-r2", "clean-8", "host", [2]),
        ("link-r6", "clean-8", "transfer", [6]),
        ("heavy-stage1", "clean-p4", "compute", [2, 3]),
    ],
)
def test_predicted_saving_matches_twin(runs, fault, clean, kind, ranks):
    measured = step_times(runs[fault]).mean() - step_times(runs[clean]).mean()
    e = entry(runs[fault], kind, ranks)
    assert measured > 0.2
    assert abs(e["saving_ms"] - measured) <= 0.10 * measured, (e, measured)
    assert e["step_time_ms"] - e["step_time_ms_after"] == pytest.approx(e["saving_ms"], abs=1e-5)
    # the finding that names the fault carries the saving; the list is sorted, largest saving first
    assert any(f.get("saving_ms") == e["saving_ms"] for f in runs[fault]["findings"])
    savings = [w["saving_ms"] for w in runs[fault]["what_if"]]
    assert savings == sorted(savings, reverse=True)


@pytest.mark.parametrize("clean", ["clean-8", "clean-p4", "clean-1f1b-m8"])
def test_clean_twin_saves_no_more_than_noise(runs, clean):
    """No fix of a fault saves more than the noise on a run without faults (the schedule and layout what-ifs
    change the run itself: tests/integration/test_schedule_whatif_sim.py)."""
    noise = 2 * step_times(runs[clean]).std(ddof=1)
    for w in runs[clean]["what_if"]:
        if w["kind"] not in ("schedule", "layout"):
            assert w["saving_ms"] <= noise, (w, noise)


def test_largest_rank_share(runs):
    cp = runs["compute-r1"]["critical_path"]
    assert max(cp["by_rank_ms"], key=cp["by_rank_ms"].get) == "1"
    cp = runs["heavy-stage1"]["critical_path"]
    assert max(cp["by_rank_ms"], key=cp["by_rank_ms"].get) in ("2", "3")
    assert max(cp["by_stage_ms"], key=cp["by_stage_ms"].get) == "1"


def test_bubble_share_1f1b(runs):
    cp = runs["clean-1f1b-m8"]["critical_path"]
    p, m = 4, 8
    share = cp["by_kind_ms"]["bubble"] / sum(cp["by_kind_ms"].values())
    assert share == pytest.approx((p - 1) / (m + p - 1), rel=0.10)
    # the replay of the unchanged graph reproduces the run: the path adds up to the step
    assert sum(cp["by_kind_ms"].values()) == pytest.approx(cp["step_time_ms"], rel=1e-6)
    assert len(cp["segments"]) <= 200
