"""Truncated traces (a profiler killed mid-write): every complete event before the cut is kept, the rank is
marked PARTIAL_TRACE with how much was salvaged, and only its complete steps are analyzed."""

from __future__ import annotations

import gzip
import json
import zlib

import msgspec
import pyarrow.compute as pc
import pytest
from broken_traces import (
    GLOO,
    HTA,
    LOG_TEXT,
    PLUGIN_TEXT,
    REPO,
    cli,
    cut,
    decompressed,
    kineto_doc,
    step_events,
    text_with_offsets,
    write,
    x,
)

from tracelens.analyze.rank.breakdown import breakdown
from tracelens.errors import BadTraceError
from tracelens.ingest import flight_recorder, kineto, nccl_log, nccl_plugin
from tracelens.run_analysis import Options, analyze_run

pytestmark = pytest.mark.usefixtures("decoder")  # each test on both chunk decoders (tests/conftest.py)

REAL = HTA / "negative_queue_length_values_check" / "rank0.json.gz"


def _x_events(raw: bytes) -> list[dict]:
    """Complete events of a whole trace, by an independent decoder (msgspec's generic JSON)."""
    return [e for e in msgspec.json.decode(raw)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.skipif(not REAL.exists(), reason=f"real HTA traces not present ({REAL})")
def test_real_trace_cut_at_60_percent_through_the_cli(tmp_path):
    full = decompressed(REAL)
    want = _x_events(full)
    write(tmp_path / "run" / "rank0.json", cut(full, 0.6))
    out = tmp_path / "out"
    r = cli("analyze", tmp_path / "run", "-o", out, "--no-report")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    partial = [f for f in s["findings"] if f["code"] == "PARTIAL_TRACE"]
    assert len(partial) == 1 and partial[0]["ranks"] == [0]
    msg = partial[0]["message"]
    assert "rank0.json was cut mid-write" in msg
    n = partial[0]["salvaged_events"]
    assert f"{n:,} complete events" in msg and "complete steps analyzed: " in msg
    assert n >= 0.55 * len(want), (n, len(want))
    assert n < len(want)
    assert "PARTIAL_TRACE" in r.stdout  # the warning is printed too

    # What was salvaged is exactly a subset of the full trace's events ...
    tr = kineto.read(tmp_path / "run" / "rank0.json", salvage=True)
    whole = kineto.read(REAL)
    key = ["name", "ts_ns", "dur_ns"]
    got = {tuple(r.values()) for r in tr.events.select(key).to_pylist()}
    ref = {tuple(r.values()) for r in whole.events.select(key).to_pylist()}
    assert got <= ref
    # ... and the steps kept are the complete ones: their breakdown equals the full file's.
    assert s["run"]["steps"] == [553]  # 550, 551, 554 lost events; 552 holds the lost work of 551
    b_full = breakdown(whole.events).to_pylist()
    for row in s["per_step"]:
        ref_row = next(b for b in b_full if b["step"] == row["step"])
        assert row["step_time_ms"] == pytest.approx(ref_row["step_time_ns"] / 1e6)
        assert row["compute_ms"] == pytest.approx(ref_row["compute_ns"] / 1e6)


SKEW = REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"


@pytest.mark.skipif(not SKEW.exists(), reason=f"sample run absent ({SKEW})")
@pytest.mark.parametrize("frac", [0.95, 0.97])
def test_a_step_whose_end_was_cut_is_left_out(tmp_path, frac):
    """The simulator writes each rank's events in time order, so a cut loses the end of the last step with its
    launches: no launch lacks its kernel. Before, step 3 of rank 0 was kept with 836.6 ms (0.95) or 881.6 ms
    (0.97) of compute against 974.9 ms in the whole file (and on its stage peers)."""
    import shutil

    files = sorted(SKEW.glob("*.pt.trace.json.gz"))
    run = tmp_path / "run"
    run.mkdir()
    for f in files[1:]:
        shutil.copy(f, run / f.name)
    shutil.copy(SKEW / "tracelens.toml", run)
    write(run / files[0].name.removesuffix(".gz"), cut(decompressed(files[0]), frac))
    s = analyze_run(run, Options(no_cache=True)).summary()
    partial = [f for f in s["findings"] if f["code"] == "PARTIAL_TRACE"]
    assert [f["steps_analyzed"] for f in partial] == [[2]]
    whole = {b["step"]: b for b in breakdown(kineto.read(files[0]).events).to_pylist()}
    mine = [r for r in s["per_step"] if r["rank"] == 0]
    assert [r["step"] for r in mine] == [2]
    assert mine[0]["step_time_ms"] == pytest.approx(whole[2]["step_time_ns"] / 1e6)
    assert mine[0]["compute_ms"] == pytest.approx(whole[2]["compute_ns"] / 1e6)
    peers = [r["compute_ms"] for r in s["per_step"] if r["rank"] in (1, 2, 3) and r["step"] == 3]
    assert len(peers) == 3 and all(abs(c - whole[3]["compute_ns"] / 1e6) < 5 for c in peers)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("frac", [0.35, 0.5, 0.77, 0.999])
def test_every_complete_event_before_the_cut_is_kept(tmp_path, frac, gz):
    events = [x("cpu_op", f"op{i}", 10.0 * i, 5, args_text="a}, {b" * (i % 3)) for i in range(200)]
    text, ends = text_with_offsets(kineto_doc(0, 1, events))
    data = cut(text, frac)
    want = sum(1 for e in ends if e <= len(data))
    p = write(tmp_path / "t.json", data, gz=gz)
    with pytest.raises(BadTraceError, match=r"t\.json.*cut mid-write"):
        kineto.read(p)
    tr = kineto.read(p, salvage=True, chunk_bytes=4096)
    assert tr.events.num_rows == want
    assert tr.events.column("name").to_pylist() == [f"op{i}" for i in range(want)]
    assert tr.metadata["salvaged"] is True
    assert 0 < tr.metadata["salvaged_fraction"] <= 1


def test_gzip_cut_mid_stream_is_salvaged(tmp_path):
    text, ends = text_with_offsets(kineto_doc(0, 1, [x("cpu_op", f"op{i}", i, 1) for i in range(3000)]))
    gz = gzip.compress(text)
    p = write(tmp_path / "t.json.gz", gz[: len(gz) // 2])
    with pytest.raises(BadTraceError, match="truncated gzip stream"):
        kineto.read(p)
    tr = kineto.read(p, salvage=True)
    # the cut gzip decompresses to a prefix of the text: every event ending in that prefix is kept
    got = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(gz[: len(gz) // 2])
    want = sum(1 for e in ends if e <= len(got))
    assert 0 < want < 3000
    assert tr.events.num_rows in (want, want - 1)  # the last one needs its closing brace and a separator


def test_incomplete_steps_are_left_out(tmp_path):
    events = step_events(steps=4)
    text, ends = text_with_offsets(kineto_doc(0, 1, events))
    # cut inside step 4 (events are written step by step): steps 1-3 complete, step 4 lost its kernels
    p = write(tmp_path / "rank0.json", text[: ends[19] + 3])
    tr = kineto.read(p, salvage=True)
    assert kineto.incomplete_steps(tr.events) == []  # already dropped
    steps = set(tr.events.column("step").drop_null().to_pylist())
    assert steps == {1, 2, 3}
    # every complete event kept; the ProfilerStep#4 marker stays as a left-out step's marker (kind other,
    # step null), which only bounds the kept steps' windows
    assert tr.events.num_rows == 20
    m4 = tr.events.filter(pc.equal(tr.events.column("name").cast("string"), "ProfilerStep#4")).to_pylist()
    assert [(r["kind"], r["step"]) for r in m4] == [("other", None)]
    a = analyze_run(p, Options(no_cache=True))
    s = a.summary()
    assert s["run"]["steps"] == [1, 2, 3]
    codes = [f["code"] for f in s["findings"]]
    assert "PARTIAL_TRACE" in codes


def test_cut_before_trace_events_is_an_error(tmp_path):
    text, _ = text_with_offsets(kineto_doc(0, 1))
    p = write(tmp_path / "t.json", text[: text.index(b"traceEvents") - 3])
    with pytest.raises(BadTraceError, match=r"t\.json: not a valid Kineto JSON trace"):
        kineto.read(p, salvage=True)


def test_cli_exit_2_without_salvage_only_when_nothing_is_left(tmp_path):
    text, _ = text_with_offsets(kineto_doc(0, 1))
    write(tmp_path / "run" / "rank0.json", text[:40])
    r = cli("analyze", tmp_path / "run", "-o", tmp_path / "out", "--no-report")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "rank0.json" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not GLOO.exists(), reason="sample_traces/cpu-gloo-4rank absent")
def test_flight_recorder_json_cut_is_an_error_naming_the_file(tmp_path):
    raw = (GLOO / "flight_recorder" / "json" / "fr_trace_rank_0.json").read_bytes()
    p = write(tmp_path / "fr_trace_rank_0.json", cut(raw, 0.6))
    with pytest.raises(BadTraceError, match=r"fr_trace_rank_0\.json: invalid JSON"):
        flight_recorder.read(p)


def test_plugin_and_log_cut_keep_what_precedes_the_cut(tmp_path):
    # plugin: the events before the cut; the collective whose end was lost has no row
    p = write(tmp_path / "prof_987654321_2.json", PLUGIN_TEXT[: PLUGIN_TEXT.index('{"name": "Send"')])
    t = nccl_plugin.read(p)
    assert t.column("op").to_pylist() == ["allreduce"]
    # log: the lines before the cut (a gzip log cut mid-stream as well)
    whole = nccl_log.read(write(tmp_path / "a.log", LOG_TEXT))
    cut_at = LOG_TEXT.index("node07:31337:31337 [3] NCCL INFO Recv")
    part = nccl_log.read(write(tmp_path / "b.log", LOG_TEXT[:cut_at]))
    assert whole.num_rows == 3 and part.num_rows == 2
    gz = gzip.compress(LOG_TEXT.encode())
    t = nccl_log.read(write(tmp_path / "c.log.gz", gz[: len(gz) - 12]))
    assert 0 < t.num_rows <= 3


@pytest.mark.skipif(not GLOO.exists(), reason="sample_traces/cpu-gloo-4rank absent")
def test_a_cut_flight_recorder_dump_in_a_run_is_skipped_with_a_warning(tmp_path):
    """The Kineto analysis and the other dumps still count; the cut dump is named in run.warnings."""
    d = tmp_path / "run"
    d.mkdir()
    for r in range(2):
        write(d / f"rank{r}.json", kineto_doc(r, 2))
    fr = GLOO / "flight_recorder" / "json"
    write(d / "fr_trace_rank_0.json", (fr / "fr_trace_rank_0.json").read_bytes())
    write(d / "fr_trace_rank_1.json", cut((fr / "fr_trace_rank_1.json").read_bytes(), 0.5))
    s = analyze_run(d, Options(no_cache=True)).summary()
    assert s["run"]["ranks"] == [0, 1]
    assert any(
        w.startswith("skipped ") and "fr_trace_rank_1.json: invalid JSON" in w for w in s["run"]["warnings"]
    )
    whole = flight_recorder.read(fr / "fr_trace_rank_0.json").num_rows
    assert s["collectives"]["sources"]["flight_recorder"] == whole


def test_end_rule_on_a_time_ordered_cut(tmp_path):
    """Hand-built, written in time order: 3 steps of 1 ms, each a ProfilerStep, one op, two launches and their
    kernels (the last ending 0.1 ms before the step's end). A cut before step 3's second launch keeps no
    launch without its kernel, but step 3's last kernel starts 0.4 ms before its end against 0.3 ms in steps
    1-2 (whose ends later events show): step 3 is left out. The whole file keeps all three."""
    events = []
    for i in range(3):
        t0 = 1000.0 * i
        events += [
            x("user_annotation", f"ProfilerStep#{i + 1}", t0, 1000),
            x("cpu_op", "aten::mm", t0 + 10, 50),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 20, 5, correlation=10 * i),
            x("kernel", "gemm", t0 + 100, 400, pid=0, tid=7, device=0, stream=7, correlation=10 * i),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 30, 5, correlation=10 * i + 1),
            x("kernel", "gemm", t0 + 700, 200, pid=0, tid=7, device=0, stream=7, correlation=10 * i + 1),
        ]
    text, ends = text_with_offsets(kineto_doc(0, 1, events))
    whole = kineto.read(write(tmp_path / "whole.json", text))
    assert sorted(set(whole.events.column("step").drop_null().to_pylist())) == [1, 2, 3]
    p = write(tmp_path / "rank0.json", text[: ends[15] + 3])  # step 3: marker, op, first launch and kernel
    tr = kineto.read(p, salvage=True)
    assert tr.events.num_rows == 16
    assert sorted(set(tr.events.column("step").drop_null().to_pylist())) == [1, 2]
