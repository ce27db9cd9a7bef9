"""Figures for the report: each function takes analyzer results and returns a plotly Figure.

No figure reads files or runs analyses, so tests check their data without a browser. Inputs may come from
a summary dict (summary.json) or from analyzer results (Arrow tables, result dataclasses). Large runs are
aggregated (by stage, else by node of `NODE_SIZE` ranks) beyond `MAX_ITEMS` ranks, and floats are rounded,
so a 1,024-rank report stays small. Every string that came from a trace or a summary file is HTML-escaped
before it reaches Plotly, whose labels understand a subset of HTML (`<b>`, `<a href>`).
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc

#: Stacked parts of a rank's step, in drawing order, with the summary field each comes from.
BREAKDOWN_PARTS = (
    ("compute (not overlapped)", "compute_only_ms", "#4C78A8"),
    ("overlapped comm", "overlapped_comm_ms", "#72B7B2"),
    ("exposed comm: wait", "exposed_wait_ms", "#E45756"),
    ("exposed comm: transfer", "exposed_transfer_ms", "#F58518"),
    ("exposed comm", "exposed_comm_ms", "#E45756"),
    ("memcpy", "memcpy_ms", "#B279A2"),
    ("idle", "idle_ms", "#BAB0AC"),
)
#: The pipeline bubble is not a stacked part: it spans idle time and exposed P2P waits (see
#: analyze/pipeline/pipeline.py), so it is drawn as a marker at its height beside the stack.
BUBBLE_MARKER = ("pipeline bubble (spans idle and P2P waits)", "bubble_ms", "#EECA3B")
#: Beyond this many ranks, per-rank figures show groups (stages or nodes) instead.
MAX_ITEMS = 256
#: Ranks per node when grouping by node (8 GPUs per host is the common case).
NODE_SIZE = 8
#: Colours of layer types (others get the Plotly default cycle).
TYPE_COLORS = {
    "full_attention": "#E45756",
    "linear_attention": "#4C78A8",
    "mixer": "#54A24B",
    "mlp": "#F58518",
    "lm_head": "#B279A2",
    "embedding": "#9D755D",
}
PHASE_COLORS = {"forward": "#4C78A8", "backward": "#F58518"}
#: Legends sit right of the plot, top-aligned: Plotly widens the right margin to fit them, so they never
#: cover the x axis's title, its tick labels (rotated ones included) or the bars. (Plotly's horizontal
#: legend goes below the plot at a fixed offset and overlapped the x axis's title and labels.)
LEGEND = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"}


def txt(x) -> str:
    """Text from a trace or summary, safe for a Plotly label (its pseudo-HTML is escaped)."""
    return html.escape("" if x is None else str(x), quote=True)


def _r(x, nd: int = 3) -> float | None:
    """Round for the page (keeps the embedded JSON small); None and NaN stay None."""
    if x is None:
        return None
    x = float(x)
    return None if x != x else round(x, nd)


def _get(obj, key: str, default=None):
    """Attribute or key of an analyzer result or its summary dict."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


