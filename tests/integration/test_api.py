"""Notebook API on the real gloo sample and a simulated run: DataFrames agree with summary.json and truth."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import tracelens

ROOT = Path(__file__).resolve().parents[2]
GLOO = ROOT / "sample_traces" / "cpu-gloo-4rank"
SKEW = ROOT / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"


@pytest.fixture(scope="module")
def gloo():
    return tracelens.load(GLOO, no_cache=True)


def test_tables_are_pandas_with_arrow_dtypes(gloo):
    ev = gloo.events
    assert isinstance(ev, pd.DataFrame) and set(ev["rank"].unique()) == {0, 1, 2, 3}
    assert isinstance(ev["ts_ns"].dtype, pd.ArrowDtype)
    assert len(gloo.metadata) == 4
    assert set(gloo.to_arrow()) == {"events", "memory", "metadata"}
    assert "tracelens.Run" in repr(gloo)


def test_breakdown_agrees_with_summary(gloo):
    bd = gloo.breakdown()
    s = gloo.summary()
    for row in s["ranks"]:
        mine = bd[bd["rank"] == row["rank"]]
        assert mine["compute_ms"].mean() == pytest.approx(row["compute_ms"], abs=1e-6)
    parts = bd["compute_ms"] + bd["exposed_comm_ms"] + bd["memcpy_ms"] + bd["idle_ms"]
    assert ((parts - bd["step_time_ms"]).abs() < 1e-9).all()


def test_stragglers_and_collectives_on_real_gloo_run(gloo):
    truth = json.loads((GLOO / "truth.json").read_text())
    st = gloo.stragglers()
    assert list(st["rank"]) == [truth["straggler"]["rank"]] and list(st["cause"]) == ["compute"]
    coll = gloo.collectives()
    assert len(coll) > 0 and {"op", "wait_ns", "transfer_ns"} <= set(coll.columns)
    lag = gloo.arrival_lag()
    assert set(lag.index) == {0, 1, 2, 3}
    # one column per analyzed step, named with its unit like every per-step table (`*_ms`), after `stage`
    steps = gloo.summary()["run"]["steps"]
    assert list(lag.columns) == ["stage"] + [f"step{s}_lag_ms" for s in steps]
    raw = gloo.analysis.cross.arrival_lag.to_pylist()
    for row in raw:
        assert lag.loc[row["rank"], f"step{row['step']}_lag_ms"] == pytest.approx(row["lag_ns"] / 1e6)


def test_simulated_run_bubbles_and_stages():
    run = tracelens.load(SKEW, no_cache=True)
    truth = json.loads((SKEW / "truth.json").read_text())
    stages = run.stages()
    assert list(stages["stage"]) == [0, 1]
    assert len(run.bubbles()) == truth["layout"]["world_size"] * len(truth["ranks"][0]["steps"])
    assert "STRAGGLER" in set(run.findings()["code"])
    assert list(run.stragglers()["rank"]) == [6]
