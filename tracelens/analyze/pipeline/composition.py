"""Stage composition: which layer types each pipeline stage holds and what they cost.

Layer counts come from module annotations in the trace (`layers.13.linear_attn`, `layers.15.self_attn`,
`layers.15.mlp`; patterns configurable) or, without them, from the model config and the layer split.
Per-stage compute per microbatch per layer type is the GPU time inside those annotations: the
`gpu_user_annotation` span when Kineto wrote one, otherwise the kernels launched inside the CPU
annotation (kernel -> launch by correlation id); on CPU-only ranks (gloo) the CPU annotation itself.
Findings: UNEQUAL_STAGE_COMPOSITION when stages hold
different layer-type counts, STAGE_IMBALANCE when the heaviest stage's compute exceeds the mean by more
than `imbalance_threshold` (default 1.10), with a balanced split suggested on block boundaries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.core.intset import distinct, member
from tracelens.analyze.layout import Grid
from tracelens.analyze.pipeline import layers as _layers
from tracelens.analyze.rank.breakdown import class_sets
from tracelens.errors import TracelensError
from tracelens.findings import finding
from tracelens.schema import SPANS
from tracelens.thresholds import DEFAULT

if TYPE_CHECKING:
    from tracelens.models.audit import AuditResult
    from tracelens.models.spec import ModelSpec
    from tracelens.schema import RankSets

#: Module annotation patterns (tracelens.analyze.pipeline.layers.RULES): named groups `layer` (index, optional: -1
#: when absent) and `module` (type); the first pattern that matches wins.
DEFAULT_PATTERNS: tuple[str, ...] = tuple(_layers.patterns())
#: Annotation module name -> canonical type (mixers use ModelSpec's layer type names).
MODULE_TYPES = _layers.MODULE_TYPES
#: Types that decide a layer's kind (counted per stage); the others only get time shares.
MIXER_TYPES = ("full_attention", "linear_attention", "sliding_attention", "mamba", "mixer")
BACKWARD = re.compile(r"(backward|bwd|\bgrad\b|_bw\b)", re.IGNORECASE)
IMBALANCE_THRESHOLD = DEFAULT.stage_imbalance  # (tracelens.thresholds: stage_imbalance)


def _compile(patterns: Sequence[str] | None) -> list[re.Pattern[str]]:
    return [re.compile(p) for p in (patterns or DEFAULT_PATTERNS)]


#: patterns -> name -> (layer, module type, backward?) of the first pattern matching, None for no match:
#: the names of a run repeat on every rank, so each is matched once per process (bounded).
_MATCHED: dict[tuple[tuple[str, int], ...], dict[str, tuple[int, str, bool] | None]] = {}
_MATCHED_MAX = 1 << 16


def _match_one(v: str, pats: list[re.Pattern[str]]) -> tuple[int, str, bool] | None:
    for p in pats:
        m = p.search(v)
        if m:
            name = m.group("module")
            layer = int(m.group("layer")) if "layer" in p.groupindex else -1
            return layer, _layers.canonical(name), bool(BACKWARD.search(v))
    return None


def _match_names(
    values: list[str | None], pats: list[re.Pattern[str]]
) -> tuple[np.ndarray, np.ndarray, list[str | None], np.ndarray]:
    """Per dictionary value: matched?, layer, module type, backward?"""
    n = len(values)
    ok = np.zeros(n + 1, bool)
    layer = np.full(n + 1, -1, np.int64)
    bwd = np.zeros(n + 1, bool)
    mod: list[str | None] = [None] * (n + 1)
    key = tuple((p.pattern, p.flags) for p in pats)  # (the same text with other flags matches otherwise)
    memo = _MATCHED.get(key)
    if memo is None:
        if len(_MATCHED) >= 64:
            _MATCHED.clear()
        memo = _MATCHED[key] = {}
    for i, v in enumerate(values):
        if not v:
            continue
        if v in memo:  # (a string's hash is kept: two cheap lookups)
            got = memo[v]
        else:
            got = _match_one(v, pats)
            if len(memo) >= _MATCHED_MAX:
                memo.clear()
            memo[v] = got
        if got is not None:
            ok[i] = True
            layer[i], mod[i], bwd[i] = got
    return ok, layer, mod, bwd


def module_spans(
    events: pa.Table, patterns: Sequence[str] | None = None, sets: dict[int, RankSets] | None = None
) -> pa.Table:
    """One row per module annotation instance with its GPU span and the compute time inside it (SPANS)."""
    if events.num_rows == 0:
        return SPANS.empty_table()
    pats = _compile(patterns)
    cols = columns(events)
    values, idx = cols.codes("name")
    ok, layer_of, mod_of, bwd_of = _match_names(values, pats)
    if not ok.any():
        return SPANS.empty_table()
    is_gpu_ann = cols.kinds("gpu_user_annotation")
    is_cpu_ann = cols.kinds("user_annotation", "cpu_op")
    hit = ok[idx]
    rank = cols.int64("rank")
    ts = cols.int64("ts_ns")
    end = cols.end_signed()
    step = cols.int64("step", -1)
    if sets is None:
        sets = class_sets(events)

    cpu_path_rank = {int(r): getattr(sets.get(int(r)), "path", "gpu") == "cpu" for r in distinct(rank)}
    # backward passes: real PyTorch runs them outside the module annotations; follow each autograd node
    # back to the forward op that created it (same sequence number) and that op's annotation. Where this
    # works it replaces backward annotations (e.g. from module backward hooks, which close early for a
    # module whose input needs no gradient and miss nodes that run after the input gradient is ready).
    fwd_ann = np.flatnonzero(hit & is_cpu_ann & ~bwd_of[idx])
    bw = _backward_by_sequence(events, fwd_ann, rank, ts, end, cpu_path_rank) if fwd_ann.size else None
    seq_ranks = distinct(rank[bw[0]]) if bw is not None else np.zeros(0, np.int64)
    use = hit & ~(bwd_of[idx] & member(rank, seq_ranks))
    gpu_rows = np.flatnonzero(use & is_gpu_ann)
    gpu_ranks = distinct(rank[gpu_rows])
    # CPU annotations only for ranks without GPU annotations (else the same instance counts twice)
    cpu_rows = np.flatnonzero(use & is_cpu_ann & ~member(rank, gpu_ranks))
    # (rows, gpu start, gpu end, layer, module, backward)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str | None], np.ndarray]] = []

    def add(rows_: np.ndarray, s_: np.ndarray, e_: np.ndarray) -> None:
        n_ = idx[rows_]
        parts.append((rows_, s_, e_, layer_of[n_], [mod_of[i] for i in n_], bwd_of[n_]))

    if gpu_rows.size:
        add(gpu_rows, ts[gpu_rows], end[gpu_rows])
    if cpu_rows.size:
        # ranks analysed on the CPU timeline (no device events, e.g. gloo): the annotation is the span
        cpu_path = np.array([cpu_path_rank[int(r)] for r in rank[cpu_rows]], bool)
        on_cpu, launched = cpu_rows[cpu_path], cpu_rows[~cpu_path]
        if on_cpu.size:
            add(on_cpu, ts[on_cpu], end[on_cpu])
        if launched.size:
            s, e = _launched_span(events, launched, rank, ts, end)
            add(launched, s, e)
    if bw is not None:
        rows_, s_, e_, owner = bw
        n_ = idx[fwd_ann[owner]]
        parts.append((rows_, s_, e_, layer_of[n_], [mod_of[i] for i in n_], np.ones(rows_.size, bool)))
    if not parts:
        return SPANS.empty_table()
    rows = np.concatenate([p[0] for p in parts])
    g_start = np.concatenate([p[1] for p in parts])
    g_end = np.concatenate([p[2] for p in parts])
    lay = np.concatenate([p[3] for p in parts])
    mods = np.array([m for p in parts for m in p[4]], dtype=object)
    bwds = np.concatenate([p[5] for p in parts])
    keep = g_end > g_start
    rows, g_start, g_end, lay, mods, bwds = (
        rows[keep],
        g_start[keep],
        g_end[keep],
        lay[keep],
        mods[keep],
        bwds[keep],
    )
    busy = np.zeros(rows.size, np.int64)
    for r in distinct(rank[rows]):
        m = rank[rows] == r
        rs = sets.get(int(r))
        if rs is not None:
            busy[m] = iv.measure_in_windows(rs.compute, g_start[m], g_end[m])
    # an annotation nested in another of the same layer and module (e.g. `layers.3.self_attn.core`) is
    # part of the outer one: drop it so its time is counted once
    k = ~_nested_in_same(rank[rows], lay, mods, bwds, g_start, g_end)
    rows, g_start, g_end, busy, lay, mods, bwds = (
        rows[k],
        g_start[k],
        g_end[k],
        busy[k],
        lay[k],
        mods[k],
        bwds[k],
    )
    return pa.table(
        {
            "rank": pa.array(rank[rows].astype(np.int32)),
            "step": pa.array(np.where(step[rows] < 0, np.array(None), step[rows]).tolist(), pa.int32()),
            "layer": pa.array(lay.astype(np.int32)),
            "module": pa.array(mods.tolist(), pa.string()),
            "backward": pa.array(bwds.astype(bool)),
            "gpu_start_ns": pa.array(g_start),
            "gpu_end_ns": pa.array(g_end),
            "compute_ns": pa.array(busy),
        },
        schema=SPANS,
    )


def _nested_in_same(
    r: np.ndarray, lay: np.ndarray, mods: np.ndarray, bwd: np.ndarray, s: np.ndarray, e: np.ndarray
) -> np.ndarray:
    """Per span: it ends no later than an earlier-starting span of the same (rank, layer, module, backward)
    (in a stable sort by start; null modules are in no group). Compared in float64, as the pandas
    cummax / shift it replaces did."""
    n = r.size
    same = np.zeros(n, bool)
    if n < 2:
        return same
    # one code per distinct module (only equality matters: a group's rows keep their order by start), -1 null
    seen: dict[str, int] = {}
    m_code = np.array([-1 if m is None else seen.setdefault(m, len(seen)) for m in mods.tolist()], np.int64)
    known = m_code >= 0
    o = np.lexsort((s, bwd, m_code, lay, r))
    new = np.zeros(n, bool)
    new[0] = True
    for key in (r, lay, m_code, bwd):
        ks = key[o]
        new[1:] |= ks[1:] != ks[:-1]
    gid = np.cumsum(new) - 1
    # running max of the end within each group: dense ranks of the ends offset by group, one accumulate
    ue, er = np.unique(e[o], return_inverse=True)
    cm = ue[np.maximum.accumulate(gid * ue.size + er) - gid * ue.size]
    has_prev = ~new & known[o]
    prev = np.full(n, float(np.iinfo(np.int64).min))
    prev[1:] = cm[:-1].astype(np.float64)
    same[o] = has_prev & (e[o].astype(np.float64) <= prev)
    return same


#: Name prefix of the autograd engine's per-node cpu op (one per backward node executed).
EVAL_PREFIX = "autograd::engine::evaluate_function:"


def _is_eval_name(v: str) -> bool:
    return str(v).startswith(EVAL_PREFIX)


def _backward_by_sequence(
    events: pa.Table,
    fwd_ann: np.ndarray,
    rank: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    cpu_path: dict[int, bool],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Backward spans of forward module annotations, from the autograd sequence number.

    Each autograd node's `autograd::engine::evaluate_function: XBackward0` op carries the `Sequence
    number` of the forward op that recorded the node; that op ran inside a module annotation on the
    forward thread. Returns (evaluate_function rows, span start, span end, index into `fwd_ann` of the
    owning annotation): the span is the GPU window of the kernels launched inside the node (device
    ranks) or the node itself (ranks on the CPU timeline). None without sequence numbers."""
    if "sequence_nr" not in events.column_names:
        return None
    cols = columns(events)
    seq = cols.int64("sequence_nr", -1)
    if not (seq >= 0).any():
        return None
    is_op = cols.kinds("cpu_op")
    is_eval = cols.flag("name", _is_eval_name)
    tid = cols.int64("tid", -1)
    fwd_ops = np.flatnonzero(is_op & ~is_eval & (seq >= 0) & member(rank, rank[fwd_ann]))
    if fwd_ops.size == 0:
        return None
    owner = _owners(fwd_ann, fwd_ops, rank, tid, ts, end)
    fwd_ops, owner = fwd_ops[owner >= 0], owner[owner >= 0]
    if fwd_ops.size == 0:
        return None
    # (rank, sequence number) -> owning annotation; sequence numbers count up per forward thread, so a
    # number names one forward op in a run (one forward thread per rank, as in training loops)
    key = rank[fwd_ops] * (1 << 40) + seq[fwd_ops]
    o = np.argsort(key, kind="stable")
    key, owner = key[o], owner[o]
    evals = np.flatnonzero(is_eval & (seq >= 0))
    ekey = rank[evals] * (1 << 40) + seq[evals]
    pos = np.clip(np.searchsorted(key, ekey), 0, key.size - 1)
    found = key[pos] == ekey
    evals, eowner = evals[found], owner[pos[found]]
    if evals.size == 0:
        return None
    on_cpu = np.array([cpu_path.get(int(r), False) for r in rank[evals]], bool)
    s_ = ts[evals].copy()
    e_ = end[evals].copy()
    dev = np.flatnonzero(~on_cpu)
    if dev.size:
        s_[dev], e_[dev] = _launched_span(events, evals[dev], rank, ts, end)
    return evals, s_, e_, eowner


