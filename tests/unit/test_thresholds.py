"""Verdict thresholds in one place (tracelens/thresholds.py), overridable in tracelens.toml [thresholds]."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from tracelens.config import parse_config
from tracelens.errors import BadConfigError
from tracelens.run_analysis import Options, analyze_run
from tracelens.thresholds import DEFAULT, REASONS, Thresholds, from_config

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"


def test_every_threshold_has_its_reason():
    names = {f.name for f in dataclasses.fields(Thresholds)}
    assert names == set(REASONS)
    assert all(len(r) > 30 for r in REASONS.values())


def test_overrides_are_checked():
    t = from_config({"stage_imbalance": 1.2, "slow_link_min_calls": 6})
    assert t.stage_imbalance == 1.2 and t.slow_link_min_calls == 6 and isinstance(t.slow_link_min_calls, int)
    assert t.changed() == {"stage_imbalance": 1.2, "slow_link_min_calls": 6}
    assert DEFAULT.changed() == {}
    from tracelens.analyze.comm.stragglers import StragglerConfig

    cfg = StragglerConfig.of(t)
    assert cfg.min_link_calls == 6 and cfg.clock_skew_ns == 100_000
    for bad in ({"stage_imbalnce": 1.2}, {"gpu_idle": -1}, {"gpu_idle": "a"}, {"gpu_idle": True}):
        with pytest.raises(BadConfigError):
            from_config(bad)
    assert parse_config("[thresholds]\ngpu_idle = 0.3\n").thresholds == {"gpu_idle": 0.3}
    with pytest.raises(BadConfigError):
        parse_config("[thresholds]\nnope = 0.3\n")


def test_a_threshold_in_tracelens_toml_changes_the_verdict(tmp_path):
    # the bundled straggler run names rank 6; a persistence no step can reach names nobody, and says so
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    base = analyze_run(run, Options(no_cache=True)).summary()
    assert [s["rank"] for s in base["stragglers"]] == [6]
    toml = run / "tracelens.toml"
    toml.write_text(toml.read_text() + "\n[thresholds]\nstraggler_persistence = 1.01\n")
    strict = analyze_run(run, Options(no_cache=True)).summary()
    assert strict["stragglers"] == [] and strict["run"]["thresholds"] == {"straggler_persistence": 1.01}
