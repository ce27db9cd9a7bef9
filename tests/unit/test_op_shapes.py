"""`ingest.op_shapes.read`: the one-decode path gives exactly the event-by-event path's rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tracelens.ingest import op_shapes as S

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"


def _op(ext, dims, types=None, concrete=None, cat="cpu_op", name="aten::mm"):
    args = {"External id": ext, "Input Dims": dims}
    if types is not None:
        args["Input type"] = types
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": cat, "name": name, "ts": 1, "dur": 2, "args": args}


def _write(tmp_path: Path, events: list, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events}, indent=1))  # indented: the raw text has spaces
    return p


def test_rows_by_hand(tmp_path):
    ev = [
        _op(7, [[2, 3], [3, 4]], ["float", "float"], ["", ""]),
        _op("8", [[5]], None, None, name="aten::relu"),  # External id as text
        _op(9, [[1]], cat="user_annotation"),  # not a cpu op
        _op(True, [[1]]),  # not an id
        _op(10, "[[1]]"),  # dims that are not a list
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"External id": 7}},
        _op(7, [[2, 3], [3, 4]], ["float", "float"], ["", ""]),  # the same shapes again (one text)
    ]
    t = S.read(_write(tmp_path, ev))
    assert t.to_pydict() == {
        "external_id": [7, 8, 7],
        "name": ["aten::mm", "aten::relu", "aten::mm"],
        "input_dims": ["[[2,3],[3,4]]", "[[5]]", "[[2,3],[3,4]]"],
        "input_types": ['["float","float"]', None, '["float","float"]'],
        "concrete_inputs": ['["",""]', None, '["",""]'],
    }
    assert t.equals(S._read_loose(S._text(tmp_path / "t.json")))


def test_args_that_are_not_an_object_fall_back_event_by_event(tmp_path):
    ev = [_op(1, [[4]]), {"ph": "X", "cat": "cpu_op", "name": "odd", "ts": 1, "dur": 1, "args": [1, 2]}]
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    t = S.read(p)
    assert t.column("external_id").to_pylist() == [1]
    assert t.column("input_dims").to_pylist() == ["[[4]]"]


def test_unreadable_file_is_empty(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"traceEvents": [ {"ph": ')
    assert S.read(p).num_rows == 0


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is absent")
def test_real_traces_equal_the_event_by_event_read():
    # the smaller real traces (the loose read is slow) and one rank of each bundled sample run
    files = sorted(
        p
        for p in SHARED.rglob("*.json*")
        if p.is_file() and p.stat().st_size < 1_000_000 and not p.name.endswith((".pkl", ".log"))
    )
    files += [sorted(d.rglob("*.pt.trace.json*"))[0] for d in sorted((ROOT / "sample_traces").iterdir())
              if d.is_dir() and any(d.rglob("*.pt.trace.json*"))]  # fmt: skip
    assert len(files) > 20
    with_shapes = 0
    for p in files:
        try:
            text = S._text(p)
        except (OSError, EOFError, ValueError):
            continue
        fast = S.read(p)
        assert fast.equals(S._read_loose(text)), p
        with_shapes += fast.num_rows > 0
    assert with_shapes >= 5


def test_key_spelled_with_an_escape_is_still_read(tmp_path):
    # the quick "no shape key in the text" test must not skip a key written with a JSON escape
    text = json.dumps({"traceEvents": [_op(3, [[2, 2]])]}).replace("Input Dims", "Input\\u0020Dims")
    assert "Input Dims" not in text
    p = tmp_path / "t.json"
    p.write_text(text)
    t = S.read(p)
    assert t.column("external_id").to_pylist() == [3]
    assert t.column("input_dims").to_pylist() == ["[[2,2]]"]


def test_trace_without_shapes_is_empty(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "args": {"External id": 1}}]
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": ev, "name": 'a\\"b'}).encode()))
    t = S.read(p)
    assert t.num_rows == 0 and t.schema == S.OP_SHAPES


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is absent")
def test_small_pieces_equal_the_whole_document(monkeypatch):
    """The streamed read in pieces (a few KB here, so that every file is cut many times, also inside the
    header, the args and the gzip blocks) gives the whole document's rows."""
    files = sorted(
        p
        for p in SHARED.rglob("*.json*")
        if p.is_file() and p.stat().st_size < 3_000_000 and not p.name.endswith((".pkl", ".log"))
    )
    assert len(files) > 20
    monkeypatch.setattr(S, "PIECE_BYTES", 4096)
    with_shapes = 0
    for p in files:
        got = S.read(p)
        assert got.equals(S._read_whole(p)), p
        with_shapes += got.num_rows > 0
    assert with_shapes >= 5


def test_pieces_hold_a_bounded_part_of_the_text(tmp_path, monkeypatch):
    """A trace of many events with shapes is decoded one piece at a time: no decode sees more than a
    piece (and the event that crosses its end)."""
    ev = [_op(i, [[i % 7 + 1, 3]], ["float"], [""]) for i in range(3000)]
    p = _write(tmp_path, ev)
    sizes: list[int] = []
    real = S._DEC_FAST.decode

    class Spy:
        def decode(self, text):
            sizes.append(len(text))
            return real(text)

    monkeypatch.setattr(S, "_DEC_FAST", Spy())
    monkeypatch.setattr(S, "PIECE_BYTES", 20_000)
    t = S.read(p)
    assert t.column("external_id").to_pylist() == list(range(3000))
    assert len(sizes) > 10 and max(sizes) < 20_000 + 1_000
    assert p.stat().st_size > 10 * 20_000
