"""Odd but valid traces: each has a defined behaviour (docs/bad-input.md), asserted here against hand-built
ground truth. Reference: `step_events()` has 3 steps of 950 µs, each with a 400 µs gemm (compute) and a
200 µs allreduce kernel that does not overlap it, 50 µs of cpu op."""

from __future__ import annotations

import json

import pytest
from broken_traces import BASE_NS, kineto_doc, step_events, write, x

from tracelens.ingest import kineto
from tracelens.run_analysis import Options, analyze_run

pytestmark = pytest.mark.usefixtures("decoder")  # each test on both chunk decoders (tests/conftest.py)


def _summary(tmp_path, events, **top) -> dict:
    p = write(tmp_path / "rank0.json", kineto_doc(0, 1, events, **top))
    return analyze_run(p, Options(no_cache=True)).summary()


def _steps(s: dict) -> dict:
    return {r["step"]: r for r in s["per_step"]}


def _codes(s: dict) -> list[str]:
    return [f["code"] for f in s["findings"]]


REF = {"step_time_ms": 0.95, "compute_ms": 0.4, "exposed_comm_ms": 0.2, "idle_ms": 0.35}


def _assert_ref(row: dict, **over) -> None:
    for k, v in {**REF, **over}.items():
        assert row[k] == pytest.approx(v, abs=1e-9), (k, row)


def test_reference_trace(tmp_path):
    s = _summary(tmp_path, step_events())
    assert s["run"]["steps"] == [1, 2, 3]
    for row in s["per_step"]:
        _assert_ref(row)


def test_no_profiler_step_is_one_window(tmp_path):
    evs = [e for e in step_events() if not e["name"].startswith("ProfilerStep")]
    s = _summary(tmp_path, evs)
    assert s["run"]["steps"] == []
    assert "NO_STEPS" in _codes(s)
    (row,) = s["per_step"]
    assert row["step"] is None
    # window: the first compute/communication interval (gemm at 100 µs) to the last (allreduce ends 2700 µs)
    assert row["step_time_ms"] == pytest.approx(2.6)
    assert row["compute_ms"] == pytest.approx(1.2)


def test_no_gpu_events_is_a_cpu_analysis(tmp_path):
    evs = [e for e in step_events() if e["cat"] != "kernel"]
    s = _summary(tmp_path, evs)
    assert s["run"]["analysis_path"] == ["cpu"]
    assert s["run"]["steps"] == [1, 2, 3]
    for row in s["per_step"]:
        assert row["step_time_ms"] == pytest.approx(0.95)
        assert row["compute_ms"] == pytest.approx(0.05)  # the cpu op (CPU-only runs: CPU ops are compute)


def test_zero_and_negative_durations(tmp_path):
    evs = step_events()
    evs[3]["dur"] = 0  # step 1's gemm: an instant, no compute
    evs[15]["dur"] = -400  # step 3's gemm: treated as 0 as well
    evs[6]["dur"] = -950  # step 2's ProfilerStep: an empty window
    s = _summary(tmp_path, evs)
    rows = _steps(s)
    _assert_ref(rows[1], compute_ms=0.0, idle_ms=0.75)
    assert rows[2]["step_time_ms"] == 0 and rows[2]["compute_ms"] == 0
    _assert_ref(rows[3], compute_ms=0.0, idle_ms=0.75)
    tr = kineto.read(tmp_path / "rank0.json")
    assert sorted(tr.events.column("dur_ns").to_pylist())[:2] == [-950000, -400000]  # kept as written


def test_overlapping_steps(tmp_path):
    evs = step_events()
    evs[6]["ts"] = 900.0  # step 2 starts 50 µs before step 1 ends
    s = _summary(tmp_path, evs)
    rows = _steps(s)
    # windows are disjoint (issue 16): step 1 ends where step 2 starts, so the overlap [900, 950) (idle) is
    # step 2's only; step 2's window [900, 1850) holds its own work
    _assert_ref(rows[1], step_time_ms=0.9, idle_ms=0.3)
    _assert_ref(rows[2], step_time_ms=0.95, idle_ms=0.35)
    # an event in the overlap belongs to the step that started last
    tr = kineto.read(write(tmp_path / "t.json", kineto_doc(0, 1, evs + [x("cpu_op", "late", 920, 1)])))
    names = tr.events.column("name").to_pylist()
    assert tr.events.column("step").to_pylist()[names.index("late")] == 2


def test_unknown_categories_are_other_with_their_names(tmp_path):
    evs = step_events() + [
        x("my_custom_cat", "mystery", 200, 10),
        {"ph": "X", "name": "no_cat", "pid": 1, "tid": 1, "ts": 210, "dur": 5},
        x(123, "numeric_cat", 220, 5),
    ]
    tr = kineto.read(write(tmp_path / "t.json", kineto_doc(0, 1, evs)))
    df = tr.events.to_pandas()
    kinds = dict(zip(df["name"].astype(str), df["kind"].astype(str)))
    assert kinds["mystery"] == kinds["no_cat"] == kinds["numeric_cat"] == "other"
    s = _summary(tmp_path, evs)
    _assert_ref(_steps(s)[1])  # "other" events are neither compute nor communication


