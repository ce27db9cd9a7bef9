"""No usable input -> one-line error, exit 2 (not a table of 0 ranks); a hang-only run prints the hang
(issue 20, item 7)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from broken_traces import cli, write

REPO = Path(__file__).resolve().parents[2]
HANG = REPO / "sample_traces" / "cpu-gloo-4rank-hang"


class _Refused:
    def __reduce__(self):
        import os

        return (os.getcwd, ())  # any global outside the restricted unpickler's allow-list


def test_only_an_unsafe_pickle_exits_2_with_one_line(tmp_path):
    dump = {"version": "2.4", "pg_config": {}, "entries": [_Refused()]}
    write(tmp_path / "run" / "fr_trace_rank_0", pickle.dumps(dump, protocol=4))
    res = cli("analyze", tmp_path / "run", "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("tracelens: error: ") and "unsafe or invalid pickle" in line
    assert "0 rank(s)" not in res.stdout and not (tmp_path / "out" / "summary.json").exists()


def test_only_a_trace_cut_before_any_event_exits_2(tmp_path):
    write(tmp_path / "run" / "trace.json", b'{"traceEvents": [')
    res = cli("analyze", tmp_path / "run", "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert "no usable input" in line and "cut mid-write" in line


def test_hang_only_run_prints_the_hang_not_an_empty_table(tmp_path):
    res = cli("analyze", HANG, "-o", tmp_path / "out", "--no-report")
    assert res.returncode == 0, res.stderr
    assert "no profiler traces; NCCL inputs only" in res.stdout and "from 4 rank(s) (0-3)" in res.stdout
    assert "[error] COLLECTIVE_HANG: rank 3 never joined allreduce #5" in res.stdout
    assert "┏" not in res.stdout and "0 rank(s)" not in res.stdout
    # the world is known from the dumps (ranks 0-3, as recorded: truth.json), not null
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    truth = json.loads((HANG / "truth.json").read_text())
    assert s["run"]["world_size"] == truth["world_size"] == 4 and s["run"]["ranks"] == []