# ----------------------------------------------------------------------------------------------------
# grouping of ranks for large runs
# ----------------------------------------------------------------------------------------------------
def rank_groups(
    ranks: Sequence[int],
    stage_of: Mapping[int, int | None] | None = None,
    max_items: int = MAX_ITEMS,
    node_size: int = NODE_SIZE,
) -> tuple[list[str], list[list[int]], str]:
    """Labels and member ranks of the bars/rows to draw: one per rank up to `max_items`, else one per stage
    (when stages are known and few enough), else one per node of `node_size` consecutive ranks."""
    ranks = sorted(int(r) for r in ranks)
    stage_of = stage_of or {}
    if len(ranks) <= max_items:
        labels = [f"r{r}" + (f" s{stage_of[r]}" if stage_of.get(r) is not None else "") for r in ranks]
        return labels, [[r] for r in ranks], "rank"
    stages = sorted({s for s in (stage_of.get(r) for r in ranks) if s is not None})
    if stages and all(stage_of.get(r) is not None for r in ranks) and len(stages) <= max_items:
        members = [[r for r in ranks if stage_of.get(r) == s] for s in stages]
        return [f"stage {s} ({len(m)} ranks)" for s, m in zip(stages, members)], members, "stage"
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        nodes.setdefault(r // node_size, []).append(r)
    size = node_size
    while len(nodes) > max_items:  # very large runs: several nodes per group
        size *= 2
        nodes = {}
        for r in ranks:
            nodes.setdefault(r // size, []).append(r)
    return [f"ranks {m[0]}-{m[-1]}" for m in nodes.values()], list(nodes.values()), "node"


#: At most this many ranks named by findings are drawn on their own beside the groups of a large run.
MAX_FLAGGED = 32


def flagged_ranks(summary: Mapping, limit: int = MAX_FLAGGED) -> list[int]:
    """Ranks the findings point at (stragglers first, then warning/error findings naming a few ranks).

    Aggregated views (stage means, the CLI's first and last ranks) must still show these. A finding that
    names more than `limit` ranks (exposed communication on every rank) describes the run, not a rank,
    and is left to the aggregate.
    """
    out: list[int] = []
    for s in summary.get("stragglers") or []:
        if s.get("rank") is not None and int(s["rank"]) not in out:
            out.append(int(s["rank"]))
    for f in summary.get("findings") or []:
        ranks = f.get("ranks") or []
        if f.get("severity") in ("warning", "error") and 0 < len(ranks) <= limit:
            out += [int(r) for r in ranks if int(r) not in out]
    return out[:limit]


def _with_flagged(
    labels: list[str], members: list[list[int]], unit: str, flagged: Sequence[int], known: set[int]
) -> tuple[list[str], list[list[int]]]:
    """Append one item per flagged rank to an aggregated grouping (per-rank groupings already show them)."""
    if unit == "rank":
        return labels, members
    extra = [r for r in flagged if r in known]
    return labels + [f"r{r} (in findings)" for r in extra], members + [[r] for r in extra]


def _stage_map(summary: dict) -> dict[int, int | None]:
    return {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}


# ----------------------------------------------------------------------------------------------------
# breakdown
# ----------------------------------------------------------------------------------------------------
def _parts(rank: dict) -> dict[str, float | None]:
    """The disjoint parts of one rank's mean step (they add up to step_time_ms), and the bubble."""
    compute = rank.get("compute_ms") or 0.0
    overlapped = rank.get("overlapped_comm_ms") or 0.0
    split = rank.get("exposed_wait_ms") is not None and rank.get("exposed_transfer_ms") is not None
    return {
        "compute_only_ms": compute - overlapped,
        "overlapped_comm_ms": overlapped,
        "exposed_wait_ms": rank.get("exposed_wait_ms") if split else None,
        "exposed_transfer_ms": rank.get("exposed_transfer_ms") if split else None,
        "exposed_comm_ms": None if split else rank.get("exposed_comm_ms"),
        "memcpy_ms": rank.get("memcpy_ms"),
        "idle_ms": rank.get("idle_ms"),
        "bubble_ms": rank.get("bubble_ms"),
    }


def breakdown_bar(summary: dict, max_items: int = MAX_ITEMS) -> go.Figure:
    """Per-rank stacked bar of the mean step (compute, overlapped / exposed comm, memcpy, idle) + bubble.

    Beyond `max_items` ranks each bar is the mean of a stage (or node) of ranks."""
    ranks = summary.get("ranks") or []
    by_rank = {int(r["rank"]): _parts(r) for r in ranks}
    labels, members, unit = rank_groups(list(by_rank), _stage_map(summary), max_items)
    flagged = flagged_ranks(summary)
    labels, members = _with_flagged(labels, members, unit, flagged, set(by_rank))
    fig = go.Figure()
    for name, key, color in BREAKDOWN_PARTS:
        cols = [[by_rank[r][key] for r in m] for m in members]
        if all(v is None for c in cols for v in c):
            continue
        ys = [_r(np.mean([v or 0.0 for v in c])) for c in cols]
        fig.add_bar(name=name, x=labels, y=ys, marker_color=color)
    name, key, color = BUBBLE_MARKER
    cols = [[by_rank[r][key] for r in m] for m in members]
    if not all(v is None for c in cols for v in c):
        fig.add_scatter(
            name=name,
            x=labels,
            y=[_r(np.mean([v or 0.0 for v in c])) for c in cols],
            mode="markers",
            marker={"color": color, "symbol": "diamond", "size": 11, "line": {"color": "#333", "width": 1}},
        )
    marked = [(lab, m[0]) for lab, m in zip(labels, members) if len(m) == 1 and m[0] in flagged]
    if marked:  # the ranks the findings name: a marked point above their bar, also in an aggregated view
        top = {lab: sum(v or 0.0 for k, v in by_rank[r].items() if k != "bubble_ms") for lab, r in marked}
        fig.add_scatter(
            name="rank in findings",
            x=[lab for lab, _ in marked],
            y=[_r(top[lab] * 1.03) for lab, _ in marked],
            mode="markers+text",
            text=[f"r{r}" for _, r in marked],
            textposition="top center",
            marker={"color": "#D62728", "symbol": "triangle-down", "size": 12},
        )
    fig.update_layout(
        barmode="stack",
        title="Where each rank's step goes (mean over analyzed steps)"
        + ("" if unit == "rank" else f"; {len(ranks)} ranks shown as the mean of each {unit}"),
        yaxis_title="ms per step",
        xaxis_title=unit,
        legend=LEGEND,
        height=420,
    )
    return fig


#: Per-step fields the heatmap can switch between (buttons), in this order.
HEATMAP_METRICS = ("step_time_ms", "compute_ms", "exposed_comm_ms", "exposed_wait_ms", "idle_ms", "bubble_ms")


#: The heatmap's colour scale spans at least this share of the metric's median (centred on it), so that
#: run-to-run noise of a fraction of a percent stays one colour and a real outlier stands out.
HEATMAP_MIN_SPAN = 0.10


def heatmap_range(
    z: Sequence[Sequence[float | None]], min_span: float = HEATMAP_MIN_SPAN
) -> tuple[float, float] | None:
    """(zmin, zmax) of a heatmap: the data's range, widened to `min_span` x the median around the median
    (never below 0 for non-negative data). None without data."""
    vals = np.array([v for row in z for v in row if v is not None and v == v], dtype=float)
    if vals.size == 0:
        return None
    lo, hi, med = float(vals.min()), float(vals.max()), float(np.median(vals))
    half = min_span * abs(med) / 2
    lo, hi = min(lo, med - half), max(hi, med + half)
    if float(vals.min()) >= 0:
        lo = max(lo, 0.0)
    if hi <= lo:
        hi = lo + 1.0
    return round(lo, 3), round(hi, 3)


def _metric_label(metric: str) -> str:
    return metric.replace("_ms", "").replace("_", " ")


def step_heatmap(
    summary: dict,
    metric: str = "step_time_ms",
    max_items: int = MAX_ITEMS * 2,
    metrics: Sequence[str] = HEATMAP_METRICS,
) -> go.Figure:
    """Rank x step heatmap of `metric` from summary["per_step"] (groups of ranks beyond `max_items`), with
    buttons switching to the other `metrics` that the summary has."""
    rows = [r for r in summary.get("per_step") or [] if r.get("step_time_ms") is not None or r.get(metric)]
    ranks = sorted({int(r["rank"]) for r in rows})
    steps = sorted({r["step"] for r in rows}, key=lambda s: (s is None, s if s is not None else 0))
    labels, members, unit = rank_groups(ranks, _stage_map(summary), max_items)
    labels, members = _with_flagged(labels, members, unit, flagged_ranks(summary), set(ranks))
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: j for j, s in enumerate(steps)}
    shown = [metric] + [m for m in metrics if m != metric]
    zs: dict[str, list] = {}
    for name in shown:
        if not any(r.get(name) is not None for r in rows):
            continue
        grid = np.full((len(ranks), len(steps)), np.nan)
        for r in rows:
            if r.get(name) is not None:
                grid[ri[int(r["rank"])], si[r["step"]]] = float(r[name])
        z = []
        for m in members:
            sub = grid[[ri[r] for r in m]]
            with warnings.catch_warnings():  # an all-missing column is None, not a warning
                warnings.simplefilter("ignore", RuntimeWarning)
                vals = np.nanmean(sub, axis=0) if sub.size else np.array([])
            z.append([_r(v) for v in vals])
        zs[name] = z
    first = next(iter(zs), metric)
    ranges = {name: heatmap_range(z) for name, z in zs.items()}
    rng = ranges.get(first)
    fig = go.Figure(
        go.Heatmap(
            z=zs.get(first, []),
            zmin=rng[0] if rng else None,
            zmax=rng[1] if rng else None,
            x=["whole trace" if s is None else f"step {s}" for s in steps],
            y=labels,
            colorscale="Viridis",
            colorbar_title="ms",
            hovertemplate="%{y}, %{x}: %{z:.2f} ms<extra></extra>",
        )
    )
    title = f"{{}} per {unit} and step (ms)"
    fig.update_layout(
        title=title.format(_metric_label(first)),
        yaxis_autorange="reversed",
        height=max(300, min(900, 24 * len(labels) + 150)),
    )
    if len(zs) > 1:
        fig.update_layout(
            updatemenus=[
                {
                    "type": "buttons",
                    "direction": "right",
                    "x": 0,
                    "y": 1.01,
                    "xanchor": "left",
                    "yanchor": "bottom",
                    "buttons": [
                        {
                            "label": _metric_label(name),
                            "method": "update",
                            "args": [
                                {
                                    "z": [z],
                                    "zmin": [(ranges[name] or (None, None))[0]],
                                    "zmax": [(ranges[name] or (None, None))[1]],
                                },
                                {"title.text": title.format(_metric_label(name))},
                            ],
                        }
                        for name, z in zs.items()
                    ],
                }
            ],
            margin={"t": 120},
        )
    return fig


# ----------------------------------------------------------------------------------------------------
# pipeline
# ----------------------------------------------------------------------------------------------------
#: Height of a block on the pipeline timeline (rows are 1 apart on the y axis).
TIMELINE_BAR = 0.6
#: Where the critical path runs on the timeline, relative to its stage's row: below the row's bars (their
#: edge is at TIMELINE_BAR / 2 = 0.3), in the gap before the next row's bars (at 1 - 0.3 = 0.7), so that
#: it never covers the microbatch numbers written inside the bars.
CRITICAL_OFFSET = 0.42
#: Colour of the waits in sends and receives (hatched) on the pipeline timeline.
WAIT_COLOR = "#BAB0AC"


def pipeline_timeline(
    blocks: Sequence[Mapping],
    stages: Sequence[Mapping] | None = None,
    step=None,
    critical: Sequence[Mapping] | None = None,
) -> go.Figure:
    """Per-stage timeline of one step: a bar per forward/backward microbatch block (its number inside),
    the waits in sends and receives hatched, the critical path as a line under each stage's bars.

    `blocks`: dicts with stage, rank, phase (forward|backward|wait), microbatch, start_ms, end_ms (from
    `tracelens.analyze.pipeline.timeline.pipeline_blocks`). `stages`: summary["stages"] rows for the row labels (the
    measured bubble) and the subtitle (the schedule's expected bubble)."""
    frac = {s.get("stage"): s.get("bubble_fraction") for s in stages or []}
    exp = next(
        (
            s.get("expected_bubble_fraction")
            for s in stages or []
            if s.get("expected_bubble_fraction") is not None
        ),
        None,
    )

    def row(b: Mapping) -> str:
        f = frac.get(b["stage"])
        return f"stage {b['stage']} (r{b['rank']})" + (f" bubble {100 * f:.0f}%" if f is not None else "")

    order = sorted({(b["stage"] if b["stage"] is not None else -1, row(b)) for b in blocks})
    y_of = {label: i for i, (_, label) in enumerate(order)}
    fig = go.Figure()
    for phase in ("forward", "backward", "wait"):
        bs = [b for b in blocks if b["phase"] == phase]
        if not bs:
            continue
        rows = [row(b) for b in bs]
        common = {
            "orientation": "h",
            "y": [y_of[r] for r in rows],
            "x": [_r(b["end_ms"] - b["start_ms"]) for b in bs],
            "base": [_r(b["start_ms"]) for b in bs],
            "width": TIMELINE_BAR,
        }
        if phase == "wait":
            fig.add_bar(
                name="waiting in send/recv",
                customdata=rows,
                marker={
                    "color": "white",
                    "line": {"color": WAIT_COLOR, "width": 1},
                    "pattern": {"shape": "/", "fgcolor": WAIT_COLOR, "size": 6},
                },  # fmt: skip
                hovertemplate="%{customdata}: waiting in send/recv, %{base:.2f} + %{x:.2f} ms<extra></extra>",
                **common,
            )
            continue
        mbs = ["" if b.get("microbatch") is None else str(b["microbatch"]) for b in bs]
        fig.add_bar(
            name=phase,
            text=mbs,
            textposition="inside",
            insidetextanchor="middle",
            customdata=[[r, m] for r, m in zip(rows, mbs)],
            marker_color=PHASE_COLORS[phase],
            hovertemplate="%{customdata[0]}: " + phase + " mb %{customdata[1]}, %{base:.2f} + %{x:.2f} ms"
            "<extra></extra>",
            **common,
        )
    shown = (
        _critical_overlay(fig, blocks, critical, step, {b["rank"]: y_of[row(b)] for b in blocks})
        if critical
        else None
    )
    title = "Pipeline timeline of " + (f"step {step}" if step is not None else "one step")
    sub = "bars: compute of each microbatch (numbered); hatched: waiting in send/recv; blank: neither"
    if shown is not None and shown[1] > 0:
        sub += f"; red: the critical path on its own rank ({shown[0]:,.1f} of its {shown[1]:,.1f} ms drawn)"
    if exp is not None:
        sub += f"; the schedule expects a {100 * exp:.0f}% bubble"
    fig.update_layout(
        title={"text": f"{title}<br><sup>{sub}</sup>"},
        barmode="overlay",
        xaxis_title="ms from the start of the step's pipeline window",
        yaxis={
            "tickvals": list(range(len(order))),
            "ticktext": [label for _, label in order],
            "autorange": "reversed",
            "zeroline": False,
            "showgrid": False,
        },
        legend=LEGEND,
        height=max(260, 60 * len(order) + 160),
    )
    return fig


def _critical_overlay(fig: go.Figure, blocks, critical, step, y_of_rank: dict) -> tuple[float, float] | None:
    """The step's critical-path segments (summary `critical_path.segments`) as a line under the row of the rank
    each ran on (`CRITICAL_OFFSET`); segments of ranks without a row are not drawn. Returns (ms drawn, ms of
    the step's path), None without a timeline zero."""
    t0 = blocks[0].get("t0_ms") if blocks else None
    if t0 is None:
        return None
    xs, ys, texts = [], [], []
    drawn = total = 0.0
    for sgm in critical:
        if sgm.get("step") != step:
            continue
        total += float(sgm.get("ms") or 0.0)
        if sgm.get("rank") not in y_of_rank:
            continue
        drawn += float(sgm.get("ms") or 0.0)
        a = sgm["start_ms"] - t0
        xs += [_r(a), _r(a + sgm["ms"]), None]
        y = y_of_rank[sgm["rank"]] + CRITICAL_OFFSET
        ys += [y, y, None]
        label = f"r{sgm['rank']} {sgm['kind']} {txt(sgm['op'])} {sgm['ms']:.3f} ms"
        texts += [label, label, None]
    if xs:
        fig.add_scatter(
            name="critical path",
            x=xs,
            y=ys,
            text=texts,
            mode="lines",
            line={"color": "#D62728", "width": 4},
            hovertemplate="%{text}<extra>critical path</extra>",
        )
    return drawn, total


def bubble_bar(stages: Sequence[Mapping]) -> go.Figure:
    """Measured vs expected bubble fraction per stage (summary["stages"])."""
    rows = [s for s in stages if s.get("bubble_fraction") is not None]
    x = [f"stage {s['stage']}" for s in rows]
    fig = go.Figure()
    fig.add_bar(
        name="measured", x=x, y=[_r(100 * s["bubble_fraction"], 2) for s in rows], marker_color="#EECA3B"
    )
    if any(s.get("expected_bubble_fraction") is not None for s in rows):
        fig.add_bar(
            name="expected for the schedule",
            x=x,
            y=[
                _r(100 * s["expected_bubble_fraction"], 2)
                if s.get("expected_bubble_fraction") is not None
                else None
                for s in rows
            ],
            marker_color="#BAB0AC",
        )
    fig.update_layout(
        title="Pipeline bubble per stage (% of the pipeline window)",
        yaxis_title="%",
        barmode="group",
        legend=LEGEND,
        height=360,
    )
    return fig


# ----------------------------------------------------------------------------------------------------
# composition
# ----------------------------------------------------------------------------------------------------
def _stacked_by_type(per_stage: Mapping, value, title: str, yaxis: str, height: int) -> go.Figure:
    """Stacked bars per stage, one trace per layer type; `per_stage`: {stage: {layer type: number}}."""
    keys = sorted(per_stage, key=lambda s: int(s))
    types = sorted({t for s in keys for t in per_stage[s]})
    fig = go.Figure()
    for t in types:
        fig.add_bar(
            name=txt(t),
            x=[f"stage {s}" for s in keys],
            y=[value(per_stage[s].get(t)) for s in keys],
            marker_color=TYPE_COLORS.get(t),
        )
    fig.update_layout(barmode="stack", title=title, yaxis_title=yaxis, legend=LEGEND, height=height)
    return fig


def composition_bar(stages: Mapping) -> go.Figure:
    """Stacked layer counts by type per stage; `stages`: {stage: {layer type: count}}."""
    return _stacked_by_type(
        stages, lambda v: int(v or 0), "Layers per pipeline stage, by type", "layers", 360
    )


def stage_type_ms_bar(per_stage_type_ms: Mapping) -> go.Figure:
    """Stacked GPU compute per microbatch by layer type per stage (composition.per_stage_type_ms, ms)."""
    return _stacked_by_type(
        per_stage_type_ms,
        lambda v: _r(v or 0.0),
        "Compute per microbatch by layer type and stage (forward + backward)",
        "ms per microbatch",
        380,
    )


def time_share_bar(
    time_share: Mapping[str, float], title: str = "Share of step time by layer type"
) -> go.Figure:
    """Horizontal bar: fraction of step time spent in each layer type's modules (composition.time_share)."""
    items = sorted(time_share.items(), key=lambda kv: -(kv[1] or 0.0))
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=[txt(k) for k, _ in items],
            x=[_r(100 * (v or 0.0), 2) for _, v in items],
            marker_color=[TYPE_COLORS.get(k, "#4C78A8") for k, _ in items],
            hovertemplate="%{y}: %{x:.1f}% of step time<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="% of step time",
        yaxis_autorange="reversed",
        height=max(220, 40 * len(items) + 140),
    )
    return fig


