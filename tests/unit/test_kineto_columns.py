"""The column builders of the Kineto reader that work per distinct value (pid / tid, `Process Group Ranks`)
and the collective columns placed with one shared index: each must give what coercing every value on its
own gives (hand-written expectations), also through a whole hand-written trace."""

from __future__ import annotations

import kineto_traces as kt
import msgspec
import numpy as np
import pyarrow as pa

from tracelens.ingest import kineto
from tracelens.ingest.kineto import columns


def test_lowcard_int_array_coerces_each_distinct_value_as_one_value():
    vals = [7, None, "Spans", "0x1f", 2**70, -5, 7, "12", 7, None]
    got = columns._lowcard_int_array(vals)
    assert got.type == pa.int64()
    # "Spans" and an int beyond int64 are no int64: null, like an absent value
    assert got.to_pylist() == [7, None, None, 31, None, -5, 7, 12, 7, None]


def test_lowcard_int_array_with_many_distinct_values_or_floats():
    many = list(range(100)) + ["0x10"]
    assert columns._lowcard_int_array(many).to_pylist() == list(range(100)) + [16]
    # (the loose decoder's floats: an integral one is its int)
    assert columns._lowcard_int_array([2.0, "x", 3, None, 2.0]).to_pylist() == [2, None, 3, None, 2]


def test_pg_ranks_array_parses_each_text_once_with_the_same_result():
    vals = ["[0, 1]", None, "[0, 1]", "[2, 3, ...]", "bad", "[]", "[0, 1]", "[4,5]"]
    got = columns._pg_ranks_array(vals)
    assert got.type == pa.list_(pa.int32())
    assert got.to_pylist() == [[0, 1], None, [0, 1], None, None, [], [0, 1], [4, 5]]
    # list values (unhashable: the loose decoder's) take the per-value path
    assert columns._pg_ranks_array([[1, 2], "[3]", None]).to_pylist() == [[1, 2], [3], None]


def _coll(i: int, ranks: str) -> dict:
    return kt.x(
        "kernel",
        "ncclDevKernel_AllReduce",
        str(100 * i + 5),
        "10",
        pid=0,
        tid=7,
        device=0,
        stream=7,
        correlation=i,
        **{
            "Collective name": "allreduce",
            "Process Group Name": str(i % 2),
            "Process Group Ranks": ranks,
            "Group size": 2,
            "Seq": i,
            "In msg nelems": 1000 + i,
            "Out msg nelems": 2000 + i,
            "dtype": "Float",
            "Src Rank": i % 3,
        },
    )


def test_trace_with_string_pids_and_sparse_collectives_reads_exactly(tmp_path, monkeypatch):
    """Kineto's last complete event has `pid: "Spans"`, `tid: "PyTorch Profiler"` (strings: null); the
    collective columns of the few collective kernels land on their rows, null elsewhere."""
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    evs: list = []
    for i in range(40):
        evs.append(kt.x("cpu_op", f"aten::op{i % 3}", str(100 * i), "50", pid=11, tid=12 + i % 2))
        if i % 10 == 3:
            evs.append(_coll(i, "[0, 1]" if i < 20 else "[0, 1, ...]"))
    evs.append(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": kt.Num("0"), "dur": kt.Num("5000"), "args": {"Op count": 0}}
    )  # fmt: skip
    p = kt.write(tmp_path / "t.json", kt.doc(events=evs))
    ev = kineto.read(p, chunk_bytes=1024).events  # several chunks
    rows = ev.to_pylist()
    assert len(rows) == 45
    cpu = [r for r in rows if r["kind"] == "cpu_op"]
    assert [r["pid"] for r in cpu] == [11] * 40 and [r["tid"] for r in cpu] == [12 + i % 2 for i in range(40)]
    last = [r for r in rows if r["name"] == "PyTorch Profiler (0)"]
    assert len(last) == 1 and last[0]["pid"] is None and last[0]["tid"] is None
    coll = [r for r in rows if r["collective"] is not None]
    assert [r["seq"] for r in coll] == [3, 13, 23, 33]
    assert [r["pg_ranks"] for r in coll] == [[0, 1], [0, 1], None, None]
    assert [r["pg_name"] for r in coll] == ["1", "1", "1", "1"]
    assert [(r["in_nelems"], r["out_nelems"], r["src_rank"]) for r in coll] == [
        (1000 + i, 2000 + i, i % 3) for i in (3, 13, 23, 33)
    ]
    assert all(r["group_size"] == 2 and r["dtype"] == "Float" and r["device"] == 0 for r in coll)
    others = [r for r in rows if r["collective"] is None]
    fields = ("pg_name", "pg_desc", "pg_ranks", "group_size", "seq", "in_nelems", "out_nelems", "dtype")
    assert all(r[f] is None for r in others for f in fields)


