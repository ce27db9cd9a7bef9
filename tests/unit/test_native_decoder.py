"""The compiled chunk decoder (tracelens.ingest.kineto.native) against the Python decoders it stands in for:
on every chunk of every real trace (the bundled samples and ../shared/traces), on generated events with odd
values, and on damaged chunks, it gives the Python path's columns exactly or leaves the chunk to it (None);
never columns where msgspec finds an error. Whole reads agree table for table."""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelens.ingest import kineto
from tracelens.ingest.kineto import columns, native
from tracelens.ingest.kineto.decode import _decode_events, _Hint
from tracelens.ingest.kineto.stream import _TE_KEY, _last_boundary

pytestmark = pytest.mark.skipif(native._native is None, reason="the compiled decoder is not built")

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "traces"


def _kineto_files(root: Path) -> list[Path]:
    out = []
    for f in sorted(root.rglob("*.json*")):
        if f.suffix not in (".json", ".gz") or "flight" in f.parts[-2] or f.name == "truth.json":
            continue
        with gzip.open(f) if f.suffix == ".gz" else open(f, "rb") as fh:
            head = fh.read(1 << 16)
        if b'"traceEvents"' in head or b'"schemaVersion"' in head:
            out.append(f)
    return out


def _text(f: Path) -> bytes:
    return gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()


def _chunks(text: bytes, size: int = 1 << 20) -> list[bytes]:
    """The file's `traceEvents` cut as the reader cuts it: JSON arrays of whole events, ~`size` bytes each."""
    m = _TE_KEY.search(text)
    if m is None:
        return []
    buf = bytearray(text[m.end() - 1 :])
    out = []
    while len(buf) > 2:
        cut = _last_boundary(buf, 1, min(len(buf), size))
        if cut is None:
            break
        out.append(bytes(buf[: cut[0]]) + b"]")
        buf = buf[cut[1] - 1 :]
        buf[0] = 91
    return out


def _python(part: bytes) -> columns._Chunk | Exception:
    try:
        return columns._columns(_decode_events(part, _Hint(), False))
    except msgspec.DecodeError as err:
        return err


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, pa.Array):
        assert isinstance(b, pa.Array) and a.type == b.type, (where, a.type, getattr(b, "type", b))
        assert a.to_pylist() == b.to_pylist(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, (where, a, b)


def _agree(part: bytes) -> bool:
    """Checks the compiled decoder against the Python path on one chunk; True when it took the chunk."""
    got = native.scan(part)
    want = _python(part)
    if got is None or got[1] != len(part):  # (the reader takes a chunk only when its array ends the text)
        return False
    assert not isinstance(want, Exception), f"the compiled decoder took a chunk msgspec refuses: {want}"
    chunk = got[0]
    for f in columns._Chunk.__dataclass_fields__:
        _same(getattr(chunk, f), getattr(want, f), f)
    return True


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    monkeypatch.setattr(native, "AVAILABLE", True)


def _files() -> list[Path]:
    return _kineto_files(SAMPLES) + (_kineto_files(SHARED) if SHARED.is_dir() else [])


def test_every_chunk_of_every_real_trace_agrees():
    """Every chunk of the bundled samples and of ../shared/traces (when present): the compiled decoder takes
    it (none is left to msgspec on these files: string pids, ids written as hex strings, 16-digit timestamps,
    metadata-only chunks and collectives included) and its columns are the Python path's."""
    files = _files()
    assert len(files) >= 8
    taken = total = 0
    for f in files:
        for part in _chunks(_text(f)):
            total += 1
            taken += _agree(part)
    assert total >= 20 and taken == total, f"{total - taken} of {total} chunks left to msgspec"


@pytest.mark.parametrize(
    "f", _files()[:8] + ([] if not SHARED.is_dir() else _kineto_files(SHARED)[::6]), ids=str
)
def test_whole_read_is_the_python_reads(f, monkeypatch):
    """`kineto.read` with the compiled decoder gives the tables of a read with the Python decoders."""
    got = kineto.read(f, salvage=True)
    monkeypatch.setattr(native, "AVAILABLE", False)
    want = kineto.read(f, salvage=True)
    assert got.events.equals(want.events) and got.memory.equals(want.memory)
    assert got.metadata == want.metadata


def test_lone_values_the_python_path_coerces():
    """Values outside the common case: taken and coerced as the Python path does, or left to it."""
    cases = [
        b'[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":"stream 7","ts":1.5,"dur":2,"args":{"stream":"0x1f"}}]',
        b'[{"ph":"X","name":"n","pid":"Spans","tid":"PyTorch Profiler","ts":-0.0005,"dur":1.00049,"args":{}}]',
        b'[{"ph":"X","cat":null,"name":null,"ts":1669783687391640,"dur":null}]',
        b'[{"ph":"X","cat":"Kernel","name":"\xc3\xa9t\xc3\xa9","ts":9223372036854775,"dur":0.807}]',
        b'[{"ph":"i","name":"[memory]","ts":5,"args":{"Bytes":"12","Device Id":0}},{"ph":"M","pid":"x"}]',
        b'[{"ts":1,"ph":"X","args":{"Collective name":"allreduce","Process Group Ranks":"[0, 1]","Seq":3}}]',
        b'[{"ph":"X","name":"record_param_comms","ts":1,"args":{"Input Dims":[[4, 8]],"Input type":["float"]}}]',
        # (found by the generated events below: a null name beside a communication op's)
        b'[{"ph":"X"},{"ph":"X","name":"record_param_comms"}]',
        # args read once with the event (scan_object): an escaped key in the args of a phase not read is only
        # JSON to check, as a repeated args key there is
        b'[{"ph":"M","name":"thread_name","args":{"na\\u006de":"x"}},{"ph":"X","ts":1,"args":{"grid":[1]}}]',
        b'[{"ph":"s","args":{"a":1},"args":{"b":[2]}},{"ph":"X","ts":1,"args":{"stream":7}}]',
    ]
    for c in cases:
        assert _agree(c), c
    left = [
        b'[{"ph":"X","ts":1e3}]',  # an exponent
        b'[{"ph":"X","ts":92233720368547758.07}]',  # beyond int64 ns
        b'[{"ph":"X","ts":1,"pid":1.0}]',  # a float id
        b'[{"ph":"X","ts":1,"ts":2}]',  # a key twice
        b'[{"ph":"X","name":"a\\"b","ts":1}]',  # an escaped name
        b'[{"ph":"X","ts":1,"args":{"Process Group Ranks":[0,1]}}]',  # a list msgspec checks
        b'[{"ph":"Z","ts":1}]',  # an unknown phase
        b'[{"ts":1}]',  # no phase
        b'[{"ph":"X","ts":1,"args":null}]',
        b'[{"ph":"X","ts":01}]',  # not JSON
        b'[{"ph":"X","name":"a\x01","ts":1}]',  # a control character
        b'[{"ph":"X","name":"\xff","ts":1}]',  # not UTF-8
        b'[{"ph":"X","ts":1},]',
        b'[{"ph":"X","ts":1,"args":{"Exter\\u006eal id":3}}]',  # an escaped args key of a complete event
        b'[{"ph":"i","name":"[memory]","ts":1,"args":{"B\\u0079tes":3}}]',  # ... of an instant event
        b'[{"ph":"X","ts":1,"args":{},"args":{"stream":1}}]',  # args twice
        b'[{"ph":"X","ts":1,"args":{"stream":1,"stream":2}}]',  # an args key twice
        b'[{"ph":"M","args":{"a":[1,}}]',  # broken JSON in the args of a phase not read
    ]
    for c in left:
        assert native.scan(c) is None, c
        _agree(c)


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["0x1f", "7", " 12 ", "Spans", "1e3", "[0, 1]", "…", 'a"b', "\\"]),
)
_ts = st.one_of(
    st.none(),
    st.integers(-(10**17), 10**17),
    st.decimals(min_value=-(10**16), max_value=10**16, places=5, allow_nan=False, allow_infinity=False),
    st.sampled_from(["1.5", "x"]),
)
_args = st.dictionaries(
    st.sampled_from(
        [
            "External id",
            "Sequence number",
            "device",
            "stream",
            "correlation",
            "Collective name",
            "Process Group Name",
            "Process Group Ranks",
            "Group size",
            "Seq",
            "In msg nelems",
            "dtype",
            "Input Dims",
            "Device Id",
            "Bytes",
            "Total Allocated",
            "Total Reserved",
            "grid",
            "other",
        ]
    ),
    st.one_of(_scalar, st.lists(st.integers(0, 9), max_size=3)),
    max_size=6,
)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "I", "s", "f", "M", "Q"])},
    optional={
        "cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "Runtime", "gpu_memcpy"]), _scalar),
        "name": st.one_of(st.sampled_from(["[memory]", "ncclKernel", "record_param_comms", "k"]), _scalar),
        "pid": _scalar,
        "tid": _scalar,
        "ts": _ts,
        "dur": _ts,
        "args": st.one_of(_args, st.none()),
    },
)