# ----------------------------------------------------------------------------------------------------
# collectives
# ----------------------------------------------------------------------------------------------------
def _group_slices(op_code: np.ndarray, gs_of: np.ndarray, nb_of: np.ndarray) -> list[np.ndarray]:
    """Row numbers of each (op, group size, bytes) group, groups in sorted order with missing (NaN) sizes
    last, each group's rows in their order: what a stable `np.lexsort` of the three keys cut at each change
    gives, from hashed group codes (a run has few groups) and a stable sort of small integers instead of a
    sort of every row by three keys (~0.08 s at 1,024 ranks)."""
    import pandas as pd

    c_gs, _ = pd.factorize(gs_of)  # NaN: -1 (equal values one code, as the sorted cut compares them)
    c_nb, _ = pd.factorize(nb_of)
    key = (op_code.astype(np.int64) * (int(c_gs.max(initial=-1)) + 2) + (c_gs + 1)) * (
        int(c_nb.max(initial=-1)) + 2
    ) + (c_nb + 1)
    group, uniq = pd.factorize(key)
    n = len(uniq)
    # each group's rows in their order (a stable sort of small codes), the group's first row first
    order = np.argsort(group.astype(np.int16) if n < 2**15 else group, kind="stable")
    counts = np.bincount(group, minlength=n)
    slices = np.split(order, np.cumsum(counts)[:-1])
    first = np.array([int(x[0]) for x in slices], dtype=np.int64)
    gs, nb = gs_of[first], nb_of[first]
    place = np.lexsort((np.nan_to_num(nb), np.isnan(nb), np.nan_to_num(gs), np.isnan(gs), op_code[first]))
    return [slices[i] for i in place]


