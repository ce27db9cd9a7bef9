"""Issue 19, items 3, 7, 8 and 9: outputs never clobber inputs, exit 2 (not 3) for user-made problems,
int64 timestamp wrap, and files a user needs named (unreadable, BOM-prefixed, tracelens' own outputs)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from broken_traces import GLOO, REPO, cli, cli_inproc, kineto_doc, step_events, write, x

from tracelens.ingest import kineto

SAMPLE = next((REPO / "sample_traces" / "h200-qwen35-block-seq4k").glob("*.json.gz"))


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> Path:
    """A real summary.json (the gloo sample analyzed)."""
    out = tmp_path_factory.mktemp("sum")
    r = cli("analyze", GLOO / "traces", "-o", out, "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    return out / "summary.json"


# ---- item 3: no command writes over its inputs --------------------------------------------------------
def test_check_never_overwrites_its_baseline(tmp_path, summary):
    b = tmp_path / "b.json"
    shutil.copy(summary, b)
    before = b.read_bytes()
    r = cli("check", b, b, "-o", b)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is an input of this command" in r.stderr and "Traceback" not in r.stderr
    assert b.read_bytes() == before


def test_output_inside_an_input_folder_is_refused_even_with_force(tmp_path, summary):
    """Issue 42, item 2: an input folder is never written into, --force or not."""
    run = tmp_path / "run"
    shutil.copytree(GLOO / "traces", run)
    shutil.copy(summary, run / "summary.json")  # an older report kept in the run folder
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for extra in ([], ["--force"]):
        r = cli("analyze", run, "-o", run, "--no-report", "--no-cache", *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "inside the input folder" in line and "--force" not in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


# ---- issue 42, item 2: no output over a file tracelens read, with or without --force -------------------
@pytest.fixture
def gloo_run(tmp_path) -> tuple[Path, dict[str, bytes]]:
    """A copy of the gloo sample's traces (a real run) and its files' bytes."""
    run = tmp_path / "run"
    shutil.copytree(GLOO / "traces", run)
    return run, {p.name: p.read_bytes() for p in sorted(run.iterdir())}


def _untouched(run: Path, before: dict[str, bytes]) -> None:
    assert {p.name: p.read_bytes() for p in sorted(run.iterdir())} == before


@pytest.mark.parametrize("force", [False, True])
def test_no_command_writes_over_a_trace_it_reads(tmp_path, gloo_run, force):
    run, before = gloo_run
    trace = run / sorted(before)[0]
    extra = ["--force"] if force else []
    cases = [
        ("analyze", run, "-o", tmp_path / "out", "--json", trace, "--no-cache", "--no-report"),
        ("report", "export-trace", run, "-o", trace),
        ("ingest", run, "-o", run / "tables", "--no-cache"),
        ("compare", run, GLOO / "traces", "-o", run / "cmp"),
        ("analyze", trace, "-o", tmp_path / "out2", "--json", trace, "--no-cache", "--no-report"),
    ]
    for args in cases:
        if args[0] == "ingest" and not force:
            extra_args: list = []
        else:
            extra_args = extra
        r = cli(*args, *extra_args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("tracelens: error: ") and "write the output elsewhere" in line, line
        assert "use --force" not in line
        _untouched(run, before)
    assert not (tmp_path / "out").exists() or not (tmp_path / "out" / "summary.json").exists()


def test_an_output_linked_to_a_trace_is_refused(tmp_path, gloo_run):
    run, before = gloo_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").symlink_to(run / sorted(before)[0])
    r = cli("analyze", run, "-o", out, "--no-report", "--no-cache", "--force")
    assert r.returncode == 2 and "write the output elsewhere" in r.stderr, r.stderr
    _untouched(run, before)


def test_analyze_from_inside_the_run_folder_writes_beside_it(tmp_path, gloo_run):
    """`cd RUN && tracelens analyze .`: the default output folder is RUN/../reports/<run name>, not inside."""
    run, before = gloo_run
    r = cli("analyze", ".", "--no-report", "--no-cache", cwd=run)
    assert r.returncode == 0, r.stderr
    _untouched(run, before)
    s = json.loads((tmp_path / "reports" / "run" / "summary.json").read_text())
    assert s["run"]["world_size"] == 4
    # the same from a sub-folder of the run folder (the outermost input folder decides)
    sub = run / "sub"
    sub.mkdir()
    r = cli("analyze", "..", "--no-report", "--no-cache", cwd=sub)
    assert r.returncode == 0, r.stderr
    assert list(sub.iterdir()) == []


# ---- item 7: exit 2, checked before the analysis -----------------------------------------------------
def test_output_at_an_existing_file_or_unwritable_is_exit_2_before_analysis(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = cli("analyze", GLOO / "traces", "-o", f, "--no-report", "--no-cache")
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr
    r = cli("analyze", GLOO / "traces", "-o", tmp_path / "o", "--json", f / "s.json", "--no-cache")
    assert r.returncode == 2 and "cannot write" in r.stderr
    assert not (tmp_path / "o" / "summary.json").exists()  # refused before the analysis wrote anything


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: s.update(mfu={"value": "high"}), "mfu.value"),
        (lambda s: s.update(stragglers=[{"rank": [1], "cause": "compute"}]), "stragglers[0].rank"),
        (lambda s: s["ranks"][0].update(step_time_ms="slow"), "ranks[0].step_time_ms"),
    ],
)
def test_wrongly_typed_summary_fields_are_exit_2(tmp_path, summary, change, field):
    s = json.loads(summary.read_text())
    change(s)
    bad = tmp_path / "summary.json"
    bad.write_text(json.dumps(s))
    for cmd in (("check", summary, bad), ("compare", summary, bad, "-o", tmp_path / "cmp")):
        r = cli(*cmd)
        assert r.returncode == 2, (cmd, r.stderr)
        assert field in r.stderr and "internal error" not in r.stderr


def test_schema_only_summary_is_not_a_baseline(tmp_path, summary):
    only = tmp_path / "only.json"
    only.write_text('{"schema": "tracelens.summary/1"}')
    r = cli("check", only, summary)
    assert r.returncode == 2 and "not a complete tracelens summary" in r.stderr


def test_deep_json_is_exit_2_everywhere(tmp_path, summary):
    deep = "[" * 5000 + "]" * 5000
    k = write(
        tmp_path / "k.json",
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"x": ' + deep + "}}]}",
    )
    r = cli("analyze", k, "-o", tmp_path / "o1", "--no-report", "--no-cache")
    assert r.returncode == 2 and "nested too deeply" in r.stderr
    s = write(tmp_path / "s.json", '{"schema": "tracelens.summary/1", "x": ' + deep + "}")
    r = cli("check", summary, s)
    assert r.returncode == 2, r.stderr
    # in a run folder a deep Flight Recorder dump is skipped and named, the run analyzed
    run = tmp_path / "run"
    shutil.copytree(GLOO / "traces", run)
    write(run / "fr_trace_0.json", '{"version": "2.4", "pg_config": {}, "entries": ' + deep + "}")
    r = cli("analyze", run, "-o", tmp_path / "o2", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    warns = json.loads((tmp_path / "o2" / "summary.json").read_text())["run"]["warnings"]
    assert any("fr_trace_0.json" in w and "nested too deeply" in w for w in warns)


def test_special_file_given_directly_is_one_line(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    r = cli("analyze", fifo, "-o", tmp_path / "o")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a regular file" in r.stderr


def test_negative_seq_len_is_rejected(capsys):
    code, _, err = cli_inproc(capsys, "analyze", GLOO / "traces", "--seq-len", "-5", "-o", "/tmp/unused")
    assert code == 2 and "--seq-len -5" in err


# ---- item 8: int64 wrap ------------------------------------------------------------------------------
def test_timestamps_beyond_int64_are_dropped_and_counted(tmp_path):
    evs = step_events(2)
    evs += [
        x("kernel", "late_a", 7.5e15, 5.0, pid=0, tid=7),
        x("kernel", "late_b", 9.2e15, 5.0, pid=0, tid=7),
    ]
    p = write(tmp_path / "rank0.json", kineto_doc(0, 1, evs))
    tr = kineto.read(p)
    names = tr.events.column("name").cast("string").to_pylist()
    assert "late_a" not in names and "late_b" not in names
    assert tr.metadata["dropped_events"] == 2
    assert min(tr.events.column("ts_ns").to_pylist()) > 0  # nothing wrapped to a negative time
    r = cli("analyze", tmp_path, "-o", tmp_path.parent / f"{tmp_path.name}-o", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    f = [
        f
        for f in json.loads((tmp_path.parent / f"{tmp_path.name}-o" / "summary.json").read_text())["findings"]
        if f["code"] == "PARTIAL_TRACE"
    ]
    assert f and f[0]["dropped_events"] == 2


# ---- item 9: files a user needs named ----------------------------------------------------------------
def test_bom_prefixed_trace_is_read(tmp_path):
    raw = gzip.decompress(SAMPLE.read_bytes())
    clean = kineto.read(write(tmp_path / "a.json", raw))
    for gz in (False, True):
        p = write(tmp_path / f"bom{int(gz)}.json", b"\xef\xbb\xbf" + raw, gz=gz)
        from tracelens.ingest.sniff import detect_format

        assert detect_format(p) == "kineto"
        assert kineto.read(p).events.num_rows == clean.events.num_rows


def test_gzip_with_trailing_garbage_after_a_whole_member(tmp_path):
    raw = gzip.decompress(SAMPLE.read_bytes())
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(raw, 1) + b"trailing garbage, not gzip\n" * 100)
    ref = kineto.read(write(tmp_path / "a.json", raw))
    for salvage in (False, True):
        tr = kineto.read(p, salvage=salvage)
        assert tr.events.num_rows == ref.events.num_rows and tr.metadata["salvaged"] is False


def test_own_outputs_and_unreadable_files_in_a_run_folder_are_named(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(GLOO / "traces", run)
    r = cli("report", "export-trace", run, "-o", tmp_path / "merged.json")
    assert r.returncode == 0, r.stderr
    shutil.copy(tmp_path / "merged.json", run / "merged.json")  # a user keeps it beside the traces
    (run / "rank9.json").symlink_to(tmp_path / "gone.json")  # a dangling link: cannot be read
    r = cli("analyze", run, "-o", tmp_path / "o", "--no-report", "--no-cache")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["run"]["ranks"] == [0, 1, 2, 3]
    warns = s["run"]["warnings"]
    assert any("merged.json" in w and "written by tracelens" in w for w in warns)
    assert any("rank9.json" in w and "cannot read" in w for w in warns)
