"""Pipeline bubbles per stage and step: fill, drain and in-flight waits, beside the schedule's expectation.

For one pipeline (the ranks of one (dp, tp, cp) coordinate, in stage order) and one step:

    pipeline window  = [earliest first-forward start, latest last-backward end] over the pipeline's ranks
    fill   (rank)    = first forward start on the rank  - window start
    drain  (rank)    = window end - last backward end on the rank
    wait   (rank)    = time between the two with no compute, collective or memcpy on the GPU
                       (idle, or only a P2P send/recv spinning: a wait for a neighbour stage)
    bubble           = fill + drain + wait
    bubble_fraction  = bubble / step time (the rank's ProfilerStep window: the share of the step lost)
    window_bubble_fraction = bubble / pipeline window (what the schedule's expectation describes)

With uniform stages the window fraction is (p-1)/(m+p-1) for 1F1B and GPipe, and (p-1)/(v*m + p-1) for the
interleaved schedule with v model chunks per rank (that is (p-1)/(v*m) of the ideal time).

First forward / last backward come from module annotations (`layers.N.<module>` and
`...backward`, see composition.py). Without them: the first compute kernel of the step, and the end of
the last compute kernel before the first non-P2P collective that starts after the rank's last P2P op
(an approximation, documented in docs/pipeline.md). Microbatches: given, or forward executions of a
rank's first layer per step, or sends of a stage-0 rank per step. Schedule: given, or `interleaved`
when a rank holds several separate layer ranges, `gpipe` when stage 0 runs every forward before its
first backward (m > p), else `1f1b`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import columns, sharing
from tracelens.analyze.layout import P2P_NAMES, Grid
from tracelens.analyze.pipeline.composition import _runs, module_spans
from tracelens.analyze.pipeline.schedule import schedule_from_actions, schedule_from_order
from tracelens.analyze.pipeline.schedule_infer import (
    forwards_before_first_backward,
    pair_reduce,
    schedule_from_p2p,
    send_mask,
)
from tracelens.analyze.rank.breakdown import breakdown as compute_breakdown
from tracelens.analyze.rank.breakdown import class_sets
from tracelens.analyze.rank.classify import COMM, COMPUTE, classify, rank_mask
from tracelens.findings import finding
from tracelens.schema import RankSets
from tracelens.thresholds import DEFAULT

#: Excess bubble (fraction of the pipeline window above the expectation) that raises PIPELINE_BUBBLE_EXCESS.
EXCESS_THRESHOLD = DEFAULT.bubble_excess  # (tracelens.thresholds: bubble_excess)

PER_RANK_STEP = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("stage", pa.int32()),
        ("step_time_ns", pa.int64()),  # the rank's ProfilerStep window
        ("window_ns", pa.int64()),  # the pipeline window (first forward to last backward of the pipeline)
        ("fill_ns", pa.int64()),
        ("drain_ns", pa.int64()),
        ("wait_ns", pa.int64()),
        ("bubble_ns", pa.int64()),
        ("bubble_fraction", pa.float64()),  # bubble / step time
        ("window_bubble_fraction", pa.float64()),  # bubble / pipeline window (compare with the expectation)
    ]
)


@dataclass
class PipelineResult:
    """Bubbles per (rank, step) and per stage, the schedule used for the expectation, and findings."""

    per_rank_step: pa.Table = field(default_factory=PER_RANK_STEP.empty_table)
    stages: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    microbatches: int | None = None
    microbatches_observed: int | None = None  # counted in the trace (spans or sends), even when given
    schedule: str | None = None
    virtual_stages: int = 1
    expected_bubble_fraction: float | None = None
    cause_stage: int | None = None
    #: schedule read from P2P counts and order (analyze/pipeline/schedule_infer.py), None when not readable
    schedule_evidence: dict[str, Any] | None = None
    #: each rank's actions in one step, as annotated (analyze/pipeline/schedule.py), None without annotations
    orders: dict[int, list[Any]] | None = None
    #: per (rank, step): the rank's own first forward start and last backward end (`rank`, `step`, `first_ns`,
    #: `last_ns`, its own clock), what the schedule what-if (analyze/pipeline/prescribe.py) measures work in
    rank_windows: pd.DataFrame | None = None


def expected_bubble_fraction(
    pp: int | None, microbatches: int | None, schedule: str | None = None, virtual_stages: int = 1
) -> float | None:
    """Idle share of the pipeline window for uniform stages, when the schedule is known: GPipe and 1F1B
    (p-1)/(m+p-1) (their orders replayed, analyze/pipeline/schedule.py); interleaved 1F1B and looped BFS with v chunks
    per rank (p-1)/(v*m+p-1). None for a schedule not recognised, and for the zero-bubble schedules unless
    their annotated order is replayed (`analyze_pipeline` does that)."""
    if not pp or not microbatches:
        return None
    if pp == 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):  # (their orders replay to this exactly: tests/unit/test_schedule.py)
        return (pp - 1) / (microbatches + pp - 1)
    if schedule in ("interleaved_1f1b", "looped_bfs"):
        return (pp - 1) / (max(virtual_stages, 1) * microbatches + pp - 1)
    return None


def _is_p2p_name(v: str) -> bool:
    return P2P_NAMES.search(v) is not None


def _is_p2p_collective(v: str) -> bool:
    return v.lower() in ("send", "recv", "isend", "irecv")


def _p2p_mask(events: pa.Table) -> np.ndarray:
    """Rows that are point-to-point sends/receives (send/recv collectives; SendRecv kernels and c10d/gloo
    send and recv ops when no collective name is recorded)."""
    cols = columns(events)
    by_name = cols.flag("name", _is_p2p_name)
    by_coll = cols.flag("collective", _is_p2p_collective)
    # an all_to_all also runs in a SendRecv kernel: when the collective name is known it decides
    has_coll = cols.valid("collective")
    out: np.ndarray = (by_name & ~has_coll) | by_coll
    return out


def _pair_lookup(
    index: pd.MultiIndex, values: np.ndarray, rank: np.ndarray, step: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(value, found) of each (rank, step) row in a sorted, unique (rank, step) index (pair_reduce's)."""
    out = np.zeros(rank.size, values.dtype)
    found = np.zeros(rank.size, bool)
    if not len(index) or not rank.size:
        return out, found
    ir = index.get_level_values(0).to_numpy().astype(np.int64)
    ist = index.get_level_values(1).to_numpy().astype(np.int64)
    lo = int(min(ist.min(), step.min()))
    span = int(max(ist.max(), step.max())) - lo + 1
    key = ir * span + (ist - lo)  # ascending: the index is sorted by (rank, step)
    q = rank.astype(np.int64) * span + (step.astype(np.int64) - lo)
    i = np.minimum(np.searchsorted(key, q), key.size - 1)
    found = key[i] == q
    out[found] = values[i[found]]
    return out, found


