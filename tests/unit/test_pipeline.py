"""Pipeline bubbles on hand-built schedules whose idle time is known by construction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from pipeline_tables import events_table, pipeline_run

from tracelens.analyze.layout import grid_from_layout
from tracelens.analyze.pipeline.pipeline import (
    _detect_schedule,
    _virtual_stages,
    analyze_pipeline,
    expected_bubble_fraction,
)

US = 1_000


def _run(tf, tb, m, **kw):
    rows, truth = pipeline_run([t * US for t in tf], [t * US for t in tb], m, **kw)
    ev = events_table(rows)
    grid = grid_from_layout(len(tf), pp=len(tf))
    return ev, grid, truth


def test_expected_formula():
    assert expected_bubble_fraction(4, 4, "1f1b") == pytest.approx(3 / 7)
    assert expected_bubble_fraction(4, 4, "gpipe") == pytest.approx(3 / 7)
    assert expected_bubble_fraction(4, 8, "interleaved_1f1b", 2) == pytest.approx(3 / 19)
    # a schedule not recognised has no expectation (never the 1F1B formula by default)
    assert expected_bubble_fraction(4, 4) is None
    assert expected_bubble_fraction(4, 4, "zbv_zero_bubble", 2) is None
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
    # the schedule is not recognised (no annotations, p < 3 for the P2P counts): no expectation is invented
    assert res.expected_bubble_fraction is None
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
    from tracelens.analyze.layout import Grid

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
    assert res.virtual_stages == 2 and res.schedule == "interleaved_1f1b" and res.microbatches == 4
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


# ---- the vectorised helpers against the per-group loops they replaced (kept here as references) ----


def virtual_stages_reference(sp):
    layered = sp[sp["layer"] >= 0]
    if not len(layered):
        return 1
    runs = []
    for _, g in layered.groupby("rank"):
        ls = np.unique(g["layer"].to_numpy())
        runs.append(int((np.diff(ls) > 1).sum()) + 1)
    return int(np.median(runs))


def detect_schedule_reference(sp, bwd, grid, m, v):
    if v > 1:
        return "interleaved_1f1b"
    if not len(sp) or not m or not len(bwd):
        return None
    p = grid.pp or 1
    s0 = sp[(sp["stage"] == 0) & (sp["layer"] >= 0) & ~sp["backward"]]
    if not len(s0) or m <= p:
        return "1f1b"
    counts = []
    for key, f in s0.groupby(["rank", "step"]):
        if key not in bwd.index:
            continue
        f = f.sort_values("gpu_start_ns")
        first_layer = f["layer"].min()
        first_mod = f.loc[f["layer"] == first_layer, "module"].iloc[0]
        fwd = f[(f["layer"] == first_layer) & (f["module"] == first_mod)]
        counts.append(int((fwd["gpu_start_ns"] < bwd.loc[key, "b_start"]).sum()))
    if not counts:
        return None
    return "gpipe" if np.median(counts) >= m else "1f1b"


def _sp(rows):
    """rows: (rank, step, layer, module, backward, gpu_start_ns); stage = rank % 2"""
    df = pd.DataFrame(rows, columns=["rank", "step", "layer", "module", "backward", "gpu_start_ns"])
    df = df.astype(
        {"rank": "int32", "step": "int64", "layer": "int32", "backward": bool, "gpu_start_ns": "int64"}
    )
    df["stage"] = df["rank"].to_numpy() % 2
    return df


def _bwd(starts):
    """{(rank, step): b_start}"""
    idx = pd.MultiIndex.from_tuples(list(starts), names=["rank", "step"])
    return pd.DataFrame({"b_start": np.array(list(starts.values()), np.int64)}, index=idx)


def test_virtual_stages_known_answer():
    rows = [(0, 0, L, "mlp", False, 0) for L in (0, 1, 2, 8, 9, 1, -1)]  # 2 ranges
    rows += [(1, 0, L, "mlp", True, 0) for L in (3, 4, 5, 11)]  # 2 ranges (backward spans count too)
    rows += [(2, 0, L, "mlp", False, 0) for L in (6, 7)]  # 1
    sp = _sp(rows)
    assert _virtual_stages(sp) == virtual_stages_reference(sp) == 2
    assert _virtual_stages(sp[sp["rank"] == 2]) == 1
    assert _virtual_stages(sp[sp["layer"] < 0]) == 1


def test_detect_schedule_known_answer():
    grid = grid_from_layout(4, pp=2)
    rows = []
    # rank 0 (stage 0), step 0: layer 0 attention at 0, 10, 20, 30 (earliest: the first module), mlp just
    # after each; backward from 25: 3 forwards before it. Step 1: all 4 before. Layer 1 is not counted.
    for t in (0, 10, 20, 30):
        rows += [(0, 0, 0, "full_attention", False, t), (0, 0, 0, "mlp", False, t + 1)]
        rows += [(0, 1, 0, "full_attention", False, 100 + t), (0, 0, 1, "mlp", False, t + 2)]
    # rank 2 (stage 0): 4 mlp forwards of layer 2 (its first layer), before the backward at 1000
    rows += [(2, 0, 2, "mlp", False, t) for t in (5, 6, 7, 8)]
    # rank 1 is stage 1: ignored; rank 0 step 2 has no backward: skipped
    rows += [(1, 0, 0, "mlp", False, t) for t in range(9)] + [(0, 2, 0, "mlp", False, 500)]
    sp = _sp(rows)
    bwd = _bwd({(0, 0): 25, (0, 1): 1000, (2, 0): 1000, (1, 0): 0})
    # counts 3, 4, 4: median 4 >= m = 4
    assert _detect_schedule(sp, bwd, grid, 4, 1) == detect_schedule_reference(sp, bwd, grid, 4, 1) == "gpipe"
    bwd2 = _bwd({(0, 0): 25, (0, 1): 115, (2, 0): 1000})  # counts 3, 2, 4: median 3 < 4
    assert _detect_schedule(sp, bwd2, grid, 4, 1) == detect_schedule_reference(sp, bwd2, grid, 4, 1) == "1f1b"
    assert _detect_schedule(sp, bwd, grid, 2, 1) == "1f1b"  # m <= p
    assert _detect_schedule(sp, bwd, grid, 4, 2) == "interleaved_1f1b"
    assert _detect_schedule(sp, _bwd({(3, 0): 5}), grid, 4, 1) is None  # no stage-0 step with a backward


def test_detect_schedule_equal_first_starts_follow_the_sort():
    # two first-layer spans start at the same instant with different modules: the sort by start decides
    # which module is counted (numpy's default argsort order), as in the per-group loop
    grid = grid_from_layout(2, pp=2)
    rng = np.random.default_rng(3)
    rows = [(0, 0, 0, "mlp", False, 10 * k) for k in range(10)]
    rows += [(0, 0, 0, "full_attention", False, 10 * k) for k in range(3)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    sp = _sp(rows)
    bwd = _bwd({(0, 0): 1000})
    for m in (3, 4, 10, 11):
        assert _detect_schedule(sp, bwd, grid, m, 1) == detect_schedule_reference(sp, bwd, grid, m, 1)


_ROW = hst.tuples(
    hst.integers(0, 3),
    hst.integers(-1, 2),
    hst.integers(-1, 2),
    hst.sampled_from(["full_attention", "linear_attention", "mlp"]),
    hst.booleans(),
    hst.integers(0, 40),
)


@settings(deadline=None, max_examples=100)
@given(
    hst.lists(_ROW, min_size=1, max_size=50),
    hst.dictionaries(hst.tuples(hst.integers(0, 3), hst.integers(0, 2)), hst.integers(0, 45), min_size=1),
    hst.integers(1, 8),
)
def test_schedule_helpers_match_reference_on_random_spans(rows, b_starts, m):
    grid = grid_from_layout(4, pp=2)
    sp, bwd = _sp(rows), _bwd(b_starts)
    assert _detect_schedule(sp, bwd, grid, m, 1) == detect_schedule_reference(sp, bwd, grid, m, 1)
    assert _virtual_stages(sp) == virtual_stages_reference(sp)


def test_schedule_helpers_match_reference_on_a_sample(tmp_path):
    from pathlib import Path

    from tracelens.analyze.pipeline.pipeline import _backward_marks
    from tracelens.run_analysis import Options, analyze_run

    sample = (
        Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"
    )
    an = analyze_run(sample, Options(cache_dir=str(tmp_path)))
    sp = an.spans.to_pandas()
    sp["stage"] = an.grid.stage_lookup(sp["rank"].to_numpy())
    sp["step"] = sp["step"].fillna(-1).astype(np.int64)
    ev = an._xevents
    rank = ev.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    step = ev.column("step").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    ts = ev.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    end = ts + ev.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    bwd = _backward_marks(ev, sp, an.sets, rank, step, ts, end)
    assert len(bwd)
    for m in (2, 4, 8, 16):
        want = detect_schedule_reference(sp, bwd, an.grid, m, 1)
        assert _detect_schedule(sp, bwd, an.grid, m, 1) == want
    assert _virtual_stages(sp) == virtual_stages_reference(sp) == 1


def test_waits_on_one_axis_match_the_per_rank_loop():
    # the shared-axis computation against the per-rank loop, with ranks that have no sets, no collectives,
    # windows reaching outside their rank's intervals and reversed windows; then clocks so far apart that
    # the shared axis would overflow and the per-rank loop runs
    from tracelens.analyze.core.intervals import union
    from tracelens.analyze.pipeline.pipeline import _waits, _waits_per_rank
    from tracelens.schema import RankSets

    rng = np.random.default_rng(11)
    for far in (0, 4 * 10**18):
        n = 400
        rank = rng.integers(0, 6, n)
        ts = rng.integers(0, 10_000, n) + np.where(rank == 5, far, 0)
        end = ts + rng.integers(0, 300, n)
        coll = rng.random(n) < 0.5
        sets = {}
        for r in (0, 1, 2, 5):  # 3 and 4 have no sets
            base = far if r == 5 else 0
            c = rng.integers(0, 10_000, 30) + base
            m = rng.integers(0, 10_000, 5) + base
            comp = union(c, c + rng.integers(1, 200, 30))
            sets[r] = RankSets(rank=r, path="gpu", compute=comp, comm=union([], []), memory=union(m, m + 50))
        m_rank = np.array([0, 0, 1, 2, 3, 4, 5, 5, 6])  # rank 6: no events at all
        lo = rng.integers(-500, 9_000, m_rank.size) + np.where(m_rank == 5, far, 0)
        hi = lo + rng.integers(-100, 3_000, m_rank.size)
        got = _waits(m_rank, lo, hi, rank, ts, end, coll, sets)
        want = _waits_per_rank(m_rank, lo, hi, rank, ts, end, coll, sets)
        np.testing.assert_array_equal(got, want)
        assert (want[hi > lo] > 0).any()


def _fallback_last_reference(ev, is_comp, p2p, coll, marks):
    """The pandas group-by / join formulation _fallback_last replaced (float64 compares once a join leaves
    NaN, as pandas makes them)."""
    valid = ev["step"].to_numpy() >= 0
    last_p2p = ev[p2p & valid].groupby(["rank", "step"])["ts"].max().rename("lp")
    if not len(last_p2p):
        return marks["last"]
    c = ev[coll & valid].join(last_p2p, on=["rank", "step"])
    first_coll = c[c["ts"] >= c["lp"]].groupby(["rank", "step"])["ts"].min().rename("fc")
    comp = ev[is_comp & valid].join(first_coll, on=["rank", "step"])
    comp = comp[comp["fc"].isna() | (comp["ts"] < comp["fc"])]
    last = comp.groupby(["rank", "step"])["end"].max()
    return last.reindex(marks.index).fillna(marks["last"]).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_fallback_last_and_pair_reduce_match_pandas(seed):
    # epoch-scale nanoseconds (above 2**53: a float64 compare differs from an int64 one) on random ranks,
    # steps and classes; seeds with every (rank, step) holding a P2P op and seeds with some lacking one
    from tracelens.analyze.pipeline.pipeline import _fallback_last
    from tracelens.analyze.pipeline.schedule_infer import pair_reduce

    rng = np.random.default_rng(seed)
    n = 3000
    rank = rng.integers(0, 4, n).astype(np.int64)
    step = rng.integers(-1, 4, n).astype(np.int64)
    ts = (1_793_400_000_000_000_000 + rng.integers(0, 400, n) * 37).astype(np.int64)
    end = ts + rng.integers(0, 3_000, n)
    cls = rng.integers(0, 3, n)
    is_comp = cls == 0
    p2p = cls == 1
    if seed % 2:
        p2p &= rank != 3  # rank 3 sends nothing: its collectives find no last P2P op (NaN in the join)
    coll = cls == 2
    ev = pd.DataFrame({"rank": rank, "step": step, "ts": ts, "end": end})
    sel = is_comp & (step >= 0)
    marks = pair_reduce(rank[sel], step[sel], first=(ts[sel], np.minimum), last=(end[sel], np.maximum))
    want = ev[sel].groupby(["rank", "step"]).agg(first=("ts", "min"), last=("end", "max"))
    pd.testing.assert_frame_equal(marks, want, check_exact=True)
    got = _fallback_last(rank, step, ts, end, is_comp, p2p, coll, marks)
    ref = _fallback_last_reference(ev, is_comp, p2p, coll, marks)
    pd.testing.assert_series_equal(got, ref, check_exact=True, check_names=False)
