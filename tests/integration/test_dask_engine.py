"""`--engine dask`: per-rank ingest and stage as tasks on a 2-worker LocalCluster, reduction on the client,
summary.json identical to the local engine's and to the one-table engine's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] (the 'dask' extra) is not installed"
)

from tracelens.run_analysis import Options, analyze_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as c:
        yield c


def _copy(name: str, tmp_path: Path) -> Path:
    """The sample in a temporary folder (its listing must stay as it is)."""
    dst = tmp_path / name
    shutil.copytree(SAMPLES / name, dst, ignore=shutil.ignore_patterns(".tracelens"))
    return dst


def _dump(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True, default=str)


@pytest.mark.parametrize("name", ["qwen35-27b-seq4k-tp2pp3-split22-21-21", "cpu-gloo-4rank"])
def test_dask_summary_identical_to_local(cluster, tmp_path: Path, name: str):
    run = _copy(name, tmp_path)
    listing = sorted(p.name for p in run.rglob("*"))
    cache = tmp_path / "shared-cache"
    dask = analyze_run(run, Options(engine="dask", scheduler=cluster.scheduler_address, cache_dir=str(cache)))
    # the workers wrote the per-rank cache and stage files into the given cache folder (shared storage)
    stage_files = list(cache.rglob("stage-*/rank*.stage"))
    assert len(stage_files) == len(dask.ranks) > 1
    assert sorted(p.name for p in run.rglob("*")) == listing  # nothing in the run folder
    got = dask.summary()
    local_run = analyze_run(run, Options(engine="local", no_cache=True))
    local = local_run.summary()
    assert _dump(got) == _dump(local)
    assert got["ranks"] and got["per_step"]
    if local_run.idle is not None:  # the GPU idle rows come from the stage files the Dask workers wrote
        assert len(local_run.idle) == len(dask.ranks) * 2
        assert dask.idle.to_dict("records") == local_run.idle.to_dict("records")


def test_cli_engine_dask(cluster, tmp_path: Path):
    run = _copy("cpu-gloo-4rank", tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRACELENS_DEBUG="1")  # tracebacks on failure

    def analyze(out: Path, *extra: str) -> dict:
        r = subprocess.run(
            [sys.executable, "-m", "tracelens", "analyze", str(run), "-o", str(out), "--no-report", *extra],
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        return json.loads((out / "summary.json").read_text())

    a = analyze(tmp_path / "dask", "--engine", "dask", "--scheduler", cluster.scheduler_address)
    b = analyze(tmp_path / "local")
    assert _dump(a) == _dump(b)


def test_scheduler_needs_engine_dask(tmp_path: Path):
    from tracelens.errors import BadInputError

    run = _copy("cpu-gloo-4rank", tmp_path)
    with pytest.raises(BadInputError, match="--engine dask"):
        analyze_run(run, Options(scheduler="tcp://127.0.0.1:1"))
    with pytest.raises(BadInputError, match="--engine spark"):
        analyze_run(run, Options(engine="spark"))
