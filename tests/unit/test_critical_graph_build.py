"""The critical path's graph build against its previous implementation (kept here as the reference): the
cross-stream predecessor search (`cross_candidates`, once a loop inside `_build_graph`) and the topological
levels (`_levels`); every array of the Graph built from real traces is the same with either."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.core.frame_cells import unique_inverse
from tracelens.analyze.critical import critical_path as CP
from tracelens.analyze.critical.critical_replay import NEG

REPO = Path(__file__).resolve().parents[2]
TRACES = [
    *sorted((REPO.parent / "shared" / "traces" / "hta" / "critical_path").glob("*")),
    REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew",
    REPO / "sample_traces" / "qwen35-27b-seq4k-tp2pp3-split22-21-21",
    REPO / "sample_traces" / "qwen35-27b-seq4k-tp4pp4",
]
TRACES = [p for p in TRACES if p.is_dir()]


def cross_candidates_old(stream, grp_rs, s, e, need, score, ix):
    """The previous loop of `_build_graph` (one sorted search per stream, keys built per stream)."""
    n = s.size
    SH = float(2**40)
    best_end = np.full(n, NEG)
    best_score = np.full(n, NEG)
    best_idx = np.full(n, -1, dtype=ix)
    for st in unique_inverse(stream)[0]:
        is_st = stream == st
        mine = np.flatnonzero(is_st)
        keys = grp_rs[mine].astype(float) * SH + e[mine]
        if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):
            order = np.argsort(keys, kind="stable")
            keys, mine = keys[order], mine[order]
        other = np.flatnonzero(~is_st & need)
        if other.size == 0 or mine.size == 0:
            continue
        j = np.searchsorted(keys, grp_rs[other].astype(float) * SH + s[other], side="right") - 1
        cand = mine[np.maximum(j, 0)]
        ok = (j >= 0) & (grp_rs[cand] == grp_rs[other])
        sc = score[cand]
        better = ok & (sc > best_score[other])
        o, c = other[better], cand[better]
        best_score[o] = sc[better]
        best_end[o] = e[c]
        best_idx[o] = c
    return best_end, best_idx


def levels_old(g) -> None:
    """The previous `_levels`' Kahn rounds (frontier offsets by `np.r_`, a sum and the levels set per level)."""
    n = g.n_nodes
    all_src, all_dst = np.r_[g.e_src, g.s_src], np.r_[g.e_dst, g.s_dst]
    indeg = np.bincount(all_dst, minlength=n)
    order = np.argsort(all_src, kind="stable")
    dst_by_src = all_dst[order]
    starts = np.r_[0, np.cumsum(np.bincount(all_src, minlength=n))]
    level = np.full(n, -1, dtype=np.int64)
    slot = np.zeros(n, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        lo = starts[frontier]
        cnt = starts[frontier + 1] - lo
        tot = int(cnt.sum())
        if tot == 0:
            break
        idx = np.repeat(lo - np.cumsum(np.r_[0, cnt[:-1]]), cnt) + np.arange(tot)
        d = dst_by_src[idx]
        np.subtract.at(indeg, d, 1)
        z = d[indeg[d] == 0]
        slot[z] = np.arange(z.size)
        frontier = z[slot[z] == np.arange(z.size)]
        lv += 1
    if (level < 0).any():
        raise CP.GraphCycleError("cycle")
    CP._by_level(g, level)  # (the layout by level is not what changed: the same code)


def _same(a, b, name):
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), name
        for i, (u, v) in enumerate(zip(a, b)):
            _same(u, v, f"{name}[{i}]")
    elif isinstance(a, CP.Cells):
        _same(a.codes, b.codes, name + ".codes")
        _same(a.values, b.values, name + ".values")
    else:
        assert a == b, name


def _inputs(trace: Path, tmp: Path):
    """The arguments the analysis passes to `build_graph` for `trace` (a cache of its own: no kept graph)."""
    from tracelens.run_analysis import Options, analyze_run

    got = {}

    def grab(*args, **kw):
        got["args"] = args
        return None

    mp = pytest.MonkeyPatch()
    mp.setattr(CP, "build_graph", grab)
    try:
        _ = analyze_run(trace, Options(cache_dir=str(tmp))).critical
    finally:
        mp.undo()
    return got.get("args")


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_graph_is_the_previous_builds_on_real_traces(trace, tmp_path, monkeypatch):
    args = _inputs(trace, tmp_path)
    if args is None:
        pytest.skip("no device work")
    new = CP.build_graph(*args)
    monkeypatch.setattr(CP, "cross_candidates", cross_candidates_old)
    monkeypatch.setattr(CP, "cross_candidates_exact", lambda *a: None)
    monkeypatch.setattr(CP, "_levels", levels_old)
    old = CP.build_graph(*args)
    assert (new is None) == (old is None)
    if new is None:
        return
    assert new.n_nodes > 0
    for f in dataclasses.fields(new):
        _same(getattr(new, f.name), getattr(old, f.name), f.name)


