"""Issue 42, item 4: what a failed or explicit-file call learns does not change how the folder is read later
(the discovery memo and the run memo in the cache)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from broken_traces import REPO, cli

import tracelens

SAMPLE = REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp3-split22-21-21"  # 6 ranks and a command.txt


def _summary(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    s.pop("tracelens_version", None)
    return s


def test_a_wrong_argument_does_not_poison_the_cache(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    env = {"TRACELENS_CACHE_DIR": str(tmp_path / "cache")}
    r = cli("analyze", run, "-o", tmp_path / "a", "--no-report", env=env)
    assert r.returncode == 0, r.stderr
    # a file that is not a trace, given by name: read as Kineto for this call, and refused
    r = cli("analyze", run / "command.txt", "-o", tmp_path / "b", "--no-report", env=env)
    assert r.returncode == 2 and "command.txt: not a valid Kineto JSON trace" in r.stderr
    # one trace of the run, given by name: a one-rank run of its own
    one = sorted(run.glob("*.json.gz"))[3]
    r = cli("analyze", one, "-o", tmp_path / "c", "--no-report", env=env)
    assert r.returncode == 0, r.stderr
    assert _summary(tmp_path / "c")["run"]["ranks"] == [3]
    # the folder reads as before: the same six ranks and the same summary as the first call
    r = cli("analyze", run, "-o", tmp_path / "d", "--no-report", env=env)
    assert r.returncode == 0, r.stderr
    first, again = _summary(tmp_path / "a"), _summary(tmp_path / "d")
    assert again["run"]["ranks"] == list(range(6))
    assert again == first
    loaded = tracelens.load(run, cache_dir=str(tmp_path / "cache"))
    assert sorted(loaded.metadata["rank"]) == list(range(6))
