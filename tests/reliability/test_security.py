"""Hostile inputs: trace strings never become markup, pickles never run code, gzip bombs are refused with an
overridable limit, no path written in a trace is opened, and the cache survives concurrent and corrupt use."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest
from broken_traces import (
    GLOO,
    LOG_TEXT,
    PLUGIN_TEXT,
    REPO,
    cli_inproc,
    kineto_doc,
    step_events,
    whitespace_bomb,
    write,
)

from tracelens.errors import BadTraceError
from tracelens.ingest import flight_recorder, kineto, nccl_log, nccl_plugin
from tracelens.ingest.kineto import stream as kineto_stream
from tracelens.run import load_tables
from tracelens.run_analysis import Options, analyze_run
from tracelens.store.arrays import read_arrays
from tracelens.store.cache import default_cache_dir, ipc_schema
from tracelens.store.results import exact_loads, read_tail
from tracelens.store.stages import read_stage_parts
from tracelens.views import ReportViews

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(2)">'
SVG = "</script><svg onload=alert(3)>"
QUOTE = "\"' onmouseover='alert(4)"


def _hostile_run(d: Path) -> Path:
    """Two ranks whose kernel names, host names, pg descriptions and other strings are markup."""
    for r in range(2):
        evs = step_events(kernel_name=SCRIPT)
        for e in evs:
            if "Collective name" in e.get("args", {}):
                e["args"]["Process Group Description"] = SVG
                e["args"]["Process Group Name"] = QUOTE
        evs[1]["name"] = IMG
        write(
            d / f"rank{r}.json",
            kineto_doc(
                r,
                2,
                evs,
                host_name=IMG,
                deviceProperties=[{"id": 0, "name": SCRIPT}],
                distributedInfo={
                    "rank": r,
                    "world_size": 2,
                    "backend": SVG,
                    "pg_config": {"0": {"desc": SVG}},
                },
            ),
        )
    return d


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_html_report_escapes_every_trace_string(tmp_path, capsys):
    d = _hostile_run(tmp_path / "run")
    out = tmp_path / "out"
    code, _, err = cli_inproc(capsys, "analyze", d, "-o", out, "--no-cache")
    assert code == 0, err
    page = (out / "report.html").read_text()
    s = json.loads((out / "summary.json").read_text())
    assert s["run"]["ranks"] == [0, 1]
    # the kernel name is shown (escaped), so the test would see it if it were not
    # (its short form in the top-kernels table, `<…>` for the template-like parts, and the whole name as
    # the cell's tooltip, escaped in the attribute too)
    assert (
        '<td class="name" title="&lt;script&gt;alert(1)&lt;/script&gt;">&lt;…&gt;alert(<wbr>1)&lt;…&gt;</td>'
        in page
    )
    assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in page  # in the embedded summary JSON
    _assert_no_markup(page)


def _assert_no_markup(page: str) -> None:
    for raw in (SCRIPT, IMG, SVG, "<svg onload", "<img src=x", 'onerror="alert', "onmouseover='alert"):
        assert raw not in page, raw
    p = _Tags()
    p.feed(page)
    names = {t for t, _ in p.tags}
    assert not names & {"img", "svg", "iframe", "object", "embed"}
    for tag, attrs in p.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    # a hostile string could only run inside a <script> it opened itself, which the checks above exclude;
    # within tracelens's own scripts (plotly, figures, embedded JSON) "<" is escaped as \\u003c
    for m in re.finditer(r"<script[^>]*>(.*?)</script>", page, flags=re.S):
        for bad in ("<script>alert", "<img src=x", "<svg onload", "</script><svg"):
            assert bad not in m.group(1)


def test_every_summary_string_is_escaped_in_the_report(tmp_path):
    """Whatever string of the summary the report shows (names, hosts, pg descriptions, warnings,
    findings), it shows escaped: every string value of a real summary is made hostile, then rendered."""
    from tracelens.report.html import write_report

    d = _hostile_run(tmp_path / "run")
    a = analyze_run(d, Options(no_cache=True))
    summary = a.summary()

    def poison(v, key=""):
        if isinstance(v, dict):
            return {k: poison(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [poison(x, key) for x in v]
        if isinstance(v, str) and key not in ("severity", "code", "schema"):
            return v + IMG + SCRIPT
        return v

    hostile = poison(summary)
    hostile["run"]["warnings"] = [IMG, SVG]
    write_report(hostile, tmp_path / "report.html", ReportViews(a))
    page = (tmp_path / "report.html").read_text()
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in page  # shown, escaped
    _assert_no_markup(page)


def test_pickle_only_through_the_restricted_unpickler(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    dump = {"version": "2.4", "pg_config": {}, "entries": [Evil()]}
    p = write(tmp_path / "run" / "fr_trace_rank_0", pickle.dumps(dump, protocol=4))
    write(tmp_path / "run" / "rank0.json", kineto_doc(0, 1))
    with pytest.raises(BadTraceError, match=r"fr_trace_rank_0: unsafe or invalid pickle \(refused global"):
        flight_recorder.read(p)
    # in a run, the dump is skipped and named (the Kineto analysis goes on)
    s = analyze_run(tmp_path / "run", Options(no_cache=True)).summary()
    assert any("fr_trace_rank_0: unsafe or invalid pickle (refused global" in w for w in s["run"]["warnings"])
    assert not marker.exists()
    # a plain-data pickle is fine
    ok = {"version": "2.4", "pg_config": {}, "entries": []}
    p2 = write(tmp_path / "fr2" / "fr_trace_rank_1", pickle.dumps(ok))
    assert flight_recorder.read(p2).num_rows == 0


def test_no_other_unpickling_in_the_code():
    """Static check: every pickle load in tracelens goes through a restricted unpickler (flight_recorder's;
    the local worker pool's `_Unpickler`, which admits only tracelens globals, paths and exceptions)."""
    pat = re.compile(
        r"pickle\.loads?\(|read_pickle\(|allow_pickle\s*=\s*True|cloudpickle|dill\.|joblib\.load"
    )
    # (kineto's split read hands its child's columns back as Arrow IPC and msgpack: no pickle either)
    hits = []
    for f in (REPO / "tracelens").rglob("*.py"):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if pat.search(line):
                hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert hits == []
    from tracelens.engine import executor

    with pytest.raises(pickle.UnpicklingError, match=r"refused global (os|posix)\.system"):
        executor._Unpickler(io.BytesIO(pickle.dumps(os.system))).load()


def test_gzip_bomb_is_refused_with_an_overridable_limit(tmp_path, monkeypatch, capsys):
    p = whitespace_bomb(tmp_path / "bomb" / "rank0.json.gz", 48 << 20)
    assert p.stat().st_size < 100_000
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(16 << 20))
    with pytest.raises(
        BadTraceError,
        match=r"rank0\.json\.gz: decompresses to more than 16777216 bytes; raise "
        "TRACELENS_MAX_DECOMPRESSED_BYTES",
    ):
        kineto.read(p)
    code, _, err = cli_inproc(capsys, "analyze", p, "-o", tmp_path / "out", "--no-cache")
    assert code == 2 and "decompresses to more than 16777216 bytes" in err and err.count("\n") == 1
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(1 << 30))  # the user says it is genuine
    assert kineto.read(p).events.num_rows == len(step_events())


