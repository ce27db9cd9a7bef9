"""Real multi-rank CPU runs recorded on demand with scripts/record_cpu_run.py (torch 2.13, gloo).

`recorded_run(kind, **opts)` records a run once per test session into a temporary folder and returns its
path (truth.json inside). Kinds name the planted fault; keyword options are the script's pipeline flags
(`annotate="hf"`, `schedule="gpipe"`, ...) so other layouts and schedules reuse the same cache.
Skips when torch is not installed (it is in the `test` extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "record_cpu_run.py"

#: kind -> record_cpu_run.py flags (all `--kind pipeline`: 8 ranks, pp=4 x dp=2, 1F1B, m=4)
KINDS: dict[str, list[str]] = {
    "clean": [],
    "heavy_stage": ["--heavy-stage", "2", "--heavy-layers", "6"],
    "faults": ["--fault-compute", "--slow-rank", "5", "--stall-rank", "1", "--stall-ms", "30"],
    "skipped_send": ["--skip-send", "2:3:1", "--timeout-s", "10"],
}
_CACHE: dict[tuple, Path] = {}
_ROOT: list[Path] = []


def _flags(opts: dict) -> list[str]:
    out = []
    for k, v in sorted(opts.items()):
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def recorded_run(kind: str, **opts) -> Path:
    """Path of a recorded run of `kind` with extra script options; recorded once per session."""
    pytest.importorskip("torch", reason="torch==2.13.0 (the test extra) records the real runs")
    key = (kind, tuple(sorted(opts.items())))
    if key in _CACHE:
        return _CACHE[key]
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="tracelens-recorded-")))
    out = _ROOT[0] / f"{kind}-{len(_CACHE)}"
    cmd = [sys.executable, str(SCRIPT), "--kind", "pipeline", "-o", str(out), *KINDS[kind], *_flags(opts)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"recording {kind} failed:\n{proc.stderr[-3000:]}")
    _CACHE[key] = out
    return out


def truth(run: Path) -> dict:
    return json.loads((run / "truth.json").read_text())


# ----- layouts and schedules read from structure (issue 23): scripts/record_cpu_layouts.py -----------------

LAYOUT_SCRIPT = REPO / "scripts" / "record_cpu_layouts.py"
#: kind -> record_cpu_layouts.py flags (8 ranks each; see the script's docstring)
LAYOUT_KINDS: dict[str, list[str]] = {
    "tppdp_clean": ["--layout", "tppdp"],
    "tppdp_slow_tp": ["--layout", "tppdp", "--slow-rank", "5"],
    "ulysses": ["--layout", "ulysses"],
    "interleaved_bare": ["--layout", "interleaved", "--bare"],
}


def recorded_layout(kind: str) -> Path:
    """Path of a recorded run of LAYOUT_KINDS[kind] (truth.json inside); recorded once per session."""
    pytest.importorskip("torch", reason="torch==2.13.0 (the test extra) records the real runs")
    key = ("layout", kind)
    if key in _CACHE:
        return _CACHE[key]
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="tracelens-recorded-")))
    out = _ROOT[0] / f"layout-{kind}"
    cmd = [sys.executable, str(LAYOUT_SCRIPT), "-o", str(out), *LAYOUT_KINDS[kind]]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"recording {kind} failed:\n{proc.stderr[-3000:]}")
    _CACHE[key] = out
    return out
