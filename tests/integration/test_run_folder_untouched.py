"""`tracelens analyze RUN` writes nothing into RUN: the cache goes to the user cache folder (or --cache-dir),
a read-only run folder with an unwritable cache is analyzed without cache (exit 0, a warning)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


def _listing(d: Path) -> list[tuple[str, int, int]]:
    """Every file and folder under d with its size and mtime (ns)."""
    out = []
    for p in sorted(d.rglob("*")):
        st = p.stat()
        out.append((str(p.relative_to(d)), st.st_size if p.is_file() else 0, st.st_mtime_ns))
    return out


def _analyze(run: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli("analyze", run, "-o", out, "--no-report", *extra, env={"TRACELENS_CACHE_DIR": str(cache)})


@pytest.mark.parametrize("name", ["cpu-gloo-4rank", "qwen35-27b-seq4k-tp2pp3-split22-21-21"])
def test_analyze_leaves_the_run_folder_listing_unchanged(tmp_path: Path, name: str):
    run = tmp_path / name
    shutil.copytree(SAMPLES / name, run)
    before = _listing(run)
    cache = tmp_path / "cache"
    cold = _analyze(run, tmp_path / "out1", cache)
    assert cold.returncode == 0, cold.stderr
    warm = _analyze(run, tmp_path / "out2", cache)
    assert warm.returncode == 0, warm.stderr
    assert _listing(run) == before
    n_ranks = len(json.loads((tmp_path / "out1" / "summary.json").read_text())["run"]["ranks"])
    assert len(list(cache.glob("entries/*/rank*.meta.arrow"))) == n_ranks > 1  # cached elsewhere
    assert (tmp_path / "out1" / "summary.json").read_bytes() == (
        tmp_path / "out2" / "summary.json"
    ).read_bytes()


def test_read_only_run_and_unwritable_cache_dir_still_analyze(tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "cpu-gloo-4rank", run)
    blocker = tmp_path / "file"
    blocker.write_text("")  # a cache folder below a file cannot be made, not even by root
    for p in [run, *run.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        before = _listing(run)
        r = _analyze(run, tmp_path / "out", blocker / "cache")
        assert r.returncode == 0, r.stderr
        assert _listing(run) == before
    finally:
        for p in [run, *run.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("not writable: analyzed without cache" in w for w in s["run"]["warnings"])
