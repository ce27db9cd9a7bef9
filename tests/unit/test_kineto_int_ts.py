"""Integer-timestamp decoding (older Kineto writes µs as JSON integers): exact ns, absent/null values, values
beyond int64 ns, and files that switch to fractional timestamps part-way (the reader falls back per chunk)."""

from __future__ import annotations

import kineto_traces as kt
import pytest

from tracelens.ingest import kineto

pytestmark = pytest.mark.usefixtures("decoder")  # each test on both chunk decoders (tests/conftest.py)


def _ev(i: int, ts: str, dur: str) -> dict:
    return kt.x("cpu_op", f"op{i}", ts, dur)


@pytest.mark.parametrize("ext", ["json", "json.gz"])
def test_integer_timestamps_exact(tmp_path, ext):
    big = 9_007_199_254_740_993  # 2**53 + 1 µs: a float64 cannot hold it, the int decoder must
    events = [_ev(0, str(big), "7"), _ev(1, "1669783687464181", "45"), _ev(2, "-3", "0")]
    events.append({"ph": "X", "cat": "cpu_op", "name": "no_ts", "dur": 1})  # absent ts: the event is dropped
    events.append({"ph": "X", "cat": "cpu_op", "name": "null_dur", "ts": 5, "dur": None})
    p = kt.write(tmp_path / f"t.{ext}", kt.doc(events=events))
    ev = kineto.read(p).events
    rows = {r["name"]: (r["ts_ns"], r["dur_ns"]) for r in ev.select(["name", "ts_ns", "dur_ns"]).to_pylist()}
    assert rows == {
        "op0": (big * 1000, 7000),
        "op1": (1669783687464181000, 45000),
        "op2": (-3000, 0),
        "null_dur": (5000, 0),  # a missing or non-numeric dur is 0 (an instant)
    }


def test_integer_timestamps_beyond_int64_ns_are_invalid(tmp_path):
    too_big = 2**63 // 1000 + 1  # µs whose ns overflow int64
    events = [_ev(0, "10", "1"), _ev(1, "11", str(too_big)), _ev(2, str(too_big), "1")]
    tr = kineto.read(kt.write(tmp_path / "t.json", kt.doc(events=events)))
    rows = tr.events.select(["name", "ts_ns", "dur_ns"]).to_pylist()
    assert rows == [
        {"name": "op0", "ts_ns": 10000, "dur_ns": 1000},
        {"name": "op1", "ts_ns": 11000, "dur_ns": 0},  # no valid dur: 0, like a missing one
    ]  # op2 has no valid ts: dropped like a missing one


def test_switch_to_fractional_timestamps_in_a_later_chunk(tmp_path):
    """Integer timestamps in the first chunks, then 3-decimal ones: every value exact in both parts."""
    events = [_ev(i, str(1000 + i), "2") for i in range(300)]
    events += [_ev(300 + i, f"{2000 + i}.{i % 1000:03d}", "0.125") for i in range(300)]
    events.append(_ev(600, "3000", "4"))  # an integer again after the switch
    p = kt.write(tmp_path / "t.json", kt.doc(events=events))
    tr = kineto.read(p, chunk_bytes=2000)
    got = tr.events.select(["ts_ns", "dur_ns"]).to_pylist()
    want = [{"ts_ns": (1000 + i) * 1000, "dur_ns": 2000} for i in range(300)]
    want += [{"ts_ns": (2000 + i) * 1000 + i % 1000, "dur_ns": 125} for i in range(300)]
    want.append({"ts_ns": 3_000_000, "dur_ns": 4000})
    assert got == want
    # the same file read in one piece gives the same table
    assert kineto.read(p, chunk_bytes=1 << 30).events.equals(tr.events)
