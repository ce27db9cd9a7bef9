"""MFU guards end to end (issue 20, item 3): a flag contradicting the run's metadata or its trace is
named with both values; an MFU above 100% is an error finding, not a number."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "qwen35-27b-seq4k-tp4pp4"  # tracelens.toml: global_batch = 4


def tracelens(*args) -> subprocess.CompletedProcess:
    return _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not SAMPLE.is_dir():
        pytest.skip(f"sample traces absent: {SAMPLE}")
    root = tmp_path_factory.mktemp("mfu")
    out = {}
    for name, extra in {
        "plain": [],
        "readme": [
            "--model",
            "qwen3.5-27b",
            "--seq-len",
            "4096",
            "--global-batch",
            "4",
            "--layout",
            "tp=4,pp=4",
        ],
        "doubled": ["--global-batch", "8"],
    }.items():
        proc = tracelens("analyze", SAMPLE, "-o", root / name, "--no-report", *extra)
        assert proc.returncode == 0, proc.stderr
        out[name] = (proc.stdout, json.loads((root / name / "summary.json").read_text()))
    return out


def test_metadata_run_and_readme_line_agree(runs):
    plain, readme = runs["plain"][1], runs["readme"][1]
    assert plain["mfu"]["tokens_per_step"] == 4 * 4096
    assert readme["mfu"]["value"] == pytest.approx(plain["mfu"]["value"])
    assert 0 < plain["mfu"]["value"] < 1 and 0 < plain["mfu"]["without_bubbles_and_exposed_comm"] < 1
    assert not [w for w in readme["run"]["warnings"] if "contradicts" in w or "global batch" in w]


def test_doubled_global_batch_warns_and_refuses_the_impossible_mfu(runs):
    stdout, s = runs["doubled"]
    plain = runs["plain"][1]["mfu"]
    warnings = " ".join(s["run"]["warnings"])
    assert "--global-batch 8 contradicts the run's tracelens.toml ([training] global_batch = 4)" in warnings
    assert "global batch 8 (given) but the trace shows 4 microbatches x dp 1 = 4" in warnings
    # the doubled batch would give 2x the MFU and an "ideal" MFU above 100%: withheld, as an error
    assert 2 * plain["without_bubbles_and_exposed_comm"] > 1
    assert s["mfu"]["value"] is None and s["mfu"]["without_bubbles_and_exposed_comm"] is None
    assert s["mfu"]["invalid"]
    (err,) = [f for f in s["findings"] if f["code"] == "MFU_IMPOSSIBLE"]
    assert err["severity"] == "error" and "32,768 = seq_len 4,096 x global batch 8" in err["message"]
    assert "[error] MFU_IMPOSSIBLE" in stdout and "MFU 60" not in stdout


# ---- item 8: a --layout that contradicts the trace ---------------------------------------------------


def test_contradicting_layout_uses_the_evidence_unless_forced(tmp_path):
    if not SAMPLE.is_dir():
        pytest.skip(f"sample traces absent: {SAMPLE}")
    truth = json.loads((SAMPLE / "truth.json").read_text())["layout"]
    proc = tracelens("analyze", SAMPLE, "-o", tmp_path / "a", "--no-report", "--layout", "tp=2,pp=8")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (s["run"]["layout"]["tp"], s["run"]["layout"]["pp"]) == (truth["tp"], truth["pp"]) == (4, 4)
    assert s["run"]["layout"]["source"] == "inferred" and len(s["stages"]) == 4
    (bad,) = [f for f in s["findings"] if f["code"] == "LAYOUT_INCONSISTENT"]
    assert bad["used"] == "inferred" and "the findings use the traces' layout tp=4,pp=4" in bad["message"]
    assert [f["stages"] for f in s["findings"] if f["code"] == "STAGE_IMBALANCE"] == [[3]]
    proc = tracelens("analyze", SAMPLE, "-o", tmp_path / "b", "--no-report", "--layout", "tp=2,pp=8",
                     "--force-layout")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (s["run"]["layout"]["pp"], s["run"]["layout"]["source"], len(s["stages"])) == (8, "config", 8)
    (bad,) = [f for f in s["findings"] if f["code"] == "LAYOUT_INCONSISTENT"]
    assert bad["used"] == "given" and "the findings use the given layout tp=2,pp=8" in bad["message"]
