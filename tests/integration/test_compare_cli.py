"""`tracelens compare` end to end: summaries and run folders, labels, outputs, exit codes, 4k vs 256k."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
SEQ4K = SAMPLES / "qwen35-27b-seq4k-tp4pp4"
SEQ256K = SAMPLES / "qwen35-27b-seq256k-tp2pp4cp2"
CPU = SAMPLES / "cpu-gloo-4rank"


def tracelens(*args: str) -> subprocess.CompletedProcess:
    return _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)


def summary(step: float, share: dict, tokens: int) -> dict:
    ranks = [
        {
            "rank": r,
            "step_time_ms": step,
            "compute_ms": 0.7 * step,
            "exposed_comm_ms": 0.2 * step,
            "overlapped_comm_ms": 0.0,
            "memcpy_ms": 0.0,
            "idle_ms": 0.1 * step,
            "bubble_ms": None,
        }
        for r in range(2)
    ]
    return {
        "schema": "tracelens.summary/1",
        "run": {"name": "x", "path": "x"},
        "ranks": ranks,
        "stages": [],
        "stragglers": [],
        "mfu": {"value": 0.3, "tokens_per_step": tokens},
        "findings": [],
        "per_step": [],
        "composition": {"time_share": share, "stages": {}},
    }


def test_summaries_with_comma_labels(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b-summary.json"
    a.write_text(json.dumps(summary(100.0, {"full_attention": 0.1, "mlp": 0.4}, 4096)))
    b.write_text(json.dumps(summary(3000.0, {"full_attention": 0.3, "mlp": 0.3}, 65536)))
    out = tmp_path / "cmp"
    p = tracelens("compare", str(a), str(b), "--labels", "seq 4,096,seq 65,536", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == (
        "Biggest change: Full attention's share of step time rose from 10.0% "
        "(seq 4,096) to 30.0% (seq 65,536), +20.0 points."
    )
    data = json.loads((out / "compare.json").read_text())
    assert data["schema"] == "tracelens.compare/1" and data["labels"] == ["seq 4,096", "seq 65,536"]
    page = (out / "compare.html").read_text()
    assert '<meta name="generator" content="tracelens' in page and "seq 65,536" in page
    # a second run overwrites its own outputs; a foreign file needs --force
    assert tracelens("compare", str(a), str(b), "-o", str(out)).returncode == 0
    (out / "compare.html").write_text("mine")
    p = tracelens("compare", str(a), str(b), "-o", str(out))
    assert p.returncode == 2 and "--force" in p.stderr


def test_bad_inputs_exit_2(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(summary(100.0, {}, 4096)))
    p = tracelens("compare", str(a), str(tmp_path / "missing"), "-o", str(tmp_path / "o"))
    assert p.returncode == 2 and "no such file" in p.stderr
    p = tracelens("compare", str(a), str(a), "--labels", "one", "-o", str(tmp_path / "o"))
    assert p.returncode == 2 and "two labels" in p.stderr
    bad = tmp_path / "summary.json"
    bad.write_text('{"schema": "other"}')
    assert tracelens("compare", str(a), str(bad), "-o", str(tmp_path / "o")).returncode == 2


@pytest.mark.skipif(not CPU.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_run_folder_against_itself_changes_nothing(tmp_path):
    p = tracelens("compare", str(CPU), str(CPU), "-o", str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert data["biggest"] is None
    assert all(m["delta"] in (0, None) for m in data["metrics"])
    # the real run has module annotations: layer-type shares are there (from the traces)
    assert {m["key"] for m in data["metrics"] if m["group"] == "layer_types"} >= {
        "share.full_attention",
        "share.linear_attention",
    }


@pytest.mark.skipif(
    not (SEQ4K.exists() and SEQ256K.exists()), reason="simulated 4k / 256k samples are absent"
)
def test_4k_vs_256k_names_full_attention_share_rising(tmp_path):
    p = tracelens(
        "compare", str(SEQ4K), str(SEQ256K), "--labels", "seq 4,096,seq 262,144", "-o", str(tmp_path)
    )
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["biggest"]["key"] == "share.full_attention" and data["biggest"]["delta"] > 0.2
    assert p.stdout.startswith("Biggest change: Full attention's share of step time rose from")
    # the fair comparison is per token: 64x the tokens per step
    tok = next(m for m in data["metrics"] if m["key"] == "tokens_per_step")
    assert tok["ratio"] == pytest.approx(64.0)
    assert any(m["key"] == "step_time_per_1k_tokens_ms" for m in data["metrics"])