def _brute(stream, grp, s, e, need, score):
    """Per needing kernel: over the other streams in ascending order, the last (by end, stably) kernel of the
    same group ending at or before the start; the first of highest score among them."""
    n = s.size
    best_end, best_idx = np.full(n, NEG), np.full(n, -1)
    for k in np.flatnonzero(need):
        best = NEG
        for st in sorted(set(stream.tolist()) - {int(stream[k])}):
            rows = [i for i in range(n) if stream[i] == st and grp[i] == grp[k] and e[i] <= s[k]]
            if not rows:
                continue
            c = sorted(rows, key=lambda i: e[i])[-1]  # (stable: the last of equal ends)
            if score[c] > best:
                best, best_end[k], best_idx[k] = score[c], e[c], c
    return best_end, best_idx


@pytest.mark.parametrize("seed", range(6))
def test_cross_candidates_against_brute_force_and_previous(seed):
    rng = np.random.default_rng(seed)
    n = 300
    grp = np.sort(rng.integers(0, 4, n)).astype(np.int32)
    stream = rng.choice(np.array([7, 20, 24, 31], dtype=np.int32), n)
    s = rng.integers(0, 50, n).astype(float) * 10
    e = s + rng.integers(0, 6, n) * 10
    order = np.lexsort((s, stream, grp))  # (the graph's kernel order)
    grp, stream, s, e = grp[order], stream[order], s[order], e[order]
    need = rng.random(n) < 0.7
    score = e - 0.5 * (rng.random(n) < 0.3)
    got = CP.cross_candidates(stream, grp, s, e, need, score, np.int32)
    old = cross_candidates_old(stream, grp, s, e, need, score, np.int32)
    want = _brute(stream, grp, s, e, need, score)
    _all_equal(got, old, want)
    assert got[1].dtype == np.int32 and (got[1] >= 0).sum() > 50


def _all_equal(got, old, want):
    """Each array of `got` equals the previous implementation's (`old`) and the brute force's (`want`)."""
    for g_, o_, w_ in zip(got, old, want):
        assert np.array_equal(g_, o_)
        assert np.array_equal(g_, w_)


def _kernels(rng, n, streams, overlap):
    """Random kernels in the graph's order (step-rank group, stream, start), whole ns; `overlap`: kernels of one
    stream may overlap (ends out of order), else each starts at or after the previous end of its stream."""
    grp = np.sort(rng.integers(0, 4, n)).astype(np.int32)
    stream = rng.choice(np.array(streams, dtype=np.int32), n)
    s = rng.integers(0, 40, n).astype(float) * 10
    o = np.lexsort((s, stream, grp))
    grp, stream, s = grp[o], stream[o], s[o]
    dur = rng.integers(0, 4, n) * 10.0
    if overlap:
        return grp, stream, s, s + dur
    # back to back (with gaps) per stream: starts are the running sum of the durations and gaps
    run = np.r_[True, (grp[1:] != grp[:-1]) | (stream[1:] != stream[:-1])]
    step = dur + rng.integers(0, 3, n) * 10.0
    cum = np.cumsum(step)
    first = np.flatnonzero(run)
    base = np.repeat(cum[first] - step[first], np.diff(np.r_[first, n]))
    s = cum - step - base
    return grp, stream, s, s + dur


