"""Schedule and layout what-ifs, the losses of a step and severities by saving (analyze/pipeline/prescribe.py), on
hand-built pipelines whose replays are worked out by hand."""

from __future__ import annotations

import pytest

from tracelens.analyze.pipeline import prescribe as P

MS = 1e6  # ns per ms: the entries give ms rounded to the ns


def _model(
    p: int = 4, m: int = 4, work: float = 3 * MS, fwd: float = 1 / 3, outside: float = 4 * MS, **kw
) -> P.PipelineModel:
    """Uniform stages of `work` ns per microbatch (forward `fwd` of it), no P2P time, a step of window +
    outside, the window as 1F1B's (m + p - 1) x work."""
    window = (m + p - 1) * work
    chain = [P.StageWork(stage=s, rank=s, work_ns=work, fwd_share=fwd) for s in range(p)]
    pm = P.PipelineModel(
        schedule="1f1b",
        p=p,
        v=1,
        m=m,
        chains=[chain],
        hop_ns={},
        step_ns=window + outside,
        window_ns=window,
        bubble_ns=(p - 1) * work,
        replayed_window_ns=window,
        layers={s: {"linear_attention": 3, "full_attention": 1} for s in range(p)},
        type_ms={},
        **kw,
    )
    return pm


def _entry(entries: list[dict], **match) -> dict:
    hits = [e for e in entries if all(e.get(k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, [e["change"] for e in entries])
    return hits[0]


def test_more_microbatches_and_interleaving_replayed_by_hand():
    """p = 4, m = 4, F = 1, B = 2 per stage, outside the window 4: 1F1B's window is (m+p-1) x 3 = 21 (step 25).
    8 microbatches: 11 x 3 = 33 (step 37); interleaved with 2 chunks (F = 0.5, B = 1 each): (v*m+p-1) x 1.5 =
    16.5 (step 20.5), each rank idle 16.5 - 12 = 4.5 of it; ZB-H1 (I = W = 1): 3m + (p-1) = 15 (step 19)."""
    pm = _model(act_bytes={s: 100.0 for s in range(4)}, in_flight={0: 4, 1: 3, 2: 2, 3: 1})
    got = P.what_ifs(pm)
    m8 = _entry(got, microbatches=8)
    assert m8["kind"] == "schedule" and m8["from"] == {"microbatches": 4}
    assert m8["step_time_ms_after"] == pytest.approx(37)
    assert m8["throughput_gain"] == pytest.approx((8 / 37) / (4 / 25) - 1, abs=1e-4)
    assert m8["activation_bytes"] == 400 and m8["activation_bytes_after"] == 400  # 1F1B holds p on stage 0
    v2 = _entry(got, schedule="interleaved_1f1b", virtual_stages=2)
    assert v2["step_time_ms_after"] == pytest.approx(20.5)
    assert v2["bubble_fraction_after"] == pytest.approx(4.5 / 20.5, abs=1e-4)
    assert v2["saving_ms"] == pytest.approx(4.5)
    # rank 0 warms up min((v-1)*p + 2(p-1), v*m) = 8 chunk-microbatches of 50 bytes: all of them
    assert v2["activation_bytes_after"] == 400
    zb = _entry(got, schedule="interleaved_zero_bubble", virtual_stages=1)
    assert zb["step_time_ms_after"] == pytest.approx(19)
    assert all(e["bubble_fraction"] == pytest.approx(9 / 25) for e in got)


def test_calibration_scales_the_window_by_measured_over_replayed():
    """A run whose measured window is 10% longer than its replay: every prediction's window too."""
    pm = _model()
    pm.window_ns = 23.1 * MS
    pm.step_ns = 27.1 * MS
    m8 = _entry(P.what_ifs(pm), microbatches=8)
    assert m8["step_time_ms_after"] == pytest.approx(27.1 - 23.1 + 33 * 1.1)


def test_receives_are_paid_by_the_consumer():
    """Two stages, one microbatch, F = 1 and B = 2 each, a hop of 0.5 each way: F0 [0,1], F1 [1,2.5], B1
    [2.5,4.5], B0 [4.5,7]: window 7, and with two microbatches (1F1B) by the same rule."""
    chain = [P.StageWork(s, s, 3.0, 1 / 3) for s in range(2)]
    hop = {(0, 1): 0.5, (1, 0): 0.5}
    pm = P.PipelineModel("1f1b", 2, 1, 1, [chain], hop, 8.0, 7.0, 0.0, 7.0, {}, {})
    from tracelens.analyze.pipeline.schedule import canonical_orders

    got = P._replay_chains(
        pm, canonical_orders("1f1b", 2, 1), 2, lambda c, i: P._chunk_costs(c, 2, 1, "loop")
    )
    assert got is not None and got[0] == pytest.approx(7.0)


def test_extras_stay_on_the_chunk_that_holds_them():
    """Interleaving cuts a stage's layer work over its chunks; the LM head stays on the last virtual stage."""
    chain = [P.StageWork(0, 0, 6.0, 0.5), P.StageWork(1, 1, 10.0, 0.5, {"lm_head": 4.0})]
    c = P._chunk_costs(chain, 2, 2, "loop")
    assert [c[(k, "F")] + c[(k, "B")] for k in range(4)] == [3.0, 3.0, 3.0, 7.0]
    v = P._chunk_costs(chain, 2, 2, "v")  # ZB-V: rank 0 holds virtual stages 0 and 3 (the head)
    assert [v[(k, "F")] + v[(k, "B")] for k in range(4)] == [3.0, 3.0, 3.0, 7.0]
    assert v[(3, "I")] == v[(3, "W")] == pytest.approx(3.5 / 2)


def test_a_block_moved_off_the_heavy_stage():
    """Two stages of 8 layers (2 blocks of 4), 1 ms of work per layer; stage 1 also holds an LM head worth 4.
    1F1B, m = 4, forward a third: the window is stage 0's first forward + 4 x stage 1's 12 + stage 0's last
    backward = 8/3 + 48 + 16/3 = 56. Moving layers 8-11 to stage 0 (split 12,4 blocks: 12 and 4 layers)
    makes the stages 12 and 8: worked by hand, the window is 52."""
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    types = {"linear_attention": 6.0, "full_attention": 2.0, "mlp": 8.0}  # 2 ms of compute per layer
    chain = [P.StageWork(0, 0, 8 * MS, 1 / 3), P.StageWork(1, 1, 12 * MS, 1 / 3, {"lm_head": 4 * MS})]
    pm = P.PipelineModel(
        "1f1b", 2, 1, 4, [chain], {}, 60 * MS, 56 * MS, 0.0, 56 * MS,
        layers={0: {"linear_attention": 6, "full_attention": 2}, 1: {"linear_attention": 6, "full_attention": 2}},
        type_ms={0: dict(types), 1: {**types, "lm_head": 8.0}},
    )  # fmt: skip
    from tracelens.analyze.pipeline.schedule import canonical_orders

    base = P._replay_chains(
        pm, canonical_orders("1f1b", 2, 4), 2, lambda c, i: P._chunk_costs(c, 2, 1, "loop")
    )
    assert base is not None and base[0] == pytest.approx(56 * MS)
    assert P._layer_ns(pm, 0, "linear_attention") == pytest.approx(MS)
    assert P._layer_ns(pm, 1, "full_attention") == pytest.approx(MS)
    got = P._best_move(pm, kinds * 4, 4, [8, 8])
    assert got is not None
    split, rep, _act, text = got
    assert split == [12, 4] and "from stage 1 to stage 0" in text and "layers 8-11" in text
    assert rep[0] == pytest.approx(52 * MS)
    entry = _entry(P.what_ifs(pm, layer_types=kinds * 4, block_size=4, layer_split=[8, 8]), kind="layout")
    assert entry["layer_split"] == [12, 4] and entry["from"] == {"layer_split": [8, 8]}
    assert entry["step_time_ms_after"] == pytest.approx(56.0)  # 60 - 56 + 52


def test_losses_ranked_and_disjoint():
    """Two ranks, 100 ms steps: bubble 30 (expected 20 of it), exposed 40 of which wait 35, idle 5."""
    ranks = [
        {"rank": r, "step_time_ms": 100.0, "bubble_ms": 30.0, "exposed_comm_ms": 40.0, "exposed_wait_ms": 35.0,
         "idle_ms": 5.0, "compute_ms": 50.0}
        for r in (0, 1)
    ]  # fmt: skip
    stages = [
        {"stage": s, "bubble_ms": 30.0, "window_ms": 100.0, "expected_bubble_fraction": 0.2} for s in (0, 1)
    ]
    out = P.losses(ranks, stages, [], [], [])
    got = {x["loss"]: x["ms_per_step"] for x in out}
    # the bubble's waits are exposed communication: wait beyond the bubble 35 - 30 = 5, transfer 40 - 30 - 5 = 5
    assert got == {"pipeline_bubble": 20.0, "pipeline_bubble_excess": 10.0, "exposed_wait": 5.0,
                   "exposed_transfer": 5.0, "host_idle": 5.0}  # fmt: skip
    assert [x["ms_per_step"] for x in out] == sorted(got.values(), reverse=True)
    assert out[0]["share_of_step"] == 0.2 and out[0]["basis"] == "measured"


def test_pipeline_bubble_finding_and_severity_by_saving():
    stages = [
        {"stage": s, "bubble_ms": 45.0, "window_ms": 100.0, "expected_bubble_fraction": 0.4} for s in (0, 1)
    ]
    pipe = {"schedule": "1f1b", "microbatches": 4, "virtual_stages": 1, "expected_bubble_fraction": 0.4}
    entry = {"kind": "schedule", "change": "interleaved", "step_time_ms": 110.0, "step_time_ms_after": 90.0,
             "throughput_gain": 110 / 90 - 1}  # fmt: skip
    f = P.bubble_findings(stages, pipe, [entry], 110.0, 0.10, 0.20, 0.02)
    assert len(f) == 1 and f[0]["code"] == "PIPELINE_BUBBLE" and f[0]["severity"] == "warning"
    assert f[0]["bubble_ms"] == 40.0 and f[0]["saving_ms"] == pytest.approx(20.0)
    assert f[0]["ranks"] == [] and f[0]["stages"] == [0, 1]
    assert P.bubble_findings(stages, pipe, [], 110.0, 0.10, 0.20, 0.02)[0]["severity"] == "info"  # no lever
    assert P.bubble_findings(stages, pipe, [entry], 500.0, 0.10, 0.20, 0.02) == []  # 8% of the step
    findings = [
        {"code": "EXPOSED_COMM_HIGH", "severity": "warning", "saving_ms": 0.32},
        {"code": "STRAGGLER", "severity": "warning", "saving_ms": 317.0},
        {"code": "KV_HEAD_REPLICATION", "severity": "warning"},
    ]
    P.severity_by_saving(findings, 1697.0, 0.02)
    assert [f["severity"] for f in findings] == ["info", "warning", "warning"]
    assert "0.32 ms" in findings[0]["severity_reason"]


def test_tp_entry_without_a_pipeline_names_the_degree_the_architecture_allows():
    """Qwen3.5-27B (4 KV heads, 16 DeltaNet QK heads, 24 Q heads) at tp = 8 replicates K/V: the largest degree
    that divides every partitioned dimension is 4. Without a measured pipeline nothing is replayed: the step
    time is null, never invented."""
    from tracelens.models import get_model

    m = get_model("qwen3.5-27b")
    e = P.tp_entry_unreplayed(m, 8, 1, 4096)
    assert e is not None and e["tp"] == 4 and e["from"] == {"tp": 8} and e["kind"] == "layout"
    assert e["step_time_ms_after"] is None and e["saving_ms"] is None and e["activation_bytes_after"] is None
    assert "320.0 MiB of duplicated K/V weights" in e["buys"][0]  # (the audit's 320 MiB)
    assert P.tp_entry_unreplayed(m, 4, 1, 4096) is None  # tp = 4 divides everything
    assert P.tp_entry_unreplayed(m, 2, 1, 4096) is None
