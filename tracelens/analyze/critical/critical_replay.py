"""The replay of a dependency graph (`critical_path.Graph`), level by level in a prepared node order.

A replay computes every node's finish `max(entry + D, Q[, S])` (module docstring of `critical_path`): the
node terms D, Q (and the sync term's Qs) from the per-kernel durations, releases and transfers, then the
levels in topological order. `replay_plan` prepares what every replay of one graph shares, once:

- the plain kernels by segment and the collective kernels (for the node terms);
- the nodes in level order (`pos`: each node's place in it), within a level those with an in-edge
  first, so that a level is a slice of the level-ordered arrays and its entries one `maximum.reduceat` over
  its in-edges' sources (the edges sorted by target: no scattered `maximum.at`, no gathers of the level's
  nodes);
- the nodes by step (for the step times and the critical path walk).

A `Replay` keeps its arrays in that level order; its per-node fields (`finish`, `entry`, `D`, ...) are put
back in node order when first read (the what-if replays read only `step_time`). A replay that changes only
collective transfers (`base`: a replay of the same durations and releases) reuses its node terms and
sets the FIN nodes' D alone. Every value is the one the former node-order replay computed: the same float
operations on the same operands (a max is exact whatever the order of its operands).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from tracelens.analyze.core.dictcol import per_object
from tracelens.analyze.critical.critical_keys import code_type

try:  # the level loop compiled (_replay.c); the Python loop below where it is not built
    from tracelens.analyze.critical import _replay
except ImportError:  # pragma: no cover (depends on the install)
    _replay = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from tracelens.analyze.critical.critical_path import Graph

NEG = -1e30
#: Whether `replay` runs its level loop compiled (built, and not turned off with TRACELENS_NATIVE=0).
NATIVE = _replay is not None and os.environ.get("TRACELENS_NATIVE", "1") != "0"


def _release_terms(
    val: np.ndarray, starts: np.ndarray, seg_idx: np.ndarray, ks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per segment the max of `val` over its kernels and the first kernel attaining it (-1: none)."""
    qmax = np.maximum.reduceat(val, starts)
    hit = val == qmax[seg_idx]
    hit &= val > NEG / 2
    cand = np.arange(
        ks.size, dtype=ks.dtype
    )  # (in place, one array a kernel: this runs over every kernel per replay)
    cand[~hit] = ks.size
    del hit
    amin = np.minimum.reduceat(cand, starts)
    return qmax, np.where(amin < ks.size, ks[np.minimum(amin, ks.size - 1)], -1)