def _joined_cmp(a: np.ndarray, b: np.ndarray, found: np.ndarray, op: np.ufunc) -> np.ndarray:
    """`df["a"] OP df["b"]` where `b` came from a left join: compared exactly while every row found a
    value (the column stays int64), else in float64 as pandas does once the join's NaN make it float
    (unfound rows: False)."""
    if found.all():
        out: np.ndarray = op(a, b)
        return out
    out = found & op(a.astype(np.float64), b.astype(np.float64))
    return out


def _virtual_stages(sp: pd.DataFrame) -> int:
    """Separate layer ranges held by one rank (interleaved model chunks), median over ranks."""
    rows = np.flatnonzero(sp["layer"].to_numpy() >= 0)  # (two columns taken: no copy of the frame)
    if not rows.size:
        return 1
    rank = sp["rank"].to_numpy()[rows].astype(np.int64)
    layer = sp["layer"].to_numpy()[rows].astype(np.int64)
    o, first = _runs(rank, layer)  # the distinct (rank, layer) pairs, in order
    r, ls = rank[o][first], layer[o][first]
    gap = np.zeros(r.size, bool)
    gap[1:] = (r[1:] == r[:-1]) & (np.diff(ls) > 1)
    ranks, rid = np.unique(r, return_inverse=True)
    runs = np.bincount(rid, weights=gap, minlength=ranks.size).astype(np.int64) + 1
    return int(np.median(runs))