def collective_rows(coll: pa.Table | None, top: int = 30) -> list[dict]:
    """Collectives grouped by (op, group size, bytes): calls, time, median bus bandwidth and arrival skew.

    `coll`: analysis.cross.collectives (schema.COLLECTIVES plus instance / wait / transfer / busbw columns).
    Sorted by total time on all ranks, the `top` heaviest first."""
    if coll is None or coll.num_rows == 0:
        return []
    import pandas as pd

    names = set(coll.column_names)

    def col(name: str) -> np.ndarray | None:  # float64 values, NaN for null (None: no such column)
        if name not in names:
            return None
        c = coll.column(name)
        if pa.types.is_dictionary(c.type):
            c = c.cast(c.type.value_type)
        return pc.cast(c, pa.float64(), safe=False).to_numpy(zero_copy_only=False)

    n = coll.num_rows
    # op as text, a null op as "nan" (the text pandas gave it), coded by its place in sorted order;
    # the dictionary's few texts are sorted, not each row's
    op_t = coll.select(["op"])
    if not pa.types.is_dictionary(op_t.schema.field("op").type):
        op_t = pa.table({"op": pc.dictionary_encode(op_t.column("op"))})
    op = op_t.unify_dictionaries().combine_chunks().column("op").chunk(0)
    texts = ["nan" if v is None else str(v) for v in op.dictionary.to_pylist()] + ["nan"]
    op_names, place = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    idx = op.indices.fill_null(len(texts) - 1).to_numpy(zero_copy_only=False)
    op_code = place[idx]  # each row's op text by its place in sorted order
    gs_of = col("group_size") if "group_size" in names else np.full(n, np.nan)
    nb_of = col("bytes") if "bytes" in names else np.full(n, np.nan)
    assert gs_of is not None and nb_of is not None
    # groups by (op, group size, bytes) in sorted order, missing sizes last (as pandas' sorted group-by),
    # then numpy over each group's slice of the sorted rows: no per-group pandas objects (~0.3 s at 1,024
    # ranks)
    slices = _group_slices(op_code, gs_of, nb_of)
    if "start_ns" in names and "end_ns" in names:
        s, e = coll.column("start_ns"), coll.column("end_ns")
        if s.null_count or e.null_count:  # (as pandas did: nulls make both float first)
            dur = pc.cast(e, pa.float64(), safe=False).to_numpy(zero_copy_only=False) - pc.cast(
                s, pa.float64(), safe=False
            ).to_numpy(zero_copy_only=False)
        else:  # nanosecond clocks: the difference in int64, exact
            dur = (e.to_numpy() - s.to_numpy()).astype("float64")
    else:
        dur = np.full(n, np.nan)
    inst = col("instance")
    busbw, skew, wait, transfer = (
        col("busbw_gbps"),
        col("arrival_skew_ns"),
        col("wait_ns"),
        col("transfer_ns"),
    )
    # arrival skew and the wait / transfer split need a second participant: a call seen on one rank only
    # (its peers not traced) has none (null, as in summary.json; not 0)
    parts = col("n_participants")
    if parts is not None:
        alone = ~(parts > 1)
        skew, wait, transfer = (
            None if v is None else np.where(alone, np.nan, v) for v in (skew, wait, transfer)
        )

    def med(v: np.ndarray | None, scale: float = 1.0) -> float | None:
        if v is None:
            return None
        v = v[~np.isnan(v)]
        return None if v.size == 0 else _r(float(np.median(v)) / scale)

    def mx(v: np.ndarray | None, scale: float = 1.0) -> float | None:
        if v is None:
            return None
        v = v[~np.isnan(v)]
        return None if v.size == 0 else _r(float(v.max()) / scale)

    def total(v: np.ndarray) -> float:
        return float(np.where(np.isnan(v), 0.0, v).sum())

    bus_n = col("bus_n")
    bus_from = coll.column("bus_n_from").to_numpy(zero_copy_only=False) if "bus_n_from" in names else None

    def bus_text(idx: np.ndarray) -> str | None:
        """n of the bus-bandwidth factor and where it comes from ("128 (world size)"); "2, 4" when mixed."""
        if bus_n is None or busbw is None:
            return None
        pairs = sorted(
            {
                (
                    int(n),
                    "" if bus_from is None or bus_from[i] is None else str(bus_from[i]).replace("_", " "),
                )
                for i, n in zip(idx, bus_n[idx])
                if not np.isnan(n)
            }
        )
        return ", ".join(f"{n} ({w})" if w else str(n) for n, w in pairs) or None

    def known_total(v: np.ndarray | None, scale: float) -> float | None:
        """The sum of the known values; None when none is known."""
        if v is None or np.isnan(v).all():
            return None
        return _r(total(v) / scale)

    out: list[dict] = []
    for idx in slices:
        first = idx[0]
        if inst is not None:
            iv = inst[idx]
            calls = int(pd.unique(iv[iv >= 0]).size + (iv < 0).sum())  # (hashed: no sort per group)
        else:
            calls = len(idx)
        gs, nb = gs_of[first], nb_of[first]
        out.append(
            {
                "op": str(op_names[op_code[first]]),
                "group_size": None if np.isnan(gs) else int(gs),
                "bytes": None if np.isnan(nb) else int(nb),
                "calls": calls,
                "rows": len(idx),
                "total_ms": _r(total(dur[idx]) / 1e6),
                "median_ms": med(dur[idx], 1e6),
                "busbw_gbps": med(None if busbw is None else busbw[idx]),
                "busbw_n": bus_text(idx),
                "median_skew_ms": med(None if skew is None else skew[idx], 1e6),
                "max_skew_ms": mx(None if skew is None else skew[idx], 1e6),
                "wait_ms": known_total(None if wait is None else wait[idx], 1e6),
                "transfer_ms": known_total(None if transfer is None else transfer[idx], 1e6),
            }
        )
    out.sort(key=lambda r: -(r["total_ms"] or 0.0))
    return out[:top]


