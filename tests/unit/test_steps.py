"""Step windows (analyze.rank.steps) on hand-built timelines: disjoint when the GPU lags the CPU, absurd windows
cut and reported."""

from __future__ import annotations

import numpy as np

from tracelens._testing import events_table
from tracelens.analyze.core import intervals as iv
from tracelens.analyze.rank.breakdown import breakdown
from tracelens.analyze.rank.steps import step_windows, step_windows_noted, window_findings

MS = 1_000_000


def _ms(x: float) -> int:
    return int(round(x * MS))


def cpu_step(n, t0, t1, rank=0, pid=1, tid=1, kind="user_annotation"):
    return {"rank": rank, "kind": kind, "name": f"ProfilerStep#{n}", "ts_ns": _ms(t0), "dur_ns": _ms(t1 - t0),
            "pid": pid, "tid": tid}  # fmt: skip


def gpu_step(n, t0, t1, rank=0):
    return {"rank": rank, "kind": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "ts_ns": _ms(t0),
            "dur_ns": _ms(t1 - t0), "pid": 0, "tid": 7}  # fmt: skip


def kern(step, t0, t1, name="gemm", rank=0):
    return {"rank": rank, "kind": "kernel", "name": name, "ts_ns": _ms(t0), "dur_ns": _ms(t1 - t0),
            "step": step, "pid": 0, "tid": 7, "device": 0, "stream": 7}  # fmt: skip


# The MI300X facts: three ~16 ms CPU steps; the GPU runs each step's kernels long after the CPU
# launched them, so the GPU-side ProfilerStep annotations end at 32.3, 51.3 and 70.3 ms and merging CPU and
# GPU annotations as [min start, max end] gave [0, 32.3], [16.8, 51.3], [32.8, 70.3] (overlapping).
LAGGING = [
    cpu_step(1, 0, 16), cpu_step(2, 16.8, 32.8), cpu_step(3, 32.8, 48.8),
    gpu_step(1, 0, 32.3), gpu_step(2, 16.8, 51.3), gpu_step(3, 32.8, 70.3),
    kern(1, 2, 10), kern(1, 24, 32.3),
    kern(2, 32.5, 40), kern(2, 45, 51.3),
    kern(3, 51.5, 60), kern(3, 64, 70.3),
]  # fmt: skip


def test_gpu_lagging_windows_are_disjoint_and_ordered():
    w = step_windows(events_table(LAGGING)).to_pylist()
    got = [(r["step"], r["start_ns"] / MS, r["end_ns"] / MS) for r in w]
    # step N starts when the GPU finishes step N-1's work (it still runs it when the CPU starts step N)
    assert got == [(1, 0.0, 32.3), (2, 32.3, 51.3), (3, 51.3, 70.3)]
    for a, b in zip(w, w[1:]):
        assert a["end_ns"] <= b["start_ns"]


def test_gpu_lagging_compute_adds_up_to_the_trace():
    ev = events_table(LAGGING)
    b = breakdown(ev).to_pylist()
    k = [r for r in LAGGING if r["kind"] == "kernel"]
    s = np.array([r["ts_ns"] for r in k])
    e = s + np.array([r["dur_ns"] for r in k])
    total = iv.total(iv.union(s, e))
    assert total == _ms(44.9)
    assert sum(r["compute_ns"] for r in b) == total  # every device interval in exactly one step
    assert [r["compute_ns"] for r in b] == [_ms(16.3), _ms(13.8), _ms(14.8)]
    for r in b:
        assert r["compute_ns"] + r["exposed_comm_ns"] + r["memcpy_ns"] + r["idle_ns"] == r["step_time_ns"]


def test_no_lag_keeps_the_cpu_windows():
    ev = events_table([cpu_step(1, 0, 10), cpu_step(2, 10, 20), kern(1, 1, 9), kern(2, 11, 19)])
    got = [(r["start_ns"], r["end_ns"]) for r in step_windows(ev).to_pylist()]
    assert got == [(0, _ms(10)), (_ms(10), _ms(20))]


def test_foreign_profiler_step_far_past_the_trace_is_cut_and_reported():
    # triton_example: a ProfilerStep of another pid starts 1.67 ms before the trace's last event and ends
    # 13.3 s after it
    ev = events_table(
        [
            {
                "rank": 0,
                "kind": "cpu_op",
                "name": "aten::mm",
                "ts_ns": 0,
                "dur_ns": _ms(5),
                "pid": 2,
                "tid": 2,
            },
            kern(None, 1, 5),
            {
                "rank": 0,
                "kind": "cpu_op",
                "name": "aten::add",
                "ts_ns": _ms(4),
                "dur_ns": _ms(1),
                "pid": 2,
                "tid": 2,
            },
            cpu_step(1, 3.33, 13_340, pid=9, tid=9),
        ]
    )
    res = step_windows_noted(ev)
    (w,) = res.windows.to_pylist()
    assert (w["start_ns"], w["end_ns"]) == (_ms(3.33), _ms(5))
    (note,) = res.notes
    assert note["action"] == "clipped" and note["clipped_ns"] == _ms(13_340) - _ms(5)
    bd = breakdown(ev)
    (f,) = window_findings(ev, bd)
    assert f["code"] == "STEP_WINDOW_CLIPPED" and f["ranks"] == [0] and f["steps"] == [1]
    assert bd.column("step_time_ns").to_pylist() == [_ms(5) - _ms(3.33)]


