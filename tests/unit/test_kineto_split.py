"""Split reads (one large file decoded by two processes): the result must be identical to the serial read.

The size threshold is lowered so that small hand-built traces are split; each test checks that the split
was really used (or, where the layout forbids it, that it was refused) and compares every column with a
serial read of the same file.
"""

from __future__ import annotations

import gzip
import os
import threading

import kineto_traces as kt
import pytest

from tracelens.errors import BadTraceError
from tracelens.ingest import kineto
from tracelens.ingest.kineto import columns, decode, reader, scan, split, stream

pytestmark = pytest.mark.usefixtures("decoder")  # each test on both chunk decoders (tests/conftest.py)


def _events(n: int, fractional: bool) -> list:
    """n steps of a CPU op, a launch and its kernel, a collective kernel, a memory event and flow events;
    some names hold `}, {` (the split boundary search must not be fooled by them)."""
    evs: list = [{"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "spans"}}]
    for i in range(n):
        t0 = 1000 * i

        def us(v: float) -> str:
            return f"{v:.3f}" if fractional else str(int(v))

        evs.append(kt.x("user_annotation", f"ProfilerStep#{i}", us(t0 + 0.125), us(900.5)))
        evs.append(
            kt.x("cpu_op", 'odd }, {"name": "x' if i % 7 == 0 else "aten::mm", us(t0 + 1.5), us(20.25))
        )
        evs.append(kt.x("cuda_runtime", "cudaLaunchKernel", us(t0 + 2), us(3), correlation=10 + i))
        evs.append(
            kt.x(
                "kernel",
                "sgemm}, {",
                us(t0 + 50.001),
                us(100),
                pid=0,
                tid=7,
                device=0,
                stream=7,
                correlation=10 + i,
            )
        )
        if i % 5 == 0:
            evs.append(
                kt.x(
                    "kernel",
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                    us(t0 + 200),
                    us(300),
                    pid=0,
                    tid=20,
                    device=0,
                    stream=20,
                    **{
                        "Collective name": "allreduce",
                        "Process Group Name": "0",
                        "Process Group Ranks": "[0, 1]",
                        "Group size": 2,
                        "In msg nelems": 1024 + i,
                        "Out msg nelems": 1024 + i,
                        "dtype": "Float",
                    },
                )
            )
        evs.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "s": "t",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": kt.Num(us(t0 + 3)),
                "args": {
                    "Device Id": 0,
                    "Bytes": 512 * i,
                    "Total Allocated": 4096 + i,
                    "Total Reserved": 8192,
                },
            }
        )
        evs.append(
            {
                "ph": "s",
                "id": 10 + i,
                "pid": 1,
                "tid": 1,
                "ts": kt.Num(us(t0 + 2)),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
    return evs


def _write(tmp_path, name: str, doc: dict):
    data = kt.dumps(doc, indent=1).encode()
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


@pytest.fixture
def split_on(monkeypatch):
    """Split every file above 1 KiB; record whether each read was split."""
    if threading.active_count() != 1:
        pytest.skip("another Python thread is running in this test process: reads are never split then")
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 1024)
    monkeypatch.setenv("TRACELENS_SPLIT", "1")
    used: list[bool] = []
    orig = reader._scan_split

    def spy(*a, **kw):
        sc = orig(*a, **kw)
        used.append(sc is not None)
        return sc

    monkeypatch.setattr(reader, "_scan_split", spy)
    return used


def _serial(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("TRACELENS_SPLIT", "0")
        return kineto.read(path)


def _same(a, b) -> None:
    assert a.events.schema.equals(b.events.schema)
    for name in a.events.column_names:
        assert a.events.column(name).to_pylist() == b.events.column(name).to_pylist(), name
    assert a.memory.equals(b.memory)
    assert a.metadata == b.metadata


@pytest.mark.parametrize("fractional", [True, False])
@pytest.mark.parametrize("ext", ["json", "json.gz"])
def test_split_read_equals_serial(tmp_path, monkeypatch, split_on, fractional, ext):
    doc = kt.doc(events=_events(60, fractional), baseTimeNanoseconds=kt.Num(str(kt.BASE)))
    # distributedInfo after traceEvents: it comes from the second part's tail
    doc["distributedInfo"] = {"backend": "nccl", "rank": 3, "world_size": 4}
    p = _write(tmp_path, f"t.{ext}", doc)
    tr = kineto.read(p)
    assert split_on == [True]
    serial = _serial(p, monkeypatch)
    _same(tr, serial)
    assert tr.metadata["rank"] == 3 and tr.metadata["world_size"] == 4
    ev = tr.events
    assert ev.num_rows == 60 * 4 + 12
    assert ev.column("collective").drop_null().to_pylist() == ["allreduce"] * 12
    assert tr.memory.num_rows == 60
    # exact ns timestamps on both sides of the split
    rows = ev.select(["name", "ts_ns"]).to_pylist()
    ts = [r["ts_ns"] for r in rows if r["name"] == "cudaLaunchKernel"]
    assert ts == [kt.BASE + 1000 * i * 1000 + 2000 for i in range(60)]


def test_split_refused_when_middle_is_not_in_the_events(tmp_path, monkeypatch, split_on):
    """A file whose second half is trailing metadata (a list of objects, which has `}, {` separators too):
    the split must be given up and the serial read used."""
    doc = kt.doc(events=_events(3, True))
    doc["deviceProperties"] = [{"id": i, "name": "GPU", "totalGlobalMem": 1 << 30} for i in range(400)]
    p = _write(tmp_path, "t.json", doc)
    tr = kineto.read(p)
    assert split_on == [False]
    _same(tr, _serial(p, monkeypatch))
    assert tr.metadata["num_devices"] == 400


def test_split_refused_when_events_start_after_the_middle(tmp_path, monkeypatch, split_on):
    doc = {"deviceProperties": [{"id": i, "name": "GPU"} for i in range(400)]}
    doc.update(kt.doc(events=_events(3, True)))
    p = _write(tmp_path, "t.json.gz", doc)
    tr = kineto.read(p)
    assert split_on == [False]
    _same(tr, _serial(p, monkeypatch))


def test_split_errors_are_the_serial_errors(tmp_path, monkeypatch, split_on):
    """A cut file: the split read gives up and the serial read raises its usual error."""
    text = gzip.compress(kt.dumps(kt.doc(events=_events(60, True))).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(text[: int(len(text) * 0.8)])
    with pytest.raises(BadTraceError, match="cut mid-write"):
        kineto.read(p)
    assert split_on == [False]


def test_split_not_used_when_disabled_or_small(tmp_path, monkeypatch):
    p = _write(tmp_path, "t.json", kt.doc(events=_events(5, True)))
    monkeypatch.setenv("TRACELENS_SPLIT", "1")
    assert split._split_point(p) is None  # below SPLIT_MIN_BYTES
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 1024)
    assert split._split_point(p) == int(p.stat().st_size * split.SPLIT_SHARE)
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    assert split._can_split() is False
    monkeypatch.delenv("TRACELENS_SPLIT")
    # default "auto": only with an idle CPU (1-minute load average below CPUs - 0.5)
    monkeypatch.setattr(split.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert split._can_split() is False
    monkeypatch.setattr(split.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert split._can_split() is (threading.active_count() == 1 and len(os.sched_getaffinity(0)) >= 2)
    # "auto" never splits on one usable CPU (cgroup/affinity), whatever the load; "1" still does
    monkeypatch.setattr(split.os, "sched_getaffinity", lambda pid: {0})
    assert split._can_split() is False
    monkeypatch.setenv("TRACELENS_SPLIT", "1")
    assert split._can_split() is (threading.active_count() == 1)


def test_first_boundary():
    fb = stream._first_boundary
    buf = b'[{"a": 1}, {"b": 2} ,\n {"c": 3}]'
    assert fb(buf, 0) == (9, 11)
    assert fb(buf, 10) == (19, 23)
    assert fb(buf, 20) is None  # no separator after offset 20
    assert fb(b'{"a": 1} ,  ', 0) is None  # may continue in the next block
    assert fb(b'{"a": {"b": 1}}, {', 0) == (15, 17)  # the inner `}` is not followed by `,`
    assert fb(buf, 8) == (9, 11)  # a `}` at or after `lo`


def test_split_tests_run_in_a_fresh_process(tmp_path):
    """A split read needs a process with no other thread; in a long pytest session (Dask, browsers) threads
    linger and the fixture above skips. Run this module in a fresh interpreter so the split path is always
    tested: every test must pass and none may skip."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET
    from pathlib import Path

    here = Path(__file__)
    report = tmp_path / "split.xml"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(here),
            "-p",
            "no:cacheprovider",
            "-k",
            "not fresh_process",
            f"--junitxml={report}",
        ],
        capture_output=True,
        text=True,
        cwd=here.parents[2],
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    suite = ET.parse(report).getroot().find("testsuite")
    assert int(suite.get("tests")) >= 9 and suite.get("skipped") == "0" and suite.get("failures") == "0"


def test_split_columns_larger_than_the_shared_mapping(tmp_path, monkeypatch, split_on):
    """The child's columns normally come back through shared memory (message kind M); when they do not fit,
    inside the pipe message (kind P): same result either way."""
    doc = kt.doc(events=_events(60, True), baseTimeNanoseconds=kt.Num(str(kt.BASE)))
    doc["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 2, "pg_config": [{"x": [1, 2.5]}]}
    p = _write(tmp_path, "t.json.gz", doc)
    kinds: list[bytes] = []
    orig = split._part_from_message

    def spy(msg, shm):
        kinds.append(msg[:1])
        return orig(msg, shm)

    monkeypatch.setattr(split, "_part_from_message", spy)
    shared = kineto.read(p)
    monkeypatch.setattr(split, "_SHM_SLACK", -(1 << 40))  # a one-page mapping: the columns cannot fit
    tr = kineto.read(p)
    assert split_on == [True, True]
    assert kinds == [b"M", b"P"]
    _same(tr, shared)
    _same(tr, _serial(p, monkeypatch))
    assert tr.events.num_rows == 60 * 4 + 12 and tr.memory.num_rows == 60
    assert tr.metadata["rank"] == 1
    assert '"pg_config":[{"x":[1,2.5]}]' in tr.metadata["distributed_info_json"]


def test_part_message_round_trip():
    """The child's message carries every column, the collective args and the metadata exactly."""
    import mmap

    evs = decode._decode_events(kt.dumps(_events(12, True)).encode())
    c = columns._columns(evs)
    meta = {"distributedInfo": {"rank": 3, "big": 2**62, "f": 0.1}}
    for shm in (mmap.mmap(-1, 1 << 20), mmap.mmap(-1, 4096)):  # in the mapping, then in the message
        sc = scan._Scan(meta, [c], 100, 100, False, 42)
        back = split._part_from_message(split._part_message(sc, shm), shm)
        assert back.meta == sc.meta and back.split_at == 42 and back.bytes_total == 100
        b = back.chunks[0]
        assert b.n == c.n == 12 * 4 + 3
        for f in ("kind", "ts", "ts_valid", "dur", "dur_valid", "coll_rows"):
            assert getattr(b, f).dtype == getattr(c, f).dtype and (getattr(b, f) == getattr(c, f)).all(), f
        for f in ("name", "pid", "tid", "device", "stream", "correlation", "external_id"):
            assert getattr(b, f).equals(getattr(c, f)), f
        assert b.coll == c.coll and b.coll["in_nelems"] == [1024, 1029, 1034]
        assert set(b.mem) == set(c.mem) and all((b.mem[k] == c.mem[k]).all() for k in ("ts", "valid"))
        assert all(
            b.mem[k].equals(c.mem[k]) for k in ("device", "bytes", "total_allocated", "total_reserved")
        )
        del b, back


def test_split_blocks_same_bytes_and_limits(tmp_path, monkeypatch):
    """The split read's reader gives the bytes of _blocks (multi-member gzip included); a cut or oversized
    file ends the split read (the serial read reports it)."""
    data = [kt.dumps(kt.doc(events=_events(30, True))).encode(), b"\n" * 70000]
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(data[0]) + gzip.compress(data[1]))

    def joined(it) -> bytes:
        return b"".join(bytes(b) for b in it)

    assert joined(stream._reused_blocks(p, 4096)) == joined(stream._blocks(p, 4096)) == data[0] + data[1]
    if stream._GzipReader is None:
        pytest.skip("python-isal is not installed: split reads use _blocks itself")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(p.read_bytes()[: len(gzip.compress(data[0])) // 2])
    with pytest.raises(stream._SplitFailed):
        joined(stream._reused_blocks(cut, 4096))
    monkeypatch.setenv("TRACELENS_MAX_DECOMPRESSED_BYTES", str(len(data[0])))
    with pytest.raises(stream._SplitFailed):
        joined(stream._reused_blocks(p, 4096))
    plain = tmp_path / "t.json"
    plain.write_bytes(data[0])
    assert joined(stream._reused_blocks(plain, 4096)) == data[0]


def _spy_block_readers(monkeypatch) -> list[str]:
    """Record which block reader each read uses (reader._scan picks it): "_reused_blocks" (the inline fast
    path) or "_blocks" (the careful one)."""
    used: list[str] = []
    for name in ("_reused_blocks", "_blocks"):
        orig = getattr(reader, name)

        def spy(*a, _orig=orig, _name=name, **kw):
            used.append(_name)
            return _orig(*a, **kw)

        monkeypatch.setattr(reader, name, spy)
    return used


def test_serial_fast_path_gives_up_on_a_cut_file(tmp_path, monkeypatch):
    """One-process read: the inline reader gives up on a cut gzip stream, and the careful reader then raises
    the usual error (or, with salvage, keeps the complete events)."""
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    whole = gzip.compress(kt.dumps(kt.doc(events=_events(200, True))).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(whole[: int(len(whole) * 0.8)])
    used = _spy_block_readers(monkeypatch)
    with pytest.raises(BadTraceError, match="cut mid-write"):
        kineto.read(p, chunk_bytes=4096)
    assert used[:2] == ["_reused_blocks", "_blocks"]
    tr = kineto.read(p, chunk_bytes=4096, salvage=True)
    assert tr.metadata["salvaged"] and 0 < tr.events.num_rows < 200 * 4 + 40


def test_salvage_reads_a_whole_file_by_the_fast_paths(tmp_path, monkeypatch, split_on):
    """`salvage=True` (the CLI's and tracelens.load's default) reads a whole, well-formed file by the split
    read and the inline reader, as without salvage, with the same result; only a file they cannot read
    whole goes to the careful reader."""
    doc = kt.doc(events=_events(60, True), baseTimeNanoseconds=kt.Num(str(kt.BASE)))
    p = _write(tmp_path, "t.json.gz", doc)
    tr = kineto.read(p, salvage=True)
    assert split_on == [True]
    _same(tr, kineto.read(p))
    assert not tr.metadata["salvaged"]
    used = _spy_block_readers(monkeypatch)
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    _same(kineto.read(p, salvage=True), tr)
    assert used == ["_reused_blocks"]  # whole: the careful reader is not needed
    # a damaged event that only salvage skips: the fast read refuses it, the careful one keeps the rest
    text = kt.dumps(doc, indent=1)
    i = text.index('"dur"', len(text) // 2)
    bad = tmp_path / "bad.json"
    bad.write_text(text[:i] + '"dur": 1x2' + text[i + len('"dur": ') :])
    used.clear()
    with pytest.raises(BadTraceError):
        kineto.read(bad)
    got = kineto.read(bad, salvage=True)
    assert used[-2:] == ["_reused_blocks", "_blocks"] and 0 < got.events.num_rows < tr.events.num_rows