@dataclass
class ReplayPlan:
    """What every replay of one graph shares: the plain kernels (`ks`) by segment (`starts`, `seg_idx`, the
    segments' places `u_pos`), the collective kernels (`ck`), which of them launch after a sync, the nodes
    by step, and the level order (module docstring). `replay` builds one when not given one;
    `whatif.what_if` builds one for all its replays."""

    ks: np.ndarray
    starts: np.ndarray
    seg_idx: np.ndarray
    ck: np.ndarray
    sy_ks: np.ndarray | None  # per plain kernel: launched after a sync (None: no kernel is)
    sy_ck: np.ndarray | None
    by_step: np.ndarray  # node ids by step (ascending within a step)
    step_bounds: np.ndarray  # start of each step's run in `by_step`
    steps: np.ndarray  # the steps, ascending
    # level order
    pos: np.ndarray  # node id -> its place in level order
    u_pos: np.ndarray  # places of the segments' nodes
    arr_pos: np.ndarray  # places of the collective kernels' ARR nodes
    fin_pos: np.ndarray  # places of their FIN nodes
    e_src: np.ndarray  # places of the entry edges' sources, by level and target place
    levels: list[tuple[int, int, int, int, int, np.ndarray]]  # a, a + with in-edges, b, edges e0, e1, starts
    sync: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]  # per level: slots, X's place, X's end
    # the observed replay's sums of res + dur before each segment, when exact (`_tail_terms`): its durations
    # and releases (the very arrays) and the sums
    prefix: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def replay_plan(g: Graph) -> ReplayPlan:
    kx = g.n_first_k.dtype  # (kernel and node ids: the graph's id type)
    plain = ~g.k_comm | (g.k_instance < 0)
    ks = np.flatnonzero(plain).astype(kx)
    ck = np.flatnonzero(~plain).astype(kx)
    del plain
    node = g.k_node[ks]
    first = np.empty(ks.size, dtype=bool)
    if ks.size:
        first[0] = True
    np.not_equal(node[1:], node[:-1], out=first[1:])
    starts = np.flatnonzero(first).astype(kx)
    nodes_u = node[starts]
    del node
    seg_idx = np.cumsum(first, dtype=kx)
    seg_idx -= 1
    del first
    synced = g.k_sync_x >= 0 if g.k_sync_x.size == g.k_dur.size else None
    sy_ks = sy_ck = None
    if synced is not None and synced.any():
        sy_ks, sy_ck = synced[ks], synced[ck]
    # nodes by step: every node's step is a kernel's, and kernels are sorted by step (`step_origin` has them)
    steps = np.array(sorted(g.step_origin), dtype=np.int64)
    code = np.searchsorted(steps, g.n_step).astype(code_type(max(steps.size, 1)))
    by_step = np.argsort(code, kind="stable").astype(kx)
    step_bounds = np.r_[0, np.cumsum(np.bincount(code, minlength=steps.size))[:-1]]
    del code
    # level order: by level, within a level the nodes with an entry edge first
    n = g.n_nodes
    n_lv = len(g.levels)
    sizes = np.array([lv.size for lv in g.levels], dtype=np.int64)
    level = g.level_of.astype(code_type(2 * n_lv + 2))  # (small: a radix sort below)
    has_in = np.zeros(n, dtype=bool)
    has_in[g.e_dst] = True
    key = level * 2
    key += ~has_in
    perm = np.argsort(key, kind="stable").astype(kx)
    del key
    pos = np.empty(n, dtype=kx)
    pos[perm] = np.arange(n, dtype=kx)
    lb = np.r_[0, np.cumsum(sizes)]
    n_in = np.bincount(level[has_in], minlength=n_lv)
    del level, has_in
    # entry edges by target place (stable: a node's in-edges keep their order)
    dst = pos[g.e_dst]
    eo = np.argsort(dst, kind="stable")
    dst = dst[eo]
    e_src = pos[g.e_src[eo]]
    del eo
    eb = np.asarray(np.searchsorted(dst, lb))
    first_e = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]]) if dst.size else dst
    fb = np.asarray(np.searchsorted(first_e, eb))
    # each level's reduceat starts (within its edges): views of one array of the edge id type
    first_e -= np.repeat(eb[:-1], np.diff(fb))
    first_e = first_e.astype(code_type(int(e_src.size) + 1))
    del dst
    levels = []
    for i in range(n_lv):
        a, e0, e1 = int(lb[i]), int(eb[i]), int(eb[i + 1])
        levels.append((a, a + int(n_in[i]), int(lb[i + 1]), e0, e1, first_e[fb[i] : fb[i + 1]]))
    # sync terms: per level, the slots (within the level) of the nodes with one, their X's place and end
    sync: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * n_lv
    if g.n_sync_src.size == n:
        sp = np.flatnonzero(g.n_sync_src[perm] >= 0)
        lv_of = np.searchsorted(lb, sp, side="right") - 1
        xs = pos[g.n_sync_src[perm[sp]]]
        ends = g.n_sync_end[perm[sp]]
        cut = np.searchsorted(lv_of, np.arange(n_lv + 1))
        for i in np.unique(lv_of).tolist():
            c0, c1 = int(cut[i]), int(cut[i + 1])
            sync[i] = (sp[c0:c1] - lb[i], xs[c0:c1], ends[c0:c1])
    fin = g.k_node[ck]
    return ReplayPlan(
        ks,
        starts,
        seg_idx,
        ck,
        sy_ks,
        sy_ck,
        by_step,
        step_bounds,
        steps,
        pos,
        pos[nodes_u],
        pos[fin - ck.size],  # (ARR nodes precede their FIN nodes by the number of collective kernels)
        pos[fin],
        e_src,
        levels,
        sync,
    )


