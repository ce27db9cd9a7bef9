"""Schedule what-ifs against simulated twins: a 1F1B run (p=4, m=4) predicts the step time of the same model
run with 8 microbatches and with interleaved 1F1B (2 chunks per rank), each simulated on its own.

The twins' step times come from their own truth.json (the simulator's timeline: per step the longest rank,
mean over steps), not from tracelens; the prediction comes from the 1F1B run's traces alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracelens.run_analysis import Options, analyze_run
from tracelens.simulate import TINY_MODEL, SimConfig, simulate

#: A 16-layer hybrid (4 blocks of 3 Gated DeltaNet + 1 full attention) big enough that compute, not launch
#: overhead, fills a stage: 4 layers per stage at p = 4.
MODEL = dict(
    TINY_MODEL,
    num_hidden_layers=16,
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=5632,
    vocab_size=32000,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)
BASE = {"model": MODEL, "seq_len": 4096, "tp": 1, "pp": 4, "microbatches": 4, "steps": 3, "seed": 7,
        "ranks_per_host": 2, "compress_level": 1}  # fmt: skip
TWINS = {
    "run": {},
    "m8": {"microbatches": 8},
    "v2": {"schedule": "interleaved_1f1b", "virtual_stages": 2},
}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("schedule_twins")
    out = {}
    for name, kw in TWINS.items():
        truth = simulate(SimConfig(**{**BASE, **kw}), root / name)
        out[name] = (truth, root / name)
    return out


@pytest.fixture(scope="module")
def run_summary(twins):
    return analyze_run(twins["run"][1], Options(no_cache=True)).summary()


def twin_step_ms(truth: dict) -> float:
    """Mean over steps of the longest rank's step, from the simulator's own timeline."""
    steps = len(truth["ranks"][0]["steps"])
    per = [max(r["steps"][k]["step_time_ns"] for r in truth["ranks"]) for k in range(steps)]
    return sum(per) / len(per) / 1e6


def entry(summary: dict, **match) -> dict:
    hits = [w for w in summary["what_if"] if all(w.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, [w["change"] for w in summary["what_if"]])
    return hits[0]


def test_more_microbatches_predicts_its_twin(twins, run_summary):
    e = entry(run_summary, kind="schedule", microbatches=8)
    want = twin_step_ms(twins["m8"][0])
    assert e["step_time_ms_after"] == pytest.approx(want, rel=0.10), (e, want)
    assert e["from"] == {"microbatches": 4}
    # 1F1B holds p microbatches on stage 0 whatever m: the activations in flight do not grow
    assert e["activation_bytes_after"] == e["activation_bytes"]
    assert e["bubble_fraction_after"] < e["bubble_fraction"]
    assert e["costs"] and e["buys"]


def test_interleaving_predicts_its_twin(twins, run_summary):
    e = entry(run_summary, kind="schedule", schedule="interleaved_1f1b", virtual_stages=2)
    want = twin_step_ms(twins["v2"][0])
    assert e["step_time_ms_after"] == pytest.approx(want, rel=0.10), (e, want)
    assert e["from"] == {"schedule": "1f1b", "virtual_stages": 1}
    assert any("P2P sends" in c for c in e["costs"])


def test_the_interleaved_twin_is_read_as_interleaved(twins):
    """The simulator's interleaved run is what the prediction claims to be: tracelens reads its schedule,
    chunks, microbatches and layout from the traces."""
    _, path = twins["v2"]
    truth = json.loads((Path(path) / "truth.json").read_text())
    s = analyze_run(path, Options(no_cache=True)).summary()
    assert (s["pipeline"]["schedule"], s["pipeline"]["virtual_stages"], s["pipeline"]["microbatches"]) == (
        "interleaved_1f1b", 2, 4,
    )  # fmt: skip
    assert s["pipeline"]["expected_bubble_fraction"] == pytest.approx(3 / 11)
    assert {k: s["run"]["layout"][k] for k in ("tp", "pp", "dp")} == {"tp": 1, "pp": 4, "dp": 1}
    assert [sorted(st["ranks"]) for st in s["stages"]] == [st["ranks"] for st in truth["stages"]]


def test_the_measured_pipeline_replays_the_run(run_summary):
    """The replay of the schedule as run, with the measured work, reproduces the measured window (the
    calibration every prediction is scaled by stays small)."""
    model = run_summary["pipeline"]["what_if_model"]
    assert model["replayed_window_ms"] == pytest.approx(model["measured_window_ms"], rel=0.05)
    assert 0.25 < model["forward_share"] < 0.45  # backward about twice the forward
    assert model["activation_bytes_per_microbatch"] is not None


def test_the_bubble_is_a_finding_with_its_lever(run_summary):
    f = [x for x in run_summary["findings"] if x["code"] == "PIPELINE_BUBBLE"]
    assert len(f) == 1 and f[0]["severity"] == "warning" and f[0]["saving_ms"] > 0
    losses = run_summary["losses"]
    assert losses[0]["loss"] == "pipeline_bubble" and losses[0]["lever"] == f[0]["best_change"]