def test_compression_ratio_limit(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACELENS_MAX_DECOMPRESSED_BYTES", raising=False)
    monkeypatch.setattr(
        kineto_stream, "RATIO_MIN_BYTES", 8 << 20
    )  # as beyond 1 GiB, but small enough for a test
    monkeypatch.setattr(kineto_stream, "MAX_RATIO", 100)
    p = whitespace_bomb(tmp_path / "rank0.json.gz", 32 << 20)
    with pytest.raises(BadTraceError, match=r"compression ratio above 100:1 \(decompression bomb\?\)"):
        kineto.read(p)


def test_bombs_in_the_other_formats(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(1 << 20))
    pad = b" " * (4 << 20)
    fr = write(tmp_path / "fr_trace_rank_0.json", b'{"version": "2.4", "entries": []' + pad + b"}", gz=True)
    pl = write(tmp_path / "prof_1_0.json", PLUGIN_TEXT.encode()[:-2] + pad + b"]", gz=True)
    lg = write(tmp_path / "nccl.log", LOG_TEXT.encode() + pad, gz=True)
    for read, p in ((flight_recorder.read, fr), (nccl_plugin.read, pl), (nccl_log.read, lg)):
        with pytest.raises(BadTraceError, match=f"{p.name}: decompresses to more than 1048576 bytes"):
            read(p)
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(64 << 20))
    assert flight_recorder.read(fr).num_rows == 0
    assert nccl_plugin.read(pl).num_rows == 2
    assert nccl_log.read(lg).num_rows == 3