def _detect_schedule(sp: pd.DataFrame, bwd: pd.DataFrame, grid: Grid, m: int | None, v: int) -> str | None:
    """interleaved_1f1b (v > 1), gpipe (stage 0 runs all m forwards before its first backward, m > p) or 1f1b.

    Per (rank, step) of stage 0 with a backward pass: the forwards of the first layer's first module
    (the module of the earliest-starting span of that layer) that start before the backward does."""
    if v > 1:
        return "interleaved_1f1b"
    if not len(sp) or not m or not len(bwd):
        return None
    p = grid.pp or 1
    s0_rows = np.flatnonzero(
        (sp["stage"].to_numpy() == 0) & (sp["layer"].to_numpy() >= 0) & ~sp["backward"].to_numpy(bool)
    )  # (stage 0's forward layer spans: the columns read taken at these rows, no copy of the frame)
    if not s0_rows.size or m <= p:
        return "1f1b"  # GPipe and 1F1B coincide when m <= p; same expected bubble
    rank = sp["rank"].to_numpy()[s0_rows].astype(np.int64)
    step = sp["step"].to_numpy()[s0_rows].astype(np.int64)
    layer = sp["layer"].to_numpy()[s0_rows].astype(np.int64)
    start = sp["gpu_start_ns"].to_numpy()[s0_rows].astype(np.int64)
    # module codes: equal for equal modules, -1 for none; factorized in the column's own dtype
    mod = np.asarray(pd.factorize(sp["module"].iloc[s0_rows])[0], np.int64)
    o, first = _runs(rank, step)
    ng = first.size
    mark = np.zeros(o.size, np.int64)
    mark[first] = 1
    gid = np.empty(o.size, np.int64)
    gid[o] = np.cumsum(mark) - 1  # (rank, step) group of each row
    pos = bwd.index.get_indexer(pd.MultiIndex.from_arrays([rank[o][first], step[o][first]]))
    has = pos >= 0  # groups with a backward pass
    if not has.any():
        return None
    b_start = np.zeros(ng, np.int64)
    b_start[has] = bwd["b_start"].to_numpy()[pos[has]].astype(np.int64)
    big = np.iinfo(np.int64).max
    min_layer = np.full(ng, big, np.int64)
    np.minimum.at(min_layer, gid, layer)
    at_first = layer == min_layer[gid]
    t0 = np.full(ng, big, np.int64)  # earliest start among the first layer's spans
    np.minimum.at(t0, gid[at_first], start[at_first])
    earliest = np.flatnonzero(at_first & (start == t0[gid]))
    first_mod = np.full(ng, -1, np.int64)
    first_mod[gid[earliest]] = mod[earliest]
    # several first-layer spans starting at that instant with different modules: the one the sort by start
    # puts first decides, as it always has (below, per group)
    n_mods = np.zeros(ng, np.int64)
    pairs = np.unique(np.stack([gid[earliest], mod[earliest]]), axis=1)
    np.add.at(n_mods, pairs[0], 1)
    sel = at_first & (mod == first_mod[gid]) & (mod >= 0) & (start < b_start[gid])
    counts = np.bincount(gid[sel], minlength=ng)
    for g in np.flatnonzero(has & (n_mods > 1)):
        f = sp.iloc[s0_rows[np.flatnonzero(gid == g)]].sort_values("gpu_start_ns")
        fl = f["layer"].min()
        fm = f.loc[f["layer"] == fl, "module"].iloc[0]
        fwd = f[(f["layer"] == fl) & (f["module"] == fm)]
        counts[g] = int((fwd["gpu_start_ns"] < b_start[g]).sum())
    return "gpipe" if np.median(counts[has]) >= m else "1f1b"


def _is_autograd_eval(v: str) -> int:
    return int(v.startswith("autograd::engine::evaluate_function"))


