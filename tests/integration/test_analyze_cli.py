"""`tracelens analyze` end to end through its entry point (tests/cli.py; a fresh interpreter where that is
the point), on the bundled samples and the real HTA traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import tracelens

ROOT = Path(__file__).resolve().parents[2]
HTA = ROOT.parent / "shared" / "traces" / "hta"
GLOO = ROOT / "sample_traces" / "cpu-gloo-4rank"


def run(*args, cwd=None, fresh=False):
    return tracelens(*args, cwd=cwd, fresh=fresh)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("tracelens ")


def test_analyze_gloo_sample(tmp_path):
    out = tmp_path / "out"
    r = run("analyze", GLOO, "-o", out, "--json", tmp_path / "s.json", "--no-cache")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["schema"] == "tracelens.summary/1"
    assert s["run"]["world_size"] == 4 and s["run"]["ranks"] == [0, 1, 2, 3]
    assert s["run"]["analysis_path"] == ["cpu"]
    assert json.loads((tmp_path / "s.json").read_text())["ranks"] == s["ranks"]
    for rank in s["ranks"]:
        parts = rank["compute_ms"] + rank["exposed_comm_ms"] + rank["memcpy_ms"] + rank["idle_ms"]
        assert parts == pytest.approx(rank["step_time_ms"], abs=1e-5)
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "plotly" in html
    assert "rank" in r.stdout


def test_bad_path_is_one_line_exit_2(tmp_path):
    r = run("analyze", tmp_path / "nope", fresh=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr
    assert "Traceback" not in r.stderr


def test_debug_shows_traceback(tmp_path):
    r = run("--debug", "analyze", tmp_path / "nope", fresh=True)
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_refuses_to_overwrite_user_file(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text('{"precious": true}')
    r = run("analyze", GLOO, "-o", tmp_path / "o", "--json", mine)
    assert r.returncode == 2 and "--force" in r.stderr
    assert json.loads(mine.read_text()) == {"precious": True}
    r = run("analyze", GLOO, "-o", tmp_path / "o", "--json", mine, "--force", "--no-report")
    assert r.returncode == 0 and json.loads(mine.read_text())["schema"] == "tracelens.summary/1"


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces/hta is absent")
@pytest.mark.parametrize("folder", sorted(p.name for p in HTA.iterdir()) if HTA.is_dir() else [])
def test_every_hta_folder_analyzes_or_exits_2(folder, tmp_path):
    r = run("analyze", HTA / folder, "-o", tmp_path / "o", "--no-report", "--no-cache")
    if r.returncode == 0:
        s = json.loads((tmp_path / "o" / "summary.json").read_text())
        assert s["ranks"], folder
    else:
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tracelens: error: "), r.stderr


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces/hta is absent")
def test_compat_hta_matches_hta_golden(tmp_path):
    """Acceptance: `--compat hta` on trace_filter matches HTA 0.5's own numbers within 0.1 pp for both ranks."""
    golden = json.loads((ROOT / "tests" / "golden" / "hta_trace_filter.json").read_text())["ranks"]
    r = run(
        "analyze",
        HTA / "trace_filter",
        "--compat",
        "hta",
        "--json",
        tmp_path / "s.json",
        "-o",
        tmp_path / "o",
    )
    assert r.returncode == 0, r.stderr
    rows = {row["rank"]: row for row in json.loads((tmp_path / "s.json").read_text())["compat"]["ranks"]}
    assert set(rows) == {0, 1}
    for rank, want in golden.items():
        got = rows[int(rank)]
        for key in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg", "comp_comm_overlap_pctg"):
            assert abs(got[key] - want[key]) <= 0.1, (rank, key, got[key], want[key])


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/traces/hta is absent")
def test_assumed_rank_is_a_warning(tmp_path):
    """A lone trace without rank info is analyzed as rank 0, and the summary and CLI say so."""
    r = run("analyze", HTA / "rank_unavailable", "-o", tmp_path / "o", "--no-report")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["run"]["ranks"] == [0]
    assert any("analyzed as rank 0" in w for w in s["run"]["warnings"])
    assert "analyzed as rank 0" in r.stdout
    r = run("analyze", GLOO, "-o", tmp_path / "g", "--no-report")
    s = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert not any("analyzed as rank" in w for w in s["run"]["warnings"])
