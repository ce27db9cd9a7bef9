"""`tracelens check` end to end: exit codes, output files, run folders through `summarize`."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "cpu-gloo-4rank"


def tracelens(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI through its entry point, as a user would (exit codes included; tests/cli.py)."""
    return _cli(*args, cwd=cwd or REPO)


def summary(seed: int, step_ms: float = 100.0, stragglers: tuple[int, ...] = (), n_steps: int = 12) -> dict:
    """4 ranks, `n_steps` steps, step times lognormal (2%) around `step_ms`, 20% exposed communication."""
    rng = np.random.default_rng(seed)
    t = step_ms * rng.lognormal(0.0, 0.02, (n_steps, 4))
    rows = [
        {"rank": r, "step": s, "step_time_ms": t[s, r], "exposed_comm_ms": 0.2 * t[s, r], "bubble_ms": None}
        for s in range(n_steps)
        for r in range(4)
    ]
    return {
        "schema": "tracelens.summary/1",
        "run": {"name": f"run{seed}", "layout": {"pp": 1}},
        "ranks": [],
        "stages": [],
        "stragglers": [{"rank": r, "cause": "compute"} for r in stragglers],
        "mfu": {"value": 0.4},
        "findings": [],
        "per_step": rows,
    }


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_pass_exits_zero(tmp_path):
    base = write(tmp_path / "base.json", summary(1))
    cur = write(tmp_path / "cur.json", summary(2))
    res = tracelens("check", str(base), str(cur))
    assert res.returncode == 0, res.stderr
    assert "OK: no regression" in res.stdout
    assert "step_time" in res.stdout


def test_regression_exits_one_and_writes_junit(tmp_path):
    base = write(tmp_path / "base.json", summary(1))
    cur = write(tmp_path / "cur.json", summary(2, step_ms=120.0, stragglers=(2,)))
    out = tmp_path / "out" / "check.xml"
    res = tracelens("check", str(base), str(cur), "--format", "junit", "--output", str(out))
    assert res.returncode == 1, res.stderr
    assert "REGRESSION" in res.stdout and f"wrote {out}" in res.stdout  # text table on the terminal
    root = ET.parse(out).getroot()
    failed = {c.attrib["name"] for c in root.iter("testcase") if c.find("failure") is not None}
    assert failed == {"step_time", "stragglers"}


def test_github_and_markdown_formats(tmp_path):
    base = write(tmp_path / "base.json", summary(1))
    cur = write(tmp_path / "cur.json", summary(2, step_ms=120.0))
    res = tracelens("check", str(base), str(cur), "--format", "github")
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert any(ln.startswith("::error title=tracelens check fail%3A step_time::") for ln in lines)
    assert all(ln.startswith(("::error ", "::notice ")) for ln in lines)
    res = tracelens("check", str(base), str(cur), "--format", "markdown")
    assert res.returncode == 1
    assert "| Rule | Status |" in res.stdout and "|---|" in res.stdout