def _backward_marks(
    events: pa.Table,
    sp: pd.DataFrame,
    sets: dict[int, RankSets],
    rank: np.ndarray,
    step: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
) -> pd.DataFrame:
    """Per (rank, step): start and end of the backward pass, from backward module annotations, else (on
    ranks analysed on the CPU timeline) from the autograd engine's `evaluate_function` ops."""
    out = pd.DataFrame(
        columns=["b_start", "b_end"], index=pd.MultiIndex.from_arrays([[], []], names=["rank", "step"])
    )
    if len(sp) and sp["backward"].any():
        b = (sp["backward"] & (sp["step"] >= 0)).to_numpy(bool)
        out = pair_reduce(
            sp["rank"].to_numpy()[b],
            sp["step"].to_numpy()[b],
            b_start=(sp["gpu_start_ns"].to_numpy()[b], np.minimum),
            b_end=(sp["gpu_end_ns"].to_numpy()[b], np.maximum),
        )
    cpu_ranks = [
        r for r, rs in sets.items() if rs.path == "cpu" and r not in set(out.index.get_level_values(0))
    ]
    if cpu_ranks:
        is_ag = columns(events).flag("name", _is_autograd_eval)
        sel = is_ag & np.isin(rank, cpu_ranks) & (step >= 0)
        if sel.any():
            extra = pair_reduce(
                rank[sel], step[sel], b_start=(ts[sel], np.minimum), b_end=(end[sel], np.maximum)
            )
            out = pd.concat([out, extra]) if len(out) else extra
    return out


def analyze_pipeline(
    events: pa.Table,
    grid: Grid,
    breakdown: pa.Table | None = None,
    microbatches: int | None = None,
    schedule: str | None = None,
    spans: pa.Table | None = None,
    excess_threshold: float = EXCESS_THRESHOLD,
    clock_offsets_ns: dict[int, int] | None = None,
    sets: dict[int, RankSets] | None = None,
    virtual_stages: int | None = None,
) -> PipelineResult:
    """Bubble per (rank, step) and per stage; PIPELINE_BUBBLE_EXCESS when the excess is material.

    `virtual_stages` (model chunks per rank, tracelens.toml `[training] virtual_stages`) overrides the v
    read from layer ranges or P2P counts.

    `clock_offsets_ns` (rank -> ns to subtract, as `collectives.clock_offsets` gives) aligns hosts before
    fill and drain are measured across ranks; waits are measured on each rank's own clock. `sets`
    (breakdown.class_sets) and `spans` (composition.module_spans) may be passed to reuse them.
    """
    if not grid.pp or not grid.coords or events.num_rows == 0:
        return PipelineResult()
    with sharing(events):  # classify and the lookups below decode each column of `events` once
        return _analyze_pipeline(
            events,
            grid,
            breakdown,
            microbatches,
            schedule,
            spans,
            excess_threshold,
            clock_offsets_ns,
            sets,
            virtual_stages,
        )