def _one_by_one_ns(raw: bytes) -> int | None:
    """A timestamp text on its own: the reader's exact slow path (Decimal), independent of the vectorised one."""
    return columns._parse_one(raw)


def test_parse_us_to_ns_offsets_from_commas_agree_with_each_text_on_its_own():
    """parse_us_to_ns finds the texts' lengths by the commas of one join (_joined_offsets); texts holding a
    comma (a JSON array or object where a number belongs) make it measure each text: either way each value is
    what parsing its text alone gives, absent ones invalid."""
    texts = [b"2542974000003.948", b"", b"17.412", b"-0.5", b"1", b'"2.25"', b"1e3", b"0.0005"]
    with_commas = [*texts[:3], b"[1,2]", *texts[3:], b'{"a":1,"b":2}']
    for raws in (texts, with_commas, texts[:1], [b""], [b"", b""]):
        got, ok = kineto.parse_us_to_ns([msgspec.Raw(r) for r in raws])
        want = [None if not r else _one_by_one_ns(r) for r in raws]
        assert ok.tolist() == [w is not None for w in want], raws
        assert got.tolist() == [0 if w is None else w for w in want], raws
        assert got.dtype == np.int64 and got.flags.c_contiguous and got.flags.writeable


def test_joined_offsets_are_arrow_offsets_of_the_texts():
    raws = [b"1.5", b"", b"22.25", b"3"]
    off, data = columns._joined_offsets(raws)
    assert off is not None and off.dtype == np.int32
    assert off.tolist() == [0, 3, 3, 8, 9] and data == b"1.522.253"
    off, data = columns._joined_offsets([b"[1,2]", b"4"])  # a comma inside a text: measured one by one
    assert off is not None and off.tolist() == [0, 5, 6] and data == b"[1,2]4"


def test_null_array_is_pa_nulls_without_resident_memory():
    """The all-null columns of a read (collective fields of a trace without collectives, peer_local) equal
    `pa.nulls` for every type of the events schema, over zero pages the OS has not handed out yet."""
    import subprocess
    import sys

    from tracelens import schema
    from tracelens.ingest.kineto.columns import null_array

    for f in schema.EVENTS:
        for n in (0, 1, 7, 1000):
            got = null_array(f.type, n)
            assert got.type == f.type and got.null_count == n and got.equals(pa.nulls(n, f.type)), f
            assert got.to_pylist() == [None] * n
    if sys.platform.startswith("linux"):
        # measured in a process of its own: in a test worker, another test's background writer thread or the
        # heap it hands back moves the resident size by hundreds of MB while this runs
        code = (
            "import pyarrow as pa\n"
            "from tracelens import schema\n"
            "from tracelens.ingest.kineto.columns import null_array\n"
            "from tracelens.store.pages import resident_bytes\n"
            "for f in schema.EVENTS:\n"  # (first calls: what they import and set up is not measured)
            "    null_array(f.type, 1000).to_pylist()\n"
            "n = 20_000_000\n"  # (pa.nulls: 160 MB of int64 zeros written)
            "before = resident_bytes()\n"
            "arrays = [null_array(t, n) for t in (pa.int64(), schema.DICT_STR, pa.list_(pa.int32()))]\n"
            "grew = resident_bytes() - before\n"
            "assert arrays[0].slice(n - 3).to_pylist() == [None] * 3\n"
            "assert arrays[1].slice(n - 1).to_pylist() == [None]\n"
            "print(grew)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert int(out.stdout.split()[-1]) < 16 * 2**20
