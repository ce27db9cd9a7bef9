"""Kineto ingest, field by field, on hand-written traces (expected values computed by hand)."""

from __future__ import annotations

import copy
import gzip
from decimal import ROUND_HALF_UP, Decimal

import kineto_traces as kt
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest import kineto
from tracelens.ingest.kineto import scan as kscan

pytestmark = pytest.mark.usefixtures("decoder")  # each test on both chunk decoders (tests/conftest.py)

B = kt.BASE
REL = 5111733288000000  # ProfilerStep#7 start, ns relative to baseTimeNanoseconds


def _rows(table):
    return table.to_pylist()


@pytest.fixture(params=["json", "json.gz"])
def rank1(tmp_path, request):
    return kt.write(tmp_path / f"trace.{request.param}", kt.RANK1_DOC)


def test_schema_and_counts(rank1):
    tr = kineto.read(rank1)
    assert tr.events.schema.equals(schema.EVENTS)
    assert tr.memory.schema.equals(schema.MEMORY)
    assert tr.events.num_rows == 10  # every ph X event; M, s and i events are not events
    assert tr.memory.num_rows == 1


def test_fields_field_by_field(rank1):
    rows = _rows(kineto.read(rank1).events)
    by = {r["name"]: r for r in rows}
    step = by["ProfilerStep#7"]
    assert step["kind"] == "user_annotation"
    assert step["ts_ns"] == B + REL and step["dur_ns"] == 1_000_000
    assert step["rank"] == 1 and step["pid"] == 100 and step["tid"] == 100
    assert step["device"] is None and step["stream"] is None and step["step"] == 7

    mm = by["aten::mm"]
    assert mm["kind"] == "cpu_op"
    assert mm["ts_ns"] == B + 5111733288010123 and mm["dur_ns"] == 20456
    assert mm["external_id"] == 2 and mm["correlation"] is None and mm["step"] == 7
    assert mm["collective"] is None and mm["pg_ranks"] is None

    k = by["ampere_sgemm_128x64_tn"]
    assert k["kind"] == "kernel"
    assert k["ts_ns"] == B + 5111733289100500 and k["dur_ns"] == 300250
    assert (k["device"], k["stream"], k["correlation"], k["external_id"]) == (0, 7, 501, 2)
    # starts after the CPU step window closed (REL + 1 ms) but was launched inside it
    assert k["ts_ns"] > B + REL + 1_000_000
    assert k["step"] == 7

    launches = [r for r in rows if r["name"] == "cudaLaunchKernel"]
    assert [r["kind"] for r in launches] == ["cuda_runtime", "cuda_runtime"]
    assert [r["correlation"] for r in launches] == [501, 502]
    assert [r["dur_ns"] for r in launches] == [5002, 4000]

    memcpy = by["Memcpy HtoD (Pageable -> Device)"]
    assert memcpy["kind"] == "gpu_memcpy" and memcpy["device"] == 0 and memcpy["stream"] == 7
    assert memcpy["step"] == 7  # no launch with correlation 503: falls back to its own start

    trace = by["PyTorch Profiler (0)"]
    assert trace["kind"] == "other" and trace["pid"] is None and trace["tid"] is None

    assert by["aten::add"]["step"] is None  # after the last step window


def test_collective_fields(rank1):
    rows = _rows(kineto.read(rank1).events)
    rpc = next(r for r in rows if r["name"] == "record_param_comms")
    nccl = next(r for r in rows if r["name"].startswith("ncclDevKernel_AllReduce"))
    for r in (rpc, nccl):
        assert r["collective"] == "allreduce"
        assert r["pg_name"] == "0" and r["pg_desc"] == "default_pg"
        assert r["pg_ranks"] == [0, 1]
        assert r["group_size"] == 2 and r["seq"] == 12
        assert r["in_nelems"] == 1048576 and r["out_nelems"] == 1048576
        assert r["dtype"] == "BFloat16"
        assert r["src_rank"] is None and r["dst_rank"] is None
    assert nccl["kind"] == "kernel" and nccl["step"] == 7 and nccl["dur_ns"] == 150999
    assert (nccl["device"], nccl["stream"]) == (0, 20)
    assert rpc["kind"] == "cpu_op" and rpc["device"] is None