def _analyze_pipeline(
    events: pa.Table,
    grid: Grid,
    breakdown: pa.Table | None,
    microbatches: int | None,
    schedule: str | None,
    spans: pa.Table | None,
    excess_threshold: float,
    clock_offsets_ns: dict[int, int] | None,
    sets: dict[int, RankSets] | None,
    virtual_stages: int | None,
) -> PipelineResult:
    res = PipelineResult()
    classes = classify(events)
    if sets is None:
        sets = class_sets(events, classes)
    if spans is None:
        spans = module_spans(events, sets=sets)
    sp = spans.to_pandas()
    if len(sp):
        sp["stage"] = grid.stage_lookup(sp["rank"].to_numpy())
        sp["step"] = sp["step"].fillna(-1).astype(np.int64)

    cols = columns(events)
    rank = cols.int64("rank")
    ts = cols.int64("ts_ns")
    end = cols.end_signed()
    step = cols.int64("step", -1)
    p2p = _p2p_mask(events) & (classes == COMM)
    is_comp = classes == COMPUTE
    coll = (classes == COMM) & ~p2p

    # ---- per (rank, step): own first forward start and last backward end ----
    sel = is_comp & (step >= 0)
    marks = pair_reduce(rank[sel], step[sel], first=(ts[sel], np.minimum), last=(end[sel], np.maximum))
    bwd = _backward_marks(events, sp, sets, rank, step, ts, end)
    if len(sp) and (~sp["backward"]).any():
        f = (~sp["backward"] & (sp["step"] >= 0)).to_numpy(bool)
        fwd = pair_reduce(
            sp["rank"].to_numpy()[f],
            sp["step"].to_numpy()[f],
            f=(sp["gpu_start_ns"].to_numpy()[f], np.minimum),
        )
        marks = marks.join(fwd["f"], how="left")
        marks["first"] = marks["f"].fillna(marks["first"]).astype(np.int64)
    marks = marks.join(bwd["b_end"], how="left")
    if marks["b_end"].isna().any():  # a (rank, step) without a backward annotation's end: the fallback
        fallback = _fallback_last(rank, step, ts, end, is_comp, p2p, coll, marks)
        marks["last"] = marks["b_end"].fillna(fallback).astype(np.int64)
    else:  # (every one has it: the fallback, a pass over the events, is not computed)
        marks["last"] = marks["b_end"].astype(np.int64)
    marks = marks[["first", "last"]]
    if not len(marks):
        return res
    marks = marks.reset_index()
    marks["stage"] = grid.stage_lookup(marks["rank"].to_numpy())
    marks = marks[marks["stage"] >= 0]

    # ---- pipeline windows ----
    chain_of: dict[int, int] = {}
    for i, chain in enumerate(grid.pipelines()):
        for r in chain:
            chain_of[r] = i
    marks["chain"] = marks["rank"].map(chain_of).fillna(-1).astype(np.int64)
    # fill and drain compare ranks: put every rank on one clock first (offsets from collectives.py)
    off = marks["rank"].map(clock_offsets_ns or {}).fillna(0).astype(np.int64)
    marks["first_al"] = marks["first"] - off
    marks["last_al"] = marks["last"] - off
    win = marks.groupby(["chain", "step"]).agg(w0=("first_al", "min"), w1=("last_al", "max"))
    marks = marks.join(win, on=["chain", "step"])

    # ---- waits between a rank's own first forward and last backward ----
    wait = _waits(
        marks["rank"].to_numpy(np.int64),
        marks["first"].to_numpy(np.int64),
        marks["last"].to_numpy(np.int64),
        rank,
        ts,
        end,
        coll,
        sets,
    )
    marks["window"] = (marks["w1"] - marks["w0"]).clip(lower=0)
    marks["fill"] = (marks["first_al"] - marks["w0"]).clip(lower=0)
    marks["drain"] = (marks["w1"] - marks["last_al"]).clip(lower=0)
    marks["wait"] = np.maximum(wait, 0)
    marks["bubble"] = marks["fill"] + marks["drain"] + marks["wait"]
    if grid.pp == 1:
        marks[["fill", "drain", "wait", "bubble"]] = 0
    bd = breakdown if breakdown is not None and breakdown.num_rows else compute_breakdown(events, sets=sets)
    bdf = bd.select(["rank", "step", "step_time_ns", "compute_ns"]).to_pandas()
    bdf = bdf[bdf["step"].notna()].astype({"step": np.int64})
    step_time = bdf.set_index(["rank", "step"])["step_time_ns"]
    step_time = step_time[~step_time.index.duplicated()]
    st = step_time.reindex(pd.MultiIndex.from_arrays([marks["rank"], marks["step"]])).to_numpy()
    marks["step_time"] = np.where(np.isnan(st), marks["window"], st).astype(np.int64)
    marks["frac"] = _ratio(marks["bubble"], marks["step_time"])
    marks["wfrac"] = _ratio(marks["bubble"], marks["window"])
    marks = marks.sort_values(["rank", "step"])
    res.rank_windows = pd.DataFrame(
        {
            "rank": marks["rank"].to_numpy(np.int64),
            "step": marks["step"].to_numpy(np.int64),
            "first_ns": marks["first"].to_numpy(np.int64),
            "last_ns": marks["last"].to_numpy(np.int64),
        }
    )
    res.per_rank_step = pa.table(
        {
            "rank": pa.array(marks["rank"].to_numpy().astype(np.int32)),
            "step": pa.array(marks["step"].to_numpy().astype(np.int32)),
            "stage": pa.array(marks["stage"].to_numpy().astype(np.int32)),
            "step_time_ns": pa.array(marks["step_time"].to_numpy().astype(np.int64)),
            "window_ns": pa.array(marks["window"].to_numpy().astype(np.int64)),
            "fill_ns": pa.array(marks["fill"].to_numpy().astype(np.int64)),
            "drain_ns": pa.array(marks["drain"].to_numpy().astype(np.int64)),
            "wait_ns": pa.array(marks["wait"].to_numpy().astype(np.int64)),
            "bubble_ns": pa.array(marks["bubble"].to_numpy().astype(np.int64)),
            "bubble_fraction": pa.array(marks["frac"].to_numpy().astype(np.float64)),
            "window_bubble_fraction": pa.array(marks["wfrac"].to_numpy().astype(np.float64)),
        },
        schema=PER_RANK_STEP,
    )

    # ---- microbatches, schedule, expectation ----
    found = schedule_from_actions(
        events, grid
    )  # the schedule's own annotations (analyze/pipeline/schedule.py)
    v = _virtual_stages(sp) if len(sp) else 1
    res.schedule_evidence = schedule_from_p2p(events, grid, p2p)
    by_p2p = res.schedule_evidence
    if by_p2p is not None and v == 1 and by_p2p["virtual_stages"] > 1:
        v = by_p2p["virtual_stages"]  # chunks seen in the P2P counts (layer annotations absent or merged)
    if found is not None:
        v = found.v
    if virtual_stages is not None:
        v = virtual_stages
    observed = None  # what the trace shows, also when --microbatches is given (checked against it)
    if found is not None and found.m:
        observed = found.m
    if observed is None and len(sp):
        from tracelens.analyze.pipeline.composition import _microbatches_from_spans

        observed = _microbatches_from_spans(sp)
    if observed is None and by_p2p is not None:
        observed = by_p2p["microbatches"]
    if observed is None:
        observed = _microbatches_from_sends(events, grid, p2p, rank, step)
    m = microbatches if microbatches is not None else observed
    res.microbatches_observed = observed
    given = schedule is not None
    if schedule is None and found is not None:
        schedule = found.name
    elif schedule is None:
        schedule = _detect_schedule(sp, bwd, grid, m, v) if len(sp) else None
        if schedule is None and by_p2p is not None:
            if v > 1:
                schedule = "interleaved_1f1b"
            else:
                schedule = schedule_from_order(by_p2p["forwards_before_first_backward"], grid.pp or 1, m)
        elif schedule is None and v == 1:  # (p = 2, no annotations: the order of stage 0's work decides)
            schedule = schedule_from_order(forwards_before_first_backward(events, grid, p2p), grid.pp or 1, m)
    res.microbatches, res.schedule, res.virtual_stages = m, schedule, v
    res.expected_bubble_fraction = expected_bubble_fraction(grid.pp, m, schedule, v)
    if (
        res.expected_bubble_fraction is None
        and found is not None
        and found.name is not None
        and not given
        and (found.v, found.m) == (v, m)
    ):
        res.expected_bubble_fraction = found.expected_bubble_fraction  # the annotated order, replayed
    if found is not None:
        res.schedule_evidence = {**(by_p2p or {}), **found.evidence()}
        if found.name is not None and found.name == schedule:
            res.orders = found.orders

    # ---- per stage ----
    comp_by_rank = bdf.groupby("rank")["compute_ns"].mean()
    for s, g in marks.groupby("stage"):
        ranks = grid.ranks_of_stage(int(s))
        window = float(g["window"].sum())
        steps = float(g["step_time"].sum())
        rec: dict[str, Any] = {
            "stage": int(s),
            "ranks": ranks,
            "compute_ms": float(comp_by_rank.reindex(g["rank"].unique()).mean()) / 1e6,
            "bubble_ms": float(g["bubble"].mean()) / 1e6,
            "fill_ms": float(g["fill"].mean()) / 1e6,
            "drain_ms": float(g["drain"].mean()) / 1e6,
            "wait_ms": float(g["wait"].mean()) / 1e6,
            "window_ms": float(g["window"].mean()) / 1e6,
            "step_time_ms": float(g["step_time"].mean()) / 1e6,
            "bubble_fraction": float(g["bubble"].sum()) / steps if steps > 0 else 0.0,
            "window_bubble_fraction": float(g["bubble"].sum()) / window if window > 0 else 0.0,
            "expected_bubble_fraction": res.expected_bubble_fraction,
            "microbatches": m,
            "schedule": schedule,
        }
        if res.expected_bubble_fraction is not None:
            rec["excess_ms"] = rec["bubble_ms"] - res.expected_bubble_fraction * rec["window_ms"]
        res.stages.append(rec)
    res.findings, res.cause_stage = _excess_finding(res, grid, excess_threshold)
    return res


