"""_columns reads the fields of a chunk's typed events in one pass (msgspec.structs.astuple, transposed:
_struct_columns) and pid / tid by their distinct values first (_int_values): each must give exactly what
reading every field with its own attribute lookup gives (the previous implementation, kept as the path of
loose events), on hand-built values and on real traces."""

from __future__ import annotations

import glob
from itertools import chain
from operator import attrgetter
from pathlib import Path

import pyarrow as pa
import pytest

from tracelens.ingest import kineto
from tracelens.ingest.kineto import columns, decode

REPO = Path(__file__).resolve().parents[2]
_REAL = sorted(
    chain(
        glob.glob(str(REPO / "sample_traces" / "*" / "*.json*"))[:4],
        glob.glob(str(REPO.parent / "shared" / "traces" / "hta" / "*" / "*.json*"))[:6],
    )
)


def _by_attribute(objs, fields):
    return [tuple(map(attrgetter(f), objs)) for f in fields]


def _events(path: str) -> list:
    import gzip

    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rb") as fh:
        top = decode._decode_top(fh.read())
    return list(top.traceEvents or [])


def _assert_same_chunk(a: columns._Chunk, b: columns._Chunk) -> None:
    assert a.n == b.n
    for f in ("kind", "ts", "ts_valid", "dur", "dur_valid", "coll_rows"):
        assert (getattr(a, f) == getattr(b, f)).all(), f
    for f in ("name", "pid", "tid", "device", "stream", "correlation", "external_id", "sequence_nr"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.type == y.type and x.equals(y), f
    assert a.coll == b.coll
    assert (a.mem is None) == (b.mem is None)


def test_struct_columns_are_the_attributes_of_each_struct():
    evs = [
        decode._Event(cat="kernel", name="k", pid=1, tid="x", args=decode._Args(external_id=3, device=0)),
        decode._Event(cat=None, name=None, pid=None, tid=2),
    ]
    got = columns._struct_columns(evs, columns._EV_FIELDS)
    assert got == _by_attribute(evs, columns._EV_FIELDS)
    args = got[-1]
    assert columns._struct_columns(args, columns._ARG_FIELDS) == _by_attribute(args, columns._ARG_FIELDS)


@pytest.mark.parametrize(
    "vals",
    [
        [7, 7, 8, 7, "Spans"],  # the typed decoders' pid/tid: ints and a last string
        [7, 7, 8, None, 7],
        [7, 7, 8, 7, 8],
        list(range(300)),  # not few distinct values
        list(range(300)) + ["0x10"],
        [2**70, 1, 1, 1],  # beyond int64: null
        [],
    ],
)
def test_int_values_lowcard_is_the_value_by_value_coercion(vals):
    want = columns._int_array(vals, pa.int64())
    got = columns._int_values(vals, pa.int64(), False, lowcard=True)
    assert got.type == want.type and got.to_pylist() == want.to_pylist()
    assert columns._int_values(tuple(vals), pa.int64(), False, lowcard=True).to_pylist() == want.to_pylist()


@pytest.mark.skipif(not _REAL, reason="no real traces here")
@pytest.mark.parametrize("path", _REAL, ids=[Path(p).parent.name + "/" + Path(p).name[:30] for p in _REAL])
def test_columns_on_real_traces_match_attribute_lookups(path, monkeypatch):
    evs = _events(path)
    if not evs:
        pytest.skip("no events")
    got = columns._columns(evs)
    # the previous implementation: one attribute lookup per field and event
    monkeypatch.setattr(columns, "_struct_columns", _by_attribute)
    want = columns._columns(evs)
    _assert_same_chunk(got, want)


@pytest.mark.skipif(not _REAL, reason="no real traces here")
def test_read_is_unchanged_by_the_one_pass_fields(monkeypatch):
    path = _REAL[0]
    got = kineto.read(path)
    monkeypatch.setattr(columns, "_struct_columns", _by_attribute)
    want = kineto.read(path)
    assert got.events.equals(want.events) and got.memory.equals(want.memory)