def test_memory_table(rank1):
    mem = _rows(kineto.read(rank1).memory)
    assert mem == [
        {
            "rank": 1,
            "ts_ns": B + 5111733288020500,
            "device": 0,
            "bytes": 524288,
            "total_allocated": 1048576,
            "total_reserved": 2097152,
        }
    ]


def test_metadata(rank1):
    md = kineto.read(rank1).metadata
    assert md["rank"] == 1 and md["world_size"] == 2 and md["backend"] == "nccl"
    assert md["host_name"] == "node7" and md["trace_id"] == "ABC123"
    assert md["base_time_ns"] == B
    assert md["gpu_name"] == "NVIDIA H100 80GB HBM3" and md["num_devices"] == 1
    assert md["events"] == 10 and md["salvaged"] is False and md["salvaged_fraction"] is None
    assert md["path"] == str(rank1)
    assert '"pg_desc":"default_pg"' in md["pg_config_json"]
    assert '"world_size":2' in md["distributed_info_json"]
    assert "H100" in md["device_properties_json"]
    assert kineto.metadata_table([md]).schema.equals(schema.METADATA)


def test_epoch_scale_three_decimals_exact(tmp_path):
    # 1712195495519689.047 µs = 1.7e18 ns, beyond float64's 2**53: must stay exact to the ns
    events = [
        kt.x("cpu_op", "a", "1712195495519689.047", "63.813"),
        kt.x("cpu_op", "b", "1712195495519689.048", "0.001"),
        kt.x("cpu_op", "c", "1712195495519695", "68.0"),  # integer µs and one decimal
    ]
    p = kt.write(tmp_path / "t.json", kt.doc(events=events))
    rows = _rows(kineto.read(p).events)
    assert [r["ts_ns"] for r in rows] == [1712195495519689047, 1712195495519689048, 1712195495519695000]
    assert [r["dur_ns"] for r in rows] == [63813, 1, 68000]
    assert float(Decimal("1712195495519689.047")) * 1000 != 1712195495519689047  # a float would be wrong


def test_string_pids_and_odd_values(tmp_path):
    events = [
        kt.x("cpu_op", "a", "1.000", "1.000", pid="host", tid="thread 7"),
        kt.x(
            "kernel", "k", "2.000", "1.000", pid=0, tid=3, stream="0x1f", device="1"
        ),  # ROCm-style hex stream
        kt.x("Kernel", "old", "3.000", "1.000", pid=1, tid=4),  # old capitalised cat, no args
        kt.x("Memcpy", "m", "4.000", "1.000"),
        kt.x("Runtime", "r", "5.000", "1.000"),
        kt.x("mtia_ccp_events", "dma", "6.000", "1.000"),
        kt.x("mtia_runtime", "launch", "7.000", "1.000"),
        kt.x("cuda_sync", "sync", "8.000", "1.000"),
        kt.x("python_function", "f", "9.000", "1.000"),
    ]
    rows = _rows(kineto.read(kt.write(tmp_path / "t.json", kt.doc(events=events))).events)
    assert rows[0]["pid"] is None and rows[0]["tid"] is None
    assert (rows[1]["device"], rows[1]["stream"]) == (1, 31)
    assert (rows[2]["kind"], rows[2]["device"], rows[2]["stream"]) == ("kernel", 1, 4)  # pid/tid convention
    assert [r["kind"] for r in rows[3:]] == [
        "gpu_memcpy",
        "cuda_runtime",
        "kernel",
        "cuda_runtime",
        "other",
        "python_function",
    ]


def test_kind_normalisation():
    assert kineto.normalise_kind("Kernel") == "kernel"
    assert kineto.normalise_kind("gpu_memset") == "gpu_memset"
    assert kineto.normalise_kind("Memset") == "gpu_memset"
    assert kineto.normalise_kind("cuda_driver") == "cuda_driver"
    assert kineto.normalise_kind("hip_runtime") == "cuda_runtime"
    assert kineto.normalise_kind("something_new") == "other"
    assert kineto.normalise_kind(None) == "other"