def _json(v: object) -> str:
    from decimal import Decimal

    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, dict):
        return "{" + ", ".join(f"{msgspec.json.encode(k).decode()}: {_json(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_json(x) for x in v) + "]"
    return msgspec.json.encode(v).decode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, min_size=1, max_size=12))
def test_generated_events_agree_or_are_left_to_msgspec(events):
    _agree(("[" + ",\n ".join(_json(e) for e in events) + "]").encode())


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_damaged_chunks_agree_or_are_left_to_msgspec(data):
    """A byte of a real chunk replaced, deleted or duplicated: never columns where msgspec finds an error,
    and the Python path's columns where the compiled decoder takes the chunk."""
    part = _SMALL_CHUNK
    at = data.draw(st.integers(0, len(part) - 2))
    how = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    byte = data.draw(st.sampled_from(list(b'"\\{}[],:0.-e \x00\xc3\xff') + [ord("a")]))
    if how == "replace":
        part = part[:at] + bytes([byte]) + part[at + 1 :]
    elif how == "delete":
        part = part[:at] + part[at + 1 :]
    else:
        part = part[:at] + bytes([byte]) + part[at:]
    _agree(part)


def _small_chunk() -> bytes:
    """The first ~12 KB of events of the bundled H200 trace (kernels, launches, cpu ops, flows, memory)."""
    f = next(iter(sorted(SAMPLES.glob("h200-*/*.json.gz"))))
    return _chunks(_text(f), 12 * 1024)[3]


_SMALL_CHUNK = _small_chunk()


def test_last_piece_with_a_second_trace_events_key_reads_as_the_python_path(tmp_path, monkeypatch):
    """The file's last piece is the array, its `]` and the keys after it: a second `traceEvents` key there
    (msgspec keeps the last value) is left to the Python path, which reads what it always read."""
    p = tmp_path / "rank0.json"
    a, b = ('{"ph": "X", "cat": "kernel", "name": "' + n + '", "ts": 1, "dur": 2}' for n in "ab")
    p.write_text('{"traceEvents": [' + a + '], "traceEvents": [' + b + "]}")
    got = kineto.read(p).events.column("name").to_pylist()
    monkeypatch.setattr(native, "AVAILABLE", False)
    assert got == kineto.read(p).events.column("name").to_pylist() == ["b"]