class Replay:
    """One replay's per-node arrays (in the plan's level order; the fields below in node order), its step
    times (step -> ns) and the per-kernel durations, releases and transfers it replayed."""

    def __init__(
        self,
        pos: np.ndarray,
        terms: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        finish: np.ndarray,
        entry: np.ndarray,
        S: np.ndarray,
        step_time: dict[int, float],
        dur: np.ndarray,
        release: np.ndarray,
        transfer: np.ndarray,
    ):
        self.pos, self.terms = (
            pos,
            terms,
        )  # the plan's `pos` (not the plan: it is not kept); (D, Q, Qs, qk, qs)
        self.level_finish, self.level_entry, self.level_S = finish, entry, S
        self.step_time = step_time
        self.dur, self.release, self.transfer = dur, release, transfer

    def _node_order(self, a: np.ndarray) -> np.ndarray:
        out: np.ndarray = a[self.pos] if a.size else a
        return out

    @cached_property
    def finish(self) -> np.ndarray:
        return self._node_order(self.level_finish)

    @cached_property
    def entry(self) -> np.ndarray:  # latest predecessor finish (NEG when none)
        return self._node_order(self.level_entry)

    @cached_property
    def D(self) -> np.ndarray:
        return self._node_order(self.terms[0])

    @cached_property
    def Q(self) -> np.ndarray:  # fixed release term
        return self._node_order(self.terms[1])

    @cached_property
    def q_kernel(self) -> np.ndarray:  # SEG: the kernel whose release gives Q
        return self._node_order(self.terms[3])

    @cached_property
    def S(self) -> np.ndarray:  # sync term: Q_sync + finish[X] - end_X (empty: no sync)
        return self._node_order(self.level_S)

    @cached_property
    def s_kernel(self) -> np.ndarray:  # its kernel
        return self._node_order(self.terms[4])