# ----------------------------------------------------------------------------------------------------
# memory
# ----------------------------------------------------------------------------------------------------
def memory_bar(
    peaks: Sequence[Mapping], stage_of: Mapping[int, int | None] | None = None, max_items: int = MAX_ITEMS
) -> go.Figure:
    """Peak allocated / reserved memory per rank in GiB (group maxima beyond `max_items` ranks)."""
    by_rank = {int(p["rank"]): p for p in peaks}
    labels, members, unit = rank_groups(list(by_rank), stage_of, max_items)
    fig = go.Figure()
    for key, name, color in (
        ("allocated", "peak allocated", "#4C78A8"),
        ("reserved", "peak reserved", "#BAB0AC"),
    ):
        vals = [[by_rank[r].get(key) for r in m] for m in members]
        if all(v is None for c in vals for v in c):
            continue
        fig.add_bar(
            name=name, x=labels, y=[_r(max((v or 0) for v in c) / 2**30) for c in vals], marker_color=color
        )
    fig.update_layout(
        title="Peak memory per " + unit + ("" if unit == "rank" else " (maximum over its ranks)"),
        yaxis_title="GiB",
        barmode="group",
        legend=LEGEND,
        height=380,
    )
    return fig


#: Ranks drawn by default on the memory-over-time chart when no stage is known: the highest peaks.
MEMORY_TOP_RANKS = 4


