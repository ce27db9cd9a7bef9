"""Pipeline bubbles on hand-built schedules whose idle time is known by construction."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_tables import events_table, pipeline_run

from tracelens.analyze.pipeline import analyze_pipeline, expected_bubble_fraction
from tracelens.topology import grid_from_layout

US = 1_000


def _run(tf, tb, m, **kw):
    rows, truth = pipeline_run([t * US for t in tf], [t * US for t in tb], m, **kw)
    ev = events_table(rows)
    grid = grid_from_layout(len(tf), pp=len(tf))
    return ev, grid, truth


def test_expected_formula():
    assert expected_bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert expected_bubble_fraction(4, 8, "interleaved", 2) == pytest.approx(3 / 19)
    assert expected_bubble_fraction(1, 8) == 0.0
    assert expected_bubble_fraction(None, 8) is None and expected_bubble_fraction(4, None) is None


def test_two_stage_worked_by_hand():
    # p=2, m=2, tf=10, tb=20: window 90; stage 0 waits 30 inside (two receives); stage 1 fill 10, drain 20
    ev, grid, _ = _run([10, 10], [20, 20], 2)
    res = analyze_pipeline(ev, grid)
    t = res.per_rank_step.to_pylist()
    assert [
        (r["rank"], r["window_ns"], r["fill_ns"], r["drain_ns"], r["wait_ns"], r["bubble_ns"]) for r in t
    ] == [
        (0, 90 * US, 0, 0, 30 * US, 30 * US),
        (1, 90 * US, 10 * US, 20 * US, 0, 30 * US),
    ]
    assert res.microbatches == 2 and res.schedule == "1f1b"
    assert res.expected_bubble_fraction == pytest.approx(1 / 3)
    assert [s["window_bubble_fraction"] for s in res.stages] == pytest.approx([1 / 3, 1 / 3])
    # bubble_fraction is the share of the whole step (ProfilerStep: window 90 + all-reduce 2 + optimizer 20
    # + 1 before and 1 after)
    assert [s["bubble_fraction"] for s in res.stages] == pytest.approx([30 / 114, 30 / 114])
    assert t[0]["step_time_ns"] == 114 * US
    assert res.findings == []


@pytest.mark.parametrize("p,m,schedule", [(4, 4, "1f1b"), (4, 8, "1f1b"), (3, 6, "gpipe"), (2, 5, "1f1b")])
def test_uniform_stages_match_formula_and_truth(p, m, schedule):
    ev, grid, truth = _run([30] * p, [60] * p, m, steps=2, schedule=schedule)
    res = analyze_pipeline(ev, grid)
    assert res.microbatches == m
    assert res.schedule == schedule
    exp = (p - 1) / (m + p - 1)
    assert res.expected_bubble_fraction == pytest.approx(exp)
    for s in res.stages:
        assert s["window_bubble_fraction"] == pytest.approx(exp, rel=1e-6)
        want = np.mean(truth["bubble_ns"][s["stage"]]) / 1e6
        assert s["bubble_ms"] == pytest.approx(want, rel=1e-6)
    assert res.findings == []


def test_slow_stage_causes_excess_and_is_named():
    # stage 2 of 4 is twice as slow: the other stages wait for it
    ev, grid, truth = _run([20, 20, 40, 20], [40, 40, 80, 40], 6, steps=2)
    res = analyze_pipeline(ev, grid)
    per = {s["stage"]: s for s in res.stages}
    for s in range(4):
        assert per[s]["bubble_ms"] == pytest.approx(np.mean(truth["bubble_ns"][s]) / 1e6, rel=1e-6)
    assert per[2]["window_bubble_fraction"] < per[0]["window_bubble_fraction"]
    codes = [f["code"] for f in res.findings]
    assert codes == ["PIPELINE_BUBBLE_EXCESS"]
    f = res.findings[0]
    assert f["stages"] == [2] and f["ranks"] == [2] and res.cause_stage == 2
    assert "stage 2" in f["message"]
    assert f["measured_fraction"] > f["expected_fraction"] + 0.05


def test_without_annotations_uses_p2p_and_collectives():
    # no module annotations: microbatches from stage-0 sends, last backward from the collective after the
    # last P2P op; the numbers still equal the truth on this clean schedule
    ev, grid, truth = _run([30] * 3, [60] * 3, 4, steps=2, annotate=False)
    res = analyze_pipeline(ev, grid)
    assert res.microbatches == 4
    assert res.schedule is None
    assert res.expected_bubble_fraction == pytest.approx(2 / 6)
    for s in res.stages:
        assert s["bubble_ms"] == pytest.approx(np.mean(truth["bubble_ns"][s["stage"]]) / 1e6, rel=1e-6)


def test_given_microbatches_and_schedule_win():
    ev, grid, _ = _run([30] * 2, [60] * 2, 4)
    res = analyze_pipeline(ev, grid, microbatches=8, schedule="gpipe")
    assert res.microbatches == 8 and res.schedule == "gpipe"
    assert res.expected_bubble_fraction == pytest.approx(1 / 9)
    # measured 1/5 vs expected 1/9: flagged as excess (the given microbatch count is what the user claims)
    assert [f["code"] for f in res.findings] == ["PIPELINE_BUBBLE_EXCESS"]


def test_no_pipeline_info_gives_empty_result():
    ev, _, _ = _run([30] * 2, [60] * 2, 2)
    from tracelens.topology import Grid

    res = analyze_pipeline(ev, Grid())
    assert res.per_rank_step.num_rows == 0 and res.stages == [] and res.findings == []


def test_interleaved_detected_from_layer_ranges():
    # a rank holding layers {0, 4} and another {2, 6}: two model chunks each
    rows = []
    for r, layers in ((0, (0, 4)), (1, (2, 6))):
        t = 0
        for _mb in range(4):
            for li in layers:
                rows.append(
                    {
                        "rank": r,
                        "kind": "gpu_user_annotation",
                        "name": f"layers.{li}.mlp",
                        "ts_ns": t,
                        "dur_ns": 10,
                        "step": 0,
                    }
                )
                rows.append(
                    {"rank": r, "kind": "kernel", "name": "gemm", "ts_ns": t, "dur_ns": 10, "step": 0}
                )
                t += 10
        rows.append(
            {
                "rank": r,
                "kind": "gpu_user_annotation",
                "name": "layers.0.mlp.backward",
                "ts_ns": t,
                "dur_ns": 10,
                "step": 0,
            }
        )
    res = analyze_pipeline(events_table(rows), grid_from_layout(2, pp=2))
    assert res.virtual_stages == 2 and res.schedule == "interleaved" and res.microbatches == 4
    assert res.expected_bubble_fraction == pytest.approx(1 / 9)


def test_clock_offsets_align_ranks_before_fill_and_drain():
    rows, _ = pipeline_run([10 * US] * 2, [20 * US] * 2, 2)
    skew = 7 * US  # rank 1's host clock runs 7 us ahead
    shifted = [dict(r, ts_ns=r["ts_ns"] + skew) if r["rank"] == 1 else r for r in rows]
    grid = grid_from_layout(2, pp=2)
    want = analyze_pipeline(events_table(rows), grid).per_rank_step.to_pylist()
    skewed = analyze_pipeline(events_table(shifted), grid).per_rank_step.to_pylist()
    assert skewed != want
    fixed = analyze_pipeline(
        events_table(shifted), grid, clock_offsets_ns={1: skew}
    ).per_rank_step.to_pylist()
    assert fixed == want


def _as_cpu_run(rows):
    """The same schedule as a CPU-only (gloo) trace: ops on the main thread, c10d send/recv without peers,
    forward module annotations only, the backward pass as autograd engine ops."""
    out = []
    for r in rows:
        r = dict(r, tid=1, stream=None)
        if r["kind"] == "gpu_user_annotation":
            if r["name"].endswith(".backward"):
                continue
            r["kind"] = "user_annotation"
        elif r["name"] == "ncclDevKernel_SendRecv":
            r.update(
                kind="cpu_op",
                name="c10d::send" if r["collective"] == "send" else "c10d::recv_",
                collective=None,
                src_rank=None,
                dst_rank=None,
                # a send overlapping the next op cannot happen on one thread: make it instantaneous
                dur_ns=0 if r["collective"] == "send" else r["dur_ns"],
            )
        elif r["name"].startswith("ncclDevKernel_AllReduce"):
            r.update(kind="cpu_op", name="c10d::allreduce_", collective=None)
        elif r["kind"] == "kernel":
            bwd = r["name"] == "gemm_B"
            r.update(
                kind="cpu_op", name="autograd::engine::evaluate_function: MmBackward0" if bwd else "aten::mm"
            )
        out.append(r)
    return out


def test_cpu_only_run_matches_truth():
    rows, truth = pipeline_run([30 * US] * 3, [60 * US] * 3, 4, steps=2)
    res = analyze_pipeline(events_table(_as_cpu_run(rows)), grid_from_layout(3, pp=3))
    assert res.microbatches == 4 and res.schedule == "1f1b"
    for s in res.stages:
        assert s["bubble_ms"] == pytest.approx(np.mean(truth["bubble_ns"][s["stage"]]) / 1e6, rel=1e-6)
        assert s["window_bubble_fraction"] == pytest.approx(2 / 6)
