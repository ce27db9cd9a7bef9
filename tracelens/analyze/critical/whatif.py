"""What-if by replay: change one thing in the step's dependency graph, replay it, report the step time.

Each finding with a fix maps to one change (docs/whatif.md):

- STRAGGLER (compute): that rank's compute kernels scaled, per step, to its peers' median compute;
- STRAGGLER (host): that rank's CPU launch intervals cut to its peers' median at the same position (its host
  gaps removed), so its kernels are released as early as its peers' are;
- STRAGGLER (communication): the transfers of every collective and P2P instance the rank takes part in set
  to the median bandwidth of instances of the same kind (op, size, participants) without it;
- EXPOSED_COMM_HIGH: the group with the most transfer on the critical path runs every call at its own median
  bandwidth;
- STAGE_IMBALANCE / PIPELINE_BUBBLE_EXCESS: the heavy stage's compute scaled to the mean of the other stages;
- UNEQUAL_STAGE_COMPOSITION: each stage's compute scaled by suggested / current layers (the balanced split).

Plus the combined "all fixed". Savings are mean step time before minus after, over the analyzed steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from tracelens.analyze.core.dictcol import per_object
from tracelens.analyze.core.intset import distinct
from tracelens.analyze.critical.critical_keys import Cells
from tracelens.analyze.critical.critical_path import NEG, CriticalPath, Graph
from tracelens.analyze.critical.critical_replay import ReplayPlan, mean_step_time_ns, replay_plan, step_times


class Change:
    """Per-kernel durations, releases and transfers of one change (start from the observed values: the graph's
    own arrays, never written into; a change replaces the arrays it changes, `set`)."""

    def __init__(self, g: Graph):
        self.dur = g.k_dur
        self.release = g.k_release
        self.transfer = g.k_transfer

    def set(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """`name` ("dur", "release" or "transfer") at `rows` set to `values`, in a copy of its array."""
        arr = getattr(self, name).copy()
        arr[rows] = values
        setattr(self, name, arr)


def _compute_mask(g: Graph) -> np.ndarray:
    return ~g.k_comm


def _pair_codes(rank: np.ndarray, step: np.ndarray, lo: int, span: int, r0: int = 0) -> np.ndarray:
    """One int64 per (rank, step) pair, ordered as the pairs are (rank major): ranks from r0, steps in
    [lo, lo + span). One new array, made in three passes (the inputs may be int32: no int64 copies of them;
    at 1,024 ranks a what-if makes these codes for millions of kernels, six times)."""
    out: np.ndarray = np.multiply(rank, span, dtype=np.int64)
    out += step
    out -= r0 * span + lo
    return out


def _per_rank_step_compute(g: Graph) -> pd.Series:
    """Compute-kernel time per (rank, step), index sorted (as a group-by on the two keys gives it): one
    sort of pair codes and a bincount, not a group-by over every kernel (durations are whole ns, so the
    sums are exact either way). Computed once per graph (what-if asks for it once per stage finding and
    fix); callers only read the result (a copy is handed out)."""
    memo = per_object(g)
    got = memo.get("rank_step_compute")
    if got is None:
        got = memo["rank_step_compute"] = _compute_sums(g)
    out: pd.Series = got.copy()  # type: ignore[attr-defined]
    return out


def _compute_sums(g: Graph) -> pd.Series:
    m = _compute_mask(g)
    rank, step = g.k_rank[m], g.k_step[m]
    if not rank.size:
        return pd.Series(g.k_dur[m]).groupby([rank, step]).sum()
    lo = int(step.min())
    span = int(step.max()) - lo + 1
    r0 = int(rank.min())
    if (int(rank.max()) - r0 + 1) * span > 4 * rank.size + (1 << 20):  # sparse pairs (far-apart step numbers)
        return pd.Series(g.k_dur[m]).groupby([rank, step]).sum()
    pc = _pair_codes(rank, step, lo, span, r0)  # dense: 0 .. (ranks x steps), no sort needed
    seen = np.bincount(pc) > 0
    sums = np.bincount(pc, weights=g.k_dur[m].astype(np.float64))
    codes = np.flatnonzero(seen)
    idx = pd.MultiIndex.from_arrays(
        [(codes // span + r0).astype(rank.dtype), (codes % span + lo).astype(step.dtype)]
    )
    return pd.Series(sums[codes], index=idx)


def _factor_per_kernel(g: Graph, factor_of: dict[tuple[int, int], float]) -> np.ndarray:
    """factor_of[(rank, step)] of each kernel, NaN for pairs it does not name."""
    fac = np.full(g.k_rank.size, np.nan)
    if not factor_of or not g.k_rank.size:
        return fac
    keys = list(factor_of)
    pr = np.array([k[0] for k in keys], np.int64)
    ps = np.array([k[1] for k in keys], np.int64)
    pv = np.array([factor_of[k] for k in keys], np.float64)
    lo = int(min(g.k_step.min(), ps.min()))
    span = int(max(g.k_step.max(), ps.max())) - lo + 1
    r0 = int(min(g.k_rank.min(), pr.min()))
    cells = (int(max(g.k_rank.max(), pr.max())) - r0 + 1) * span
    kk = _pair_codes(g.k_rank, g.k_step, lo, span, r0)
    pk = _pair_codes(pr, ps, lo, span, r0)
    if cells <= 4 * g.k_rank.size + (1 << 20):  # a dense table of every (rank, step) cell
        lut = np.full(cells, np.nan)
        lut[pk] = pv  # (dict keys: no pair twice)
        out: np.ndarray = lut[kk]
        return out
    o = np.argsort(pk, kind="stable")
    pk, pv = pk[o], pv[o]
    i = np.minimum(np.searchsorted(pk, kk), pk.size - 1)
    hit = pk[i] == kk
    fac[hit] = pv[i[hit]]
    return fac


def scale_compute(g: Graph, factor_of: dict[tuple[int, int], float]) -> Change:
    """Multiply the compute kernels of (rank, step) by factor_of[(rank, step)] (at most 1)."""
    ch = Change(g)
    m = _compute_mask(g)
    if not factor_of:
        return ch
    fac = _factor_per_kernel(g, factor_of)
    fac = np.where(np.isnan(fac) | ~m, 1.0, np.minimum(fac, 1.0))
    ch.dur = g.k_dur * fac
    return ch


def _compute_steps(comp: pd.Series) -> np.ndarray:
    """The steps with compute (sorted): the only steps of np.unique(g.k_step) where a (rank, step) lookup in
    `comp` can hit, taken from its few pairs instead of every kernel."""
    out: np.ndarray = np.unique(comp.index.get_level_values(1).to_numpy())
    return out


def straggler_compute(g: Graph, rank: int, peers: list[int]) -> Change:
    comp_s = _per_rank_step_compute(g)
    comp = comp_s.to_dict()  # (rank, step) -> ns: plain dict lookups below
    out = {}
    for st in _compute_steps(comp_s):
        own = comp.get((rank, int(st)))
        vals = [comp.get((p, int(st))) for p in peers if (p, int(st)) in comp]
        if own and vals:
            out[(rank, int(st))] = float(np.median(vals)) / own
    return scale_compute(g, out)


#: A stage is heavy when its compute exceeds the mean of the other stages by this fraction; below it, the
#: difference is what the first and last stages' embedding, head and loss add, not a fix.
MIN_STAGE_EXCESS = 0.10


def stage_excess(g: Graph, ranks: list[int], others: list[int]) -> float:
    """Mean compute of `ranks` over the mean of `others`, minus 1 (over all steps)."""
    comp = _per_rank_step_compute(g).groupby(level=0).mean()
    mine = comp.reindex(ranks).dropna()
    oth = comp.reindex(others).dropna()
    if mine.empty or oth.empty or oth.mean() <= 0:
        return 0.0
    return float(mine.mean() / oth.mean() - 1.0)


def stage_compute(g: Graph, ranks: list[int], others: list[int]) -> Change:
    comp_s = _per_rank_step_compute(g)
    comp = comp_s.to_dict()  # (rank, step) -> ns: plain dict lookups below
    out = {}
    for st in _compute_steps(comp_s):
        mine = [comp[(r, int(st))] for r in ranks if (r, int(st)) in comp]
        oth = [comp[(r, int(st))] for r in others if (r, int(st)) in comp]
        if mine and oth and np.mean(mine) > 0:
            f = float(np.mean(oth) / np.mean(mine))
            out.update({(r, int(st)): f for r in ranks})
    return scale_compute(g, out)


def split_compute(
    g: Graph, stage_ranks: dict[int, list[int]], current: list[int], suggested: list[int], per_layer_ns: float
) -> Change:
    """Each stage's compute plus (suggested - current layers) x the mean compute of one layer, per step."""
    ch = Change(g)
    comp = _per_rank_step_compute(g)
    out = {}
    for s, ranks in stage_ranks.items():
        if s < len(current) and s < len(suggested):
            for (r, st), c in comp.items():
                if r in ranks and c > 0:
                    out[(r, st)] = max(c + (suggested[s] - current[s]) * per_layer_ns, 0.0) / c
    m = _compute_mask(g)
    fac = _factor_per_kernel(g, out)
    fac = np.where(np.isnan(fac), 1.0, fac)
    ch.dur = g.k_dur * np.where(m, fac, 1.0)
    # moved layers take their launches along: each stage's CPU timeline stretches or shrinks alike (from the
    # step's start, or from the return of the sync a launch follows: what came before moves through the sync)
    has = g.k_release > NEG / 2
    origin = _anchor(g)
    ch.release = np.where(has, origin + (g.k_release - origin) * fac, g.k_release)
    return ch


