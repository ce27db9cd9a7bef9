"""Lean args decoding: chunks are decoded with a smaller args struct until one holds a collective; that chunk
and the rest of the file are then decoded with the full struct. The collective columns must come out exactly
as planted, wherever the first collective falls."""

from __future__ import annotations

import kineto_traces as kt
import pytest

from tracelens.ingest import kineto
from tracelens.ingest.kineto import decode


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
    # the lean decoder ran on every chunk up to the first collective's, the full one from that chunk on
    if first_coll is None:
        assert spies[full].calls == 0 and spies[lean].calls >= 20
    elif first_coll == 0:
        assert spies[lean].calls == 1 and spies[full].calls >= 20
    else:
        assert spies[lean].calls >= 8 and spies[full].calls >= 8


def test_lean_and_full_reads_are_identical(tmp_path, monkeypatch):
    """The same file read with lean decoding and with the full struct throughout gives the same tables."""
    monkeypatch.setenv("TRACELENS_SPLIT", "0")
    p = kt.write(tmp_path / "t.json.gz", kt.doc(events=_trace(300, {120, 121, 299}, True)))
    a = kineto.read(p, chunk_bytes=4096)
    monkeypatch.setattr(decode, "_DEC_EVENTS_LEAN", decode._DEC_EVENTS)
    monkeypatch.setattr(decode, "_DEC_EVENTS_INT_LEAN", decode._DEC_EVENTS_INT)
    b = kineto.read(p, chunk_bytes=4096)
    assert a.events.equals(b.events) and a.memory.equals(b.memory) and a.metadata == b.metadata
