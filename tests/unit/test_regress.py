"""Regression rules of `tracelens check` on summaries built in code from known distributions."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tracelens.errors import BadConfigError, BadInputError
from tracelens.report.check_renderers import render
from tracelens.run_analysis import summary_of
from tracelens.summaries import regress
from tracelens.summaries.regress import Rules, check

REPO = Path(__file__).resolve().parents[2]


def make_summary(
    seed: int,
    *,
    n_ranks: int = 8,
    n_steps: int = 20,
    compute_ms: float = 80.0,
    exposed_ms: float = 20.0,
    bubble_ms: float | None = None,
    step_noise: float = 0.02,
    comm_noise: float = 0.05,
    slow_rank: int | None = None,
    slow_factor: float = 1.0,
    stragglers: tuple[int, ...] = (),
    mfu: float | None = 0.40,
    findings: tuple[tuple[str, str], ...] = (),
    pp: int = 1,
) -> dict:
    """A summary whose per-step samples follow known distributions (seeded).

    Each step has a job-wide lognormal factor (sd `step_noise`) on compute, a per-rank jitter of 0.5%,
    and independent lognormal noise (sd `comm_noise`) on exposed communication. A synchronous job:
    a slow rank's extra compute shows up as waiting (exposed communication) on every other rank, so
    every rank's step time follows the slowest.
    """
    rng = np.random.default_rng(seed)
    step_factor = rng.lognormal(0.0, step_noise, n_steps)[:, None]
    jitter = rng.lognormal(0.0, 0.005, (n_steps, n_ranks))
    compute = compute_ms * step_factor * jitter
    if slow_rank is not None:
        compute[:, slow_rank] *= slow_factor
    exposed = exposed_ms * rng.lognormal(0.0, comm_noise, (n_steps, n_ranks))
    bubble = (
        np.zeros_like(compute) if bubble_ms is None else bubble_ms * rng.lognormal(0, 0.05, compute.shape)
    )
    busy = compute + exposed + bubble
    wait = busy.max(axis=1, keepdims=True) - busy  # early ranks wait for the slowest in the collective
    exposed = exposed + wait
    step = compute + exposed + bubble
    per_step = [
        {
            "rank": r,
            "step": s + 10,
            "step_time_ms": float(step[s, r]),
            "compute_ms": float(compute[s, r]),
            "exposed_comm_ms": float(exposed[s, r]),
            "overlapped_comm_ms": 5.0,
            "memcpy_ms": 0.0,
            "idle_ms": 0.0,
            "bubble_ms": None if bubble_ms is None else float(bubble[s, r]),
        }
        for s in range(n_steps)
        for r in range(n_ranks)
    ]
    return {
        "schema": "tracelens.summary/1",
        "tracelens_version": "test",
        "run": {
            "path": f"/runs/seed{seed}",
            "name": f"seed{seed}",
            "world_size": n_ranks,
            "ranks": list(range(n_ranks)),
            "steps": list(range(10, 10 + n_steps)),
            "layout": {"tp": 1, "pp": pp, "dp": n_ranks // pp, "cp": 1, "order": None, "source": "config"},
        },
        "ranks": [
            {"rank": r, "stage": None, "step_time_ms": float(step[:, r].mean())} for r in range(n_ranks)
        ],
        "stages": [],
        "stragglers": [
            {"rank": r, "cause": "compute", "steps_flagged": n_steps, "steps_total": n_steps, "score": 3.0}
            for r in stragglers
        ],
        "mfu": None if mfu is None else {"value": mfu, "convention": "megatron"},
        "findings": [
            {"code": code, "severity": sev, "message": f"{code} planted", "ranks": [], "stages": []}
            for code, sev in findings
        ],
        "per_step": per_step,
    }


def by_rule(report: regress.CheckReport) -> dict[str, regress.RuleResult]:
    return {r.rule: r for r in report.results}


# ---- acceptance scenarios ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_noise_only_passes(seed):
    report = check(make_summary(1000 + seed), make_summary(2000 + seed))
    assert not report.regressed, render(report, "text")
    assert report.exit_code == 0


def test_step_time_plus_20_percent_fails_naming_step_time():
    base = make_summary(1)
    cur = make_summary(2, compute_ms=80.0 * 1.2, exposed_ms=20.0 * 1.2)
    report = check(base, cur)
    res = by_rule(report)["step_time"]
    assert res.status == "fail"
    assert report.exit_code == 1
    assert "step_time" in report.headline()
    # delta against the ground truth of the planted change (20%, within the step noise)
    assert res.delta == pytest.approx(20.0, abs=3.0)
    assert res.p_value < 1e-6
    assert res.n_baseline == res.n_current == 20


def test_one_percent_change_with_noise_does_not_fail():
    base = make_summary(3)
    cur = make_summary(4, compute_ms=80.0 * 1.01, exposed_ms=20.0 * 1.01)
    report = check(base, cur)
    assert not report.regressed, render(report, "text")
    assert by_rule(report)["step_time"].delta == pytest.approx(1.0, abs=2.0)


def test_new_straggler_fails_naming_straggler_rule():
    base = make_summary(5)
    cur = make_summary(6, slow_rank=3, slow_factor=1.3, stragglers=(3,))
    report = check(base, cur)
    res = by_rule(report)
    assert res["stragglers"].status == "fail"
    assert res["stragglers"].current == [3] and res["stragglers"].delta == ["+rank 3"]
    assert "rank 3" in res["stragglers"].message
    # the straggler slows every rank of a synchronous job: step time fails too
    assert res["step_time"].status == "fail"


def test_known_straggler_is_not_new():
    base = make_summary(5, slow_rank=3, slow_factor=1.3, stragglers=(3,))
    cur = make_summary(6, slow_rank=3, slow_factor=1.3, stragglers=(3,))
    assert by_rule(check(base, cur))["stragglers"].status == "pass"


def test_twenty_percent_more_exposed_comm_fails_that_rule():
    base = make_summary(7)
    cur = make_summary(8, exposed_ms=20.0 * 1.2)
    res = by_rule(check(base, cur))["exposed_comm"]
    assert res.status == "fail"
    # ground truth: 20/100 -> 24/104 of step time, plus ~1 ms of waiting for the slowest rank's jitter
    assert 20.0 < res.baseline < 22.5
    assert 100 * 24 / 104 < res.current < 100 * 26 / 106
    assert res.delta == pytest.approx(100 * 24 / 104 - 20.0, abs=0.7)
    assert res.p_value < 0.001


def test_mann_whitney_exact_p_for_separated_samples():
    base = np.arange(5.0)
    cur = np.arange(5.0) + 10
    assert regress.mann_whitney_greater(cur, base) == pytest.approx(1 / math.comb(10, 5))
    assert regress.mann_whitney_greater(base, cur) == pytest.approx(1.0)
    assert regress.min_p_value(5, 5) == pytest.approx(1 / 252)


def test_few_steps_fall_back_to_the_threshold_alone():
    """Three steps per run can never reach p < 0.05 with Mann-Whitney: the rule falls back to its
    threshold alone (beyond the per-step ranges) and says so."""
    base = make_summary(9, n_steps=3)
    cur = make_summary(10, n_steps=3, compute_ms=200.0)
    res = by_rule(check(base, cur))["step_time"]
    assert res.status == "fail" and res.threshold_only and res.p_value is None
    assert "too few steps" in res.message and "baseline 3, current 3" in res.message
    assert "at least 4 steps" in res.message and "threshold only" in res.message
    assert (
        by_rule(check(make_summary(9, n_steps=4), make_summary(10, n_steps=4, compute_ms=200.0)))[
            "step_time"
        ].status
        == "fail"
    )
    assert check(base, cur).regressed


# ---- samples against hand-computed truth ----------------------------------------------------------------


def _rows(values: dict[tuple[int, int], tuple[float, float]]) -> dict:
    return {
        "schema": "tracelens.summary/1",
        "per_step": [
            {"rank": r, "step": s, "step_time_ms": t, "exposed_comm_ms": e}
            for (r, s), (t, e) in values.items()
        ],
    }


def test_step_samples_and_shares_by_hand():
    summary = _rows(
        {
            (0, 1): (10.0, 1.0),
            (1, 1): (12.0, 3.0),
            (2, 1): (11.0, 2.0),
            (0, 2): (20.0, 0.0),
            (1, 2): (18.0, 9.0),
            (2, 2): (30.0, 3.0),
            (0, 3): (99.0, 50.0),  # step 3 only on rank 0: partial, dropped
        }
    )
    np.testing.assert_allclose(regress.step_time_samples(summary, "max"), [12.0, 30.0])
    np.testing.assert_allclose(regress.step_time_samples(summary, "median"), [11.0, 20.0])
    np.testing.assert_allclose(
        regress.share_samples(summary, "exposed_comm_ms"), [100 * 6 / 33, 100 * 12 / 68]
    )
    assert regress.share_samples(summary, "bubble_ms") is None


def test_median_aggregate_option_is_used():
    base = make_summary(11)
    cur = make_summary(12, slow_rank=0, slow_factor=1.5)
    rules = regress.rules_from_dict({"step_time": {"aggregate": "median"}})
    res = by_rule(check(base, cur, rules))["step_time"]
    assert res.status == "fail" and "median over ranks" in res.title


# ---- skips, MFU, bubbles, findings ----------------------------------------------------------------------


def test_missing_per_step_skips_with_reason():
    base = make_summary(13)
    cur = make_summary(14)
    del cur["per_step"]
    res = by_rule(check(base, cur))
    assert res["step_time"].status == "skip"
    assert res["step_time"].message == "no per-step step times in current"
    assert res["exposed_comm"].status == "skip"


def test_mfu_rule():
    base = make_summary(15, mfu=0.40)
    assert by_rule(check(base, make_summary(16, mfu=0.37)))["mfu"].status == "fail"
    res = by_rule(check(base, make_summary(16, mfu=0.39)))["mfu"]
    assert res.status == "pass" and res.delta == pytest.approx(-1.0)
    res = by_rule(check(base, make_summary(16, mfu=None)))["mfu"]
    assert res.status == "skip" and "MFU unknown in current" in res.message


def test_bubble_rule_skips_without_pipeline_and_fails_on_increase():
    assert by_rule(check(make_summary(17), make_summary(18)))["bubble"].status == "skip"
    base = make_summary(17, pp=4, bubble_ms=10.0)
    same = make_summary(18, pp=4, bubble_ms=10.0)
    worse = make_summary(18, pp=4, bubble_ms=20.0)
    assert by_rule(check(base, same))["bubble"].status == "pass"
    res = by_rule(check(base, worse))["bubble"]
    assert res.status == "fail"
    assert res.delta == pytest.approx(100 * 20 / 120 - 100 * 10 / 110, abs=0.8)


def test_bubble_rule_with_unknown_layout_says_what_is_missing():
    base, cur = make_summary(17), make_summary(18)
    for s in (base, cur):
        s["run"]["layout"]["pp"] = None
    res = by_rule(check(base, cur))["bubble"]
    assert res.status == "skip" and res.message == "no per-step bubble_ms in baseline and current"


def test_bubble_rule_falls_back_to_stage_fractions():
    base = make_summary(19, pp=2)
    cur = make_summary(20, pp=2)
    base["stages"] = [{"stage": 0, "bubble_fraction": 0.10}, {"stage": 1, "bubble_fraction": 0.12}]
    cur["stages"] = [{"stage": 0, "bubble_fraction": 0.15}, {"stage": 1, "bubble_fraction": 0.17}]
    res = by_rule(check(base, cur))["bubble"]
    assert res.status == "fail" and res.p_value is None
    assert res.delta == pytest.approx(5.0)
    assert "threshold only" in res.message


def test_new_error_finding_fails_but_warnings_and_known_codes_pass():
    base = make_summary(21, findings=(("CLOCK_SKEW", "error"),))
    cur = make_summary(
        22, findings=(("CLOCK_SKEW", "error"), ("COLLECTIVE_HANG", "error"), ("EXPOSED_COMM_HIGH", "warning"))
    )
    res = by_rule(check(base, cur))["findings"]
    assert res.status == "fail" and res.delta == ["+COLLECTIVE_HANG"]
    assert "COLLECTIVE_HANG" in res.message and "EXPOSED_COMM_HIGH" not in res.message
    rules = regress.rules_from_dict({"findings": {"ignore": ["COLLECTIVE_HANG"]}})
    assert by_rule(check(base, cur, rules))["findings"].status == "pass"
    rules = regress.rules_from_dict({"findings": {"severities": ["warning", "error"]}})
    assert by_rule(check(base, cur, rules))["findings"].delta == ["+COLLECTIVE_HANG", "+EXPOSED_COMM_HIGH"]


def test_disabled_rule_is_not_evaluated():
    rules = regress.rules_from_dict({"mfu": {"enabled": False}, "bubble": {"enabled": False}})
    names = [r.rule for r in check(make_summary(23), make_summary(24), rules).results]
    assert names == ["step_time", "exposed_comm", "stragglers", "findings"]


# ---- rules files ---------------------------------------------------------------------------------------


def test_example_rules_file_holds_the_defaults():
    assert regress.load_rules(REPO / "examples" / "rules.toml") == Rules()


def test_documented_rules_block_holds_the_defaults():
    text = (REPO / "docs" / "ci.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, "docs/ci.md has no toml block"
    assert regress.rules_from_dict(regress.tomllib.loads(blocks[0])) == Rules()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"step_tim": {}}, "unknown rule section"),
        ({"step_time": {"max_increase": 3}}, "unknown key"),
        ({"step_time": {"alpha": 1.5}}, "alpha must be between"),
        ({"step_time": {"max_increase_pct": "5"}}, "must be a number"),
        ({"step_time": {"aggregate": "mean"}}, "aggregate"),
        ({"mfu": {"enabled": 1}}, "true or false"),
        ({"findings": {"severities": ["fatal"]}}, "severities"),
        ({"mfu": 3}, "must be a table"),
    ],
)
def test_bad_rules_are_config_errors(data, needle):
    with pytest.raises(BadConfigError, match=needle):
        regress.rules_from_dict(data)


def test_rules_file_errors(tmp_path):
    with pytest.raises(BadConfigError, match="not found"):
        regress.load_rules(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[step_time\n")
    with pytest.raises(BadConfigError, match="not valid TOML"):
        regress.load_rules(bad)
    good = tmp_path / "good.toml"
    good.write_text("[step_time]\nmax_increase_pct = 10\n")
    assert regress.load_rules(good).step_time.max_increase_pct == 10.0


# ---- summaries as input ---------------------------------------------------------------------------------


def test_load_summary_errors(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        summary_of(tmp_path / "missing.json")
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(BadInputError, match="not a JSON summary"):
        summary_of(p)
    p.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(BadInputError, match="not a tracelens summary"):
        summary_of(p)
    p.write_text(json.dumps({"schema": "tracelens.summary/9"}))
    with pytest.raises(BadInputError, match="unsupported summary schema"):
        summary_of(p)
    p.write_text(json.dumps({"schema": "tracelens.summary/1", "per_step": {"a": 1}}))
    with pytest.raises(BadInputError, match="per_step"):
        summary_of(p)
    rows = [{"rank": 0, "step": 1, "step_time_ms": 1.0}, {"rank": 0, "step": 2, "step_time_ms": "slow"}]
    p.write_text(json.dumps({"schema": "tracelens.summary/1", "run": {}, "ranks": [], "per_step": rows}))
    with pytest.raises(BadInputError, match=r"per_step\[1\]"):  # the loader's shape check says which field
        regress.validate_summary(summary_of(p), str(p))
    rows = [{"rank": 0, "step": 1, "step_time_ms": 1.0}, {"step": 2, "step_time_ms": 2.0}]
    p.write_text(json.dumps({"schema": "tracelens.summary/1", "run": {}, "ranks": [], "per_step": rows}))
    with pytest.raises(BadInputError, match=r"per_step\[1\] is malformed"):
        regress.validate_summary(summary_of(p), str(p))


def test_folder_with_summary_json_is_read(tmp_path):
    s = make_summary(25)
    (tmp_path / "summary.json").write_text(json.dumps(s))
    assert summary_of(tmp_path) == s


# ---- renderers ------------------------------------------------------------------------------------------


def _failing_report() -> regress.CheckReport:
    base = make_summary(26)
    cur = make_summary(27, compute_ms=96.0, exposed_ms=24.0, slow_rank=2, slow_factor=1.2, stragglers=(2,))
    cur["mfu"] = None
    return check(base, cur)


def test_junit_structure():
    report = _failing_report()
    root = ET.fromstring(render(report, "junit"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for node in (root, suite):
        for attr in ("name", "tests", "failures", "errors", "time"):
            assert attr in node.attrib, (node.tag, attr)
        float(node.attrib["time"])
    cases = suite.findall("testcase")
    assert [c.attrib["name"] for c in cases] == [r.rule for r in report.results]
    assert int(suite.attrib["tests"]) == len(cases) == len(report.results)
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.attrib["failures"]) == len(failed) == len(report.failed) >= 2
    assert {c.attrib["name"] for c in failed} >= {"step_time", "stragglers"}
    assert int(suite.attrib["errors"]) == 0
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert int(suite.attrib["skipped"]) == len(skipped) == len(report.skipped) >= 1  # mfu: unknown
    for c in cases:
        assert c.attrib["classname"] == "tracelens.check"
        float(c.attrib["time"])
        fail = c.find("failure")
        if fail is not None:
            assert fail.attrib["message"] and fail.attrib["type"] == "regression"
            assert "baseline:" in fail.text


def _markdown_table(md: str) -> list[list[str]]:
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines]


def test_markdown_is_a_table():
    report = _failing_report()
    md = render(report, "markdown")
    rows = _markdown_table(md)
    assert len(rows) == 2 + len(report.results)
    header, sep, body = rows[0], rows[1], rows[2:]
    assert header[:3] == ["Rule", "Status", "Baseline"]
    assert all(re.fullmatch(r":?-{3,}:?", c) for c in sep)
    assert {len(r) for r in rows} == {len(header)}
    assert "FAIL" in body[0][1] and body[0][0] == "`step_time`"
    # the table is preceded by a blank line so GitHub renders it
    lines = md.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    assert lines[first - 1] == ""


def test_markdown_escapes_pipes():
    report = _failing_report()
    report.results[0].message = "a | b"
    rows = _markdown_table(render(report, "markdown"))
    assert {len(r) for r in rows} == {len(rows[0])}


def test_github_annotations():
    report = _failing_report()
    report.results[0].message = "50% slower\nsecond line"
    lines = render(report, "github").splitlines()
    assert len(lines) == len(report.results) + 1
    errors = [ln for ln in lines[:-1] if ln.startswith("::error ")]
    assert len(errors) == len(report.failed)
    for ln in lines:
        assert re.fullmatch(r"::(error|notice) title=[^:,\n]+::.*", ln), ln
    assert lines[0] == "::error title=tracelens check fail%3A step_time::50%25 slower%0Asecond line"
    assert lines[-1].startswith("::error title=tracelens check::REGRESSION")


def test_text_and_json_outputs():
    report = _failing_report()
    text = render(report, "text")
    assert "step_time" in text and "FAIL" in text and text.rstrip().endswith(report.headline())
    data = json.loads(render(report, "json"))
    assert data["regression"] is True and data["exit_code"] == 1
    assert [r["rule"] for r in data["results"]] == [r.rule for r in report.results]
    ok = check(make_summary(28), make_summary(29))
    assert render(ok, "text").rstrip().endswith(ok.headline())
    assert ok.headline().startswith("OK")


def test_identical_runs_pass_every_rule():
    s = make_summary(30, pp=4, bubble_ms=10.0, stragglers=(1,), findings=(("COLLECTIVE_HANG", "error"),))
    report = check(s, s)
    assert [r.status for r in report.results] == ["pass"] * 6
    assert all(r.delta in (0.0, []) for r in report.results)


@pytest.mark.parametrize("factor", [0.8, 1.07, 1.5])
def test_uniform_slowdown_moves_step_time_not_shares(factor):
    base = make_summary(31)
    cur = json.loads(json.dumps(base))
    for row in cur["per_step"]:
        for key in ("step_time_ms", "compute_ms", "exposed_comm_ms"):
            row[key] *= factor
    res = by_rule(check(base, cur))
    assert res["step_time"].delta == pytest.approx(100 * (factor - 1))
    assert res["step_time"].status == ("fail" if factor > 1.05 else "pass")
    assert res["exposed_comm"].delta == pytest.approx(0.0, abs=1e-9)
    assert res["exposed_comm"].status == "pass"


def test_different_setups_are_noted_in_every_format():
    base = make_summary(32)
    cur = make_summary(33, n_ranks=16)
    cur["run"]["gpu"] = "H200"
    base["run"]["gpu"] = "H100"
    report = check(base, cur)
    assert report.notes == [
        "world size differs: baseline 8, current 16; the runs are not comparable",
        "dp differs: baseline 8, current 16; the runs are not comparable",
        "GPU differs: baseline H100, current H200; the runs are not comparable",
    ]
    # no verdict (issue 42, item 8): exit 2, every rule shown but not judged, in every format
    assert report.exit_code == 2 and not report.regressed and not report.comparable
    assert report.headline().startswith(
        "NOT COMPARABLE: world size differs: baseline 8, current 16; dp differs"
    )
    assert {r.status for r in report.results} == {"skip"} and not any(r.applies for r in report.results)
    judged_msgs = [r.message for r in check(base, cur, allow_setup_change=True).results if r.status != "skip"]
    assert judged_msgs and all(
        f"not judged (the setups differ): {m}" in [r.message for r in report.results] for m in judged_msgs
    )
    assert json.loads(render(report, "json"))["regression"] is None
    assert (
        'errors="1"' in render(report, "junit") and "::error" not in render(report, "github").split("\n")[0]
    )
    judged = check(base, cur, allow_setup_change=True)
    assert judged.comparable and judged.notes == report.notes and judged.exit_code in (0, 1)
    assert "NOTE world size differs" in render(report, "text")
    assert "> **Note:** GPU differs" in render(report, "markdown")
    assert "::warning title=tracelens check::dp differs" in render(report, "github")
    props = ET.fromstring(render(report, "junit")).iter("property")
    assert sum(p.attrib["name"] == "note" for p in props) == 3
    assert check(base, make_summary(34)).notes == []  # GPU unknown in current: nothing to compare


def test_renderers_share_one_interface_and_cells():
    """Every `--format` is a CheckRenderer; the shared display cells format units as documented."""
    from tracelens.report.check_renderers import RENDERERS, CheckRenderer, cells

    assert list(RENDERERS) == ["text", "markdown", "junit", "github", "json"]
    assert all(isinstance(r, CheckRenderer) and r.name == name for name, r in RENDERERS.items())
    r = regress.RuleResult(
        "step_time",
        "Step time",
        "fail",
        "slower",
        baseline=99.5,
        current=123.45,
        delta=24.07,
        unit="ms",
        delta_unit="%",
        threshold="> +5%",
        p_value=3.2e-6,
    )
    assert cells(r) == {
        "rule": "step_time",
        "status": "FAIL",
        "baseline": "99.500 ms",
        "current": "123.5 ms",
        "delta": "+24.1%",
        "threshold": "> +5%",
        "p": "3.2e-06",
    }
    empty = regress.RuleResult(
        "stragglers", "Stragglers", "pass", "ok", baseline=[], current=[1, 3], delta=[3]
    )
    assert [cells(empty)[k] for k in ("baseline", "current", "delta", "threshold", "p")] == [
        "none",
        "[1, 3]",
        "3",
        "-",
        "-",
    ]