def test_pg_ranks_parsing():
    assert kineto.parse_pg_ranks("[0, 1, 2]") == [0, 1, 2]
    assert kineto.parse_pg_ranks("[]") == []
    assert kineto.parse_pg_ranks("[0, 1, 2, ..., 127]") is None  # truncated by the profiler
    assert kineto.parse_pg_ranks([4, 5]) == [4, 5]
    assert kineto.parse_pg_ranks("garbage") is None


def test_truncated_pg_ranks_and_p2p(tmp_path):
    args = {
        "Collective name": "send",
        "Process Group Ranks": "[0, 1, 2, 3, 4, ..., 63]",
        "Src Rank": 3,
        "Dst Rank": 4,
        "Seq": "9",
    }
    events = [kt.x("cpu_op", "record_param_comms", "1.000", "1.000", **args)]
    r = _rows(kineto.read(kt.write(tmp_path / "t.json", kt.doc(events=events))).events)[0]
    assert r["pg_ranks"] is None and r["src_rank"] == 3 and r["dst_rank"] == 4 and r["seq"] == 9


def test_no_base_time_and_rank_rules(tmp_path):
    p = kt.write(tmp_path / "run_rank_5.json", kt.doc(events=[kt.x("cpu_op", "a", "12.5", "1")]))
    tr = kineto.read(p)
    assert tr.metadata["rank"] == 5 and tr.metadata["base_time_ns"] is None
    assert tr.events.column("ts_ns").to_pylist() == [12500]
    assert kineto.read(p, rank=9).events.column("rank").to_pylist() == [9]
    q = kt.write(tmp_path / "plain.json", kt.doc())
    assert kineto.read(q).metadata["rank"] == 0


def test_distributed_info_after_trace_events(tmp_path):
    d = kt.doc(events=[kt.x("cpu_op", "a", "1.000", "1.000")])
    d["distributedInfo"] = {"rank": 3, "world_size": 4}  # written after traceEvents
    for name in ("t.json", "t.json.gz"):
        p = kt.write(tmp_path / name, d)
        assert kineto.read(p).metadata["rank"] == 3
        info = kineto.peek(p)
        assert info["rank"] == 3 and info["world_size"] == 4


def test_peek_head(rank1):
    info = kineto.peek(rank1)
    assert info["rank"] == 1 and info["world_size"] == 2 and info["backend"] == "nccl"
    assert info["base_time_ns"] == B


@pytest.mark.parametrize("chunk", [64, 300, 1000, 5000])
def test_chunked_decoding_matches_whole(tmp_path, chunk):
    events = copy.deepcopy(kt.RANK1_EVENTS)
    # a name holding the very separator the chunker cuts at, and nested objects in args
    events.append(
        kt.x("cpu_op", 'tricky "}, {" name', "5111733288500.000", "1.000", nested=[{"a": 1}, {"b": 2}])
    )
    events *= 20
    d = dict(kt.RANK1_DOC, traceEvents=events)
    for indent in (None, 2):
        p = kt.write(tmp_path / f"t{indent}.json", d, indent=indent)
        whole = kineto.read(p, chunk_bytes=1 << 30)
        parts = kineto.read(p, chunk_bytes=chunk)
        assert whole.events.num_rows == 11 * 20
        assert parts.events.equals(whole.events) or _rows(parts.events) == _rows(whole.events)
        assert _rows(parts.memory) == _rows(whole.memory)


