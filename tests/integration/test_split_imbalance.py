"""Issue acceptance: on the simulated unequal-split run the heavy stage is named, and the same split's
imbalance at 262,144 tokens is larger than at 4,096 (attention cost grows with s^2)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tracelens.run_analysis import Options, analyze_run
from tracelens.simulate import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[2]
SPLIT = ROOT / "sample_traces" / "qwen35-27b-seq4k-tp2pp3-split22-21-21"


def test_heavy_stage_named_and_imbalance_grows_with_sequence(tmp_path):
    truth4k = json.loads((SPLIT / "truth.json").read_text())
    s4k = analyze_run(SPLIT, Options(no_cache=True)).summary()
    # The same command at 262,144 tokens (the split and everything else unchanged).
    cmd = shlex.split((SPLIT / "command.txt").read_text())
    assert "--split" in cmd and cmd[cmd.index("--split") + 1] == "22,21,21"
    cfg = SimConfig(
        model="qwen3.5-27b",
        seq_len=262144,
        tp=2,
        pp=3,
        split=[22, 21, 21],
        microbatches=4,
        steps=2,
        gpu="H200",
        seed=2,
    )
    simulate(cfg, tmp_path / "s256k")
    s256k = analyze_run(tmp_path / "s256k", Options(no_cache=True)).summary()

    # Ground truth: the stage with the most compute in the simulator's own accounting.
    per_stage: dict[int, float] = {}
    for r in truth4k["ranks"]:
        per_stage[r["stage"]] = per_stage.get(r["stage"], 0.0) + sum(s["compute_ns"] for s in r["steps"])
    heavy = max(per_stage, key=per_stage.get)
    for s in (s4k, s256k):
        assert s["composition"]["heavy_stage"] == heavy
        unequal = [f for f in s["findings"] if f["code"] == "UNEQUAL_STAGE_COMPOSITION"]
        assert unequal and heavy in unequal[0]["stages"]
    assert s256k["composition"]["imbalance"] > s4k["composition"]["imbalance"] > 1.0
    # At 262,144 tokens the imbalance crosses the threshold and is reported against the heavy stage.
    imb = [f for f in s256k["findings"] if f["code"] == "STAGE_IMBALANCE"]
    assert imb and imb[0]["stages"] == [heavy]
