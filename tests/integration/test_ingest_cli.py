"""`tracelens ingest RUN_DIR -o DIR` through the CLI's entry point: Parquet outputs, overwrite guard, exit codes."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.cli import tracelens as _cli
from tracelens import schema

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
import kineto_traces as kt  # noqa: E402


def run(*args):
    return _cli(*args)  # the CLI's entry point, in this process (tests/cli.py)


def test_ingest_writes_parquet_and_guards_overwrite(tmp_path):
    run_dir = tmp_path / "run"
    for r in range(2):
        kt.write(run_dir / f"w{r}.pt.trace.json.gz", kt.doc(rank=r, world_size=2))
    out = tmp_path / "out"
    r = run("ingest", run_dir, "-o", out, "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "2 rank(s), 2 events" in r.stdout
    events = pq.read_table(out / "events.parquet")
    assert events.schema.equals(schema.EVENTS)
    assert events.column("rank").to_pylist() == [0, 1]
    assert pq.read_table(out / "memory.parquet").schema.equals(schema.MEMORY)
    assert pq.read_table(out / "metadata.parquet").column("world_size").to_pylist() == [2, 2]

    again = run("ingest", run_dir, "-o", out)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert run("ingest", run_dir, "-o", out, "--force", "--no-cache").returncode == 0


def test_ingest_bad_input_exit_2(tmp_path):
    r = run("ingest", tmp_path / "missing", "-o", tmp_path / "out")
    assert r.returncode == 2 and "no such file or folder" in r.stderr
    bad = tmp_path / "bad" / "rank0.json"
    bad.parent.mkdir()
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    r = run("ingest", bad.parent, "-o", tmp_path / "out2")
    assert r.returncode == 2 and "rank0.json" in r.stderr and "cut mid-write" in r.stderr


def test_parquet_reads_back_integers_with_nulls_as_nullable_integers(tmp_path):
    """pandas reads an integer column with nulls (a step of an event outside any ProfilerStep, the
    correlation of a CPU op) as integers with <NA>, not floats (step 2.0); the Arrow types are unchanged."""
    import pandas as pd

    run_dir = ROOT / "sample_traces" / "cpu-gloo-4rank"
    if not run_dir.is_dir():
        import pytest

        pytest.skip(f"{run_dir} is absent")
    out = tmp_path / "pq"
    assert run("ingest", run_dir, "-o", out).returncode == 0
    arrow = pq.read_table(out / "events.parquet")
    assert arrow.schema.equals(schema.EVENTS)
    for read in (lambda p: pd.read_parquet(p), lambda p: pq.read_table(p).to_pandas()):
        df = read(out / "events.parquet")
        assert str(df["step"].dtype) == "Int32" and str(df["ts_ns"].dtype) == "Int64"
        assert df["step"].isna().sum() == arrow.column("step").null_count > 0
        assert df["step"].dropna().tolist() == [s for s in arrow.column("step").to_pylist() if s is not None]
        assert df["ts_ns"].tolist() == arrow.column("ts_ns").to_pylist()  # exact ns
        assert isinstance(df["name"].dtype, pd.CategoricalDtype)
    meta = pd.read_parquet(out / "metadata.parquet")
    assert str(meta["world_size"].dtype) == "Int32" and meta["world_size"].tolist() == [4, 4, 4, 4]