def _terms(
    g: Graph, p: ReplayPlan, dur: np.ndarray, release: np.ndarray, transfer: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The node terms D, Q, Qs and the kernels giving Q and Qs, in level order (Qs, qs empty: no sync)."""
    n = g.n_nodes
    has_sync = p.sy_ks is not None
    D = np.zeros(n)
    Q = np.full(n, NEG)
    Qs = np.full(n, NEG) if has_sync else Q[:0]
    qk = np.full(n, -1, dtype=g.n_first_k.dtype)  # kernel ids: the graph's id type
    qs = np.full(n, -1, dtype=g.n_first_k.dtype) if has_sync else qk[:0]
    # segments: c = res + dur, suffix sums within segment, Q = max(release + suffix)
    ks, starts, seg_idx, u = p.ks, p.starts, p.seg_idx, p.u_pos
    if ks.size:
        # (the per-kernel arrays are built in place and dropped early: a replay's peak is these temporaries)
        c = g.k_res[ks]
        c += dur[ks]  # c = res + dur
        tot = np.add.reduceat(c, starts)
        before = np.cumsum(c)
        before -= c  # the segment's sum before the kernel
        at_start = before[starts]
        if dur is g.k_dur and release is g.k_release and p.sy_ks is None and _whole(c, before):
            p.prefix = (dur, release, at_start)  # (exact sums: `_tail_terms` starts from them)
        del c
        t = at_start[seg_idx]
        del at_start
        np.subtract(before, t, out=t)
        del before
        suffix = tot[seg_idx]
        suffix -= t  # from the kernel to its segment's end
        del t
        rel = release[ks]
        val = np.add(rel, suffix, out=suffix)
        val[~(rel > NEG / 2)] = NEG
        del rel, suffix
        D[u] = tot
        del tot
        if p.sy_ks is None or not p.sy_ks.any():
            Q[u], qk[u] = _release_terms(val, starts, seg_idx, ks)
        else:
            Q[u], qk[u] = _release_terms(np.where(p.sy_ks, NEG, val), starts, seg_idx, ks)
            Qs[u], qs[u] = _release_terms(np.where(p.sy_ks, val, NEG), starts, seg_idx, ks)
        del val
    ck = p.ck
    if ck.size:
        arr = p.arr_pos
        D[arr] = g.k_res[ck]
        q = np.where(release[ck] > NEG / 2, release[ck] + g.k_res[ck], NEG)
        if p.sy_ck is None:
            Q[arr] = q
        else:
            Q[arr] = np.where(p.sy_ck, NEG, q)
            Qs[arr] = np.where(p.sy_ck, q, NEG)
            qs[arr] = ck
        qk[arr] = ck
        D[p.fin_pos] = transfer[ck]
        del arr, q
    return D, Q, Qs, qk, qs


def _whole(c: np.ndarray, before: np.ndarray) -> bool:
    """Every `c` a whole number >= 0 and their sum below 2**53: every running sum is exact, whatever came before."""
    if not c.size:
        return False
    if not (float(c.min()) >= 0 and float(before[-1]) + float(c[-1]) < 2**52):
        return False
    return bool(np.array_equal(np.floor(c), c))


def _tail_terms(
    g: Graph, p: ReplayPlan, dur: np.ndarray, release: np.ndarray, transfer: np.ndarray, base: Replay
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """`_terms` of a replay that changes durations or releases only from some kernel on, from the observed
    replay `base`: the segments before that kernel's keep its node terms, the others are computed as `_terms`
    computes them. None when that cannot be exact (the caller computes them all).

    The running sum `_terms` takes over every plain kernel is the only term reaching across segments; over the
    observed kernels (whole ns, below 2**53: `ReplayPlan.prefix`) it is exact, so at the first changed
    segment it is the observed sum before it, and the sums from there on are the same float operations on the
    same operands (the sum at the segment plus each kernel in turn)."""
    pre = p.prefix
    ks, starts = p.ks, p.starts
    if pre is None or pre[0] is not base.dur or pre[1] is not base.release or base.pos is not p.pos:
        return None
    if p.sy_ks is not None or not ks.size:
        return None
    changed = []
    for new, old in ((dur, base.dur), (release, base.release)):
        if new is not old:
            neq = new != old  # (NaN != NaN: a NaN counts as changed)
            first = int(neq.argmax())  # (the first True)
            if neq[first]:
                changed.append(first)
            del neq
    if not changed:
        return None
    j0 = int(np.searchsorted(ks, min(changed)))  # the first plain kernel at or after the first change
    if j0 >= ks.size:
        return None
    s0 = int(p.seg_idx[j0])
    k0 = int(starts[s0])
    B = float(pre[2][s0])
    if k0 < ks.size // 8 or not B > 0:  # (little to keep; or signed zeros: all of them)
        return None
    D0, Q0, _, qk0, _ = base.terms
    D, Q, qk = D0.copy(), Q0.copy(), qk0.copy()
    kt = ks[k0:]
    st = starts[s0:] - starts[s0]
    si = p.seg_idx[k0:] - p.seg_idx[k0]
    u = p.u_pos[s0:]
    c = g.k_res[kt]
    c += dur[kt]
    tot = np.add.reduceat(c, st)
    before = c.copy()
    before[0] += B  # (the observed running sum before the segment plus its first kernel, as `np.cumsum` adds)
    np.cumsum(before, out=before)
    before -= c
    del c
    t = before[st][si]
    np.subtract(before, t, out=t)
    del before
    suffix = tot[si]
    suffix -= t
    del t
    rel = release[kt]
    val = np.add(rel, suffix, out=suffix)
    val[~(rel > NEG / 2)] = NEG
    del rel, suffix
    D[u] = tot
    del tot
    Q[u], qk[u] = _release_terms(val, st, si, kt)
    del val
    ck = p.ck
    if ck.size and release is not base.release:  # (the arrivals' terms: the observed ones otherwise)
        arr = p.arr_pos
        D[arr] = g.k_res[ck]
        Q[arr] = np.where(release[ck] > NEG / 2, release[ck] + g.k_res[ck], NEG)
        qk[arr] = ck
    if ck.size and transfer is not base.transfer:
        D[p.fin_pos] = transfer[ck]
    return D, Q, Q[:0], qk, qk[:0]


def replay(
    g: Graph,
    dur: np.ndarray | None = None,
    release: np.ndarray | None = None,
    transfer: np.ndarray | None = None,
    plan: ReplayPlan | None = None,
    base: Replay | None = None,
    native: bool = True,
) -> Replay:
    """Replay the graph with per-kernel durations, releases and collective transfers (default: observed).

    A kernel launched after a blocking sync is released at `release + finish[X] - end_X` (X: the device work
    the sync waited for), so its launch moves with X. `plan`: `replay_plan(g)`, for several replays. `base`:
    a replay with the same plan; when `dur` and `release` are the very arrays it replayed, its node terms are
    reused and only the transfers are set (a change of transfers alone). `native`: False runs the level loop
    in Python even where it is compiled (the reference the compiled one is tested against)."""
    dur = g.k_dur if dur is None else dur
    release = g.k_release if release is None else release
    transfer = g.k_transfer if transfer is None else transfer
    p = replay_plan(g) if plan is None else plan
    if base is not None and base.pos is p.pos and base.dur is dur and base.release is release:
        D0, Q, Qs, qk, qs = base.terms
        D = D0.copy()
        if p.ck.size:
            D[p.fin_pos] = transfer[p.ck]
        terms = (D, Q, Qs, qk, qs)
    else:
        got = _tail_terms(g, p, dur, release, transfer, base) if base is not None else None
        terms = got or _terms(g, p, dur, release, transfer)
        D, Q, Qs = terms[0], terms[1], terms[2]
    n = g.n_nodes
    finish = np.full(n, NEG)
    entry = np.full(n, NEG)
    S = np.full(n, NEG) if Qs.size else finish[:0]
    if NATIVE and native:
        lv, rs, sync = flat_levels(p)
        _replay.levels(finish, entry, D, Q, p.e_src, lv, rs, (S, Qs, *sync) if sync and S.size else None)
    else:
        _levels(p, finish, entry, D, Q, S, Qs)
    # the latest finish per step (fmax: NaN is skipped, as a group-by's max skips it)
    fin_step = np.fmax.reduceat(finish[p.pos[p.by_step]], p.step_bounds) if p.steps.size else p.steps
    steps = {}
    for st, v in zip(p.steps.tolist(), fin_step):
        if st >= 0:
            steps[st] = float(v - g.step_origin.get(st, 0.0))
    return Replay(p.pos, terms, finish, entry, S, steps, dur, release, transfer)


def _levels(
    p: ReplayPlan,
    finish: np.ndarray,
    entry: np.ndarray,
    D: np.ndarray,
    Q: np.ndarray,
    S: np.ndarray,
    Qs: np.ndarray,
) -> None:
    """The level loop in Python (`_replay.levels` compiled): `finish`, `entry` and `S` filled in place."""
    e_src = p.e_src
    # (per level a few calls on a few thousand nodes: their overhead is the cost, so the reduction writes
    # into `entry` itself and the functions are looked up once)
    take, reduce_max, add, maximum = np.take, np.maximum.reduceat, np.add, np.maximum
    for (a, m, b, e0, e1, rs), sy in zip(p.levels, p.sync):
        if m > a:
            reduce_max(take(finish, e_src[e0:e1]), rs, out=entry[a:m])
        f = finish[a:b]
        add(entry[a:b], D[a:b], out=f)
        maximum(f, Q[a:b], out=f)
        if sy is not None and S.size:
            slot, x, x_end = sy
            t = Qs[a + slot] + finish[x] - x_end
            S[a + slot] = t
            f[slot] = np.maximum(f[slot], t)


def flat_levels(
    p: ReplayPlan,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None]:
    """The plan's levels as flat arrays (made once a plan, kept with it): a row (a, m, b, e0, e1, r0) a level
    in one int64 array, every level's reduceat starts one after the other (the level's at r0), and its sync
    terms (None: none) as (starts: the first entry of each level and the end, slots, X's places, X's ends)."""
    memo = per_object(p)
    got = memo.get("flat_levels")
    if got is not None:
        return got  # type: ignore[return-value]
    n_lv = len(p.levels)
    lv = np.empty((n_lv, 6), dtype=np.int64)
    if n_lv:
        lv[:, :5] = [t[:5] for t in p.levels]
        sizes = lv[:, 1] - lv[:, 0]
        lv[:, 5] = np.cumsum(sizes) - sizes
    rs = np.concatenate([t[5] for t in p.levels]) if n_lv else np.empty(0, np.int64)
    sync = None
    if any(sy is not None for sy in p.sync):
        parts = [sy if sy is not None else (np.empty(0, np.int64),) * 2 + (np.empty(0),) for sy in p.sync]
        cut = np.r_[0, np.cumsum([sy[0].size for sy in parts])].astype(np.int64)
        slot, x, x_end = (np.concatenate([sy[j] for sy in parts]) for j in range(3))
        sync = (cut, slot, x, np.ascontiguousarray(x_end, dtype=np.float64))
    flat = (lv.reshape(-1), rs, sync)
    memo["flat_levels"] = flat
    return flat


def step_times(
    g: Graph,
    plan: ReplayPlan,
    dur: np.ndarray | None = None,
    release: np.ndarray | None = None,
    transfer: np.ndarray | None = None,
    base: Replay | None = None,
) -> dict[int, float]:
    """The step times (step -> ns) of a replay (`replay`'s arguments); what a what-if reads of it."""
    return replay(g, dur, release, transfer, plan, base).step_time


def mean_step_time_ns(step_time: dict[int, float]) -> float:
    """The mean of a replay's step times (`Replay.step_time`, `step_times`); NaN without a step."""
    return float(np.mean(list(step_time.values()))) if step_time else float("nan")