def test_gzip_multi_member(tmp_path):
    text = kt.dumps(kt.RANK1_DOC).encode()
    p = tmp_path / "multi.json.gz"
    p.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    assert kineto.read(p).events.num_rows == 10


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"this is not json", "not"),
        (b'{"schemaVersion": 1}', "no traceEvents"),
        (b'{"traceEvents": []}', "empty"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}', "cut mid-write"),
    ],
)
def test_bad_traces(tmp_path, content, reason):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(BadTraceError, match=reason) as ei:
        kineto.read(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_corrupt_gzip(tmp_path):
    data = bytearray(gzip.compress(kt.dumps(kt.RANK1_DOC).encode()))
    data[len(data) // 2 : len(data) // 2 + 20] = b"\xff" * 20
    p = tmp_path / "c.json.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(BadTraceError, match="gzip|JSON|cut"):
        kineto.read(p)


def test_decompression_limit(tmp_path, monkeypatch):
    p = kt.write(tmp_path / "t.json.gz", kt.RANK1_DOC)
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", "1000")
    with pytest.raises(BadTraceError, match="TRACELENS_MAX_DECOMPRESSED_BYTES"):
        kineto.read(p)
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(10**9))
    assert kineto.read(p).events.num_rows == 10


def test_truncated_file_salvage(tmp_path):
    events = [kt.x("cpu_op", f"op{i}", f"{i}.000", "0.500") for i in range(200)]
    text = kt.dumps(kt.doc(rank=2, world_size=4, events=events)).encode()
    cut = text[: int(len(text) * 0.6)]
    for name, data in (
        ("t.json", cut),
        ("t.json.gz", gzip.compress(text)[: int(len(gzip.compress(text)) * 0.6)]),
    ):
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(BadTraceError, match="cut mid-write"):
            kineto.read(p, chunk_bytes=500)
        tr = kineto.read(p, salvage=True, chunk_bytes=500)
        n = tr.events.num_rows
        assert 50 < n < 200
        assert tr.events.column("name").to_pylist() == [
            f"op{i}" for i in range(n)
        ]  # complete events, in order
        assert tr.metadata["salvaged"] is True and 0 < tr.metadata["salvaged_fraction"] < 1
        assert tr.metadata["rank"] == 2


def _ref_ns(text: str) -> int:
    return int((Decimal(text) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(10**15), 9 * 10**15), st.integers(0, 999), st.sampled_from([0, 1, 2, 3, 4, 6])
        ),
        min_size=1,
        max_size=40,
    )
)
def test_parse_us_to_ns_matches_decimal(values):
    texts = []
    for ip, frac, nd in values:
        t = str(ip) if nd == 0 else f"{ip}.{str(frac).zfill(3)[:nd].ljust(nd, '7')}"
        texts.append(t)
    raws = [msgspec.Raw(t.encode()) for t in texts]
    want = np.array([_ref_ns(t) for t in texts], dtype=np.int64)
    for fn in (kineto.parse_us_to_ns, kineto.parse_us_to_ns_numpy):
        got, ok = fn(raws)
        assert ok.all()
        # beyond 3 decimals both round half-up; negative values round half away from zero in Decimal
        exact = np.array(
            [t.count(".") == 0 or len(t.split(".")[1]) <= 3 or not t.startswith("-") for t in texts]
        )
        assert (got[exact] == want[exact]).all(), (fn.__name__, texts)


def test_parse_us_to_ns_odd_texts():
    raws = [b"1.5", b"", b"null", b'"2.25"', b"1e3", b"99999999999999999999"]
    got, ok = kineto.parse_us_to_ns(raws)
    assert ok.tolist() == [True, False, False, True, True, False]
    assert got[ok].tolist() == [1500, 2250, 1_000_000]


def test_unknown_phases_and_odd_types_fall_back_to_the_loose_decoder(tmp_path):
    events = [
        {"ph": "Z", "name": "unknown phase", "ts": 1},
        {"name": "no phase at all"},
        kt.x("cpu_op", "kept", "2.000", "1.000"),
        {"ph": "X", "cat": "cpu_op", "name": 7, "ts": kt.Num("3.000"), "dur": kt.Num("1.000"), "args": None},
        {"ph": "i", "name": "[memory]", "ts": kt.Num("4.000"), "args": {"Bytes": 8.0, "Device Id": "0"}},
    ]
    tr = kineto.read(kt.write(tmp_path / "t.json", kt.doc(events=events)))
    assert tr.events.column("name").to_pylist() == ["kept", "7"]
    assert tr.events.column("ts_ns").to_pylist() == [2000, 3000]
    assert _rows(tr.memory)[0]["bytes"] == 8 and _rows(tr.memory)[0]["device"] == 0


