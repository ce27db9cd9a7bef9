"""`tracelens report export-trace`: one valid Chrome trace with every rank of the real CPU run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "cpu-gloo-4rank"


def tracelens(*args: str) -> subprocess.CompletedProcess:
    return _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_export_trace_of_the_cpu_run(tmp_path):
    from tracelens.run_analysis import analyze_run

    out = tmp_path / "merged.json"
    p = tracelens("report", "export-trace", str(SAMPLE), "-o", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    # only top-level keys Perfetto's JSON importer knows (it stops at an unknown one)
    assert list(doc) == ["otherData", "displayTimeUnit", "traceEvents"]
    assert doc["otherData"]["schema"] == "tracelens.chrome-trace/1" and isinstance(doc["traceEvents"], list)
    evs = doc["traceEvents"]
    a = analyze_run(SAMPLE)
    x = [e for e in evs if e["ph"] == "X"]
    assert len(x) == a.events.num_rows
    assert all(
        isinstance(e["pid"], int)
        and isinstance(e["tid"], int)
        and e["ts"] >= 0
        and e["dur"] >= 0
        and isinstance(e["name"], str)
        for e in x
    )
    assert {e["pid"] for e in x} == {0, 1, 2, 3}
    names = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)} or all(
        n.startswith(f"rank {r}") for r, n in names.items()
    )
    steps = {e["args"]["step"] for e in x if "step" in e.get("args", {})}
    assert steps == set(a.steps)
    # the merged trace spans the run: rank 0's ProfilerStep annotations are in it at their own times
    ps = sorted(e["ts"] for e in x if e["pid"] == 0 and e["name"].startswith("ProfilerStep#"))
    assert len(ps) == len(a.steps)
    # one global marker per finding, and one on every rank it names
    findings = a.summary()["findings"]
    marks = [e for e in evs if e["ph"] == "i"]
    assert len([m for m in marks if m["s"] == "g"]) == len(findings)
    assert len([m for m in marks if m["s"] == "p"]) == sum(len(f["ranks"]) for f in findings)
    # rerun overwrites its own file; a foreign file needs --force
    assert tracelens("report", "export-trace", str(SAMPLE), "-o", str(out)).returncode == 0
    out.write_text("{}")
    p = tracelens("report", "export-trace", str(SAMPLE), "-o", str(out))
    assert p.returncode == 2 and "--force" in p.stderr


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_export_a_subset_of_ranks(tmp_path):
    out = tmp_path / "m.json"
    p = tracelens("report", "export-trace", str(SAMPLE), "-o", str(out), "--ranks", "1-2")
    assert p.returncode == 0, p.stderr
    assert "2 rank(s)" in p.stdout
    assert {e["pid"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"} == {1, 2}
    p = tracelens("report", "export-trace", str(SAMPLE), "-o", str(out), "--ranks", "3-9")
    assert p.returncode == 2 and "no trace for rank(s) 4, 5" in p.stderr
    p = tracelens("report", "export-trace", str(SAMPLE), "-o", str(out), "--ranks", "2-1")
    assert p.returncode == 2 and "ranges such as" in p.stderr
