"""Issue 19, items 2 and 4: salvage does not call incomplete steps complete, and every reader holds a
bounded amount of memory whatever the input (bombs fail fast or stream)."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from broken_traces import REPO, cli, kineto_doc

from tracelens.errors import BadTraceError
from tracelens.ingest import flight_recorder, kineto

SAMPLE = next((REPO / "sample_traces" / "h200-qwen35-block-seq4k").glob("*.json.gz"))


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[bytes, dict]:
    """The H200 sample's JSON and its per-step breakdown (the ground truth for its cut copies)."""
    raw = gzip.decompress(SAMPLE.read_bytes())
    d = tmp_path_factory.mktemp("full")
    (d / "run").mkdir()
    (d / "run" / "rank0.json").write_bytes(raw)
    r = cli("analyze", d / "run", "-o", d / "out", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    per_step = json.loads((d / "out" / "summary.json").read_text())["per_step"]
    return raw, {p["step"]: p for p in per_step}


# ---- item 2 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("share", [0.1, 0.3, 0.6, 0.9])
def test_cut_trace_reports_only_steps_it_covers(tmp_path, full, share):
    raw, truth = full
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json").write_bytes(raw[: int(len(raw) * share)])
    r = cli("analyze", run, "-o", tmp_path / "out", "--no-report", "--no-cache")
    if share <= 0.6:
        # launches and kernels of both steps are lost: no complete step, so nothing to analyze (the cut
        # trace's remains are not a whole window either): one line, exit 2
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "no usable input" in line and "rank0.json was cut mid-write" in line
        assert "no complete step left" in line
        assert not (tmp_path / "out" / "summary.json").exists()
        return
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    partial = [f for f in s["findings"] if f["code"] == "PARTIAL_TRACE"]
    assert partial and partial[0]["ranks"] == [0]
    assert partial[0]["steps_analyzed"] == [1]  # step 2 lost launches and kernels at the cut
    # the step it calls complete has exactly the whole trace's numbers
    (p,) = s["per_step"]
    for k in ("step_time_ms", "compute_ms", "memcpy_ms", "idle_ms"):
        assert p[k] == pytest.approx(truth[1][k], rel=1e-6, abs=1e-6), (share, k)


# ---- item 4 ------------------------------------------------------------------------------------------
def _peak_mb(code: str) -> tuple[str, float]:
    """Run `code` in a fresh interpreter; its output and peak RSS growth (MB) beyond the imports."""
    prog = (
        "import resource, sys\n"
        "from tracelens.ingest import kineto, flight_recorder, nccl_log\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n" + "".join("    " + line + "\n" for line in code.splitlines()) + "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "print('PEAK', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}
    )
    assert r.returncode == 0, r.stderr
    out, peak = r.stdout.rsplit("PEAK", 1)
    return out, float(peak)


def test_sparse_zero_file_fails_fast(tmp_path):
    p = tmp_path / "zeros.json"
    with open(p, "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB, sparse
    out, peak = _peak_mb(f"kineto.read({str(p)!r}, salvage=True)")
    assert "BadTraceError" in out and "not a JSON object" in out
    assert peak < 64, peak


def test_whitespace_padding_between_events_is_not_held(tmp_path):
    doc = json.dumps(kineto_doc(0, 1))
    at = doc.index("}, {") + 3
    pad = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    member = pad.compress(b" " * (64 << 20)) + pad.flush()
    p = tmp_path / "pad.json.gz"
    p.write_bytes(gzip.compress(doc[:at].encode()) + member * 4 + gzip.compress(doc[at:].encode()))  # 256 MiB
    out, peak = _peak_mb(f"tr = kineto.read({str(p)!r}, salvage=True)\nprint('ROWS', tr.events.num_rows)")
    want = kineto.read(_plain(tmp_path, doc)).events.num_rows
    assert f"ROWS {want}" in out
    assert peak < 96, peak  # was: the whole padding (256 MB here, 12 GB for the 46 MB gzip of the report)


def _plain(tmp_path: Path, doc: str) -> Path:
    p = tmp_path / "plain.json"
    p.write_text(doc)
    return p


def test_pickle_memo_bomb_is_refused(tmp_path):
    entry = {"record_id": 0, "pg_id": 0, "collective_seq_id": 1, "profiling_name": "nccl:all_reduce"}
    dump = {
        "version": "2.4",
        "pg_config": {},
        "entries": [entry] * 900_000,
    }  # one record, memoized (under the cap)
    p = tmp_path / "fr_trace_rank_0"
    p.write_bytes(pickle.dumps(dump, protocol=4))
    assert p.stat().st_size < 8 << 20
    with pytest.raises(BadTraceError, match="memo bomb"):
        flight_recorder.read(p)
    out, peak = _peak_mb(f"flight_recorder.read({str(p)!r})")
    assert "memo bomb" in out and peak < 256, peak


def test_flight_recorder_gzip_bomb_stops_at_its_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(flight_recorder, "MAX_BYTES", 32 << 20)
    d = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    p = tmp_path / "fr_trace_rank_0.json.gz"
    p.write_bytes(d.compress(b'{"version": "2.4", "entries": [' + b" " * (256 << 20)) + d.flush())
    with pytest.raises(BadTraceError, match="more than"):
        flight_recorder.read(p)


def test_nccl_log_streams_with_a_line_cap(tmp_path):
    d = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    line = b"host:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 4 datatype 7 op 0 root 0 comm 0xabc [nranks=2] stream 0x5\n"
    p = tmp_path / "nccl.log.gz"
    p.write_bytes(d.compress(line + b"x" * (512 << 20) + b"\n" + line) + d.flush())  # one 512 MiB line
    out, peak = _peak_mb(f"calls, inits, v = nccl_log.parse({str(p)!r})\nprint('CALLS', len(calls))")
    assert "CALLS 2" in out, out
    assert peak < 64, peak


def test_rank_that_lost_every_device_event_says_so(tmp_path):
    from broken_traces import step_events, text_with_offsets

    # Kineto order: CPU ops and launches first, device work after; the cut falls before any kernel
    evs = step_events(3)
    host = [e for e in evs if e["cat"] != "kernel"]
    text, ends = text_with_offsets(kineto_doc(0, 1, host + [e for e in evs if e["cat"] == "kernel"]))
    p = tmp_path / "run" / "rank0.json"
    p.parent.mkdir()
    p.write_bytes(text[: ends[len(host) - 1] + 3])
    tr = kineto.read(p, salvage=True)
    assert tr.metadata["salvaged"] is True and tr.metadata["device_events_lost"] is True
    assert tr.events.column("step").null_count == tr.events.num_rows  # no step called complete
    r = cli("analyze", p.parent, "-o", tmp_path / "out", "--no-report", "--no-cache")
    # nothing of the run is whole: one line naming why, exit 2, no summary
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert (
        "no usable input" in line
        and "every device event was lost" in line
        and "no complete step left" in line
    )
    assert not (tmp_path / "out" / "summary.json").exists()


def test_pickle_of_empty_records_is_refused_before_unpickling(tmp_path):
    """1 byte of pickle makes a 64-byte empty dict: 24 MB of them would take ~1 GB before the entries were
    counted. The container opcodes are counted in the bytes first."""
    p = tmp_path / "fr_trace_rank_0"
    p.write_bytes(pickle.dumps({"version": "2.4", "entries": [{} for _ in range(12_000_000)]}, protocol=4))
    out, peak = _peak_mb(f"flight_recorder.read({str(p)!r})")
    assert "more than 10,000,000 (not a Flight Recorder dump" in out, out
    assert peak < 96, peak  # the file's bytes (24 MB), not its objects
    real = REPO / "sample_traces" / "cpu-gloo-4rank" / "flight_recorder" / "pickle" / "fr_trace_rank_0"
    if real.exists():
        assert flight_recorder.read(real).num_rows > 0


@pytest.mark.parametrize("reader", ["flight_recorder", "nccl_plugin"])
def test_small_format_readers_fail_fast_on_non_trace_bytes(tmp_path, reader):
    p = tmp_path / "fr_trace_rank_0.json"
    with open(p, "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB of zeros, sparse
    mod = "from tracelens.ingest import nccl_plugin\n" if reader == "nccl_plugin" else ""
    call = "nccl_plugin.load_events" if reader == "nccl_plugin" else "flight_recorder.read"
    out, peak = _peak_mb(f"{mod}{call}({str(p)!r})")
    assert "BadTraceError" in out and "starts with b'\\x00'" in out, out
    assert peak < 32, peak  # was: the whole file (plugin) or its first 256 MiB (Flight Recorder)


def test_plugin_file_is_capped(tmp_path, monkeypatch):
    from tracelens.ingest import nccl_plugin

    monkeypatch.setattr(nccl_plugin, "MAX_BYTES", 1 << 20)
    p = tmp_path / "prof_1_0.json"
    p.write_text("[" + ", ".join(['{"name": "x", "ts": 1}'] * 100_000) + "]")
    with pytest.raises(BadTraceError, match="larger than 1 MiB"):
        nccl_plugin.load_events(p)
    g = tmp_path / "prof_1_1.json.gz"
    g.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(BadTraceError, match="decompresses to more than"):
        nccl_plugin.load_events(g)