def _anchor(g: Graph) -> np.ndarray:
    """Per kernel, where its CPU launch timeline starts: the return of the blocking sync it follows (plus the
    launch latency, in release units), else its step's start."""
    origin = np.asarray(pd.Series(g.k_step).map(g.step_origin).fillna(0.0).to_numpy(), dtype=float)
    if g.k_sync_ret.size != g.k_release.size:
        return origin
    return np.where(g.k_sync_x >= 0, np.nan_to_num(g.k_sync_ret, nan=0.0), origin)


def per_layer_ns(
    per_stage_type_ms: dict[int, dict[str, float]], current: list[int], microbatches: int | None
) -> float | None:
    """Mean compute of one layer per step (ns): the module annotations' compute per stage over its layers."""
    if not per_stage_type_ms or not microbatches:
        return None
    vals = [
        sum(types.values()) * microbatches / current[int(s)]
        for s, types in per_stage_type_ms.items()
        if int(s) < len(current) and current[int(s)] > 0
    ]
    return float(np.mean(vals)) * 1e6 if vals else None


def _send_ops(ops: Cells) -> np.ndarray:
    """Per distinct op cell: its text with "recv" read as "send" (a send and its recv are one transfer), as
    `astype(str).str.replace("recv", "send")` gives it (a null as "None"); taken per kernel by its code."""
    return np.array([str(v).replace("recv", "send") for v in ops.values], dtype=object)