def test_reference_cycle_holding_decoded_events_does_not_break_the_read(tmp_path, monkeypatch):
    """Raw timestamps reference the text they were decoded from; a reference cycle still holding a chunk's
    decoded events (the cyclic collector is paused while reading) does not break the read."""
    events = [kt.x("cpu_op", f"op{i}", f"{100 + i}.125", "0.500") for i in range(300)]
    p = kt.write(tmp_path / "rank0.json", kt.doc(rank=0, world_size=1, events=events))
    want = kineto.read(p, chunk_bytes=2048).events
    real = kscan._columns

    def leaky(evs):
        cycle = [evs]
        cycle.append(cycle)  # unreachable once this returns, but only the cyclic collector frees it
        return real(evs)

    monkeypatch.setattr(kscan, "_columns", leaky)  # (scan decodes the chunks)
    got = kineto.read(p, chunk_bytes=2048).events
    assert got.equals(want) and got.num_rows == 300


def test_decoded_events_held_from_outside_do_not_break_the_read(tmp_path, monkeypatch, decoder):
    """Something outside tracelens may hold a chunk's decoded events after the chunk is done: Dask's sampling
    profiler keeps the frames of a running task, with their locals, for a moment. The read went on resizing
    a buffer those raw timestamps were views of, and failed with "BufferError: memoryview has 4421 exported
    buffers" (CI, tests/integration/test_dask_engine.py); no garbage collection frees a live reference."""
    if decoder == "native":
        pytest.skip("msgspec's decoded events only: the compiled decoder keeps no view of the buffer")
    events = [kt.x("cpu_op", f"op{i}", f"{100 + i}.125", "0.500") for i in range(300)]
    p = kt.write(tmp_path / "rank0.json", kt.doc(rank=0, world_size=1, events=events))
    want = kineto.read(p, chunk_bytes=2048).events
    real = kscan._columns
    held: list = []

    def holding(evs):
        held.append(evs)  # a live reference, as a profiler's saved frame has
        return real(evs)

    monkeypatch.setattr(kscan, "_columns", holding)
    got = kineto.read(p, chunk_bytes=2048).events
    assert got.equals(want) and got.num_rows == 300
    assert len(held) > 5  # many chunks, each still held while the next were decoded
    raw_ts = held[0][0].ts
    assert isinstance(raw_ts, msgspec.Raw) and bytes(raw_ts) == b"100.125"  # still readable after the read


@pytest.mark.parametrize("salvage", [True, False])
def test_damaged_chunk_after_held_chunks_reads_as_without_holding(tmp_path, monkeypatch, salvage, decoder):
    """The main loop decodes each chunk from a view of its buffer and goes on with a new buffer: a damaged
    chunk (whose failed decode may leave views in its error's frames) is mended or cut from a copy, while
    the earlier chunks' events are still held from outside; results (or the error) are those of a read that
    holds nothing."""
    events = [kt.x("cpu_op", f"op{i}", f"{100 + i}.125", "0.500") for i in range(300)]
    p = kt.write(tmp_path / "rank0.json", kt.doc(rank=0, world_size=1, events=events))
    data = p.read_bytes()
    at = data.index(b'"op150"')
    p.write_bytes(data[:at] + b'"op150\x01' + data[at + 6 :])  # an invalid escape inside one event

    def read() -> object:
        try:
            return kineto.read(p, chunk_bytes=2048, salvage=salvage).events
        except BadTraceError as err:
            return str(err)

    if decoder == "native":
        pytest.skip("msgspec's decoded events only: the compiled decoder keeps no view of the buffer")
    want = read()
    real = kscan._columns
    held: list = []

    def holding(evs):
        held.append(evs)
        return real(evs)

    monkeypatch.setattr(kscan, "_columns", holding)
    got = read()
    assert len(held) > 3
    if salvage:
        assert not isinstance(want, str) and got.equals(want) and 290 <= want.num_rows < 300
    else:
        assert isinstance(want, str) and got == want
