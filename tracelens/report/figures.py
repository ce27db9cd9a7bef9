"""Figures for the report: each function takes analyzer results and returns a plotly Figure.

No figure reads files or runs analyses, so tests check their data without a browser.
"""

from __future__ import annotations

import plotly.graph_objects as go

#: Stacked parts of a rank's step, in drawing order, with the summary field each comes from.
BREAKDOWN_PARTS = (
    ("compute (not overlapped)", "compute_only_ms", "#4C78A8"),
    ("overlapped comm", "overlapped_comm_ms", "#72B7B2"),
    ("exposed comm: wait", "exposed_wait_ms", "#E45756"),
    ("exposed comm: transfer", "exposed_transfer_ms", "#F58518"),
    ("exposed comm", "exposed_comm_ms", "#E45756"),
    ("memcpy", "memcpy_ms", "#B279A2"),
    ("idle", "idle_other_ms", "#BAB0AC"),
    ("pipeline bubble", "bubble_ms", "#EECA3B"),
)


def _parts(rank: dict) -> dict[str, float | None]:
    """The disjoint parts of one rank's mean step (they add up to step_time_ms)."""
    compute = rank.get("compute_ms") or 0.0
    overlapped = rank.get("overlapped_comm_ms") or 0.0
    idle = rank.get("idle_ms") or 0.0
    bubble = rank.get("bubble_ms")
    split = rank.get("exposed_wait_ms") is not None and rank.get("exposed_transfer_ms") is not None
    return {
        "compute_only_ms": compute - overlapped,
        "overlapped_comm_ms": overlapped,
        "exposed_wait_ms": rank.get("exposed_wait_ms") if split else None,
        "exposed_transfer_ms": rank.get("exposed_transfer_ms") if split else None,
        "exposed_comm_ms": None if split else rank.get("exposed_comm_ms"),
        "memcpy_ms": rank.get("memcpy_ms"),
        "idle_other_ms": idle - min(bubble or 0.0, idle),
        "bubble_ms": min(bubble, idle) if bubble is not None else None,
    }


def breakdown_bar(summary: dict) -> go.Figure:
    """Per-rank stacked bar of the mean step: compute, overlapped / exposed comm, memcpy, idle, bubble."""
    ranks = summary["ranks"]
    labels = [f"r{r['rank']}" + (f" s{r['stage']}" if r.get("stage") is not None else "") for r in ranks]
    parts = [_parts(r) for r in ranks]
    fig = go.Figure()
    for name, key, color in BREAKDOWN_PARTS:
        ys = [p[key] for p in parts]
        if all(y is None for y in ys):
            continue
        fig.add_bar(name=name, x=labels, y=[y or 0.0 for y in ys], marker_color=color)
    fig.update_layout(
        barmode="stack",
        title="Where each rank's step goes (mean over analyzed steps)",
        yaxis_title="ms per step",
        xaxis_title="rank",
        legend_orientation="h",
        height=420,
    )
    return fig