def _waits(
    m_rank: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    rank: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    coll: np.ndarray,
    sets: dict[int, RankSets],
) -> np.ndarray:
    """Per window [lo, hi) of rank m_rank: the time with nothing on the rank's GPU (no compute, memory
    copy or non-P2P collective). The ranks' busy intervals are laid side by side on one axis (rank q
    shifted by q times the run's whole time range, so no two ranks touch), and one union and one window
    measure serve every rank; per rank, in a loop, if that axis would not fit in int64."""
    wait = np.zeros(m_rank.size, np.int64)
    if not m_rank.size:
        return wait
    ranks, q = np.unique(m_rank, return_inverse=True)
    cidx = np.flatnonzero(coll & rank_mask(rank, ranks))
    starts, ends, owner = [ts[cidx]], [end[cidx]], [np.searchsorted(ranks, rank[cidx])]
    for i, r in enumerate(ranks.tolist()):
        rs = sets.get(int(r))
        if rs is None:
            continue
        for a in (rs.compute, rs.memory):
            starts.append(a[0])
            ends.append(a[1])
            owner.append(np.full(a[0].size, i, np.int64))
    s = np.concatenate(starts).astype(np.int64)
    e = np.concatenate(ends).astype(np.int64)
    w = np.concatenate(owner).astype(np.int64)
    base = int(min(lo.min(), hi.min(), s.min() if s.size else lo.min(), e.min() if e.size else lo.min()))
    top = int(max(lo.max(), hi.max(), s.max() if s.size else hi.max(), e.max() if e.size else hi.max()))
    span = top - base + 2
    if ranks.size * span >= 2**62:
        return _waits_per_rank(m_rank, lo, hi, rank, ts, end, coll, sets)
    busy = iv.union(s - base + w * span, e - base + w * span)
    off = q.astype(np.int64) * span - base
    wait[:] = np.maximum(hi - lo, 0) - iv.measure_in_windows(busy, lo + off, hi + off)
    return wait