class _Kernels:
    """The collective kernels of the graph (all, or those of `sel`: positions among them, in kernel order)
    with their instances: `ids` the distinct instance ids (sorted), `inv` each kernel's position in `ids`
    (what a group-by on the instance id gives, by integer codes instead of a frame of every kernel)."""

    def __init__(self, g: Graph, sel: np.ndarray | None = None):
        ck = np.flatnonzero(g.k_instance >= 0)
        pos = np.arange(ck.size) if sel is None else sel
        self.k = ck[pos]
        self.bytes = g.ck_bytes[pos]
        self.rank = g.k_rank[self.k]
        self.op_code = g.k_op.codes[self.k]
        self.ops = _send_ops(g.k_op)
        self.transfer = g.k_transfer[self.k]
        ids, first, inv = np.unique(g.k_instance[self.k], return_index=True, return_inverse=True)
        self.ids, self.first, self.inv = ids, first, inv.ravel()
        self.size = np.bincount(self.inv, minlength=ids.size)

    def per_instance(self) -> pd.DataFrame:
        """Per instance id (index `inst`, sorted): the median transfer of its kernels, the first bytes that
        are not null, the first kernel's op, the number of kernels (rank), as
        `groupby("inst").agg(transfer=median, bytes=first, op=first, n=size)` of the kernels' frame."""
        n = self.ids.size
        t = self.transfer
        o = np.argsort(t, kind="stable")  # per instance, its transfers ascending (NaN last): two stable sorts
        o = o[np.argsort(self.inv[o], kind="stable")]
        ts = t[o]
        valid = np.bincount(self.inv, weights=~np.isnan(t), minlength=n).astype(np.int64)
        start = np.zeros(n, np.int64)
        np.cumsum(self.size[:-1], out=start[1:])
        has = valid > 0  # (the middle one, or the mean of the middle two, of each instance's valid values)
        med = np.full(n, np.nan)
        v, s0 = valid[has], start[has]
        med[has] = (ts[s0 + v // 2] + ts[s0 + (v - 1) // 2]) / 2
        b = np.full(n, np.nan)
        nn = np.flatnonzero(~np.isnan(self.bytes))
        if nn.size:
            u, fi = np.unique(self.inv[nn], return_index=True)
            b[u] = self.bytes[nn[fi]]
        return pd.DataFrame(
            {
                "transfer": med,
                "bytes": b,
                "op": self.ops[self.op_code[self.first]],
                "n": self.size.astype(np.int64),
            },
            index=pd.Index(self.ids, name="inst"),
        )

    def scaled(self, g: Graph, ratio: pd.Series) -> Change:
        """The change: each kernel's transfer times ratio[its instance] (1 where the instance has none)."""
        ch = Change(g)
        r = ratio.reindex(self.ids).fillna(1.0).to_numpy(np.float64)[self.inv]
        ch.set("transfer", self.k, g.k_transfer[self.k] * r)
        return ch


def _sig(inst: pd.DataFrame) -> pd.Series:
    sized = inst["bytes"].fillna(0) > 0
    bucket = np.where(sized, np.floor(np.log2(inst["bytes"].where(sized, 1))).astype(int).astype(str), "na")
    return inst["op"].astype(str) + "|" + bucket + "|" + inst["n"].astype(str)


def _all_instances(g: Graph) -> tuple[_Kernels, pd.DataFrame]:
    """`_Kernels` of every collective kernel and its `per_instance` frame, computed once per graph (one
    what-if per communication straggler asks for them; `what_if` drops them when done); callers get a
    copy of the frame."""
    memo = per_object(g)
    got = memo.get("coll_instances")
    if got is None:
        kn = _Kernels(g)
        got = memo["coll_instances"] = (kn, kn.per_instance())
    assert isinstance(got, tuple)
    kns: _Kernels = got[0]
    frame: pd.DataFrame = got[1]
    return kns, frame.copy()


def transfer_to_reference(g: Graph, ranks: list[int]) -> Change:
    """Instances with any of `ranks` at the median time per byte of same-kind instances without them."""
    kn, inst = _all_instances(g)
    if not kn.k.size:
        return Change(g)
    inst["has"] = np.bincount(kn.inv, weights=np.isin(kn.rank, ranks), minlength=kn.ids.size) > 0
    sized = inst["bytes"].fillna(0) > 0
    inst["unit"] = inst["transfer"] / inst["bytes"].where(sized, 1.0)
    inst["sig"] = _sig(inst)
    ref = inst[~inst["has"]].groupby("sig")["unit"].median()
    target = inst[inst["has"] & inst["sig"].isin(ref.index)]
    if target.empty:
        return Change(g)
    ratio = (target["sig"].map(ref) / target["unit"].where(target["unit"] > 0)).clip(upper=1.0).fillna(1.0)
    return kn.scaled(g, ratio)


def group_median_bandwidth(g: Graph, group: str) -> Change:
    """Every call of one group at the group's median time per byte (its slow calls brought to the median)."""
    ck = np.flatnonzero(g.k_instance >= 0)
    sel = np.flatnonzero(g.k_group.mask(group)[ck])
    if not sel.size:
        return Change(g)
    kn = _Kernels(g, sel)
    inst = kn.per_instance()
    sized = inst["bytes"].fillna(0) > 0
    inst["unit"] = inst["transfer"] / inst["bytes"].where(sized, 1.0)
    inst["sig"] = _sig(inst)
    med = inst.groupby("sig")["unit"].transform("median")
    ratio = (med / inst["unit"].where(inst["unit"] > 0)).clip(upper=1.0).fillna(1.0)
    return kn.scaled(g, ratio)


def host_gaps_removed(g: Graph, rank: int, peers: list[int]) -> Change:
    """The rank's launch intervals (per step, in launch order) cut to its peers' median at the same position
    (its own median interval in steps where no peer launches the same number of kernels).

    A launch after a blocking sync counts its interval from the sync's return at the earliest, and the cuts
    add up from there only: what the CPU did before the sync reaches it through the GPU work the sync waited
    for (the replay's sync term), so it is not cut twice."""
    ch = Change(g)
    sel = np.flatnonzero((g.k_release > NEG / 2) & np.isin(g.k_rank, [rank, *peers]))
    if sel.size == 0:
        return ch
    anchor = _anchor(g)
    ep = g.k_sync_x if g.k_sync_x.size == g.k_release.size else np.full(g.k_release.size, -1)
    df = pd.DataFrame(
        {
            "k": sel,
            "rank": g.k_rank[sel],
            "step": g.k_step[sel],
            "rel": g.k_release[sel],
            "anchor": anchor[sel],
            "ep": ep[sel],
        }
    )
    df = df.sort_values(["rank", "step", "rel"], kind="stable")
    prev = df.groupby(["rank", "step"])["rel"].shift(1)
    df["delta"] = (df["rel"] - np.maximum(prev.fillna(df["anchor"]), df["anchor"])).clip(lower=0.0)
    df["pos"] = df.groupby(["rank", "step"]).cumcount()
    n = df.groupby(["rank", "step"])["k"].transform("size")
    mine = df[df["rank"] == rank]
    if mine.empty:
        return ch
    n_mine = mine.groupby("step")["k"].size()
    peer = df[(df["rank"] != rank) & (n.to_numpy() == df["step"].map(n_mine).fillna(-1).to_numpy())]
    ref = peer.groupby(["step", "pos"])["delta"].median()
    own_med = mine.groupby("step")["delta"].transform("median")
    key = pd.MultiIndex.from_arrays([mine["step"], mine["pos"]])
    r = ref.reindex(key).to_numpy() if len(ref) else np.full(len(mine), np.nan)
    r = np.where(np.isnan(r), own_med.to_numpy(), r)
    d = mine["delta"].to_numpy()
    saved = pd.Series(d - np.minimum(d, r))
    # the cuts add up within a step, from its start or from the sync a launch follows
    cum = saved.groupby([mine["step"].to_numpy(), mine["ep"].to_numpy()]).cumsum().to_numpy()
    k = mine["k"].to_numpy()
    ch.set("release", k, np.minimum(g.k_release[k], g.k_release[k] - cum))
    return ch


def _peers(rank: int, peers_of: dict[int, int] | None, ranks: list[int]) -> list[int]:
    if not peers_of or rank not in peers_of:
        return [r for r in ranks if r != rank]
    grp = peers_of[rank]
    return [r for r in ranks if r != rank and peers_of.get(r) == grp]


def what_if(
    cp: CriticalPath,
    findings: list[dict[str, Any]],
    peers_of: dict[int, int] | None = None,
    stage_of: dict[int, int] | None = None,
    heavy_stage: int | None = None,
    layer_split: list[int] | None = None,
    suggested_split: list[int] | None = None,
    layer_ns: float | None = None,
) -> list[dict[str, Any]]:
    """The summary's `what_if` list (largest saving first); sets `saving_ms` on the findings it fixes."""
    g = cp.graph
    base = mean_step_time_ns(cp.baseline.step_time)
    ranks: list[int] = distinct(g.k_rank).tolist()
    stage_ranks: dict[int, list[int]] = {}
    for r in ranks:
        if stage_of and stage_of.get(r) is not None:
            stage_ranks.setdefault(int(stage_of[r]), []).append(r)
    entries: dict[tuple[str | int, ...], dict[str, Any]] = {}
    # every change so far folded into the "all fixed" one as it comes (a change is ~24 bytes per kernel:
    # none is kept): releases and transfers by min, durations by composing each change's factor
    fixed: list[np.ndarray] = []  # [dur, release, transfer] once there is a change
    # every replay below shares the baseline's plan (kept by `analyze_critical_path` for this: taken out, so
    # that it is dropped when done); one that changes transfers alone also the baseline's node terms
    plan = per_object(g).pop("replay_plan", None)
    if not isinstance(plan, ReplayPlan) or plan.pos is not cp.baseline.pos:
        plan = replay_plan(g)
    baseline = cp.baseline

    def add(
        key: tuple[str | int, ...],
        text: str,
        kind: str,
        rks: Iterable[int],
        sts: Iterable[int],
        make: Callable[[], Change],
    ) -> dict[str, Any]:
        if key not in entries:
            ch = make()
            after = mean_step_time_ns(step_times(g, plan, ch.dur, ch.release, ch.transfer, baseline))
            entries[key] = {
                "change": text,
                "kind": kind,
                "ranks": sorted(int(x) for x in rks),
                "stages": sorted(int(x) for x in sts),
                "step_time_ms": round(base / 1e6, 6),
                "step_time_ms_after": round(after / 1e6, 6),
                "saving_ms": round((base - after) / 1e6, 6),
            }
            if not fixed:
                fixed.extend([g.k_dur, g.k_release, g.k_transfer])  # (each step below makes a new array)
            # (an array the change left as observed folds to itself: x * 1.0 and min(x, observed) with x at
            # most the observed are x)
            if ch.dur is not g.k_dur:  # (in place: one array a kernel, not four at once)
                ratio = np.ones(g.k_dur.size)
                with np.errstate(divide="ignore", invalid="ignore"):
                    np.divide(ch.dur, g.k_dur, out=ratio, where=g.k_dur > 0)
                ratio *= fixed[0]
                fixed[0] = ratio
                del ratio
            if ch.release is not g.k_release:
                fixed[1] = np.minimum(fixed[1], ch.release)
            if ch.transfer is not g.k_transfer:
                fixed[2] = np.minimum(fixed[2], ch.transfer)
            del ch
        return entries[key]

    def stage_list(rks: Iterable[int]) -> list[int]:
        return sorted({stage_of[r] for r in rks if stage_of and stage_of.get(r) is not None})

    for f in findings:
        code, fr = f.get("code"), f.get("ranks") or []
        ent = None
        if code == "STRAGGLER" and fr:
            r = int(fr[0])
            cause = f.get("cause")
            peers = _peers(r, peers_of, ranks)
            if cause == "compute" and peers:
                ent = add(
                    ("compute", r),
                    f"rank {r}'s compute at its peers' median",
                    "compute",
                    [r],
                    stage_list([r]),
                    partial(straggler_compute, g, r, peers),
                )
            elif cause == "host" and peers:
                ent = add(
                    ("host", r),
                    f"rank {r}'s host gaps removed",
                    "host",
                    [r],
                    stage_list([r]),
                    partial(host_gaps_removed, g, r, peers),
                )
            elif cause == "communication":
                ent = add(
                    ("link", r),
                    f"transfers with rank {r} at the median bandwidth of their kind",
                    "transfer",
                    [r],
                    stage_list([r]),
                    partial(transfer_to_reference, g, [r]),
                )
        elif code in ("STAGE_IMBALANCE", "PIPELINE_BUBBLE_EXCESS") and len(stage_ranks) > 1:
            s = heavy_stage if heavy_stage is not None else (f.get("stages") or [None])[0]
            s = int(s) if s is not None else None
            others = [r for t, rs in stage_ranks.items() if t != s for r in rs]
            if (
                s is not None
                and s in stage_ranks
                and stage_excess(g, stage_ranks[s], others) >= MIN_STAGE_EXCESS
            ):
                ent = add(
                    ("stage", s),
                    f"stage {s}'s compute at the mean of the other stages",
                    "compute",
                    stage_ranks[s],
                    [s],
                    partial(stage_compute, g, stage_ranks[s], others),
                )
        elif code == "UNEQUAL_STAGE_COMPOSITION" and layer_split and suggested_split and layer_ns:
            if list(layer_split) != list(suggested_split):
                text = "balanced split " + ",".join(map(str, suggested_split))
                ent = add(
                    ("split",),
                    text,
                    "compute",
                    ranks,
                    sorted(stage_ranks),
                    lambda: split_compute(g, stage_ranks, list(layer_split), list(suggested_split), layer_ns),
                )
        elif code == "EXPOSED_COMM_HIGH":
            grp = _worst_group(cp)
            if grp:
                ent = add(
                    ("group", grp),
                    f"group {grp} at its median bandwidth",
                    "transfer",
                    _group_ranks(g, grp),
                    stage_list(_group_ranks(g, grp)),
                    partial(group_median_bandwidth, g, grp),
                )
        if ent is not None:
            f["saving_ms"] = ent["saving_ms"]
    per_object(g).pop("coll_instances", None)  # (the straggler changes' instances: not kept past here)
    out = sorted(entries.values(), key=lambda e: -e["saving_ms"])
    if fixed:
        # (durations compose as factors: a split can lengthen a stage; min() is right for cuts only)
        after = mean_step_time_ns(step_times(g, plan, fixed[0], fixed[1], fixed[2], baseline))
        out.append(
            {
                "change": "all fixed",
                "kind": "all",
                "ranks": sorted({r for e in entries.values() for r in e["ranks"]}),
                "stages": sorted({s for e in entries.values() for s in e["stages"]}),
                "step_time_ms": round(base / 1e6, 6),
                "step_time_ms_after": round(after / 1e6, 6),
                "saving_ms": round((base - after) / 1e6, 6),
            }
        )
        out.sort(key=lambda e: -e["saving_ms"])
    return out


def _worst_group(cp: CriticalPath) -> str | None:
    df = cp.segments
    t = df[df["kind"] == "transfer"]
    if t.empty:
        return None
    g = cp.graph
    ops = t.groupby("op")["dur_ns"].sum().sort_values(ascending=False)
    for op in ops.index:
        parts = str(op).split(" ", 1)
        if len(parts) == 2 and parts[1]:
            return parts[1]
    del g
    return None


def _group_ranks(g: Graph, grp: str) -> list[int]:
    out: list[int] = distinct(g.k_rank[g.k_group.mask(grp)]).tolist()
    return out