def test_huge_argument_lists(tmp_path):
    evs = step_events()
    evs[1]["args"] = {f"key{i}": list(range(20)) for i in range(5000)}
    evs[1]["args"]["Input Dims"] = [[7] * 50000]
    evs[5]["args"]["Process Group Ranks"] = str(list(range(4096)))
    evs[11]["args"]["Process Group Ranks"] = "[0, 1, 2, ..., 4095]"  # as the profiler truncates it
    tr = kineto.read(write(tmp_path / "t.json", kineto_doc(0, 1, evs)))
    pg = tr.events.column("pg_ranks").to_pylist()
    assert pg[5] == list(range(4096)) and pg[11] is None
    assert tr.events.num_rows == len(evs)
    for row in _summary(tmp_path, evs)["per_step"]:
        _assert_ref(row)


def test_non_ascii_names_are_kept(tmp_path):
    evs = step_events(kernel_name="核函数<float, 🚀> «ÜberKernel»")
    evs[1]["name"] = "aten::ß\u200boperator"
    p = write(tmp_path / "rank0.json", kineto_doc(0, 1, evs, host_name="nœud-07"))
    a = analyze_run(p, Options(no_cache=True))
    names = set(a.events.column("name").to_pylist())
    assert {"核函数<float, 🚀> «ÜberKernel»", "aten::ß\u200boperator"} <= names
    assert a.metadata.column("host_name").to_pylist() == ["nœud-07"]
    for row in a.summary()["per_step"]:
        _assert_ref(row)


def test_invalid_utf8_bytes_are_replaced(tmp_path):
    data = json.dumps(kineto_doc(0, 1)).encode().replace(b"aten::mm", b"aten::\xff\xfemm")
    tr = kineto.read(write(tmp_path / "t.json", data))
    assert "aten::\ufffd\ufffdmm" in tr.events.column("name").to_pylist()


def test_timestamps_as_strings(tmp_path):
    evs = step_events()
    for e in evs:
        e["ts"], e["dur"] = str(e["ts"]), str(e["dur"])  # "100.0", "400"
    evs[2]["ts"] = " 20.000 "
    s = _summary(tmp_path, evs)
    for row in s["per_step"]:
        _assert_ref(row)
    tr = kineto.read(tmp_path / "rank0.json")
    assert tr.events.column("ts_ns").to_pylist()[:3] == [BASE_NS, BASE_NS + 10_000, BASE_NS + 20_000]


def test_timestamps_that_are_not_numbers_drop_the_event(tmp_path):
    evs = step_events() + [
        x("cpu_op", "bad_ts", "soon", 5),
        x("cpu_op", "null_ts", None, 5),
        x("cpu_op", "empty_ts", "", 5),
        x("cpu_op", "nan_ts", "NaN", 5),
    ]
    tr = kineto.read(write(tmp_path / "t.json", kineto_doc(0, 1, evs)))
    names = set(tr.events.column("name").to_pylist())
    assert not names & {"bad_ts", "null_ts", "empty_ts", "nan_ts"}
    assert tr.events.num_rows == len(step_events())


def test_clock_jump_between_steps(tmp_path):
    """Timestamps are used as written: a jump between steps changes no step's own breakdown."""
    evs = step_events()
    for e in evs[12:]:  # step 3 recorded after the clock jumped an hour ahead
        e["ts"] += 3600e6
    s = _summary(tmp_path, evs)
    assert s["run"]["steps"] == [1, 2, 3]
    for row in s["per_step"]:
        _assert_ref(row)


def test_clock_jump_inside_a_step(tmp_path):
    """Events a jump moves outside every ProfilerStep window belong to no step; the step keeps the rest."""
    evs = step_events()
    for e in evs[10:12]:  # step 2's second launch and its allreduce kernel, after the clock jumped 10 s
        e["ts"] += 10e6
    tr = kineto.read(write(tmp_path / "t.json", kineto_doc(0, 1, evs)))
    steps = tr.events.column("step").to_pylist()
    assert steps[10] is None and steps[11] is None  # the moved launch and its kernel: no step
    s = _summary(tmp_path, evs)
    _assert_ref(_steps(s)[2], exposed_comm_ms=0.0, idle_ms=0.55)


def test_a_whole_rank_hours_off_is_taken_for_another_run(tmp_path):
    from tracelens.errors import RankError
    from tracelens.run import load_tables

    write(tmp_path / "rank0.json", kineto_doc(0, 2))
    write(tmp_path / "rank1.json", kineto_doc(1, 2, baseTimeNanoseconds=BASE_NS + 3 * 3600 * 10**9))
    with pytest.raises(RankError, match="different runs"):
        load_tables(tmp_path, no_cache=True)


def test_only_instant_events(tmp_path):
    """No complete event at all: the rank is read with no rows and analyzed as empty."""
    evs = [{"ph": "i", "name": "marker", "pid": 1, "tid": 1, "ts": 5, "s": "t"}]
    s = _summary(tmp_path, evs)
    assert s["per_step"] == [] and s["run"]["steps"] == [] and "NO_STEPS" in _codes(s)


def test_step_numbers_beyond_int32_are_not_steps(tmp_path):
    """`ProfilerStep#<number>` with 1-9 ASCII digits is a step marker; anything else an ordinary annotation."""
    evs = step_events()
    evs[12]["name"] = "ProfilerStep#99999999999999999999"  # step 3's marker
    evs.append(x("user_annotation", "ProfilerStep#²", 5, 1))
    s = _summary(tmp_path, evs)
    assert s["run"]["steps"] == [1, 2]
    for row in s["per_step"]:
        _assert_ref(row)