def _waits_per_rank(
    m_rank: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    rank: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    coll: np.ndarray,
    sets: dict[int, RankSets],
) -> np.ndarray:
    """`_waits` one rank at a time (clocks too far apart for the shared axis)."""
    wait = np.zeros(m_rank.size, np.int64)
    cidx = np.flatnonzero(coll)
    cidx = cidx[np.argsort(rank[cidx], kind="stable")]  # collective rows grouped by rank: no per-rank mask
    crank = rank[cidx]
    for r in np.unique(m_rank):
        rs = sets.get(int(r))
        sel = cidx[np.searchsorted(crank, r, "left") : np.searchsorted(crank, r, "right")]
        k = iv.union(ts[sel], end[sel])
        busy = iv.union2(iv.union2(rs.compute, k), rs.memory) if rs is not None else k
        pos = np.flatnonzero(m_rank == r)
        wait[pos] = np.maximum(hi[pos] - lo[pos], 0) - iv.measure_in_windows(busy, lo[pos], hi[pos])
    return wait


def _ratio(num: pd.Series, den: pd.Series) -> np.ndarray:
    n, d = num.to_numpy(dtype=np.float64), den.to_numpy(dtype=np.float64)
    out: np.ndarray = np.divide(n, d, out=np.zeros_like(n), where=d > 0)
    return out


def _fallback_last(
    rank: np.ndarray,
    step: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    is_comp: np.ndarray,
    p2p: np.ndarray,
    coll: np.ndarray,
    marks: pd.DataFrame,
) -> pd.Series:
    """Without annotations: last compute end before the first collective starting after the rank's last
    P2P op started (the gradient-norm all-reduce or DP sync that closes the pipeline phase)."""
    valid = step >= 0
    sel = np.flatnonzero(p2p & valid)
    if not sel.size:
        return marks["last"]
    last_p2p = pair_reduce(rank[sel], step[sel], lp=(ts[sel], np.maximum))
    c = np.flatnonzero(coll & valid)
    lp, found = _pair_lookup(last_p2p.index, last_p2p["lp"].to_numpy(), rank[c], step[c])
    c = c[_joined_cmp(ts[c], lp, found, np.greater_equal)]
    first_coll = pair_reduce(rank[c], step[c], fc=(ts[c], np.minimum))
    k = np.flatnonzero(is_comp & valid)
    fc, found = _pair_lookup(first_coll.index, first_coll["fc"].to_numpy(), rank[k], step[k])
    k = k[~found | _joined_cmp(ts[k], fc, found, np.less)]
    last = pair_reduce(rank[k], step[k], end=(end[k], np.maximum))["end"]
    return last.reindex(marks.index).fillna(marks["last"]).astype(np.int64)