def memory_default_ranks(
    peaks: Sequence[Mapping], stage_of: Mapping[int, int | None] | None = None
) -> list[int]:
    """The ranks the memory-over-time chart shows before the reader asks for all: the rank with the highest
    peak allocated memory of each stage when stages are known, else the `MEMORY_TOP_RANKS` highest peaks.
    `peaks`: rows with rank and peak_allocated (bytes)."""
    stage_of = stage_of or {}
    rows = sorted(
        (p for p in peaks if p.get("peak_allocated") is not None),
        key=lambda p: (-float(p["peak_allocated"]), int(p["rank"])),
    )
    if rows and all(stage_of.get(int(p["rank"])) is not None for p in rows):
        best: dict[int, int] = {}
        for p in rows:
            best.setdefault(int(stage_of[int(p["rank"])]), int(p["rank"]))  # type: ignore[arg-type]
        return sorted(best.values())
    return sorted(int(p["rank"]) for p in rows[:MEMORY_TOP_RANKS])


def memory_timeline_figure(
    timeline,
    t0_ns: float,
    shown: Sequence[int],
    stage_of: Mapping[int, int | None] | None = None,
    total_ranks: int | None = None,
) -> go.Figure:
    """Allocated (solid) and reserved (dotted) GiB over time, one legend entry per rank (its two lines toggle
    together). Only the ranks in `shown` are drawn at first (`memory_default_ranks`): a button draws every
    rank of `timeline` (a DataFrame: rank, ts_ns, allocated, reserved), so the legend needs no scrolling.
    """
    stage_of = stage_of or {}
    shown_set = {int(r) for r in shown}
    fig = go.Figure()
    visible_default: list[bool] = []
    for r, g in timeline.groupby("rank", sort=True):
        r = int(r)
        # numpy arrays, not lists: plotly checks a list element by element (~0.4 s for 16 ranks' samples)
        x = ((g["ts_ns"].to_numpy() - t0_ns) / 1e6).round(3)
        st = stage_of.get(r)
        name = f"r{r}" + (f" (stage {st})" if st is not None else "")
        on = r in shown_set
        for key, dash, legend in (("allocated", None, True), ("reserved", "dot", False)):
            fig.add_scatter(
                x=x,
                y=(g[key].to_numpy() / 2**30).round(4),
                mode="lines",
                name=name,
                legendgroup=f"r{r}",
                showlegend=legend,
                visible=on,
                line={"dash": dash} if dash else None,
                hovertemplate=f"{name} {key}: %{{y:.2f}} GiB at %{{x:.1f}} ms<extra></extra>",
            )
            visible_default.append(on)
    n = len(visible_default) // 2
    by_stage = bool(stage_of) and all(stage_of.get(int(r)) is not None for r in shown_set)
    which = "the rank with the highest peak of each stage" if by_stage else "the ranks with the highest peaks"
    title = "Allocator over time" + (
        f" ({n} of {total_ranks} ranks)" if total_ranks and total_ranks > n else ""
    )
    fig.update_layout(
        title={"text": f"{title}<br><sup>allocated solid, reserved dotted; shown: {which}</sup>"},
        xaxis_title="ms since the first sample",
        yaxis_title="GiB",
        legend=LEGEND,
        height=440,
        margin={"t": 130},
    )
    if len(shown_set) < n:
        fig.update_layout(
            updatemenus=[
                {
                    "type": "buttons",
                    "direction": "right",
                    "x": 0,
                    "y": 1.02,
                    "xanchor": "left",
                    "yanchor": "bottom",
                    "buttons": [
                        {
                            "label": "highest peaks",
                            "method": "restyle",
                            "args": [{"visible": visible_default}],
                        },
                        {
                            "label": f"all {n} ranks",
                            "method": "restyle",
                            "args": [{"visible": [True] * len(visible_default)}],
                        },
                    ],
                }
            ]
        )
    return fig


