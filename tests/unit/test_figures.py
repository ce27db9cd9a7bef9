"""Report figures and page: their data checked against hand-built summaries and tables (no browser)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens import views as V
from tracelens._testing import events_table, table_from_rows
from tracelens.analyze.pipeline.timeline import _group_modules, pipeline_blocks, rank_blocks
from tracelens.report import figures as F
from tracelens.report import html as H
from tracelens.report.export import GPU_TID_BASE, trace_events
from tracelens.report.figures import pick_step

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "cpu-gloo-4rank"
XSS = "<script>window.__xss=1</script>"
MS = 1_000_000


def rank_row(
    rank,
    stage=None,
    step=100.0,
    compute=60.0,
    overlapped=10.0,
    exposed=20.0,
    wait=None,
    transfer=None,
    memcpy=5.0,
    idle=15.0,
    bubble=None,
):
    return {
        "rank": rank,
        "stage": stage,
        "step_time_ms": step,
        "compute_ms": compute,
        "overlapped_comm_ms": overlapped,
        "exposed_comm_ms": exposed,
        "exposed_wait_ms": wait,
        "exposed_transfer_ms": transfer,
        "memcpy_ms": memcpy,
        "idle_ms": idle,
        "bubble_ms": bubble,
    }


def make_summary(n_ranks=4, n_steps=3, pp=None, **kw) -> dict:
    """Rank r: step 100 + r ms; per_step s: +s ms. Stage = r // (n / pp) when pp is given."""
    per = n_ranks // pp if pp else None
    ranks = [rank_row(r, stage=(r // per if pp else None), step=100.0 + r, **kw) for r in range(n_ranks)]
    per_step = [
        {"rank": r, "step": s, "step_time_ms": 100.0 + r + s} for r in range(n_ranks) for s in range(n_steps)
    ]
    return {
        "schema": "tracelens.summary/1",
        "tracelens_version": "t",
        "run": {
            "name": "run",
            "path": "/x/run",
            "ranks": list(range(n_ranks)),
            "steps": list(range(n_steps)),
            "layout": {"pp": pp, "source": "config"},
            "warnings": [],
        },
        "ranks": ranks,
        "stages": [],
        "stragglers": [],
        "mfu": None,
        "findings": [],
        "per_step": per_step,
    }


# ----- breakdown --------------------------------------------------------------------------------------
def test_breakdown_parts_add_up_to_step_time():
    s = make_summary(2, bubble=4.0)
    fig = F.breakdown_bar(s)
    bars = [t for t in fig.data if t.type == "bar"]
    by = {t.name: list(t.y) for t in bars}
    # compute not overlapped = 60 - 10; no wait/transfer split -> one exposed part
    assert by == {
        "compute (not overlapped)": [50.0, 50.0],
        "overlapped comm": [10.0, 10.0],
        "exposed comm": [20.0, 20.0],
        "memcpy": [5.0, 5.0],
        "idle": [15.0, 15.0],
    }
    assert np.sum([t.y for t in bars], axis=0).tolist() == [100.0, 100.0]  # = the step time
    # the bubble overlaps idle and P2P waits: a marker at its height, not a stacked part
    (marker,) = [t for t in fig.data if t.type == "scatter"]
    assert marker.name.startswith("pipeline bubble") and list(marker.y) == [4.0, 4.0]
    assert list(fig.data[0].x) == ["r0", "r1"]


def test_breakdown_wait_transfer_split_replaces_exposed():
    fig = F.breakdown_bar(make_summary(1, wait=12.0, transfer=8.0))
    by = {t.name: list(t.y) for t in fig.data}
    assert by["exposed comm: wait"] == [12.0] and by["exposed comm: transfer"] == [8.0]
    assert "exposed comm" not in by and all(t.type == "bar" for t in fig.data)


def test_large_run_is_aggregated_by_stage_then_node():
    s = make_summary(1024, n_steps=2, pp=4)
    fig = F.breakdown_bar(s)
    assert list(fig.data[0].x) == [f"stage {i} (256 ranks)" for i in range(4)]
    # exposed comm is 20 everywhere; compute-only is 50: the stage means
    assert {t.name: t.y[0] for t in fig.data}["compute (not overlapped)"] == 50.0
    heat = F.step_heatmap(s)
    z = np.array(heat.data[0].z, dtype=float)
    assert z.shape == (4, 2)
    # stage 1 = ranks 256..511: mean step = 100 + mean(rank) + step
    assert z[1, 1] == pytest.approx(100 + np.mean(np.arange(256, 512)) + 1, abs=1e-3)
    labels, members, unit = F.rank_groups(range(1024), None, max_items=256)
    assert (
        unit == "node"
        and len(members) == 128
        and members[1] == list(range(8, 16))
        and labels[1] == "ranks 8-15"
    )
    labels, members, unit = F.rank_groups(range(4096), None, max_items=256)
    assert unit == "node" and len(members) == 256 and all(len(m) == 16 for m in members)


def test_heatmap_values_and_missing_cells():
    s = make_summary(3, n_steps=2)
    s["per_step"] = [r for r in s["per_step"] if not (r["rank"] == 2 and r["step"] == 1)]
    fig = F.step_heatmap(s)
    z = fig.data[0].z
    assert list(fig.data[0].y) == ["r0", "r1", "r2"] and list(fig.data[0].x) == ["step 0", "step 1"]
    assert z[0] == [100.0, 101.0] and z[1] == [101.0, 102.0]
    assert z[2][0] == 102.0 and z[2][1] is None
    assert fig.layout.updatemenus == ()  # one metric only: no buttons


def test_heatmap_buttons_switch_metrics():
    s = make_summary(2, n_steps=2)
    for r in s["per_step"]:
        r["compute_ms"] = 10.0 * r["rank"] + r["step"]
        r["bubble_ms"] = None
    fig = F.step_heatmap(s)
    (menu,) = fig.layout.updatemenus
    assert [b.label for b in menu.buttons] == ["step time", "compute"]  # bubble: no values, no button
    assert menu.buttons[1].args[0]["z"] == [[[0.0, 1.0], [10.0, 11.0]]]
    assert menu.buttons[1].args[1]["title.text"] == "compute per rank and step (ms)"
    assert [list(r) for r in fig.data[0].z] == menu.buttons[0].args[0]["z"][0]


# ----- pipeline timeline ---------------------------------------------------------------------------------
def test_group_modules_one_block_per_microbatch():
    # two forwards of layers 4,5 (attn, mlp), then two backwards of 5,4: four blocks
    seq = [(4, "a", 0), (4, "m", 0), (5, "a", 0), (5, "m", 0)] * 2 + [
        (5, "m", 1),
        (5, "a", 1),
        (4, "m", 1),
        (4, "a", 1),
    ] * 2
    start = np.arange(len(seq)) * 10
    blocks = _group_modules(
        np.array([s[0] for s in seq]),
        [s[1] for s in seq],
        np.array([bool(s[2]) for s in seq]),
        start,
        start + 9,
    )
    assert blocks == [
        ("forward", 0, 0, 39),
        ("forward", 1, 40, 79),
        ("backward", 0, 80, 119),
        ("backward", 1, 120, 159),
    ]


def _gpu_ann(rank, name, t0, t1, step=1):
    return {
        "rank": rank,
        "kind": "gpu_user_annotation",
        "name": name,
        "ts_ns": t0,
        "dur_ns": t1 - t0,
        "step": step,
        "device": 0,
        "stream": 7,
    }


def test_pipeline_blocks_from_microbatch_annotations_with_clock_offsets():
    rows = []
    for mb in range(
        2
    ):  # stage 0 (rank 0) forwards at 0,10 ms; stage 1 (rank 1) at 10,20 ms (its clock +5 ms)
        rows.append(
            {
                "rank": 0,
                "kind": "user_annotation",
                "name": f"forward_mb{mb}",
                "ts_ns": mb * 10 * MS,
                "dur_ns": 8 * MS,
                "step": 1,
            }
        )
        rows.append(
            {
                "rank": 1,
                "kind": "user_annotation",
                "name": f"forward_mb{mb}",
                "ts_ns": (mb + 1) * 10 * MS + 5 * MS,
                "dur_ns": 8 * MS,
                "step": 1,
            }
        )
        rows.append(
            {
                "rank": 0,
                "kind": "user_annotation",
                "name": f"other_mb{mb}",
                "ts_ns": 0,
                "dur_ns": 1,
                "step": 1,
            }
        )
    ev = events_table(rows)
    blocks = pipeline_blocks(ev, [0, 1], {0: 0, 1: 1}, 1, offsets_ns={1: 5 * MS})
    got = [(b["stage"], b["phase"], b["microbatch"], b["start_ms"], b["end_ms"]) for b in blocks]
    assert got == [
        (0, "forward", 0, 0.0, 8.0),
        (0, "forward", 1, 10.0, 18.0),
        (1, "forward", 0, 10.0, 18.0),
        (1, "forward", 1, 20.0, 28.0),
    ]
    fig = F.pipeline_timeline(
        blocks, [{"stage": 0, "bubble_fraction": 0.25, "expected_bubble_fraction": 0.2}], 1
    )
    fwd = fig.data[0]
    assert fwd.name == "forward" and list(fwd.base) == [0.0, 10.0, 10.0, 20.0] and list(fwd.x) == [8.0] * 4
    labels = fig.layout.yaxis.ticktext
    assert labels[fwd.y[0]] == "stage 0 (r0) bubble 25%" and labels[fwd.y[2]] == "stage 1 (r1)"
    assert list(fwd.text) == ["0", "1", "0", "1"]  # the microbatch numbers inside the bars
    # the title says what the chart shows, never that gaps are bubbles
    assert "expects a 20% bubble" in fig.layout.title.text and "gaps are bubbles" not in fig.layout.title.text


def test_pipeline_blocks_from_gpu_module_annotations():
    rows = [
        _gpu_ann(0, "layers.0.self_attn", 0, 5),
        _gpu_ann(0, "layers.0.mlp", 5, 10),
        _gpu_ann(0, "layers.0.self_attn", 10, 15),
        _gpu_ann(0, "layers.0.mlp", 15, 20),
        _gpu_ann(0, "layers.0.mlp.backward", 30, 40),
        _gpu_ann(0, "layers.0.self_attn.backward", 40, 50),
        _gpu_ann(0, "layers.0.mlp", 0, 1, step=2),
    ]
    assert rank_blocks(events_table(rows), 0, 1) == [
        ("forward", 0, 0, 10),
        ("forward", 1, 10, 20),
        ("backward", 0, 30, 50),
    ]


def test_pick_step_is_the_median_step():
    rows = [
        {"rank": 0, "step": s, "step_time_ms": t} for s, t in ((1, 900.0), (2, 100.0), (3, 110.0), (4, 105.0))
    ]
    assert pick_step(rows) == 4
    assert pick_step([]) is None


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_real_cpu_run_timeline_has_three_microbatches_per_stage():
    from tracelens.run_analysis import analyze_run

    truth = json.loads((SAMPLE / "truth.json").read_text())
    a = analyze_run(SAMPLE)
    step = a.steps[0]
    blocks = pipeline_blocks(a.events, [0, 2], {0: 0, 2: 1}, step)
    m = truth.get("microbatches") or truth.get("schedule", {}).get("microbatches") or 3
    for stage in (0, 1):
        for phase in ("forward", "backward"):
            mbs = [b["microbatch"] for b in blocks if b["stage"] == stage and b["phase"] == phase]
            assert mbs == list(range(m)), (stage, phase, mbs)
    # stage 1 cannot finish its first forward before stage 0's first forward has sent the activation
    f0 = min(b["end_ms"] for b in blocks if b["stage"] == 0 and b["phase"] == "forward")
    f1 = min(b["end_ms"] for b in blocks if b["stage"] == 1 and b["phase"] == "forward")
    assert f1 > f0


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_real_cpu_run_timeline_shows_compute_after_the_receive():
    """On the real gloo run stage 1's first forward annotation opens before stage 0 has sent anything (it
    waits inside it for the activation): the timeline draws stage 1's forward from where its layers start,
    after its receive of stage 0's send has completed, with the wait hatched; and the chart's zero and each
    rank's first forward are the pipeline analysis' window start and fill. (Times through the float ms of
    the blocks: compared within 1 µs.)"""
    import pyarrow.compute as pc

    from tracelens.run_analysis import analyze_run

    a = analyze_run(SAMPLE)
    step = a.steps[-1]
    off = a.cross.offsets_ns
    ev = a.events
    blocks = pipeline_blocks(ev, [0, 2], {0: 0, 2: 1}, step, off)
    t0_ns = blocks[0]["t0_ms"] * 1e6

    def raw(rank: int, name: str) -> list[tuple[int, int]]:  # (start, end) in aligned ns, from the trace
        m = pc.and_(pc.equal(ev.column("rank"), rank), pc.equal(ev.column("step"), step))
        rows = ev.filter(m).filter(pc.equal(ev.filter(m).column("name").cast("string"), name))
        return sorted(
            (t - off.get(rank, 0), t + d - off.get(rank, 0))
            for t, d in zip(rows.column("ts_ns").to_pylist(), rows.column("dur_ns").to_pylist())
        )

    fwd0_ann = raw(2, "forward_mb0")[0]
    first_send = raw(0, "gloo:send")[0]
    recv = raw(2, "gloo:recv")[0]
    assert fwd0_ann[0] < first_send[0]  # the annotation opens first: stage 1 must not be drawn early
    assert recv[1] >= first_send[0]  # the activation arrives after stage 0 sent it (one clock: same host)
    f1 = next(b for b in blocks if b["stage"] == 1 and b["phase"] == "forward" and b["microbatch"] == 0)
    assert f1["start_ms"] * 1e6 + t0_ns >= recv[1] - 1e3
    # the receive is drawn as a wait on stage 1's row, clipped to the window (it began before it)
    waits = [b for b in blocks if b["stage"] == 1 and b["phase"] == "wait"]
    assert waits and waits[0]["start_ms"] == 0.0
    assert abs(waits[0]["end_ms"] * 1e6 + t0_ns - recv[1]) < 1e3
    # zero = the pipeline window's start; each stage's first forward = its fill (analyze/pipeline/pipeline.py)
    prs = a.pipeline.per_rank_step.to_pandas()
    for rank, stage in ((0, 0), (2, 1)):
        fill = int(prs[(prs["rank"] == rank) & (prs["step"] == step)]["fill_ns"].iloc[0])
        first = min(b["start_ms"] for b in blocks if b["stage"] == stage and b["phase"] == "forward")
        assert abs(first * 1e6 - fill) < 1e3, (rank, first, fill)
    fig = F.pipeline_timeline(
        blocks, [{"stage": 0, "bubble_fraction": 0.3}, {"stage": 1, "bubble_fraction": 0.4}], step
    )
    assert "gaps are bubbles" not in fig.layout.title.text
    assert "hatched: waiting in send/recv" in fig.layout.title.text
    assert [t.name for t in fig.data] == ["forward", "backward", "waiting in send/recv"]


def test_every_legend_is_right_of_its_plot():
    """Legends sit right of the plot area (Plotly makes room there), never below it where the x axis's title
    and tick labels are (the rotated ones of the compare chart included)."""
    s = make_summary(8, pp=2, bubble=5.0)
    comparison = {
        "labels": ["a", "b"],
        "metrics": [
            {"group": "breakdown", "name": n, "a": 0.5, "b": 0.4}
            for n in ("compute", "exposed communication")
        ],
    }
    blocks = [
        {"stage": 0, "rank": 0, "phase": "forward", "microbatch": 0, "start_ms": 0.0, "end_ms": 1.0},
        {"stage": 1, "rank": 4, "phase": "backward", "microbatch": 0, "start_ms": 1.0, "end_ms": 2.0},
    ]
    figs = {
        "breakdown": F.breakdown_bar(s),
        "bubbles": F.bubble_bar([{"stage": 0, "bubble_fraction": 0.2, "expected_bubble_fraction": 0.1}]),
        "composition": F.composition_bar({"0": {"mlp": 2}, "1": {"mlp": 2}}),
        "memory": F.memory_bar([{"rank": 0, "allocated": 2**30, "reserved": 2**31}]),
        "compare": F.compare_shares_bar(comparison),
        "timeline": F.pipeline_timeline(blocks, [], 1),
    }
    for name, fig in figs.items():
        leg = fig.layout.legend
        assert leg.orientation == "v" and leg.x >= 1 and leg.xanchor == "left", name


def _memory_timeline(peaks_gib: dict[int, float]):
    """Two samples per rank: 1 GiB, then the rank's peak (allocated; reserved 1 GiB above)."""
    import pandas as pd

    rows = []
    for r, peak in peaks_gib.items():
        rows += [
            {"rank": r, "ts_ns": 0, "allocated": 2**30, "reserved": 2 * 2**30},
            {"rank": r, "ts_ns": MS, "allocated": int(peak * 2**30), "reserved": int((peak + 1) * 2**30)},
        ]
    return pd.DataFrame(rows)


def test_memory_timeline_shows_the_highest_peak_of_each_stage_and_the_rest_on_a_button():
    peaks = {r: 10.0 + (r * 7) % 8 for r in range(16)}  # stage = r // 4; highest: r1 (17), r7 (16), r11, r13
    stage_of = {r: r // 4 for r in range(16)}
    rows = [{"rank": r, "peak_allocated": p * 2**30} for r, p in peaks.items()]
    want = sorted(max(range(4 * s, 4 * s + 4), key=lambda r: peaks[r]) for s in range(4))
    assert F.memory_default_ranks(rows, stage_of) == want
    fig = F.memory_timeline_figure(_memory_timeline(peaks), 0.0, want, stage_of, 16)
    listed = [t for t in fig.data if t.showlegend is not False]
    assert len(listed) == 16 and sum(t.visible is True for t in listed) == 4  # one entry per rank, 4 shown
    assert sorted(int(t.name.split()[0][1:]) for t in listed if t.visible) == want
    assert all(t.visible is True for t in fig.data if t.legendgroup in {f"r{r}" for r in want})
    assert len(fig.data) == 32  # allocated and reserved of every rank; reserved lines toggle with their rank
    buttons = fig.layout.updatemenus[0].buttons
    assert buttons[1].label == "all 16 ranks" and buttons[1].args[0]["visible"] == [True] * 32
    assert buttons[0].args[0]["visible"] == [t.visible for t in fig.data]
    # the drawn values: GiB, the peak sample kept
    r1 = [t for t in fig.data if t.legendgroup == "r1"]
    assert list(r1[0].y) == [1.0, 17.0] and list(r1[1].y) == [2.0, 18.0] and r1[1].line.dash == "dot"
    # no stages known: the four highest peaks
    assert F.memory_default_ranks(rows) == sorted(sorted(peaks, key=lambda r: -peaks[r])[:4])


# ----- composition, collectives, memory, top ops --------------------------------------------------------
def test_composition_and_time_share():
    fig = F.composition_bar({"0": {"linear_attention": 3, "full_attention": 1}, "1": {"linear_attention": 2}})
    by = {t.name: list(t.y) for t in fig.data}
    assert by == {"full_attention": [1, 0], "linear_attention": [3, 2]}
    share = F.time_share_bar({"mlp": 0.3, "full_attention": 0.45, XSS: 0.01})
    assert list(share.data[0].x) == [45.0, 30.0, 1.0]
    assert share.data[0].y[2] == "&lt;script&gt;window.__xss=1&lt;/script&gt;"


def _coll_table():
    base = dict(source="kineto", op="allreduce", group_size=2, bytes=1 << 20, is_p2p=False, state="completed")
    rows, extra = [], []
    # instance 0: rank 0 starts at 0, rank 1 at 4 ms; both end at 10 ms -> skew 4 ms; transfer 6 ms
    # instance 1: both start at 20, end at 22 -> skew 0
    for inst, starts, end in ((0, (0, 4), 10), (1, (20, 20), 22)):
        for r, st in enumerate(starts):
            rows.append({**base, "rank": r, "start_ns": st * MS, "end_ns": end * MS})
            extra.append(
                {
                    "instance": inst,
                    "arrival_skew_ns": (max(starts) - min(starts)) * MS,
                    "wait_ns": (max(starts) - st) * MS,
                    "transfer_ns": (end - max(starts)) * MS,
                    "busbw_gbps": 100.0 if inst == 0 else 300.0,
                }
            )
    rows.append({**base, "op": "send", "group_size": 2, "bytes": 10, "rank": 0, "start_ns": 0, "end_ns": MS})
    extra.append({"instance": 2, "arrival_skew_ns": 0, "wait_ns": 0, "transfer_ns": MS, "busbw_gbps": None})
    t = table_from_rows(rows, schema.COLLECTIVES)
    import pyarrow as pa

    for c, typ in (
        ("instance", pa.int64()),
        ("arrival_skew_ns", pa.int64()),
        ("wait_ns", pa.int64()),
        ("transfer_ns", pa.int64()),
        ("busbw_gbps", pa.float64()),
    ):
        t = t.append_column(c, pa.array([e[c] for e in extra], typ))
    return t


def test_collective_rows():
    rows = F.collective_rows(_coll_table())
    ar = rows[0]
    assert (ar["op"], ar["group_size"], ar["bytes"], ar["calls"], ar["rows"]) == (
        "allreduce",
        2,
        1 << 20,
        2,
        4,
    )
    assert ar["total_ms"] == 10 + 6 + 2 + 2
    assert ar["busbw_gbps"] == 200.0  # median of 100, 100, 300, 300
    assert ar["max_skew_ms"] == 4.0 and ar["median_skew_ms"] == 2.0
    assert ar["wait_ms"] == 4.0 and ar["transfer_ms"] == 6 + 6 + 2 + 2
    assert rows[1]["op"] == "send" and rows[1]["busbw_gbps"] is None
    assert F.collective_rows(None) == []


def test_memory_peaks_prefer_gpu_rows():
    rows = [
        {
            "rank": 0,
            "ts_ns": 1,
            "device": 0,
            "bytes": 1,
            "total_allocated": 3 << 30,
            "total_reserved": 4 << 30,
        },
        {
            "rank": 0,
            "ts_ns": 2,
            "device": 0,
            "bytes": -1,
            "total_allocated": 1 << 30,
            "total_reserved": 4 << 30,
        },
        {
            "rank": 0,
            "ts_ns": 3,
            "device": -1,
            "bytes": 1,
            "total_allocated": 9 << 30,
            "total_reserved": 9 << 30,
        },
        {
            "rank": 1,
            "ts_ns": 1,
            "device": 0,
            "bytes": 1,
            "total_allocated": 2 << 30,
            "total_reserved": 2 << 30,
        },
    ]
    peaks = V.rank_memory_peaks(table_from_rows(rows, schema.MEMORY))
    assert peaks == [
        {"rank": 0, "allocated": 3 << 30, "reserved": 4 << 30},
        {"rank": 1, "allocated": 2 << 30, "reserved": 2 << 30},
    ]
    fig = F.memory_bar(peaks, {0: 0, 1: 1})
    assert list(fig.data[0].y) == [3.0, 2.0] and list(fig.data[1].y) == [4.0, 2.0]
    assert V.rank_memory_peaks(None) == []


def test_top_operations_prefers_kernels():
    ev = events_table(
        [
            {"rank": 0, "kind": "kernel", "name": XSS, "ts_ns": 0, "dur_ns": 3 * MS},
            {"rank": 1, "kind": "kernel", "name": XSS, "ts_ns": 0, "dur_ns": 5 * MS},
            {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 1 * MS},
            {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 0, "dur_ns": 100 * MS},
        ]
    )
    kind, rows = F.top_operations(ev)
    assert kind == "kernel"
    assert rows == [
        {"name": XSS, "calls": 2, "total_ms": 8.0, "per_rank_ms": 4.0},
        {"name": "gemm", "calls": 1, "total_ms": 1.0, "per_rank_ms": 0.5},
    ]


# ----- page -----------------------------------------------------------------------------------------------
def _raw_payload_outside_escaped_text(page: str) -> bool:
    return XSS in page or "<img src=x" in page


def test_page_escapes_untrusted_names_everywhere():
    s = make_summary(2)
    s["run"]["name"] = XSS
    s["run"]["warnings"] = ['<img src=x onerror="window.__xss=1">']
    s["findings"] = [
        {
            "code": "STRAGGLER",
            "severity": "warning",
            "message": f"kernel {XSS} is slow",
            "ranks": [1],
            "stages": [],
        }
    ]
    s["composition"] = {"stages": {"0": {XSS: 1}}, "time_share": {XSS: 0.5}}
    ev = events_table([{"rank": 0, "kind": "kernel", "name": XSS, "ts_ns": 0, "dur_ns": MS, "step": 0}])
    from tracelens.engine.stage import op_totals

    ops = op_totals(ev)
    ops = ops.append_column("rank", pa.array([0] * ops.num_rows, pa.int32()))
    analysis = _analysis(
        run=types.SimpleNamespace(
            events_of=lambda ranks: ev, memory=None, stages=types.SimpleNamespace(ops=ops)
        )
    )
    page = H.render(s, H.build_sections(V.ReportViews(analysis), s))
    assert not _raw_payload_outside_escaped_text(page)
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page  # shown as text (title, finding, top ops)
    data = re.search(
        r'<script type="application/json" id="tracelens-summary">(.*?)</script>', page, re.S
    ).group(1)
    assert "<" not in data and json.loads(data)["run"]["name"] == XSS
    assert "could not be drawn" not in page


def _analysis(**kw):
    """What the report reads of an analysis (`tracelens.run_analysis.Analysis`), nothing computed."""
    run = types.SimpleNamespace(
        events_of=lambda ranks: None, memory=None, stages=types.SimpleNamespace(ops=None)
    )
    return types.SimpleNamespace(
        **{"warnings": [], "grid": None, "cross": None, "composition": None, "run": run, **kw}
    )


def test_absent_analyses_become_one_line_notes():
    s = make_summary(2)
    page = H.render(s, H.build_sections(None, s))
    notes = re.findall(r'<p class="note">([^<]*)</p>', page)
    assert any("pipeline" in n for n in notes) and any("composition" in n.lower() for n in notes)
    assert any("collectives" in n.lower() for n in notes) and any("memory" in n.lower() for n in notes)
    assert "could not be drawn" not in page
    assert page.count('class="plotly-graph-div"') == 2  # breakdown + heatmap
    assert page.count("window.PlotlyConfig") == 1  # plotly.js embedded once


def test_a_broken_section_becomes_a_note(monkeypatch):
    s = make_summary(2)
    monkeypatch.delenv("TRACELENS_DEBUG", raising=False)
    monkeypatch.delenv("TRACELENS_STRICT", raising=False)  # strict mode (the tests' default) re-raises
    monkeypatch.setattr(F, "step_heatmap", lambda summary: 1 / 0)
    analysis = _analysis()
    page = H.render(s, H.build_sections(V.ReportViews(analysis), s))
    assert "heatmap could not be drawn: ZeroDivisionError" in page
    assert analysis.warnings == [
        "report section heatmap could not be drawn: ZeroDivisionError: division by zero"
    ]


def test_1024_rank_page_stays_under_10_mb():
    s = make_summary(1024, n_steps=10, pp=4, wait=12.0, transfer=8.0, bubble=3.0)
    s["stages"] = [
        {"stage": i, "compute_ms": 60.0, "bubble_fraction": 0.2, "expected_bubble_fraction": 0.15}
        for i in range(4)
    ]
    s["composition"] = {
        "stages": {str(i): {"linear_attention": 12, "full_attention": 4} for i in range(4)},
        "time_share": {"linear_attention": 0.3, "full_attention": 0.1, "mlp": 0.4},
    }
    page = H.render(s, H.build_sections(None, s))
    assert len(page.encode()) < 10 * 2**20
    # the embedded summary drops the 10,240 per-step rows (summary.json has them), figures are aggregated
    assert "10240 rows: see summary.json" in page


# ----- merged Chrome trace ----------------------------------------------------------------------------------
def test_trace_events_aligned_per_rank_with_finding_markers():
    ev = events_table(
        [
            {
                "rank": 0,
                "kind": "cpu_op",
                "name": "aten::mm",
                "tid": 11,
                "ts_ns": 1_000_000,
                "dur_ns": 2000,
                "step": 3,
            },
            {
                "rank": 1,
                "kind": "kernel",
                "name": XSS,
                "device": 1,
                "stream": 7,
                "ts_ns": 1_500_000,
                "dur_ns": 1500,
            },
            {
                "rank": 1,
                "kind": "kernel",
                "name": "nccl",
                "device": 1,
                "stream": 7,
                "ts_ns": 1_600_000,
                "dur_ns": 10,
                "collective": "allreduce",
                "group_size": 2,
            },
        ]
    )
    f = {"code": "STRAGGLER", "severity": "warning", "message": "rank 1 slow", "ranks": [1], "stages": []}
    out = trace_events(ev, {0: 0, 1: 1}, {1: 400_000}, [f])
    x = [e for e in out if e["ph"] == "X"]
    # rank 1 aligned: 1.5 ms - 0.4 ms = 1.1 ms; earliest (rank 0) 1.0 ms -> 0
    assert [(e["pid"], e["tid"], e["ts"], e["dur"]) for e in x] == [
        (0, 11, 0.0, 2.0),
        (1, GPU_TID_BASE + 1007, 100.0, 1.5),
        (1, GPU_TID_BASE + 1007, 200.0, 0.01),
    ]
    assert x[0]["args"] == {"step": 3} and x[1]["name"] == XSS
    assert x[2]["args"] == {"collective": "allreduce", "group_size": 2}
    names = {
        (e["pid"], e["args"]["name"])
        for e in out
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    assert names == {(0, "rank 0 (stage 0)"), (1, "rank 1 (stage 1)"), (1, "GPU 1 stream 7")}
    marks = [e for e in out if e["ph"] == "i"]
    assert [(m["s"], m["pid"], m["ts"]) for m in marks] == [("g", 0, 0.0), ("p", 1, 100.0)]
    assert marks[0]["name"] == "STRAGGLER: rank 1 slow"


def test_stage_type_ms_and_straggler_table():
    fig = F.stage_type_ms_bar({1: {"mlp": 3.0, "full_attention": 1.25}, 0: {"mlp": 2.0}})
    by = {t.name: (list(t.x), list(t.y)) for t in fig.data}
    assert by == {
        "full_attention": (["stage 0", "stage 1"], [0.0, 1.25]),
        "mlp": (["stage 0", "stage 1"], [2.0, 3.0]),
    }
    s = make_summary(2)
    s["stragglers"] = [
        {
            "rank": 1,
            "stage": 0,
            "cause": "compute",
            "cost_ms": 20.5,
            "steps_flagged": 2,
            "steps_total": 3,
            "evidence": {"compute_ratio": 1.18, "transfer_ratio": None},
        }
    ]
    page = H.findings_html(s)
    assert "<td>1</td><td>0</td><td>compute</td><td>20.500</td><td>2 of 3</td><td>1.180</td></tr>" in page
    assert "transfer vs peers" not in page  # no rank has that evidence
    assert "Stragglers: rank 1 (compute, costs 20.5 ms/step)." in page


def test_pp1_run_has_no_timeline():
    from tracelens.analyze.layout import Grid

    s = make_summary(2)
    s["stages"] = [{"stage": 0, "layers": {"mlp": 4}}]
    page = H.render(s, H.build_sections(V.ReportViews(_analysis(grid=Grid(tp=1, pp=1, dp=2, cp=1))), s))
    assert "pp=1: no pipeline parallelism" in page and "Pipeline timeline" not in page


def test_collectives_from_a_stored_summary():
    s = make_summary(2)
    s["collectives"] = {
        "sources": {},
        "by_op": [
            {"op": "allreduce", "calls": 8, "bytes": 4096, "busbw_gbps_median": 120.5, "skew_ms_median": 0.25}
        ],
    }
    page = H.render(s, H.build_sections(None, s))
    assert "<td>allreduce</td><td>8</td><td>4,096</td><td>120.5</td><td>0.250</td>" in re.sub(
        r' class="[^"]*"', "", page
    )


def test_collective_rows_groups_nulls_and_chunks():
    """Groups by (op, group size, bytes) with missing keys last, over chunks whose dictionaries differ;
    calls count distinct instances plus each unmatched (negative instance) row; null durations add 0."""
    import pyarrow as pa

    def chunk(ops, nbytes, starts, ends, inst, skew):
        return pa.table(
            {
                "op": pa.array(ops, pa.string()).dictionary_encode(),
                "bytes": pa.array(nbytes, pa.int64()),
                "start_ns": pa.array(starts, pa.int64()),
                "end_ns": pa.array(ends, pa.int64()),
                "instance": pa.array(inst, pa.int64()),
                "arrival_skew_ns": pa.array(skew, pa.int64()),
            }
        )

    a = chunk(
        ["send", "allreduce", "allreduce"],
        [8, None, 64],
        [0, 0, 0],
        [MS, 2 * MS, 3 * MS],
        [0, 1, 2],
        [0, MS, None],
    )
    b = chunk(
        ["allreduce", "allreduce", "send"],
        [64, 64, 8],
        [MS, 0, None],
        [2 * MS, 5 * MS, 9],
        [2, -1, -1],
        [3 * MS, None, 0],
    )
    rows = F.collective_rows(pa.concat_tables([a, b]), top=10)
    by = {(r["op"], r["bytes"]): r for r in rows}
    assert set(by) == {("allreduce", 64), ("allreduce", None), ("send", 8)}
    ar = by[("allreduce", 64)]
    assert (ar["rows"], ar["calls"], ar["group_size"]) == (3, 2, None)  # instance 2 twice, one unmatched
    assert ar["total_ms"] == 3 + 1 + 5 and ar["median_ms"] == 3.0
    assert ar["median_skew_ms"] == 3.0 and ar["max_skew_ms"] == 3.0  # the nulls left out
    assert "wait_ms" in ar and ar["wait_ms"] is None and ar["transfer_ms"] is None
    assert by[("allreduce", None)]["total_ms"] == 2.0
    snd = by[("send", 8)]
    assert (snd["rows"], snd["calls"], snd["total_ms"], snd["median_ms"]) == (2, 2, 1.0, 1.0)  # null start: 0
    assert [r["op"] for r in rows] == ["allreduce", "allreduce", "send"]  # heaviest first


def test_memory_peaks_op_from_the_shown_ranks_only():
    """The memory timeline's peak table: every rank's peak; the op at the peak for the first 16 ranks and
    for each stage's highest rank (rank 19 tops stage 1), read from those ranks' events only."""
    mem_rows, ev_rows = [], []
    for r in range(20):
        peak = (2 if r == 19 else 1) * 2**30 + r  # rank 19 highest
        for t, a in ((0, 10), (1_000 + r, peak), (5_000, 20)):
            mem_rows.append(
                dict(rank=r, ts_ns=t, device=0, bytes=1, total_allocated=a, total_reserved=2 * peak)
            )
        ev_rows.append(dict(rank=r, kind="cpu_op", name=f"op{r}", ts_ns=900, dur_ns=500))
    mem = table_from_rows(mem_rows, schema.MEMORY)
    events = events_table(ev_rows)
    read: list[list[int]] = []

    def events_of(ranks, columns=None):
        read.append(list(ranks))
        return events.filter(pa.compute.is_in(events.column("rank"), pa.array(list(ranks), pa.int32())))

    an = types.SimpleNamespace(run=types.SimpleNamespace(memory=mem, events_of=events_of))
    pk = V.memory_peaks_of(an, {r: 0 if r < 10 else 1 for r in range(20)})
    assert read == [list(range(16)) + [19]]
    assert list(pk["rank"]) == list(range(20))
    ops = [None if not isinstance(o, str) else o for o in pk["op_at_peak"]]  # (pandas may give NaN)
    assert ops == [f"op{r}" for r in range(16)] + [None, None, None, "op19"]
    assert list(pk["peak_ts_ns"]) == [1_000 + r for r in range(20)]
    assert pk["peak_allocated"].iloc[19] == 2 * 2**30 + 19 and list(pk["stage"][:11]) == [0] * 10 + [1]