def test_step_enclosing_no_event_is_dropped_and_reported():
    ev = events_table([cpu_step(1, 0, 10), kern(1, 1, 9), cpu_step(2, 100, 110, pid=9, tid=9),
                       {"rank": 0, "kind": "cpu_op", "name": "x", "ts_ns": _ms(200), "dur_ns": 5, "tid": 1}])  # fmt: skip
    res = step_windows_noted(ev)
    assert res.windows.column("step").to_pylist() == [1]
    assert [(n["step"], n["action"]) for n in res.notes] == [(2, "dropped")]
    (f,) = window_findings(ev, breakdown(ev))
    assert f["code"] == "STEP_WINDOW_CLIPPED" and f["steps"] == [2]


def test_normal_last_step_outlasting_its_events_is_kept():
    ev = events_table([cpu_step(1, 0, 10), kern(1, 1, 9.99)])
    (w,) = step_windows_noted(ev).windows.to_pylist()
    assert (w["start_ns"], w["end_ns"]) == (0, _ms(10))
    assert window_findings(ev, breakdown(ev)) == []


# Left-out steps (salvage.leave_out_steps: a salvaged trace's incomplete steps) still bound their neighbours.
# Four CPU steps of 16 ms; the GPU lags. Hand-computed windows by the rule of analyze.rank.steps, all present:
#   step 1 [0, 32.3]: CPU start; ends at its last kernel (32.3), before step 2 starts
#   step 2 [32.3, 51.3]: starts when step 1's work ends (32.3 < its first kernel 32.5)
#   step 3 [51.3, 66]: starts when step 2's work ends (51.3); ends where step 4 starts: step 4's first kernel
#       (66, on another stream) starts before step 3's work ends (70.3)
#   step 4 [66, 85]
def _launched(step, corr, t_launch, t0, t1, stream=7):
    launch = {"rank": 0, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": _ms(t_launch),
              "dur_ns": _ms(0.1), "pid": 1, "tid": 1, "correlation": corr, "step": step}  # fmt: skip
    k = kern(step, t0, t1) | {"correlation": corr, "stream": stream}
    return [launch, k]


FOUR = [
    cpu_step(1, 0, 16) | {"step": 1}, cpu_step(2, 16.8, 32.8) | {"step": 2},
    cpu_step(3, 32.8, 48.8) | {"step": 3}, cpu_step(4, 48.8, 64.8) | {"step": 4},
    *_launched(1, 10, 1, 2, 10), *_launched(1, 11, 3, 24, 32.3),
    *_launched(2, 20, 17.5, 32.5, 40), *_launched(2, 21, 18, 45, 51.3),  # 45: inside step 3's CPU window
    *_launched(3, 30, 33.5, 51.5, 60), *_launched(3, 31, 34, 64, 70.3),
    *_launched(4, 40, 49.5, 66, 78, stream=8), *_launched(4, 41, 50, 80, 85),
]  # fmt: skip


def _wins(ev):
    return [(r["step"], r["start_ns"] / MS, r["end_ns"] / MS) for r in step_windows(ev).to_pylist()]


def test_left_out_steps_still_bound_their_neighbours():
    from tracelens.ingest.salvage import leave_out_steps

    full = events_table(FOUR)
    assert _wins(full) == [(1, 0.0, 32.3), (2, 32.3, 51.3), (3, 51.3, 66.0), (4, 66.0, 85.0)]
    out = leave_out_steps(full, [2, 4])
    assert out.num_rows == full.num_rows  # the CPU markers stay (as left-out markers), nothing else goes
    assert set(out.column("step").drop_null().to_pylist()) == {1, 3}
    # the kept steps keep the windows they had with steps 2 and 4 present (before: step 3 started at its CPU
    # start, 32.8, and ran to its last kernel, 70.3, over step 4's work)
    assert _wins(out) == [(1, 0.0, 32.3), (3, 51.3, 66.0)]
    b_full = {r["step"]: r for r in breakdown(full).to_pylist()}
    for r in breakdown(out).to_pylist():
        assert r["step_time_ns"] == b_full[r["step"]]["step_time_ns"]
        assert r["compute_ns"] == b_full[r["step"]]["compute_ns"]
    # every step left out: no window at all (not a whole-trace window from the kept markers' absence)
    assert step_windows(leave_out_steps(full, [1, 2, 3, 4])).num_rows == 0
    # a left-out first step: step 2 starts where the GPU finished step 1's work, as with step 1 present
    assert _wins(leave_out_steps(full, [1]))[0] == (2, 32.3, 51.3)
