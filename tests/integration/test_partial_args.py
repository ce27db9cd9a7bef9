"""Issue 19 item 5: a collective string arg (`Process Group Description`, `Collective name`) present on only
some NCCL kernels must not kill the cross-rank analysis; mixed and missing values are nulls."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracelens.cli import app

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"

pytestmark = pytest.mark.skipif(not SAMPLE.is_dir(), reason="bundled straggler sample absent")


def _thin_args(src: Path, dst: Path) -> int:
    """Copy of the sample where every 3rd collective event (kernel or record_param_comms) lacks its
    `Process Group Description` and every 4th kernel its `Collective name`; returns how many were cut."""
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".json.gz"):
            shutil.copy(f, dst / f.name)
    cut = 0
    for f in sorted(src.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        k = 0
        for e in doc["traceEvents"]:
            a = e.get("args") or {}
            if e.get("cat") in ("kernel", "cpu_op") and "Process Group Description" in a:
                k += 1
                if k % 3 == 0:
                    del a["Process Group Description"]
                    cut += 1
                if k % 4 == 0 and e.get("cat") == "kernel" and a.pop("Collective name", None) is not None:
                    cut += 1
        (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return cut


def test_partial_string_args_keep_the_cross_rank_findings(tmp_path):
    run = tmp_path / "run"
    assert _thin_args(SAMPLE, run) > 100
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["analyze", str(run), "-o", str(out), "--no-cache"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert not [w for w in s["run"]["warnings"] if "skipped" in w], s["run"]["warnings"]
    codes = {f["code"] for f in s["findings"]}
    assert {"STRAGGLER", "CLOCK_SKEW"} <= codes
    faults = json.loads((SAMPLE / "truth.json").read_text())["faults"]
    (st,) = [f for f in s["findings"] if f["code"] == "STRAGGLER"]
    assert st["ranks"] == [f["rank"] for f in faults["stragglers"]]  # rank 6, planted
    (sk,) = [f for f in s["findings"] if f["code"] == "CLOCK_SKEW"]
    assert set(sk["ranks"]) & set(faults["clock_offsets"][0]["ranks"])  # host 1 (ranks 4-7) is 850 µs off


def test_mixed_and_missing_string_values_are_null():
    from tracelens._testing import events_table
    from tracelens.analyze.comm.collectives import collectives_from_events

    rows = []
    for r in (0, 1):
        for i in range(4):
            k = {"rank": r, "kind": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                 "ts_ns": 1000 * i + r, "dur_ns": 500, "correlation": i, "external_id": 100 + i,
                 "pg_name": "1", "group_size": 2, "in_nelems": 10, "dtype": "BFloat16"}  # fmt: skip
            if i % 2 == 0:
                k["pg_desc"] = "TENSOR_MODEL_PARALLEL_GROUP"
            if i != 1:
                k["collective"] = "allreduce"
            rows.append(k)
            rows.append({"rank": r, "kind": "cpu_op", "name": "record_param_comms", "ts_ns": 1000 * i - 100,
                         "dur_ns": 50, "external_id": 100 + i, "collective": "allreduce" if i == 1 else None,
                         "pg_desc": "DP" if i == 3 else None})  # fmt: skip
    t = collectives_from_events(events_table(rows))
    desc = t.column("pg_desc").to_pylist()
    assert desc[:4] == ["TENSOR_MODEL_PARALLEL_GROUP", None, "TENSOR_MODEL_PARALLEL_GROUP", "DP"]
    assert "nan" not in desc and t.column("op").to_pylist() == ["allreduce"] * 8
    assert t.column("bytes").to_pylist() == [20] * 8