def test_rules_file_changes_the_verdict(tmp_path):
    base = write(tmp_path / "base.json", summary(1))
    cur = write(tmp_path / "cur.json", summary(2, step_ms=120.0))
    rules = tmp_path / "rules.toml"
    rules.write_text("[step_time]\nmax_increase_pct = 50\n")
    res = tracelens("check", str(base), str(cur), "--rules", str(rules), "--format", "json")
    assert res.returncode == 0, res.stdout
    data = json.loads(res.stdout)
    assert data["rules"]["step_time"]["max_increase_pct"] == 50.0
    step = next(r for r in data["results"] if r["rule"] == "step_time")
    assert step["status"] == "pass" and step["delta"] == pytest.approx(20.0, abs=3.0)


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [
        (lambda d: [str(d / "missing.json"), str(d / "cur.json")], "no such file"),
        (lambda d: [str(d / "notsummary.json"), str(d / "cur.json")], "not a tracelens summary"),
        (lambda d: [str(d / "cur.json"), str(d / "cur.json"), "--rules", str(d / "bad.toml")], "unknown key"),
        (lambda d: [str(d / "cur.json"), str(d / "cur.json"), "--format", "xml"], "--format xml"),
    ],
)
def test_bad_input_exits_two(tmp_path, make_args, needle):
    write(tmp_path / "cur.json", summary(2))
    write(tmp_path / "notsummary.json", {"traceEvents": []})
    (tmp_path / "bad.toml").write_text("[mfu]\nmax_drop = 1\n")
    res = tracelens("check", *make_args(tmp_path))
    assert res.returncode == 2
    assert res.stderr.startswith("tracelens: error:") and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_run_folders_are_summarized(tmp_path):
    """A real 4-rank run folder goes through tracelens.summary.summarize; compared with itself it passes."""
    if not (SAMPLE / "traces").is_dir():
        pytest.skip(f"sample traces absent: {SAMPLE}")
    res = tracelens("check", str(SAMPLE / "traces"), str(SAMPLE / "traces"), "--no-cache", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    step = next(r for r in data["results"] if r["rule"] == "step_time")
    assert step["baseline"] == step["current"] > 0
    assert step["delta"] == 0.0


HTA = REPO.parent / "shared" / "traces" / "hta"


def _profiler_step_ms(trace: Path) -> list[float]:
    """ProfilerStep# durations (ms) read straight from the raw Kineto JSON: the independent truth."""
    import gzip

    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [
        e["dur"] / 1000
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]


def test_real_traces_slower_run_fails_and_reverse_passes(tmp_path):
    """HTA's trace_diff pair (real single-GPU traces, 6 steps each): the test run's steps are slower."""
    if not HTA.is_dir():
        pytest.skip(f"real traces absent: {HTA}")
    from tracelens.run_analysis import summary_of
    from tracelens.summaries import regress

    control = summary_of(HTA / "trace_diff" / "control", no_cache=True)
    test = summary_of(HTA / "trace_diff" / "test", no_cache=True)
    truth_c = _profiler_step_ms(HTA / "trace_diff" / "control" / "control.json.gz")
    truth_t = _profiler_step_ms(HTA / "trace_diff" / "test" / "test.json.gz")
    assert len(truth_c) == len(truth_t) == 6
    assert min(truth_t) > max(truth_c)  # every test step is slower: the exact p-value is 1/C(12,6)

    # different jobs (8 ranks on A100, 2 on V100): no verdict unless asked for one (issue 42, item 8)
    refused = regress.check(control, test)
    assert not refused.comparable and refused.exit_code == 2 and not refused.regressed
    assert {r.status for r in refused.results} == {"skip"}
    forward = {r.rule: r for r in regress.check(control, test, allow_setup_change=True).results}["step_time"]
    assert forward.status == "fail"
    # step windows follow the GPU when it still runs the previous step's kernels (docs/breakdown.md, "Step
    # windows"), so a step moves by the GPU's lag (<0.2 ms here) against its ProfilerStep# span
    assert forward.baseline == pytest.approx(float(np.median(truth_c)), rel=0.005)
    assert forward.current == pytest.approx(float(np.median(truth_t)), rel=0.005)
    assert forward.p_value == pytest.approx(1 / 924)
    backward = {r.rule: r for r in regress.check(test, control, allow_setup_change=True).results}["step_time"]
    assert backward.status == "pass" and backward.p_value == pytest.approx(1.0)

    # the same through the CLI, with the stored baseline summary
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "summary.json").write_text(json.dumps(control))
    res = tracelens("check", str(tmp_path / "control"), str(HTA / "trace_diff" / "test"), "--no-cache")
    assert res.returncode == 2, res.stderr
    assert "NOT COMPARABLE: world size differs: baseline 8, current 2" in res.stdout
    assert "FAIL" not in res.stdout
    res = tracelens(
        "check",
        str(tmp_path / "control"),
        str(HTA / "trace_diff" / "test"),
        "--no-cache",
        "--allow-setup-change",
    )
    assert res.returncode == 1, res.stderr
    assert "FAIL step_time" in res.stdout
