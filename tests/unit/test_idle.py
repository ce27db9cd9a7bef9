"""Idle-gap split by cause on hand-built events (tracelens.analyze.rank.idle)."""

from __future__ import annotations

import pyarrow as pa

from tracelens import schema
from tracelens.analyze.rank.breakdown import breakdown
from tracelens.analyze.rank.idle import idle_breakdown, idle_findings


def _events(rows: list[dict]) -> pa.Table:
    cols = {f.name: [] for f in schema.EVENTS}
    for r in rows:
        for f in schema.EVENTS:
            cols[f.name].append(r.get(f.name))
    return pa.Table.from_pydict(
        {
            k: pa.array(
                v,
                type=schema.EVENTS.field(k).type.value_type
                if pa.types.is_dictionary(schema.EVENTS.field(k).type)
                else schema.EVENTS.field(k).type,
            )
            for k, v in cols.items()
        }
    ).cast(schema.EVENTS)


def _ev(kind, name, ts, dur, tid=1, corr=None, stream=None, step=1):
    return {"rank": 0, "kind": kind, "name": name, "pid": 1, "tid": tid, "ts_ns": ts, "dur_ns": dur,
            "correlation": corr, "stream": stream, "device": 0 if stream is not None else None, "step": step}  # fmt: skip


def test_host_bound_sync_and_launch_split_exactly():
    # step [0, 1000); kernel A [0, 100); host busy in `python_work` [100, 500), launch of B at 500,
    # B starts at 550 -> gap [100, 550): host-bound 400, launch overhead 50.
    # then a sync call [600, 800) in aten::item; C launched at 800, starts 820 -> gap [650, 820):
    # synchronization 150 (650-800), launch 20. Kernel C [820, 1000).
    ev = [
        _ev("user_annotation", "ProfilerStep#1", 0, 1000),
        _ev("cpu_op", "aten::mm", 0, 10),
        _ev("cuda_runtime", "cudaLaunchKernel", 5, 3, corr=1),
        _ev("kernel", "A", 0, 100, tid=7, corr=1, stream=7),
        _ev("cpu_op", "python_work", 100, 400),
        _ev("cpu_op", "aten::mm", 500, 10),
        _ev("cuda_runtime", "cudaLaunchKernel", 500, 3, corr=2),
        _ev("kernel", "B", 550, 100, tid=7, corr=2, stream=7),
        _ev("cpu_op", "aten::item", 600, 210),
        _ev("cuda_runtime", "cudaStreamSynchronize", 600, 200),
        _ev("cpu_op", "aten::mm", 810, 5),
        _ev("cuda_runtime", "cudaLaunchKernel", 800, 3, corr=3),
        _ev("kernel", "C", 820, 180, tid=7, corr=3, stream=7),
    ]
    t = _events(ev)
    bd = breakdown(t)
    tb = idle_breakdown(t, bd)
    row = tb.iloc[0]
    assert row["idle_ns"] == 450 + 170
    assert row["host_bound_ns"] == 400
    assert row["synchronization_ns"] == 150
    assert row["launch_overhead_ns"] == 50 + 20
    assert row["other_stream_ns"] == 0 and row["other_ns"] == 0
    assert row["host_ops"] == {"python_work": 400}
    assert row["sync_ops"] == {"aten::item": 150}
    f = idle_findings(tb)[0]
    assert f["code"] == "GPU_IDLE" and f["cause"] == "host_bound"
    assert f["causes_ms"]["host_bound"] == 400 / 1e6