def _owners(
    ann_rows: np.ndarray, pts: np.ndarray, rank: np.ndarray, tid: np.ndarray, ts: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Index into `ann_rows` of the annotation holding each event row of `pts` (its start inside the
    annotation, same rank and thread; the innermost when annotations nest), -1 for none."""
    ann_key = rank[ann_rows] * (1 << 32) + tid[ann_rows]
    p_key = rank[pts] * (1 << 32) + tid[pts]
    owner = np.full(pts.size, -1, np.int64)
    for k in np.unique(ann_key):
        a = np.flatnonzero(ann_key == k)
        a = a[np.argsort(ts[ann_rows[a]], kind="stable")]
        lo, hi = ts[ann_rows[a]], end[ann_rows[a]]
        # drop annotations that contain a later one (keep the innermost so windows are disjoint)
        inner = np.ones(a.size, bool)
        inner[:-1] = hi[:-1] <= lo[1:]
        a, lo, hi = a[inner], lo[inner], hi[inner]
        m = np.flatnonzero(p_key == k)
        w = iv.assign_windows(ts[pts[m]], lo, hi)
        owner[m[w >= 0]] = a[w[w >= 0]]
    return owner


def _launched_span(
    events: pa.Table, ann_rows: np.ndarray, rank: np.ndarray, ts: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """GPU [first kernel start, last kernel end] of the kernels launched inside each CPU annotation."""
    out_s = np.zeros(ann_rows.size, np.int64)
    out_e = np.zeros(ann_rows.size, np.int64)
    cols = columns(events)
    is_dev = cols.kinds("kernel", "gpu_memcpy", "gpu_memset")
    is_rt = cols.kinds("cuda_runtime", "cuda_driver")
    corr = cols.int64("correlation", -1)
    tid = cols.int64("tid", -1)
    dev, rt = np.flatnonzero(is_dev & (corr >= 0)), np.flatnonzero(is_rt & (corr >= 0))
    if dev.size == 0 or rt.size == 0:
        return out_s, out_e
    # launch of each device event: the runtime call with the same (rank, correlation)
    rt_key = rank[rt] * (1 << 40) + corr[rt]
    o = np.argsort(rt_key, kind="stable")
    rt_key, rt_sorted = rt_key[o], rt[o]
    dev_key = rank[dev] * (1 << 40) + corr[dev]
    pos = np.clip(np.searchsorted(rt_key, dev_key), 0, rt_key.size - 1)
    found = rt_key[pos] == dev_key
    dev, launch = dev[found], rt_sorted[pos[found]]
    owner = _owners(ann_rows, launch, rank, tid, ts, end)
    has = owner >= 0
    if has.any():
        o_idx = owner[has]
        big = np.iinfo(np.int64).max
        s = np.full(ann_rows.size, big, np.int64)
        e = np.zeros(ann_rows.size, np.int64)
        np.minimum.at(s, o_idx, ts[dev[has]])
        np.maximum.at(e, o_idx, end[dev[has]])
        seen = s != big
        out_s[seen], out_e[seen] = s[seen], e[seen]
    return out_s, out_e


@dataclass
class CompositionResult:
    """Layer-type composition and cost per stage, with findings and a suggested split."""

    stages: dict[int, dict[str, int]] = field(default_factory=dict)
    source: str = "none"  # annotations | ops | model | none
    stage_ops: dict[int, float] | None = None  # compute ops per step per stage (time-shared CPU runs)
    rule: str | None = (
        None  # the layer-annotation rule that matched (tracelens.analyze.pipeline.layers), if any
    )
    #: stage -> {type -> GPU compute ms per microbatch (forward + backward), mean over the stage's ranks}
    per_stage_type_ms: dict[int, dict[str, float]] = field(default_factory=dict)
    #: stage -> compute ms per step (mean over the stage's ranks and steps)
    per_stage_compute: dict[int, float] = field(default_factory=dict)
    time_share: dict[str, float] = field(default_factory=dict)
    imbalance: float | None = None  # max / mean stage compute
    heavy_stage: int | None = None
    layer_split: list[int] | None = None
    suggested_split: list[int] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)


def _stage_layer_counts(
    sp: pd.DataFrame,
) -> tuple[dict[int, dict[str, int]], dict[int, set[tuple[str, int]]]]:
    """Per stage (ascending): distinct layers of each mixer type (types in sorted order), and the stage's
    distinct (mixer type, layer) pairs. From the distinct (stage, type, layer) triples of the spans, not a
    group-by per stage."""
    mix = (sp["module"].isin(MIXER_TYPES) & (sp["stage"] >= 0)).to_numpy(bool)
    counts: dict[int, dict[str, int]] = {}
    pairs: dict[int, set[tuple[str, int]]] = {}
    if not mix.any():
        return counts, pairs
    if sp["layer"].isna().any():  # (module_spans always gives a layer, -1 for none): a group-by per stage
        for s, g in sp[mix].groupby("stage"):
            kinds = g.drop_duplicates(["layer", "module"]).groupby("module")["layer"].nunique()
            counts[int(s)] = {str(k): int(v) for k, v in kinds.items()}
            pairs[int(s)] = set(zip(g["module"], g["layer"]))
        return counts, pairs
    codes, mods = pd.factorize(sp["module"].to_numpy(object)[mix])
    stage = sp["stage"].to_numpy(np.int64)[mix]
    layer = sp["layer"].to_numpy(np.int64)[mix]
    # distinct (stage, type, layer) triples, sorted, as one int64 code each (stages and codes are >= 0)
    lo = int(layer.min())
    n_lay, n_mod = int(layer.max()) - lo + 1, len(mods)
    code = np.unique((stage * n_mod + codes.astype(np.int64)) * n_lay + (layer - lo))
    trip = (code // n_lay // n_mod, code // n_lay % n_mod, code % n_lay + lo)
    names = [str(m) for m in mods]
    for st, c, lay in zip(*(a.tolist() for a in trip)):
        per = counts.setdefault(int(st), {})
        per[names[c]] = per.get(names[c], 0) + 1
        pairs.setdefault(int(st), set()).add((names[c], int(lay)))
    return {st: dict(sorted(per.items())) for st, per in counts.items()}, pairs


def _census_wins(annotated: dict[int, dict[str, int]], census: dict[int, dict[str, int]]) -> bool:
    """The op census replaces the annotations' counts when they name no layers, or fewer layers on some stage
    than its ops show (annotations on some layers only)."""
    if not annotated:
        return True
    return any(sum(annotated.get(s, {}).values()) < sum(c.values()) for s, c in census.items())


def _named_census(
    annotated: dict[int, dict[str, int]], census: dict[int, dict[str, int]]
) -> dict[int, dict[str, int]]:
    """The census's counts, its "other" layers named by the one other mixer type the annotations name, if
    they name exactly one (e.g. linear_attention)."""
    other = {t for c in annotated.values() for t in c if t != "full_attention"}
    name = other.pop() if len(other) == 1 else "other"
    return {s: {k if k != "other" else name: v for k, v in c.items()} for s, c in census.items()}


def _split_from_layers(stage_layers: dict[int, set[tuple[str, int]]]) -> list[int] | None:
    if not stage_layers:
        return None
    return [len(stage_layers[s]) for s in sorted(stage_layers)]


def analyze_composition(
    events: pa.Table,
    grid: Grid,
    model: ModelSpec | None = None,
    seq_len: int | None = None,
    layer_split: Sequence[int] | None = None,
    microbatches: int | None = None,
    patterns: Sequence[str] | None = None,
    imbalance_threshold: float = IMBALANCE_THRESHOLD,
    breakdown: pa.Table | None = None,
    spans: pa.Table | None = None,
    sets: dict[int, RankSets] | None = None,
    stage_ops: dict[int, float] | None = None,
    census: dict[int, dict[str, int]] | None = None,
) -> CompositionResult:
    """Layer counts by type per stage, per-stage compute per type, run-wide time shares and findings.

    `stage_ops`: compute ops per step per stage, for ranks that time-share a host's CPUs (their wall
    durations include descheduling): the heavy stage and the imbalance then come from these exact counts."""
    res = CompositionResult()
    stage_ranks = {s: grid.ranks_of_stage(s) for s in grid.stages}
    if sets is None:
        sets = class_sets(events) if events.num_rows else {}
    if spans is None:
        spans = module_spans(events, patterns, sets=sets) if events.num_rows else SPANS.empty_table()
    sp = spans.to_pandas()
    if len(sp):
        sp["stage"] = grid.stage_lookup(sp["rank"].to_numpy())

    # --- layer counts per stage ---
    stage_layers: dict[int, set[tuple[str, int]]] = {}  # stage -> its (mixer type, layer) pairs
    if len(sp) and stage_ranks:
        res.stages, stage_layers = _stage_layer_counts(sp)
        if res.stages:
            res.source = "annotations"
            res.layer_split = _split_from_layers(stage_layers)
    if census and set(census) == set(stage_ranks) and _census_wins(res.stages, census):
        # the ops count more layers than the annotations name (some layers annotated, or none): the census
        res.stages = _named_census(res.stages, census)
        res.source = "ops"
        res.layer_split = [sum(census[s].values()) for s in sorted(census)]
    if not res.stages and model is not None and grid.pp:
        from tracelens.models.flops import check_split, default_split

        split = check_split(model, layer_split) if layer_split else default_split(model.num_layers, grid.pp)
        if len(split) == grid.pp:
            start = 0
            for s, n in enumerate(split):
                res.stages[s] = model.layer_type_counts(range(start, start + n))
                start += n
            res.source = "model"
            res.layer_split = split
    types = sorted({t for c in res.stages.values() for t in c})
    for c in res.stages.values():
        for t in types:
            c.setdefault(t, 0)

    # --- compute per stage (per step) and per type per microbatch ---
    if breakdown is not None and breakdown.num_rows:
        bd = breakdown.select(["rank", "step", "step_time_ns", "compute_ns"]).to_pandas()
    else:
        from tracelens.analyze.rank.breakdown import breakdown as _bd

        bd = (
            _bd(events, sets=sets).select(["rank", "step", "step_time_ns", "compute_ns"]).to_pandas()
            if events.num_rows
            else None
        )
    if bd is not None and len(bd):
        bd["stage"] = grid.stage_lookup(bd["rank"].to_numpy())
        for s, g in bd[bd["stage"] >= 0].groupby("stage"):
            res.per_stage_compute[int(s)] = float(g["compute_ns"].mean()) / 1e6
    if len(sp):
        n_steps = sp.groupby("rank")["step"].nunique().clip(lower=1)
        m = microbatches or _microbatches_from_spans(sp)
        staged = sp[sp["stage"] >= 0]
        if len(staged) and m:
            per = staged.groupby(["stage", "rank", "module"])["compute_ns"].sum().reset_index()
            per["ms"] = per["compute_ns"] / 1e6 / per["rank"].map(n_steps) / m
            for (s, t), g in per.groupby(["stage", "module"]):
                res.per_stage_type_ms.setdefault(int(s), {})[str(t)] = float(g["ms"].mean())
        if bd is not None and len(bd):
            total = float(bd["step_time_ns"].sum())
            if total > 0:
                shares = (
                    sp[sp["rank"].isin(bd["rank"].unique())].groupby("module")["compute_ns"].sum() / total
                )
                res.time_share = {str(k): float(v) for k, v in shares.items()}

    # --- findings ---
    if len(res.stages) > 1:
        distinct = {tuple(sorted(c.items())) for c in res.stages.values()}
        if len(distinct) > 1:
            res.findings.append(_unequal_finding(res.stages))
    res.stage_ops = dict(stage_ops) if stage_ops else None
    if len(res.per_stage_compute) > 1:
        vals = stage_ops if stage_ops and len(stage_ops) > 1 else res.per_stage_compute
        mean = float(np.mean(list(vals.values())))
        heavy = max(vals, key=lambda s: vals[s])
        res.heavy_stage = heavy
        res.imbalance = vals[heavy] / mean if mean > 0 else None
        if model is not None and grid.pp and seq_len:
            try:
                from tracelens.models.audit import balanced_split

                res.suggested_split = balanced_split(model, grid.pp, seq_len)
            except TracelensError:  # a model/pp pair the splitter rejects: no suggestion, not a crash
                res.suggested_split = None
        if res.imbalance is not None and res.imbalance > imbalance_threshold:
            res.findings.append(_imbalance_finding(res, stage_ranks, imbalance_threshold))
    return res


def _runs(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable order sorting the rows by `keys` (the first key major) and where, in that order, each run of
    equal keys starts: one vectorised group-by over int64 keys."""
    o = np.lexsort(keys[::-1])
    new = np.zeros(o.size, bool)
    if o.size:
        new[0] = True
        for k in keys:
            ks = k[o]
            new[1:] |= ks[1:] != ks[:-1]
    return o, np.flatnonzero(new)


