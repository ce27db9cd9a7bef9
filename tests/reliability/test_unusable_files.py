"""Unusable inputs: exit 2 with one line naming the file and the reason, no traceback without --debug.

Discovery is by content: in a folder, a file that is not a trace (a binary, notes, a config) is simply not
part of the run; a folder with nothing recognisable is "no trace files found". A file given directly is read
as a trace, so its own reason is reported.
"""

from __future__ import annotations

import gzip
import os

import pytest
from broken_traces import cli, cli_inproc, kineto_doc, run, write

from tracelens.errors import BadTraceError, NoTracesError
from tracelens.run import load_tables

CASES = {
    # name: (bytes, expected reason in the message)
    "empty.json": (b"", "empty file"),
    "notjson.json": (b"this is not json at all\n", "not a valid Kineto JSON trace"),
    "nokey.json": (b'{"schemaVersion": 1, "events": []}', "no traceEvents array"),
    "noevents.json": (b'{"traceEvents": []}', "traceEvents is empty"),
    "corrupt.json.gz": (b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + b"\xff" * 64, "corrupt gzip data"),
    "blob.bin": (bytes(range(256)) * 40, "not a valid Kineto JSON trace"),
    "array.json": (b"[1, 2, 3]", "not a valid Kineto JSON trace"),
    "events_not_list.json": (b'{"traceEvents": {"a": 1}}', "not a valid Kineto JSON trace"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_unusable_file_exit_2_naming_file_and_reason(tmp_path, capsys, name):
    data, reason = CASES[name]
    p = write(tmp_path / name, data)
    code, out, err = cli_inproc(capsys, "analyze", p, "-o", tmp_path / "out", "--no-report")
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tracelens: error: {p}: ")
    assert reason in lines[0]
    assert not (tmp_path / "out" / "summary.json").exists()


def test_gzip_of_junk_and_gzip_of_empty(tmp_path, capsys):
    p = write(tmp_path / "junk.json.gz", b"\x00\x01binary junk" * 100, gz=True)
    code, _, err = cli_inproc(capsys, "analyze", p, "-o", tmp_path / "o1")
    assert code == 2 and f"{p}: not a valid Kineto JSON trace" in err
    p = write(tmp_path / "nothing.json.gz", b"", gz=True)
    code, _, err = cli_inproc(capsys, "analyze", p, "-o", tmp_path / "o2")
    assert code == 2 and f"{p}: empty file" in err


def test_folder_with_no_traces(tmp_path, capsys):
    d = tmp_path / "junk"
    write(d / "blob.bin", bytes(range(256)) * 10)
    write(d / "notes.txt", "hello")
    write(d / "config.json", {"hidden_size": 4096})
    write(d / "empty.json", b"")
    code, _, err = cli_inproc(capsys, "analyze", d, "-o", tmp_path / "out")
    assert code == 2
    assert err.strip() == (
        f"tracelens: error: {d}: no trace files found in this folder (Kineto JSON, Flight Recorder, NCCL)"
    )
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(NoTracesError, match="empty_dir: no trace files found"):
        load_tables(tmp_path / "empty_dir")


def test_junk_next_to_good_traces_is_not_part_of_the_run(tmp_path):
    d = run(tmp_path / "run", 2, [0, 1])
    write(d / "core.bin", bytes(range(256)) * 10)
    write(d / "README.txt", "notes")
    write(d / "empty.json", b"")
    t = load_tables(d, no_cache=True)
    assert t.metadata.column("rank").to_pylist() == [0, 1]
    assert sorted(f.path.name for f in t.files) == ["rank0.json", "rank1.json"]


def test_corrupt_gzip_in_a_run_folder_is_an_error_naming_it(tmp_path):
    d = run(tmp_path / "run", 2, [0])
    write(d / "rank1.json.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(BadTraceError, match=r"rank1\.json\.gz: corrupt gzip data"):
        load_tables(d, no_cache=True)


def test_a_rank_with_unusable_content_in_a_run_names_it(tmp_path):
    """A file recognised as a trace but broken beyond salvage (no traceEvents array after its head)."""
    d = run(tmp_path / "run", 2, [0])
    write(d / "rank1.json", b'{"schemaVersion": 1, "traceEvents": 5}')
    with pytest.raises(BadTraceError, match=r"rank1\.json: "):
        load_tables(d, no_cache=True)


def test_missing_path(tmp_path, capsys):
    code, _, err = cli_inproc(capsys, "analyze", tmp_path / "nope", "-o", tmp_path / "out")
    assert code == 2 and err.strip() == f"tracelens: error: {tmp_path / 'nope'}: no such file or directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_unreadable_file(tmp_path, capsys):
    p = write(tmp_path / "rank0.json", kineto_doc())
    p.chmod(0)
    code, _, err = cli_inproc(capsys, "analyze", p, "-o", tmp_path / "out")
    assert code == 2 and str(p) in err


def test_no_traceback_without_debug_and_one_with_it(tmp_path):
    p = write(tmp_path / "bad.json.gz", gzip.compress(b"{not json"))
    r = cli("analyze", p, "-o", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"tracelens: error: {p}: not a valid Kineto JSON trace "
        "(JSON is malformed: object keys must be strings (byte 1))"
    ]
    r = cli("--debug", "analyze", p, "-o", tmp_path / "out")
    assert r.returncode == 2 and "Traceback" in r.stderr and r.stderr.strip().endswith("(byte 1))")