# ----------------------------------------------------------------------------------------------------
# top operations
# ----------------------------------------------------------------------------------------------------
def top_operations(events: pa.Table | None, top: int = 15) -> tuple[str, list[dict]]:
    """Kernels (or CPU ops on a CPU-only run) with the most total time over all ranks: name, calls, ms."""
    if events is None or events.num_rows == 0:
        return "", []
    kind = events.column("kind").cast(pa.string())
    for k in ("kernel", "cpu_op"):
        sel = events.filter(pc.equal(kind, k))
        if sel.num_rows:
            break
    else:
        return "", []
    t = pa.table({"name": sel.column("name").cast(pa.string()), "dur_ns": sel.column("dur_ns").fill_null(0)})
    agg = t.group_by("name").aggregate([("dur_ns", "sum"), ("dur_ns", "count")])
    # (equal totals by name: the order does not hang on the group-by's)
    agg = agg.sort_by([("dur_ns_sum", "descending"), ("name", "ascending")]).slice(0, top)
    n_ranks = len(pc.unique(sel.column("rank")))
    return ("kernel" if k == "kernel" else "CPU op"), [
        {
            "name": r["name"],
            "calls": int(r["dur_ns_count"]),
            "total_ms": _r(r["dur_ns_sum"] / 1e6),
            "per_rank_ms": _r(r["dur_ns_sum"] / 1e6 / max(n_ranks, 1)),
        }
        for r in agg.to_pylist()
    ]


