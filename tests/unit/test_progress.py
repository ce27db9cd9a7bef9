"""Plain progress lines for non-TTY logs (issue 20, item 6): only after `delay`, then once per `interval`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from tracelens.progress import PlainProgress

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_silent_when_short_then_one_line_per_interval():
    out, clock = io.StringIO(), Clock()
    p = PlainProgress(stream=out, interval=10, delay=5, clock=clock)
    for i in range(100):  # 100 updates in 4 s: quick work prints nothing
        clock.t = i * 0.04
        p.update(i, 1000)
    assert out.getvalue() == ""
    clock.t = 5.0
    p.update(100, 1000)
    clock.t = 9.0
    p.update(200, 1000)  # within the interval: no line
    clock.t = 15.0
    p.set_phase("analyzing")
    lines = out.getvalue().splitlines()
    assert lines == ["tracelens: reading traces: 100/1,000 files, 5 s", "tracelens: analyzing, 15 s"]


def test_wanted_only_off_a_terminal():
    assert PlainProgress.wanted(io.StringIO())

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not PlainProgress.wanted(Tty())


def test_cli_prints_progress_lines_to_stderr_in_a_log(tmp_path):
    sample = REPO / "sample_traces" / "cpu-gloo-4rank"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACELENS_PROGRESS_SECONDS": "0"}
    cmd = [
        sys.executable,
        "-m",
        "tracelens",
        "analyze",
        str(sample),
        "-o",
        str(tmp_path / "o"),
        "--no-report",
    ]
    res = subprocess.run(cmd + ["--no-cache"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("tracelens: ")]
    assert any(ln.startswith("tracelens: analyzing") for ln in lines), res.stderr
    assert "tracelens: " not in res.stdout  # progress stays off stdout