def test_a_step_annotation_is_never_the_responsible_op():
    """Older traces record ProfilerStep#N as a cpu_op (category "Operator"): it encloses the whole step, so
    it would be the top-level op of every host-bound gap. The ops inside it are named instead: the same
    split as the first test with the step marker a cpu_op."""
    ev = [
        _ev("cpu_op", "ProfilerStep#1", 0, 1000),
        _ev("cuda_runtime", "cudaLaunchKernel", 5, 3, corr=1),
        _ev("kernel", "A", 0, 100, tid=7, corr=1, stream=7),
        _ev("cpu_op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 300),
        _ev("cpu_op", "aten::to", 400, 100),
        _ev("cuda_runtime", "cudaLaunchKernel", 500, 3, corr=2),
        _ev("kernel", "B", 550, 450, tid=7, corr=2, stream=7),
    ]
    t = _events(ev)
    row = idle_breakdown(t, breakdown(t)).iloc[0]
    assert row["host_bound_ns"] == 400 and row["launch_overhead_ns"] == 50
    assert row["host_ops"] == {
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": 300,
        "aten::to": 100,
    }
    f = idle_findings(idle_breakdown(t, breakdown(t)))[0]
    assert "ProfilerStep" not in f["message"] and not any("ProfilerStep" in k for k in f["host_ops_ms"])


def test_queued_work_on_a_multi_stream_rank_is_other_stream_wait():
    ev = [
        _ev("user_annotation", "ProfilerStep#1", 0, 1000),
        _ev("cuda_runtime", "cudaLaunchKernel", 0, 3, corr=1),
        _ev("cuda_runtime", "cudaLaunchKernel", 5, 3, corr=2),
        _ev("kernel", "A", 0, 200, tid=7, corr=1, stream=7),
        _ev("kernel", "B", 700, 300, tid=8, corr=2, stream=8),
    ]
    t = _events(ev)
    tb = idle_breakdown(t, breakdown(t))
    assert tb.iloc[0]["other_stream_ns"] == 500
    assert idle_findings(tb)[0]["cause"] == "other_stream"


def test_busy_gpu_gets_no_finding():
    ev = [
        _ev("user_annotation", "ProfilerStep#1", 0, 1000),
        _ev("cuda_runtime", "cudaLaunchKernel", 0, 3, corr=1),
        _ev("kernel", "A", 0, 950, tid=7, corr=1, stream=7),
    ]
    t = _events(ev)
    assert idle_findings(idle_breakdown(t, breakdown(t))) == []


def test_idle_table_of_the_stage_equals_the_frame_route_ties_in_name_order():
    """`idle_breakdown_table` (the per-rank stage's route, no DataFrame) gives the rows of
    `idle_table(idle_breakdown(...))`; host ops with equal time keep pandas' order (by name), the top 3 only;
    a trace without ProfilerStep has one window whose step is null."""
    from tracelens.analyze.rank.idle import idle_breakdown_table, idle_table

    def rows(step_marker: bool) -> list[dict]:
        step = 1 if step_marker else None
        ev = [
            _ev("cuda_runtime", "cudaLaunchKernel", 5, 3, corr=1, step=step),
            _ev("kernel", "A", 0, 100, tid=7, corr=1, stream=7, step=step),
            # host busy [100, 450) in four top-level ops, then B launched at 500, starting at 550
            _ev("cpu_op", "b_op", 100, 100, step=step),
            _ev("cpu_op", "a_op", 200, 100, step=step),
            _ev("cpu_op", "c_op", 300, 100, step=step),
            _ev("cpu_op", "d_op", 400, 50, step=step),
            _ev("cuda_runtime", "cudaLaunchKernel", 500, 3, corr=2, step=step),
            _ev("kernel", "B", 550, 450, tid=7, corr=2, stream=7, step=step),
        ]
        return [_ev("user_annotation", "ProfilerStep#1", 0, 1000), *ev] if step_marker else ev

    for marker in (True, False):
        t = _events(rows(marker))
        bd = breakdown(t)
        got = idle_breakdown_table(t, bd)
        assert got.equals(idle_table(idle_breakdown(t, bd)))
        row = got.to_pylist()[0]
        assert row["step"] == (1 if marker else None)
        assert row["host_bound_ns"] == 400 and row["launch_overhead_ns"] == 50
        assert row["host_ops"] == [("a_op", 100), ("b_op", 100), ("c_op", 100)]