@pytest.mark.parametrize("seed", range(12))
def test_cross_candidates_exact_is_cross_candidates(seed):
    # one sort of all kernels by (group, end, not a send, stream) gives each kernel's candidate of the search per
    # stream, with the send/recv tie rule, ties of ends on one stream and overlapping kernels alike
    rng = np.random.default_rng(seed)
    n = 300
    streams = [7, 20, 24, 31] if seed % 3 else [3, 9]
    grp, stream, s, e = _kernels(rng, n, streams, overlap=seed % 2 == 0)
    need = rng.random(n) < 0.7
    send = rng.random(n) < 0.3
    got = CP.cross_candidates_exact(stream, grp, s, e, need, send, np.int32)
    assert got is not None
    score = e - 0.5 * send
    old = cross_candidates_old(stream, grp, s, e, need, score, np.int32)
    want = _brute(stream, grp, s, e, need, score)
    _all_equal(got, old, want)
    assert got[1].dtype == np.int32 and (got[1] >= 0).sum() > 30


def test_cross_candidates_exact_declines_keys_that_do_not_fit():
    s = np.array([0.0, 10.0, 20.0])
    e = s + 5
    stream = np.array([1, 2, 1], dtype=np.int32)
    grp = np.zeros(3, dtype=np.int32)
    need = np.ones(3, dtype=bool)
    send = np.zeros(3, dtype=bool)
    assert CP.cross_candidates_exact(stream, grp, s, e, need, send, np.int32) is not None
    assert CP.cross_candidates_exact(stream, grp + 2**13, s, e, need, send, np.int32) is None
    assert CP.cross_candidates_exact(stream, grp, s, e + 2.0**40, need, send, np.int32) is None
    assert CP.cross_candidates_exact(stream, grp, s, e, ~need, send, np.int32) is None


def _pair_lookup_old(ka, kb, qa, qb):
    """The previous `critical_keys.pair_lookup` (rows in `np.lexsort((kb, ka))` order)."""
    o = np.lexsort((kb, ka))
    sa, sb = ka[o], kb[o]
    starts = np.flatnonzero(np.r_[True, sa[1:] != sa[:-1]])
    run = int(np.diff(np.r_[starts, sa.size]).max()) if sa.size else 0
    if run > 8:
        return None
    lo = np.searchsorted(sa, qa, side="left")
    out = np.full(qa.size, -1, dtype=np.int64)
    for d in range(run):
        i = np.minimum(lo + d, sa.size - 1)
        hit = (out < 0) & (lo + d < sa.size) & (sa[i] == qa) & (sb[i] == qb)
        out[hit] = o[i[hit]]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_pair_lookup_is_the_previous_and_finds_the_first_row(seed):
    from tracelens.analyze.critical.critical_keys import pair_lookup

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    ka, kb = rng.integers(0, 20, n), rng.integers(0, 4, n)
    m = int(rng.integers(0, 40))
    qa, qb = rng.integers(0, 22, m), rng.integers(0, 5, m)
    got = pair_lookup(ka, kb, qa, qb)
    old = _pair_lookup_old(ka, kb, qa, qb)
    assert (got is None) == (old is None)
    if got is None:
        return
    assert np.array_equal(got, old)
    for j in range(m):  # the first row (in row order) equal in both keys, else -1
        rows = [i for i in range(n) if ka[i] == qa[j] and kb[i] == qb[j]]
        assert got[j] == (rows[0] if rows else -1)


def _launch_latency_old(rank, s, L):
    """The previous per-rank latency of `_build_graph` (np.minimum.at over the kernels with a launch)."""
    u_rank, r_inv = unique_inverse(rank)
    lat_r = np.full(u_rank.size, np.inf)
    has_l = ~np.isnan(L)
    np.minimum.at(lat_r, r_inv[has_l], (s - L)[has_l])
    lat_r = np.where(np.isinf(lat_r), 0.0, np.maximum(lat_r, 0.0))
    return lat_r[r_inv]


@pytest.mark.parametrize("seed", range(20))
def test_launch_latency_is_the_previous(seed):
    from tracelens.analyze.critical.critical_keys import launch_latency

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    rank = rng.integers(0, 6, n).astype(np.int32)
    step = rng.integers(0, 3, n).astype(np.int32)
    if seed % 2:  # (the graph's order: by step and rank)
        o = np.lexsort((rank, step))
        rank, step = rank[o], step[o]
    s = rng.integers(0, 10_000, n).astype(float)
    L = s - rng.integers(-50, 500, n)  # (a launch after the start too: a latency of 0)
    L[rng.random(n) < 0.3] = np.nan
    L[rank == 5] = np.nan  # a rank without any launch
    got = launch_latency(rank, step, s, L)
    want = _launch_latency_old(rank, s, L)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert launch_latency(rank[:0], step[:0], s[:0], L[:0]).size == 0
