"""The level-ordered replay (`critical_replay`) against the node-order replay it replaced (kept below as the
reference, as it was), on hand-built graphs and real traces: every per-node array and step time identical,
with observed and changed durations, releases and transfers; a change of transfers alone (the baseline's node
terms reused) as a full replay; and the what-if savings as the reference replays give them."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.critical_graphs import colls
from tracelens.analyze.core.dictcol import per_object
from tracelens.analyze.critical import critical_path as CP
from tracelens.analyze.critical import critical_replay as R
from tracelens.analyze.critical import whatif as W

REPO = Path(__file__).resolve().parents[2]
HTA = REPO.parent / "shared" / "traces" / "hta"
NEG = CP.NEG


def _reference(g, dur=None, release=None, transfer=None):
    """The former `critical_path.replay`: node terms by node id, levels by `g.levels` / `g.level_edges` with
    `maximum.at` (independent of the plan's level order)."""
    dur = g.k_dur if dur is None else dur
    release = g.k_release if release is None else release
    transfer = g.k_transfer if transfer is None else transfer
    n = g.n_nodes
    plain = ~g.k_comm | (g.k_instance < 0)
    ks, ck = np.flatnonzero(plain), np.flatnonzero(~plain)
    node = g.k_node[ks]
    first = np.r_[True, node[1:] != node[:-1]] if ks.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    nodes_u = node[starts]
    seg_idx = np.cumsum(first) - 1
    synced = g.k_sync_x >= 0 if g.k_sync_x.size == g.k_dur.size else None
    sy_ks = sy_ck = None
    if synced is not None and synced.any():
        sy_ks, sy_ck = synced[ks], synced[ck]
    has_sync = sy_ks is not None
    D, Q, Qs = np.zeros(n), np.full(n, NEG), np.full(n, NEG)
    qk, qs = np.full(n, -1), np.full(n, -1)
    if ks.size:
        c = g.k_res[ks] + dur[ks]
        tot = np.add.reduceat(c, starts)
        before = np.cumsum(c) - c
        suffix = tot[seg_idx] - (before - before[starts][seg_idx])
        rel = release[ks]
        val = rel + suffix
        val[~(rel > NEG / 2)] = NEG
        D[nodes_u] = tot
        parts = [(Q, qk, val)] if not has_sync else [(Q, qk, np.where(sy_ks, NEG, val))]
        if has_sync:
            parts.append((Qs, qs, np.where(sy_ks, val, NEG)))
        for QQ, kk, v in parts:
            qmax = np.maximum.reduceat(v, starts)
            hit = (v == qmax[seg_idx]) & (v > NEG / 2)
            cand = np.where(hit, np.arange(ks.size), ks.size)
            amin = np.minimum.reduceat(cand, starts)
            QQ[nodes_u] = qmax
            kk[nodes_u] = np.where(amin < ks.size, ks[np.minimum(amin, ks.size - 1)], -1)
    if ck.size:
        fin = g.k_node[ck]
        arr = fin - ck.size
        D[arr] = g.k_res[ck]
        q = np.where(release[ck] > NEG / 2, release[ck] + g.k_res[ck], NEG)
        if sy_ck is None:
            Q[arr] = q
        else:
            Q[arr] = np.where(sy_ck, NEG, q)
            Qs[arr] = np.where(sy_ck, q, NEG)
            qs[arr] = ck
        qk[arr] = ck
        D[fin] = transfer[ck]
    sx = g.n_sync_src
    finish, entry, S = np.full(n, NEG), np.full(n, NEG), np.full(n, NEG)
    for lv, (es, ed) in zip(g.levels, g.level_edges):
        if ed.size:
            np.maximum.at(entry, ed, finish[es])
        f = np.maximum(entry[lv] + D[lv], Q[lv])
        if has_sync:
            x = sx[lv]
            on = x >= 0
            if on.any():
                t = np.where(on, Qs[lv] + finish[np.maximum(x, 0)] - g.n_sync_end[lv], NEG)
                S[lv] = t
                f = np.maximum(f, t)
        finish[lv] = f
    steps = {}
    for st in sorted(g.step_origin):
        if st >= 0:
            steps[st] = float(np.fmax.reduce(finish[g.n_step == st]) - g.step_origin.get(st, 0.0))
    if not has_sync:
        S, Qs, qs = S[:0], Qs[:0], qs[:0]
    return {"finish": finish, "entry": entry, "D": D, "Q": Q, "q_kernel": qk, "S": S, "s_kernel": qs}, steps


def _assert_same(g, rp, dur=None, release=None, transfer=None):
    want, steps = _reference(g, dur, release, transfer)
    for name, arr in want.items():
        np.testing.assert_array_equal(getattr(rp, name), arr, err_msg=name)
    assert rp.step_time == steps


def _changes(g, seed):
    """Observed; durations scaled and releases moved at random; transfers alone scaled."""
    rng = np.random.default_rng(seed)
    dur = g.k_dur * rng.uniform(0.3, 1.2, g.k_dur.size)
    rel = np.where(g.k_release > NEG / 2, g.k_release - rng.uniform(0, 2000, g.k_dur.size), g.k_release)
    tr = g.k_transfer * rng.uniform(0.2, 1.0, g.k_transfer.size)
    return [(None, None, None), (dur, None, None), (None, rel, None), (None, None, tr), (dur, rel, tr)]


def _check_graph(g, seed=0):
    plan = R.replay_plan(g)
    base = R.replay(g, plan=plan)
    _assert_same(g, base)
    for dur, rel, tr in _changes(g, seed):
        _assert_same(g, R.replay(g, dur, rel, tr, plan), dur, rel, tr)
        _assert_same(g, R.replay(g, dur, rel, tr), dur, rel, tr)  # (a fresh plan)
        if dur is None and rel is None:  # transfers alone: the baseline's node terms reused
            rp = R.replay(g, g.k_dur, g.k_release, tr, plan, base)
            assert rp.terms[1] is base.terms[1]  # (reused, not recomputed)
            _assert_same(g, rp, None, None, tr)
            assert R.step_times(g, plan, transfer=tr, base=base) == rp.step_time
    # a base of another plan, or of other durations, is not reused
    other = R.replay(g, g.k_dur * 0.5, plan=plan)
    rp = R.replay(g, transfer=g.k_transfer * 0.5, plan=plan, base=other)
    assert rp.terms[1] is not other.terms[1]
    _assert_same(g, rp, None, None, g.k_transfer * 0.5)


def _nodes(rows):
    """rows: (rank, stream, start, end, is_comm, launch or None[, step])."""
    cols = {f.name: [] for f in CP.NODES}
    for r in rows:
        cols["rank"].append(r[0])
        cols["step"].append(r[6] if len(r) > 6 else 1)
        cols["stream"].append(r[1])
        cols["start_ns"].append(r[2])
        cols["end_ns"].append(r[3])
        cols["is_comm"].append(r[4])
        cols["launch_ns"].append(r[5])
        cols["launch_tid"].append(None if r[5] is None else 1)
        cols["label"].append(None)
    return pa.table(cols, schema=CP.NODES)


B = 10**12


def _hand_built():
    """Two ranks, two steps: compute on streams 7 and 9 (a cross-stream wait on rank 0), an all-reduce per
    step, a kernel without a launch; rank 1 launches late in step 2."""
    rows, coll = [], []
    for st, t0 in ((1, 0), (2, 10_000)):
        for r in (0, 1):
            late = 3000 if (r, st) == (1, 2) else 0
            rows += [
                (r, 7, B + t0 + 10, B + t0 + 400 + 50 * r, False, B + t0 + 5, st),
                (r, 9, B + t0 + 401 + 50 * r, B + t0 + 700, False, B + t0 + 20, st),
                (r, 7, B + t0 + 800 + late, B + t0 + 900 + late, False, B + t0 + 790 + late, st),
                (r, 20, B + t0 + 1000 + late, B + t0 + 2000 + late, True, B + t0 + 795, st),
                (r, 7, B + t0 + 2100 + late, B + t0 + 2300 + late, False, None, st),
            ]
            coll.append((r, B + t0 + 1000 + late, B + t0 + 2000 + late, st))
    return _nodes(rows), colls(coll)


def test_hand_built_graph_replays_as_the_reference():
    nodes, coll = _hand_built()
    cp = CP.analyze_critical_path(nodes, coll)
    g = cp.graph
    assert g.levels and (g.n_type == CP.FIN).sum() == 4  # two instances of two participants
    assert (g.n_type == CP.SEG).sum() > 4
    _check_graph(g)
    # a level's nodes with an in-edge come first in the plan's order; every node has one place
    plan = R.replay_plan(g)
    assert sorted(plan.pos.tolist()) == list(range(g.n_nodes))
    perm = np.empty(g.n_nodes, dtype=np.int64)
    perm[plan.pos] = np.arange(g.n_nodes)
    into = set(g.e_dst.tolist())
    for i, (a, m, b, _, _, _) in enumerate(plan.levels):
        assert sorted(perm[a:b].tolist()) == sorted(g.levels[i].tolist())
        assert all(v in into for v in perm[a:m].tolist())
        assert not any(v in into for v in perm[m:b].tolist())


def _sync_graph_inputs() -> tuple[pa.Table, pa.Table]:
    """rank 0: K1 [0, 1000]; a synchronize [10, 1005] waits for it; K2 launched at 1100, K3 on stream 9 after."""
    nodes = _nodes(
        [
            (0, 7, B, B + 1000, False, B - 4),
            (0, 7, B + 1104, B + 1204, False, B + 1100),
            (0, 9, B + 1110, B + 1300, False, B + 1101),
        ]
    )
    sy = pa.table(
        {
            "rank": pa.array([0], pa.int32()),
            "tid": pa.array([1], pa.int64()),
            "start_ns": pa.array([B + 10], pa.int64()),
            "end_ns": pa.array([B + 1005], pa.int64()),
            "name": pa.array(["cudaStreamSynchronize"]),
        },
        schema=CP.SYNCS,
    )
    return nodes, sy


def test_hand_built_sync_graph_replays_as_the_reference():
    nodes, sy = _sync_graph_inputs()
    cp = CP.analyze_critical_path(nodes, None, syncs=sy)
    g = cp.graph
    assert g.n_sync_src.size == g.n_nodes and (g.n_sync_src >= 0).any()
    assert any(s is not None for s in R.replay_plan(g).sync)
    _check_graph(g, 1)


def test_sample_run_replays_as_the_reference(sample_cp):
    g = sample_cp.graph
    assert (g.n_type == CP.FIN).sum() > 100
    _check_graph(g, 2)


@pytest.mark.parametrize(
    "trace",
    [
        "critical_path/alexnet",
        "critical_path/simple_add",
        "critical_path/cuda_event_sync",
        "critical_path/cuda_event_sync_multi_stream",
        "trace_filter",
    ],
)
def test_real_traces_replay_as_the_reference(trace):
    path = HTA / trace
    if not path.exists():
        pytest.skip(f"{path} is absent")
    from tracelens.run_analysis import Options, analyze_run

    cp = analyze_run(path, Options(no_cache=True)).critical
    assert cp is not None
    _check_graph(cp.graph, 3)
    _check_tail(cp.graph, 3, taken=False)


def _reference_what_if(cp, findings, **kw):
    """`what_if` with every replay (baseline included) by the reference replay."""

    class _Ref:
        def __init__(self, g, dur, rel, tr):
            self.step_time = _reference(g, dur, rel, tr)[1]

    orig = W.step_times
    W.step_times = lambda g, plan, dur=None, rel=None, tr=None, base=None: _Ref(g, dur, rel, tr).step_time
    try:
        return W.what_if(cp, findings, **kw)
    finally:
        W.step_times = orig


def test_what_if_savings_as_the_reference_replays_give_them(sample_cp):
    g = sample_cp.graph
    ranks = sorted({int(r) for r in np.unique(g.k_rank)})
    grp = str(g.k_group[int(np.flatnonzero(g.k_instance >= 0)[0])])
    findings = [
        {"code": "STRAGGLER", "ranks": [ranks[0]], "cause": "compute"},
        {"code": "STRAGGLER", "ranks": [ranks[1]], "cause": "host"},
        {"code": "STRAGGLER", "ranks": [ranks[2]], "cause": "communication"},
        {"code": "EXPOSED_COMM_HIGH"},
    ]
    memo = per_object(g)
    assert isinstance(memo.get("replay_plan"), R.ReplayPlan)  # (the baseline's, kept for what_if)
    got = W.what_if(sample_cp, copy.deepcopy(findings))
    assert "replay_plan" not in memo  # (taken and dropped)
    want = _reference_what_if(sample_cp, copy.deepcopy(findings))
    assert got == want
    assert W.what_if(sample_cp, copy.deepcopy(findings)) == want  # (again, with a plan of its own)
    assert {e["kind"] for e in got} >= {"transfer", "all"}
    assert grp  # (a collective group: the EXPOSED_COMM_HIGH change has one to set)


def test_graph_level_of_is_each_nodes_level():
    nodes, coll = _hand_built()
    g = CP.analyze_critical_path(nodes, coll).graph
    want = np.full(g.n_nodes, -1)
    for i, lv in enumerate(g.levels):
        want[lv] = i
    assert (want >= 0).all()
    assert g.level_of.tolist() == want.tolist()


@pytest.mark.parametrize("kind", ["dense", "sparse", "unsigned", "wide"])
def test_per_rank_is_a_lookup_per_row(kind):
    from tracelens.analyze.critical.critical_keys import per_rank

    rng = np.random.default_rng(4)
    ranks = {
        "dense": rng.integers(0, 64, 5000).astype(np.int32),
        "sparse": rng.choice(np.array([3, 900, 4000], np.int64), 5000),
        "unsigned": rng.integers(5, 20, 300).astype(np.uint16),
        "wide": rng.choice(np.array([-7, 0, 10**9], np.int64), 2000),  # (a span too wide for a table)
    }[kind]
    table = {int(r): int(r) * 1000 + 7 for r in np.unique(ranks)[::2]}  # every other rank has an offset
    got = per_rank(ranks, table)
    assert got.dtype == np.int64
    assert got.tolist() == [table.get(int(r), 0) for r in ranks]
    assert per_rank(ranks[:0], table).size == 0


def _check_tail(g, seed, taken=True):
    """Changes from a kernel on (durations, releases, both), replayed from the observed replay: node terms
    bit-identical to computing them all (`_tail_terms` keeps the observed ones before the change), and the
    replay the reference's."""
    plan = R.replay_plan(g)
    base = R.replay(g, plan=plan)
    rng = np.random.default_rng(seed)
    n = g.k_dur.size
    for i, frac in enumerate((0.3, 0.6, 0.9, 0.99)):
        k0 = int(n * frac)
        later = np.arange(n) >= k0
        dur = np.where(later, g.k_dur * rng.uniform(0.3, 1.2, n), g.k_dur)
        moved = later & (g.k_release > NEG / 2)
        rel = np.where(moved, g.k_release - rng.uniform(0, 2000, n), g.k_release)
        tr = g.k_transfer * rng.uniform(0.2, 1.0, n)
        for d, r, x in ((dur, g.k_release, g.k_transfer), (g.k_dur, rel, g.k_transfer), (dur, rel, tr)):
            got = R._tail_terms(g, plan, d, r, x, base)
            if taken and i < 3:
                assert got is not None
            if got is not None:
                full = R._terms(g, plan, d, r, x)
                for a, b in zip(got, full):
                    assert a.dtype == b.dtype
                    np.testing.assert_array_equal(a, b)
            _assert_same(g, R.replay(g, d, r, x, plan, base), d, r, x)
    # nothing changed, or a base that is not the observed replay: all terms computed
    assert R._tail_terms(g, plan, g.k_dur, g.k_release, g.k_transfer, base) is None
    other = R.replay(g, g.k_dur * 0.5, plan=plan)
    assert R._tail_terms(g, plan, g.k_dur * 0.25, g.k_release, g.k_transfer, other) is None


def test_tail_terms_are_the_terms_on_the_sample_run(sample_cp):
    _check_tail(sample_cp.graph, 4)


def test_tail_terms_are_the_terms_on_a_hand_built_graph():
    nodes, coll = _hand_built()
    _check_tail(CP.analyze_critical_path(nodes, coll).graph, 5, taken=False)


def test_tail_terms_are_not_taken_with_sync_terms():
    nodes, sy = _sync_graph_inputs()
    g = CP.analyze_critical_path(nodes, None, syncs=sy).graph
    plan = R.replay_plan(g)
    base = R.replay(g, plan=plan)
    assert plan.prefix is None
    dur = g.k_dur.copy()
    dur[-1] *= 0.5
    assert R._tail_terms(g, plan, dur, g.k_release, g.k_transfer, base) is None
    _assert_same(g, R.replay(g, dur, None, None, plan, base), dur, None, None)