def test_no_path_from_a_trace_is_ever_opened(tmp_path):
    canaries = [tmp_path / f"canary{i}" for i in range(8)]
    for c in canaries:
        c.write_text('{"traceEvents": []}')
    evs = step_events(kernel_name=str(canaries[0]))
    evs[1]["args"] = {"Input Dims": str(canaries[1]), "Call stack": f"{canaries[2]}(12): forward"}
    d = tmp_path / "run"
    write(
        d / "rank0.json",
        kineto_doc(
            0,
            1,
            evs,
            traceName=str(canaries[3]),
            host_name=str(canaries[4]),
            distributedInfo={"rank": 0, "world_size": 1, "pg_config": {"0": {"desc": str(canaries[5])}}},
            model=str(canaries[6]),
        ),
    )
    fr = json.loads((GLOO / "flight_recorder" / "json" / "fr_trace_rank_0.json").read_text())
    fr["entries"][0]["frames"] = [{"filename": str(canaries[7]), "line": 1, "name": "f"}]
    write(d / "fr_trace_rank_0.json", fr)
    opened: list[str] = []
    active = threading.Event()

    def hook(event, args):
        if active.is_set() and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # cannot be removed: it records only while `active` is set
    active.set()
    try:
        a = analyze_run(d, Options(no_cache=True))
        from tracelens.report.html import write_report

        summary = a.summary()
        write_report(summary, tmp_path / "out" / "report.html", ReportViews(a))
    finally:
        active.clear()
    assert any(o.endswith("rank0.json") for o in opened)  # the hook works
    for c in canaries:
        assert str(c) not in opened, c


def _copy_gloo(dst: Path) -> Path:
    shutil.copytree(GLOO / "traces", dst)
    return dst


@pytest.mark.skipif(not GLOO.exists(), reason="sample_traces/cpu-gloo-4rank absent")
def test_two_analyses_at_once_do_not_corrupt_the_cache(tmp_path):
    run = _copy_gloo(tmp_path / "run")
    code = (
        "import sys; from tracelens.run import load_tables; "
        "t = load_tables(sys.argv[1], workers=1); "
        "print(t.events.num_rows, t.metadata.column('events').to_pylist())"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-500:] for o in outs]
    assert outs[0][0] == outs[1][0]
    ref = load_tables(run, no_cache=True)
    assert outs[0][0].decode().split()[0] == str(ref.events.num_rows)
    # the cache holds complete entries only: no temporary files left, every file readable
    root = default_cache_dir()
    files = [f for f in root.rglob("*") if f.is_file()]
    assert files and not [f for f in files if f.name.endswith(".tmp")]
    for f in files:
        if f.parent.name == "memo":  # discovery's memo (JSON, written atomically like the rest)
            assert json.loads(f.read_text())["files"]
        elif f.name == "manifest.json":  # a run memo's manifest (store.runs), written last
            m = json.loads(f.read_text())  # (the cache may hold other runs' memos too)
            assert m["ranks"] and len(m["files"]) == 3 * len(m["ranks"])
        elif f.suffix == ".arrow":  # an entry's table or a run memo file (Arrow IPC)
            assert ipc_schema(f).names
        elif f.suffix == ".stage":  # a rank's stage file (store.stages)
            assert read_stage_parts(f)["sets"].schema.names
        elif f.name.startswith("graph-") and f.suffix == ".bin":  # a run memo's kept graph (store.arrays)
            assert read_arrays(f)[0]
        elif f.name.startswith("cross-") and f.suffix == ".json":  # its kept cross-rank result
            assert "findings" in exact_loads(f.read_text())
        elif f.name.startswith("whatif-") and f.suffix == ".json":  # its kept critical path and what-if
            assert read_tail(f.parent, f.stem[len("whatif-") :]) is not None
        else:
            raise AssertionError(f"unexpected file in the cache: {f}")
    assert load_tables(run).events.equals(ref.events)


@pytest.mark.skipif(not GLOO.exists(), reason="sample_traces/cpu-gloo-4rank absent")
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other_schema", "deleted"])
def test_a_corrupt_cache_entry_is_detected_and_rebuilt(tmp_path, damage):
    run = _copy_gloo(tmp_path / "run")
    first = load_tables(run, workers=1)
    victim = first.entries[2].events
    data = victim.read_bytes()
    if damage == "garbage":
        victim.write_bytes(b"ARROW1\0\0" + os.urandom(len(data) - 14) + b"ARROW1")
    elif damage == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        victim.write_bytes(b"")
    elif damage == "other_schema":
        import pyarrow as pa

        with pa.OSFile(str(victim), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
            w.write_table(pa.table({"x": [1, 2, 3]}))
    else:
        victim.unlink()
    again = load_tables(run, workers=1)
    assert again.events.equals(first.events)
    assert again.metadata.equals(first.metadata)
    assert ipc_schema(victim).equals(first.events.schema)  # rebuilt in place
