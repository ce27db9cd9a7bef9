"""Notebook friction (issue 20, item 5): `.str` on string columns, a stage column on every table, one unit
convention (ms per step like summary.json), and Python twins of compare / check / the report / figures."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

import tracelens
from tracelens.report import figures as F
from tracelens.summaries import regress
from tracelens.summaries.compare import compare as compare_summaries

ROOT = Path(__file__).resolve().parents[2]
TP4PP4 = ROOT / "sample_traces" / "qwen35-27b-seq4k-tp4pp4"
SPLIT = ROOT / "sample_traces" / "qwen35-27b-seq4k-tp2pp3-split22-21-21"


@pytest.fixture(scope="module")
def run():
    if not TP4PP4.is_dir():
        pytest.skip(f"sample traces absent: {TP4PP4}")
    return tracelens.load(TP4PP4)


def test_string_columns_work_with_str(run):
    ev = run.events
    gemm = ev["name"].str.contains("gemm")
    # independent count from the Arrow table
    names = run.to_arrow()["events"].column("name").to_pylist()
    assert int(gemm.sum()) == sum("gemm" in n for n in names) > 0
    assert isinstance(ev["name"].dtype, pd.CategoricalDtype)
    assert run.kernels["class"].str.startswith("comm").any()
    assert run.metadata["path"].str.endswith(".json.gz").all() or run.metadata["path"].str.len().min() > 0


def test_every_table_has_a_stage_column(run):
    truth = json.loads((TP4PP4 / "truth.json").read_text())
    tp = truth["layout"]["tp"]  # order tp-cp-dp-pp: stage = rank // (tp * cp * dp)
    for name, df in {
        "events": run.events, "kernels": run.kernels, "memory": run.memory, "metadata": run.metadata,
        "breakdown": run.breakdown(), "collectives": run.collectives(), "bubbles": run.bubbles(),
        "arrival_lag": run.arrival_lag(), "stages": run.stages(), "stragglers": run.stragglers(),
        "op_table": run.op_table(), "kernel_table": run.kernel_table(), "launch_stats": run.launch_stats(),
        "memory_timeline": run.memory_timeline(), "memory_peaks": run.memory_peaks(),
    }.items():  # fmt: skip
        assert "stage" in df.columns, name
        if len(df) and "rank" in df.columns:
            st = df[["rank", "stage"]].drop_duplicates()
            assert (st["stage"].astype(int) == st["rank"].astype(int) // tp).all(), name
    lag = run.arrival_lag()
    assert (lag["stage"].astype(int).to_numpy() == lag.index.to_numpy() // tp).all()


def test_per_step_tables_are_in_ms_like_the_summary(run):
    bd, s = run.breakdown(), run.summary()
    assert not [c for c in bd.columns if c.endswith("_ns") and "start" not in c and "end" not in c]
    for row in s["ranks"]:
        mine = bd[bd["rank"] == row["rank"]]
        assert mine["step_time_ms"].mean() == pytest.approx(row["step_time_ms"], abs=1e-6)
        assert mine["compute_ms"].mean() == pytest.approx(row["compute_ms"], abs=1e-6)
    bub = run.bubbles()
    for row in s["ranks"]:
        assert bub[bub["rank"] == row["rank"]]["bubble_ms"].mean() == pytest.approx(
            row["bubble_ms"], abs=1e-6
        )
    assert str(run.events["dur_ns"].dtype) == "int64[pyarrow]"  # events stay exact ns


def test_figures_and_report_are_what_the_cli_renders(run, tmp_path):
    figs = run.figures()
    assert all(isinstance(f, go.Figure) for f in figs.values())
    assert figs["Per-rank breakdown"].to_dict() == F.breakdown_bar(run.summary()).to_dict()
    assert figs["Step time per rank and step"].to_dict() == F.step_heatmap(run.summary()).to_dict()
    out = run.report(tmp_path / "r.html")
    page = out.read_text()
    assert "tracelens" in page and run.summary()["run"]["name"] in page


def test_compare_and_check(run):
    if not SPLIT.is_dir():
        pytest.skip(f"sample traces absent: {SPLIT}")
    other = tracelens.load(SPLIT)
    got = tracelens.compare(run, other, ("a", "b"))
    want = compare_summaries(run.summary(), other.summary(), ("a", "b"))
    assert got["text"] == want["text"] and got["metrics"] == want["metrics"]
    by_path = tracelens.compare(TP4PP4, SPLIT, ("a", "b"))
    assert [m["a"] for m in by_path["metrics"]] == pytest.approx(
        [m["a"] for m in want["metrics"]], nan_ok=True
    )
    rep = tracelens.check(run, run)
    assert isinstance(rep, regress.CheckReport) and rep.exit_code == 0
    # another layout (tp4pp4 against tp2pp3): not comparable, no verdict, unless asked for one
    refused = tracelens.check(run, other)
    assert refused.exit_code == 2 and not refused.comparable and not refused.failed
    slower = tracelens.check(run, other, allow_setup_change=True)  # 2 steps each: threshold-only sees 2.08x
    assert slower.exit_code == 1 and "step_time" in [r.rule for r in slower.failed]
