"""Issue 42, item 6: damage outside Kineto events is salvaged and said, like damaged events: a cut NCCL
profiler-plugin file, damaged values in a trace's metadata (before `traceEvents`), a file name whose rank
disagrees with `distributedInfo.rank`, UTF-16 and byte-order-marked traces. Built from the bundled samples
with the damage applied here."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from broken_traces import GLOO, REPO, cli

from tracelens.ingest import kineto, nccl_plugin

H200 = next((REPO / "sample_traces" / "h200-qwen35-block-seq4k").glob("*.json.gz"))
SKEW = REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_a_cut_plugin_file_says_what_it_lost(tmp_path):
    from tracelens.simulate.nccl_outputs import write_for_run

    run = tmp_path / "run"
    run.mkdir()
    for p in sorted(SKEW.glob("*.json.gz"))[:4]:  # ranks 0-3 of the sample (one data-parallel replica)
        shutil.copy(p, run / p.name)
    files = [Path(p) for p in write_for_run(run, formats=["plugin"])["files"]["plugin"]]
    victim = files[0]
    whole = nccl_plugin.read(victim).num_rows
    text = victim.read_text()
    victim.write_text(text[: len(text) // 2])  # the process was killed while the plugin wrote
    kept = nccl_plugin.read(victim).num_rows
    assert 0 < kept < whole
    note = nccl_plugin.cut_note(victim)
    assert note is not None and "cut mid-write" in note
    assert all(nccl_plugin.cut_note(p) is None for p in files[1:])
    r = cli("analyze", run, "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    warnings = _summary(tmp_path / "out")["run"]["warnings"]
    said = [w for w in warnings if w.startswith(f"{victim.name}: NCCL profiler-plugin file cut mid-write")]
    assert len(said) == 1 and "have no row" in said[0]


@pytest.mark.parametrize(
    "damage, field",
    [
        (('"name": "NVIDIA H200"', '"name": "NVIDIA \\ud800H200"'), "mended_strings"),
        (('"computeMajor": 9', '"computeMajor": NaN'), "header_repairs"),
        (('"schemaVersion": 1', '"schemaVersion": Infinity'), "header_repairs"),
    ],
)
def test_damage_in_the_metadata_costs_that_value(tmp_path, damage, field):
    """The same damage in an event costs the event; in the metadata it costs that value, not the whole file."""
    text = gzip.decompress(H200.read_bytes()).decode()
    assert damage[0] in text
    run = tmp_path / "run"
    run.mkdir()
    p = run / "rank0.json"
    p.write_text(text.replace(damage[0], damage[1], 1))
    clean = kineto.read(H200)
    got = kineto.read(p, salvage=True)
    assert got.events.num_rows == clean.events.num_rows and got.metadata[field] == 1
    r = cli("analyze", run, "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    s = _summary(tmp_path / "out")
    f = [f for f in s["findings"] if f["code"] == "PARTIAL_TRACE"]
    assert len(f) == 1 and f[0][field] == 1
    assert s["ranks"][0]["compute_ms"] == pytest.approx(51.45, abs=0.05)  # the whole trace's numbers (truth)


def test_a_file_name_rank_that_disagrees_is_said(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    traces = sorted((GLOO / "traces").glob("*.json.gz"))
    for p in traces:  # each file named after the next rank
        rank = kineto.peek(p)["rank"]
        shutil.copy(p, run / f"rank{(rank + 1) % 4}.json.gz")
    r = cli("analyze", run, "-o", tmp_path / "out", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    s = _summary(tmp_path / "out")
    assert s["run"]["ranks"] == [0, 1, 2, 3]  # distributedInfo.rank decides
    said = sorted(w for w in s["run"]["warnings"] if "the file name says rank" in w)
    assert said == [
        f"rank{(r + 1) % 4}.json.gz: the file name says rank {(r + 1) % 4}, distributedInfo.rank says {r}; "
        f"analyzed as rank {r} (distributedInfo)"
        for r in sorted(range(4), key=lambda r: f"rank{(r + 1) % 4}")
    ]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
@pytest.mark.parametrize("gz", [False, True])
def test_utf16_and_bom_prefixed_traces_are_read(tmp_path, encoding, gz):
    ref = tmp_path / "ref"
    ref.mkdir()
    raw = gzip.decompress(next((GLOO / "traces").glob("*.json.gz")).read_bytes())
    (ref / "rank0.json").write_bytes(raw)
    run = tmp_path / "run"
    run.mkdir()
    data = raw.decode().encode(encoding)
    (run / ("rank0.json.gz" if gz else "rank0.json")).write_bytes(gzip.compress(data) if gz else data)
    for d in (ref, run):
        r = cli("analyze", d, "-o", tmp_path / f"{d.name}-out", "--no-report", "--no-cache")
        assert r.returncode == 0, r.stderr
    a, b = _summary(tmp_path / "ref-out"), _summary(tmp_path / "run-out")
    assert a["ranks"] == b["ranks"] and a["per_step"] == b["per_step"]
