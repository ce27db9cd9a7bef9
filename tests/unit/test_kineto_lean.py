"""Lean args decoding: chunks are decoded with a smaller args struct unless their text names a collective
(`"Collective name"`: decoded with the full struct at once, never twice) or, with the lean struct, turn out
to hold a communication cpu op (that chunk is decoded again and the rest of the file with the full struct).
The collective columns must come out exactly as planted, wherever the first collective falls."""

from __future__ import annotations

import kineto_traces as kt
import pytest

from tracelens.ingest import kineto
from tracelens.ingest.kineto import decode

pytestmark = pytest.mark.usefixtures("python_decoder")  # msgspec's lean args: the Python decoders' own


def _trace(n: int, coll_at: set[int], fractional: bool) -> list:
    """n launch + kernel pairs; at the indices in coll_at the kernel is an NCCL collective with its args."""

    def us(v: float) -> str:
        return f"{v:.3f}" if fractional else str(int(v))

    evs: list = []
    for i in range(n):
        t0 = 100 * i
        evs.append(
            kt.x("cuda_runtime", "cudaLaunchKernel", us(t0 + 1), us(2), correlation=i, **{"External id": i})
        )
        args: dict = {"device": 0, "stream": 7, "correlation": i, "External id": i, "grid": [1, 2, 3]}
        if i in coll_at:
            args.update(
                {
                    "Collective name": "allreduce",
                    "Process Group Name": "0",
                    "Process Group Ranks": "[0, 1]",
                    "Group size": 2,
                    "Seq": i,
                    "In msg nelems": 1000 + i,
                    "Out msg nelems": 1000 + i,
                    "dtype": "Float",
                }
            )
        evs.append(
            kt.x(
                "kernel", "ncclKernel" if i in coll_at else "sgemm", us(t0 + 5), us(50), pid=0, tid=7, **args
            )
        )
        evs.append(
            {"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": kt.Num(us(t0 + 5)), "cat": "ac2g", "name": "ac2g"}
        )
    return evs


class _Counting:
    """Wraps a msgspec decoder and counts its decode calls."""

    def __init__(self, dec) -> None:
        self.dec, self.calls = dec, 0

    def decode(self, buf):
        self.calls += 1
        return self.dec.decode(buf)


@pytest.mark.parametrize("fractional", [False, True])
@pytest.mark.parametrize("first_coll", [0, 150, None])
def test_collective_columns_exact_wherever_the_first_collective_is(
    tmp_path, monkeypatch, fractional, first_coll
):
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    coll_at = set() if first_coll is None else {first_coll, first_coll + 3, 250}
    p = kt.write(tmp_path / "t.json", kt.doc(events=_trace(300, coll_at, fractional)))
    lean = "_DEC_EVENTS_LEAN" if fractional else "_DEC_EVENTS_INT_LEAN"
    full = "_DEC_EVENTS" if fractional else "_DEC_EVENTS_INT"
    spies = {name: _Counting(getattr(decode, name)) for name in (lean, full)}
    for name, spy in spies.items():
        monkeypatch.setattr(decode, name, spy)
    tr = kineto.read(p, chunk_bytes=4096)  # dozens of chunks
    ev = tr.events
    assert ev.num_rows == 600
    rows = ev.select(
        ["name", "correlation", "collective", "group_size", "seq", "in_nelems", "pg_ranks", "dtype"]
    )
    got = [r for r in rows.to_pylist() if r["collective"] is not None]
    assert [(r["correlation"], r["in_nelems"], r["seq"]) for r in got] == [
        (i, 1000 + i, i) for i in sorted(coll_at)
    ]
    assert all(r["name"] == "ncclKernel" and r["group_size"] == 2 and r["pg_ranks"] == [0, 1] for r in got)
    assert all(r["dtype"] == "Float" for r in got)
    assert ev.column("device").drop_null().to_pylist() == [0] * 300
    # the full decoder ran only on the chunks that hold a collective (at most one per planted collective,
    # never after a lean decode of the same chunk), the lean one on every other chunk
    if first_coll is None:
        assert spies[full].calls == 0 and spies[lean].calls >= 20
    else:
        assert 1 <= spies[full].calls <= len(coll_at) and spies[lean].calls >= 20


def _int_spies(monkeypatch) -> dict:
    """Spies on the integer-timestamp event decoders, lean and full (calls per name)."""
    spies = {n: _Counting(getattr(decode, n)) for n in ("_DEC_EVENTS_INT_LEAN", "_DEC_EVENTS_INT")}
    for n, spy in spies.items():
        monkeypatch.setattr(decode, n, spy)
    return spies


def test_comm_cpu_op_without_collective_args_switches_to_full_args(tmp_path, monkeypatch):
    """An old trace names no collective in its args, but a communication cpu op (`nccl:all_reduce`) needs
    the full struct (its `Input Dims` give the message size): the lean decode of that chunk is dropped and
    the chunk and every later one are decoded with the full struct; the sizes come out of the shapes."""
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    evs = _trace(300, set(), False)
    evs.insert(
        300,
        kt.x("cpu_op", "nccl:all_reduce", "30001", "3", **{"Input Dims": [[4, 8]], "Input type": ["float"]}),
    )
    p = kt.write(tmp_path / "t.json", kt.doc(events=evs))
    spies = _int_spies(monkeypatch)
    ev = kineto.read(p, chunk_bytes=4096).events
    assert ev.num_rows == 601
    row = [r for r in ev.to_pylist() if r["name"] == "nccl:all_reduce"]
    # (an `nccl:*` annotation's first tensor is its input, 4 x 8; its output is unknown)
    assert len(row) == 1 and row[0]["in_nelems"] == 32 and row[0]["out_nelems"] is None
    assert row[0]["dtype"] == "float"
    lean, full = spies["_DEC_EVENTS_INT_LEAN"].calls, spies["_DEC_EVENTS_INT"].calls
    # lean up to the op's chunk (decoded both ways), full from there on (about half of the ~40 chunks)
    assert lean >= 10 and full >= 10


def test_lean_and_full_reads_are_identical(tmp_path, monkeypatch):
    """The same file read with lean decoding and with the full struct throughout gives the same tables."""
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    p = kt.write(tmp_path / "t.json.gz", kt.doc(events=_trace(300, {120, 121, 299}, True)))
    a = kineto.read(p, chunk_bytes=4096)
    monkeypatch.setattr(decode, "_DEC_EVENTS_LEAN", decode._DEC_EVENTS)
    monkeypatch.setattr(decode, "_DEC_EVENTS_INT_LEAN", decode._DEC_EVENTS_INT)
    b = kineto.read(p, chunk_bytes=4096)
    assert a.events.equals(b.events) and a.memory.equals(b.memory) and a.metadata == b.metadata
