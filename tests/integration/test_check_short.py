"""`tracelens check` on short profiles (2 steps, the norm): threshold-only fallback and `--strict`.

The runs are made with `tracelens simulate` (a small dense model, no model for MFU so that only the
step-time and share rules can fail); the fault is planted: every rank computes 30% slower.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
MODEL = {
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 1000,
}  # fmt: skip


def tracelens(*args: str) -> subprocess.CompletedProcess:
    return _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("check-short")
    model = root / "config.json"
    model.write_text(json.dumps(MODEL))
    common = ["--model", model, "--tp", "2", "--dp", "2", "--ranks-per-host", "2", "--microbatches", "1",
              "--steps", "2", "--no-gzip"]  # fmt: skip
    slow = [x for r in range(4) for x in ("--straggler", f"{r}:1.3")]
    out = {}
    for name, extra in {
        "base": ["--seed", "0"],
        "noise": ["--seed", "1"],
        "slow": ["--seed", "2", *slow],
    }.items():
        out[name] = root / name
        proc = tracelens("simulate", "-o", out[name], *common, *extra)
        assert proc.returncode == 0, proc.stderr
        # the runs' own metadata names the model; drop it so that MFU (a second guard) is unknown
        (out[name] / "tracelens.toml").unlink(missing_ok=True)
    for name, path in out.items():
        proc = tracelens("analyze", path, "-o", root / f"{name}-out", "--no-cache")
        assert proc.returncode == 0, proc.stderr
        out[name] = root / f"{name}-out" / "summary.json"
    return out


def _results(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {r["rule"]: r for r in json.loads(proc.stdout)["results"]}


def test_every_rank_30pct_slower_fails_on_two_steps(runs):
    proc = tracelens("check", runs["base"], runs["slow"], "--format", "json")
    assert proc.returncode == 1, proc.stdout
    res = _results(proc)
    assert res["step_time"]["status"] == "fail" and res["step_time"]["threshold_only"]
    assert res["step_time"]["n_baseline"] == res["step_time"]["n_current"] == 2
    assert res["step_time"]["delta"] > 10  # 30% slower compute on every rank: well past the 5% limit
    assert res["mfu"]["status"] == "skip"  # the fallback alone caught it
    text = tracelens("check", runs["base"], runs["slow"]).stdout
    assert "FAIL (threshold only) step_time" in text and "too few steps" in text


def test_noise_between_two_clean_runs_passes(runs):
    proc = tracelens("check", runs["base"], runs["noise"], "--format", "json")
    assert proc.returncode == 0, proc.stdout
    res = _results(proc)
    assert res["step_time"]["status"] == "pass" and res["step_time"]["threshold_only"]
    assert abs(res["step_time"]["delta"]) < 2.0
    assert res["exposed_comm"]["status"] == "pass" and res["exposed_comm"]["threshold_only"]


def test_strict_fails_on_a_skip(runs):
    # MFU is unknown (no model): skipped, so --strict fails; the pp=1 bubble skip does not count
    proc = tracelens("check", runs["base"], runs["noise"], "--strict")
    assert proc.returncode == 1, proc.stdout
    assert "FAILED (--strict): 1 of 6 rules skipped (mfu)" in proc.stdout
    assert tracelens("check", runs["base"], runs["noise"]).returncode == 0