# ----------------------------------------------------------------------------------------------------
# comparison
# ----------------------------------------------------------------------------------------------------
def compare_shares_bar(comparison: Mapping, group: str = "breakdown") -> go.Figure:
    """Grouped bars of A's and B's shares of step time (group: 'breakdown' or 'layer_types')."""
    la, lb = comparison["labels"]
    rows = [
        m for m in comparison["metrics"] if m["group"] == group and (m["a"] is not None or m["b"] is not None)
    ]
    x = [txt(m["name"]) for m in rows]
    fig = go.Figure()
    fig.add_bar(
        name=txt(la),
        x=x,
        y=[_r(100 * m["a"], 2) if m["a"] is not None else None for m in rows],
        marker_color="#4C78A8",
    )
    fig.add_bar(
        name=txt(lb),
        x=x,
        y=[_r(100 * m["b"], 2) if m["b"] is not None else None for m in rows],
        marker_color="#F58518",
    )
    title = {
        "breakdown": "Step time breakdown (% of step time)",
        "layer_types": "Share of step time by layer type (%)",
    }.get(group, group)
    fig.update_layout(title=title, barmode="group", yaxis_title="% of step time", legend=LEGEND, height=400)
    return fig


def pick_step(per_step: Sequence[Mapping]) -> int | None:
    """The analyzed step whose mean step time is the median one (a typical step, not warm-up)."""
    by: dict[int, list[float]] = {}
    for r in per_step:
        if r.get("step") is not None and r.get("step_time_ms") is not None:
            by.setdefault(int(r["step"]), []).append(float(r["step_time_ms"]))
    if not by:
        return None
    steps = sorted(by)
    means = np.array([np.mean(by[s]) for s in steps])
    return steps[int(np.argsort(means, kind="stable")[(len(steps) - 1) // 2])]