def observed_microbatches(events: pa.Table, grid: Grid, spans: pa.Table | None) -> int | None:
    """Microbatches per step as `analyze_pipeline` reads them, without the bubble analysis: the schedule's
    actions, else the layer annotations, else the P2P counts, else the sends of a stage-0 rank."""
    if grid.pp is None or grid.pp < 2 or events.num_rows == 0:
        return None
    found = schedule_from_actions(events, grid)
    if found is not None and found.m:
        return found.m
    if spans is not None and spans.num_rows:
        from tracelens.analyze.pipeline.composition import _microbatches_from_spans

        sp = spans.to_pandas()
        sp["step"] = sp["step"].fillna(-1).astype(np.int64)
        got = _microbatches_from_spans(sp)
        if got:
            return got
    classes = classify(events)
    p2p = _p2p_mask(events) & (classes == COMM)
    by_p2p = schedule_from_p2p(events, grid, p2p)
    if by_p2p is not None:
        return int(by_p2p["microbatches"])
    cols = columns(events)
    return _microbatches_from_sends(events, grid, p2p, cols.int64("rank"), cols.int64("step", -1))


def _microbatches_from_sends(
    events: pa.Table, grid: Grid, p2p: np.ndarray, rank: np.ndarray, step: np.ndarray
) -> int | None:
    """Sends per step of a stage-0 rank (one activation send per microbatch)."""
    if grid.pp is None or grid.pp < 2:
        return None
    is_send = send_mask(events)
    sel = p2p & is_send & (step >= 0)
    sel[sel] = grid.stage_lookup(rank[sel]) == 0  # (the stage of those rows only)
    # one op may be recorded several times (kernel, c10d cpu op, gloo annotation): count one kind
    for kind in ("kernel", "cpu_op", "user_annotation"):
        k = columns(events).kinds(kind)
        if (sel & k).any():
            sel &= k
            break
    if not sel.any():
        return None
    df = pd.DataFrame({"rank": rank[sel], "step": step[sel]})
    return int(df.groupby(["rank", "step"]).size().median())


def _excess_finding(
    res: PipelineResult, grid: Grid, threshold: float
) -> tuple[list[dict[str, Any]], int | None]:
    exp = res.expected_bubble_fraction
    if exp is None or not res.stages or (grid.pp or 1) < 2:
        return [], None
    measured = float(np.mean([s["window_bubble_fraction"] for s in res.stages]))
    excess = measured - exp
    comp = {s["stage"]: s["compute_ms"] for s in res.stages if s["compute_ms"] == s["compute_ms"]}
    frac = {s["stage"]: s["window_bubble_fraction"] for s in res.stages}
    if comp and max(comp.values()) > 1.05 * float(np.mean(list(comp.values()))):
        cause = max(comp, key=lambda s: comp[s])
        why = (
            f"stage {cause} is the slowest ({comp[cause]:.1f} ms compute per step vs "
            f"{np.mean(list(comp.values())):.1f} ms mean) and its neighbours wait for it"
        )
    else:
        cause = min(frac, key=lambda s: frac[s])
        why = f"stage {cause} has the least idle time: the other stages wait for it"
    if excess <= threshold:
        return [], cause if excess > 0 else None
    excess_ms = sum(max(s.get("excess_ms", 0.0), 0.0) for s in res.stages if s["stage"] != cause)
    sched = res.schedule or "1F1B/GPipe"
    msg = (
        f"pipeline bubbles take {measured:.0%} of the pipeline window vs {exp:.0%} expected for "
        f"{sched} with p={grid.pp}, m={res.microbatches}"
        + (f", v={res.virtual_stages}" if res.virtual_stages > 1 else "")
        + f" (+{excess * 100:.1f} points, {excess_ms:.1f} ms per step on the other stages); {why}"
    )
    stage_ranks = grid.ranks_of_stage(cause)
    return [
        finding(
            "PIPELINE_BUBBLE_EXCESS",
            "warning",
            msg,
            ranks=stage_ranks,
            stages=[cause],
            measured_fraction=round(measured, 4),
            expected_fraction=round(exp, 4),
            excess_ms=round(excess_ms, 3),
        )
    ], cause
