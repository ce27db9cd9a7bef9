"""The report's use of what-if and the critical path: findings ordered by saving, the path on the timeline."""

from __future__ import annotations

from tracelens.report import figures
from tracelens.report.html import findings_html


def test_findings_ordered_by_saving():
    summary = {
        "findings": [
            {"code": "STAGE_IMBALANCE", "severity": "warning", "message": "stage", "saving_ms": 0.5},
            {"code": "CLOCK_SKEW", "severity": "error", "message": "skew"},
            {"code": "STRAGGLER", "severity": "warning", "message": "straggler", "saving_ms": 2.0},
        ],
        "ranks": [],
        "stragglers": [],
    }
    html = findings_html(summary)
    pos = [html.index(m) for m in ("straggler", "stage", "skew")]
    assert pos == sorted(pos)
    assert "saves 2.00 ms per step" in html


def test_critical_path_on_pipeline_timeline():
    blocks = [
        {
            "stage": 0,
            "rank": 0,
            "phase": "forward",
            "microbatch": 0,
            "start_ms": 0.0,
            "end_ms": 1.0,
            "t0_ms": 100.0,
        },
        {
            "stage": 1,
            "rank": 4,
            "phase": "forward",
            "microbatch": 0,
            "start_ms": 1.0,
            "end_ms": 2.0,
            "t0_ms": 100.0,
        },
    ]
    crit = [
        {"step": 3, "rank": 0, "stage": 0, "kind": "compute", "op": "mlp", "start_ms": 100.2, "ms": 0.5},
        {"step": 3, "rank": 1, "stage": 0, "kind": "compute", "op": "mlp", "start_ms": 100.7, "ms": 0.25},
        {"step": 3, "rank": 4, "stage": 1, "kind": "transfer", "op": "send", "start_ms": 101.0, "ms": 0.25},
        {"step": 2, "rank": 4, "stage": 1, "kind": "compute", "op": "mlp", "start_ms": 50.0, "ms": 1.0},
    ]
    fig = figures.pipeline_timeline(blocks, [], 3, crit)
    tr = [t for t in fig.data if t.name == "critical path"]
    assert len(tr) == 1
    xs = [x for x in tr[0].x if x is not None]
    # step 3 only, relative to the timeline's zero, each segment on its own rank's row: rank 1 (stage 0, not
    # drawn) has no row, so its segment is not drawn on rank 0's; the subtitle says how much is shown
    assert xs == [0.2, 0.7, 1.0, 1.25]
    assert "0.8 of its 1.0 ms drawn" in fig.layout.title.text
    # on each stage's row, under its bars (which hold the microbatch numbers), never across them
    bars = [t for t in fig.data if t.name == "forward"][0]
    half = figures.TIMELINE_BAR / 2
    rows = {fig.layout.yaxis.ticktext[y].split(" (")[0]: y for y in bars.y}
    ys = [y for y in tr[0].y if y is not None]
    assert (
        ys
        == [rows["stage 0"] + figures.CRITICAL_OFFSET] * 2 + [rows["stage 1"] + figures.CRITICAL_OFFSET] * 2
    )
    for y in ys:
        row = round(y - figures.CRITICAL_OFFSET)
        assert abs(y - row) > half and abs(y - (row + 1)) > half  # clear of its row's bars and the next's


def test_summary_releasing_the_critical_path_is_the_same_summary(tmp_path):
    """`tracelens analyze` lets the critical path go once its part of summary.json is built
    (`build_summary(release=True)`): the same document as keeping it, and the analysis no longer holds it (a
    later use computes it again, the same)."""
    import json
    from pathlib import Path

    from tracelens.run_analysis import Options, analyze_run

    run = Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"
    kept = analyze_run(run, Options(cache_dir=tmp_path / "a"))
    want = kept.summary()
    assert "critical" in kept.__dict__  # (kept: the notebook API's default)
    released = analyze_run(run, Options(cache_dir=tmp_path / "b"))
    got = released.summary(release=True)
    assert "critical" not in released.__dict__
    assert want["critical_path"] and want["what_if"]  # (a run whose summary has both)

    def same(d: dict) -> str:
        d = json.loads(json.dumps(d, default=str))
        d["run"].pop("path", None)
        return json.dumps(d, sort_keys=True)

    assert same(got) == same(want)
    assert released.critical.to_dict() == want["critical_path"]
