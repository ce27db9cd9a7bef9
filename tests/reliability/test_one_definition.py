"""Issue 42, items 7 and 8: one definition per number, shown the same way everywhere (unknown is not zero;
a `.gz` export is gzip; check's step time says what it is; MFU a fraction in every JSON), and messages that
point the right way (why nothing was usable; runs of different setups get no regression verdict)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from broken_traces import GLOO, HTA, REPO, cli

from tracelens.report import figures, html
from tracelens.run_analysis import Options, analyze_run
from tracelens.views import ReportViews

SKEW = REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"  # 8 ranks, a model: MFU known


@pytest.fixture(scope="module")
def skew_summary(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("skew")
    r = cli("analyze", SKEW, "-o", out, "--no-report")
    assert r.returncode == 0, r.stderr
    return out / "summary.json"


def test_unknown_skew_and_wait_are_not_zero_in_the_report():
    """HTA's nccl_parser_config is rank 0 of 2: no collective has a second participant, so arrival skew and
    wait / transfer are unknown (null in summary.json); the report showed 0.000."""
    path = HTA / "nccl_parser_config"
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/traces not mounted)")
    a = analyze_run(path, Options(no_cache=True))
    s = a.summary()
    assert s["run"]["world_size"] == 2 and s["run"]["ranks"] == [0]
    assert s["collectives"]["by_op"] and all(r["skew_ms_median"] is None for r in s["collectives"]["by_op"])
    rows = figures.collective_rows(a.cross.collectives)
    assert rows and all(r["calls"] > 0 and r["total_ms"] > 0 for r in rows)
    for key in ("median_skew_ms", "max_skew_ms", "wait_ms", "transfer_ms"):
        assert all(r[key] is None for r in rows), key
    section = html._collectives_section(ReportViews(a), s)
    assert "skew" not in section.split("</p>", 1)[1] and "wait ms" not in section  # no column of zeros
    assert (
        html.table_html([{"x": None}], [("x", "x")])
        == "<table><thead><tr><th>x</th></tr></thead><tbody><tr><td>\u2014</td></tr></tbody></table>"
    )


def test_gzip_export_is_gzip(tmp_path):
    out = tmp_path / "merged.json.gz"
    for _ in range(2):  # the second run replaces its own gzip output without --force
        r = cli("report", "export-trace", GLOO / "traces", "-o", out)
        assert r.returncode == 0, r.stderr
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["otherData"]["schema"].startswith("tracelens.chrome-trace/")
    assert {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X"} >= {0, 1, 2, 3}


def test_check_says_its_step_time_and_gives_mfu_as_a_fraction(skew_summary):
    s = json.loads(skew_summary.read_text())
    r = cli("check", skew_summary, skew_summary, "--format", "json")
    assert r.returncode == 0, r.stderr
    res = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
    # MFU: the fraction summary.json holds, not percent
    assert res["mfu"]["baseline"] == pytest.approx(s["mfu"]["value"]) and res["mfu"]["unit"] == "fraction"
    assert 0 < res["mfu"]["baseline"] < 1 and res["mfu"]["delta"] == 0
    assert 0 < res["exposed_comm"]["baseline"] < 1 and res["exposed_comm"]["unit"] == "fraction"
    # step time: the median over steps of the slowest rank's step, which is not analyze's per-rank mean
    per_step: dict[int, float] = {}
    for p in s["per_step"]:
        per_step[p["step"]] = max(per_step.get(p["step"], 0.0), p["step_time_ms"])
    assert res["step_time"]["baseline"] == pytest.approx(float(np.median(list(per_step.values()))))
    means = {row["step_time_ms"] for row in s["ranks"]}
    assert res["step_time"]["baseline"] not in means
    text = cli("check", skew_summary, skew_summary).stdout
    assert (
        "median step time (over steps, of the slowest rank's step time; analyze shows each rank's mean)"
        in text
    )
    assert "38.26%" in text  # percent in text, with its sign


def test_runs_of_8_and_128_ranks_get_no_verdict(tmp_path, skew_summary):
    src = HTA / "trace_filter"
    if not src.exists():
        pytest.skip(f"{src} is absent (../shared/traces not mounted)")
    r = cli("analyze", src, "-o", tmp_path / "tf", "--no-report")
    assert r.returncode == 0, r.stderr
    r = cli("check", skew_summary, tmp_path / "tf" / "summary.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "NOT COMPARABLE: world size differs: baseline 8, current 128" in r.stdout
    assert "REGRESSION" not in r.stdout and "FAIL" not in r.stdout
    r = cli("check", skew_summary, tmp_path / "tf" / "summary.json", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["comparable"] is False and doc["regression"] is None


def test_no_usable_input_names_the_trace_not_the_missing_ranks(tmp_path):
    """HTA's cpu_only trace (rank 34 of 300) whose events lost their categories: the reason is the trace."""
    src = HTA / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    if not src.exists():
        pytest.skip(f"{src} is absent (../shared/traces not mounted)")
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        e.pop("cat", None)
        e.pop("args", None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-34.json").write_text(json.dumps(doc))
    r = cli("analyze", run, "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "no usable input: rank-34.json: 16 events, none of a kind tracelens analyzes" in line
    assert "ranks have no trace" not in line and "process groups" not in line