def _median_per_group(gid: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group ids ascending, median of `values` in each group) as pandas computes it: the middle value, or
    the mean of the two middle values."""
    o, first = _runs(gid, values)
    g, v = gid[o], values[o].astype(np.float64)
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if o.size else first
    size = np.diff(np.append(first, o.size))
    lo, hi = first + (size - 1) // 2, first + size // 2
    med: np.ndarray = (v[lo] + v[hi]) / 2
    return g[first], med


def _microbatches_from_spans(sp: pd.DataFrame) -> int | None:
    """Forward executions of a rank's first layer per step (its first module type), median over ranks.

    Per rank: the rows of its lowest layer index whose module is that of the first such row (in `sp`
    order), counted per step (a span outside every step, null or -1, is a step of its own); the rank's
    count is the median over its steps (truncated), the result the median over ranks (truncated).
    Vectorised over all ranks at once (a group-by on (rank, step) codes)."""
    keep_rows = ~sp["backward"].to_numpy(bool) & (sp["layer"].to_numpy() >= 0)
    fwd = sp[["rank", "layer", "module", "step"]][keep_rows]  # (the columns read: no copy of the others)
    if not len(fwd):
        return None
    ranks, rid = np.unique(fwd["rank"].to_numpy(np.int64), return_inverse=True)
    layer = fwd["layer"].to_numpy(np.int64)
    # module codes: equal for equal modules, -1 for no module (never equal, as NaN == NaN); factorized in
    # the column's own dtype (no Python object per row)
    mod = np.asarray(pd.factorize(fwd["module"])[0], np.int64)
    step = pd.to_numeric(fwd["step"]).to_numpy(np.float64)
    step_k = np.where(np.isnan(step), np.iinfo(np.int64).min, np.nan_to_num(step)).astype(np.int64)
    min_layer = np.full(ranks.size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(min_layer, rid, layer)
    at_first = np.flatnonzero(layer == min_layer[rid])
    # np.unique's return_index: the first occurrence of each rank among its first-layer rows
    _, first_row = np.unique(rid[at_first], return_index=True)
    first_mod = np.full(ranks.size, -1, np.int64)
    first_mod[rid[at_first[first_row]]] = mod[at_first[first_row]]
    keep = at_first[(mod[at_first] == first_mod[rid[at_first]]) & (mod[at_first] >= 0)]
    if not keep.size:
        return None
    o, starts = _runs(rid[keep], step_k[keep])
    per_step = np.diff(np.append(starts, o.size))  # spans per (rank, step)
    _, med = _median_per_group(rid[keep][o][starts], per_step)
    counts = med.astype(np.int64)  # int(): truncation, the medians are >= 1
    return int(np.median(counts))


def _unequal_finding(stages: dict[int, dict[str, int]]) -> dict[str, Any]:
    desc = "; ".join(
        f"stage {s}: " + ", ".join(f"{n} {t}" for t, n in sorted(c.items()) if n)
        for s, c in sorted(stages.items())
    )
    types = sorted({t for c in stages.values() for t in c})
    most = {t: max(stages, key=lambda s: stages[s].get(t, 0)) for t in types}
    differ = [t for t in types if len({c.get(t, 0) for c in stages.values()}) > 1]
    lead = ", ".join(f"stage {most[t]} holds the most {t} layers" for t in differ)
    return finding(
        "UNEQUAL_STAGE_COMPOSITION",
        "warning",
        f"pipeline stages hold different layer types ({lead}): {desc}",
        stages=list(dict.fromkeys(most[t] for t in differ)),  # a stage holding the most of two types: once
        composition={str(s): c for s, c in stages.items()},
    )


def _imbalance_finding(
    res: CompositionResult, stage_ranks: dict[int, list[int]], threshold: float
) -> dict[str, Any]:
    heavy, imbalance = res.heavy_stage, res.imbalance
    assert heavy is not None and imbalance is not None  # analyze_composition sets both before calling
    vals = res.per_stage_compute
    mean = float(np.mean(list(vals.values())))
    if res.stage_ops:
        ops = res.stage_ops
        msg = (
            f"stage {heavy} is the heaviest pipeline stage: {ops[heavy]:.0f} compute ops per step vs "
            f"{float(np.mean(list(ops.values()))):.0f} mean ({res.imbalance:.2f}x, threshold {threshold:.2f}x; "
            f"counted, as its ranks time-share a host's CPUs); every other stage waits for it"
        )
    else:
        msg = (
            f"stage {heavy} is the heaviest pipeline stage: {vals[heavy]:.1f} ms compute per step vs "
            f"{mean:.1f} ms mean ({res.imbalance:.2f}x, threshold {threshold:.2f}x); every other stage waits "
            f"for it"
        )
    if res.per_stage_type_ms.get(heavy):
        parts = sorted(res.per_stage_type_ms[heavy].items(), key=lambda kv: -kv[1])
        msg += "; per microbatch it spends " + ", ".join(f"{v:.2f} ms in {t}" for t, v in parts)
    if res.suggested_split and res.suggested_split != res.layer_split:
        msg += f"; a balanced split is {','.join(map(str, res.suggested_split))}"
        if res.layer_split:
            msg += f" (now {','.join(map(str, res.layer_split))})"
    return finding(
        "STAGE_IMBALANCE",
        "warning",
        msg,
        ranks=stage_ranks.get(heavy, []),
        stages=[heavy],
        imbalance=round(imbalance, 4),
        stage_compute_ms={str(s): round(v, 3) for s, v in vals.items()},
        suggested_split=res.suggested_split,
    )


def audit_for_run(
    grid: Grid,
    model: ModelSpec | None,
    seq_len: int | None = None,
    layer_split: Sequence[int] | None = None,
    existing: Sequence[dict[str, Any]] = (),
) -> tuple[AuditResult | None, list[dict[str, Any]]]:
    """The layout audit (tracelens.models.audit) for an analysed run when the model and every degree are
    known: (AuditResult or None, its findings minus codes already reported in `existing`)."""
    tp, pp, dp, cp = grid.tp, grid.pp, grid.dp, grid.cp
    if model is None or tp is None or pp is None or dp is None or cp is None:
        return None, []
    from tracelens.models.audit import audit_layout

    try:
        audit = audit_layout(model, tp, pp, cp=cp, dp=dp, seq_len=seq_len, layer_split=layer_split)
    except TracelensError:  # e.g. a split that does not fit the model: the audit is optional here
        return None, []
    # STAGE_IMBALANCE: the run's measured stage compute (above) is the evidence; the audit's FLOPs-based
    # prediction is for `audit-layout`, before launch
    seen = {f["code"] for f in existing} | {"STAGE_IMBALANCE"}
    return audit, [f for f in audit.findings if f["code"] not in seen]
