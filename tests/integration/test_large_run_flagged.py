"""Large runs keep the straggler visible (issue 20, item 4): the CLI table of a run beyond 64 ranks shows
the first and last ranks plus every rank a finding names, and aggregated figures draw that rank on its own
with a marked point. The run is simulated (72 ranks, tp 2 x dp 36, a small dense model) with the
straggler planted in the middle, rank 37."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli
from tracelens.report import figures

REPO = Path(__file__).resolve().parents[2]
MODEL = {
    "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 1000,
}  # fmt: skip
STRAGGLER = 37


def tracelens(*args) -> subprocess.CompletedProcess:
    return _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    (root / "config.json").write_text(json.dumps(MODEL))
    proc = tracelens(
        "simulate",
        "-o",
        root / "run",
        "--model",
        root / "config.json",
        "--tp",
        "2",
        "--dp",
        "36",
        "--microbatches",
        "1",
        "--steps",
        "2",
        "--straggler",
        f"{STRAGGLER}:1.5",
        "--no-gzip",
    )
    assert proc.returncode == 0, proc.stderr
    proc = tracelens("analyze", root / "run", "-o", root / "out", "--no-report", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads((root / "out" / "summary.json").read_text())


def test_cli_table_shows_the_flagged_rank_in_the_middle(big):
    stdout, summary = big
    assert [s["rank"] for s in summary["stragglers"]] == [STRAGGLER]
    rows = re.findall(r"^│\s*(\d+)(\*?)\s*│", stdout, flags=re.M)
    shown = [int(r) for r, _ in rows]
    assert shown == [*range(8), STRAGGLER, *range(64, 72)]
    assert [int(r) for r, star in rows if star] == [STRAGGLER]
    assert "(55 ranks not shown" in stdout


def test_aggregated_figures_draw_the_flagged_rank(big):
    _, summary = big
    fig = figures.breakdown_bar(summary, max_items=16)  # force the aggregated view
    bars = [t for t in fig.data if t.type == "bar"]
    assert list(bars[0].x) == ["stage 0 (72 ranks)", f"r{STRAGGLER} (in findings)"]  # pp 1: one stage
    (marker,) = [t for t in fig.data if t.name == "rank in findings"]
    assert list(marker.x) == [f"r{STRAGGLER} (in findings)"] and list(marker.text) == [f"r{STRAGGLER}"]
    row = {r["rank"]: r for r in summary["ranks"]}[STRAGGLER]
    i = list(bars[0].x).index(f"r{STRAGGLER} (in findings)")
    compute_only = [t for t in bars if t.name == "compute (not overlapped)"][0].y[i]
    assert compute_only == pytest.approx(row["compute_ms"] - row["overlapped_comm_ms"], abs=1e-3)
    heat = figures.step_heatmap(summary, max_items=16)
    assert heat.data[0].y[-1] == f"r{STRAGGLER} (in findings)"
