"""Interval algebra checked against a brute-force per-nanosecond model on small random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens.analyze.core import intervals as iv

ivs = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=12).map(
    lambda xs: (np.array([a for a, _ in xs], np.int64), np.array([a + d for a, d in xs], np.int64))
)


def mask(s, e, n=100):
    m = np.zeros(n, bool)
    for a, b in zip(s, e):
        m[a:b] = True
    return m


def canonical(a):
    s, e = a
    assert np.all(e > s)
    assert np.all(s[1:] > e[:-1])


@given(ivs)
def test_union_matches_bruteforce(a):
    u = iv.union(*a)
    canonical(u)
    assert np.array_equal(mask(*u), mask(*a))


@given(ivs, ivs)
def test_set_ops(a, b):
    ua, ub = iv.union(*a), iv.union(*b)
    ma, mb = mask(*a), mask(*b)
    for got, want in (
        (iv.intersect(ua, ub), ma & mb),
        (iv.subtract(ua, ub), ma & ~mb),
        (iv.union2(ua, ub), ma | mb),
    ):
        canonical(got)
        assert np.array_equal(mask(*got), want)
    assert iv.total(ua) == ma.sum()


@given(ivs, st.lists(st.tuples(st.integers(0, 90), st.integers(0, 40)), min_size=1, max_size=6))
def test_measure_in_windows(a, wins):
    u = iv.union(*a)
    lo = np.array([w[0] for w in wins])
    hi = lo + np.array([w[1] for w in wins])
    got = iv.measure_in_windows(u, lo, hi)
    m = mask(*u)
    want = [m[x:y].sum() for x, y in zip(lo, hi)]
    assert got.tolist() == want


@settings(max_examples=200)
@given(ivs, ivs, ivs, st.integers(0, 40), st.integers(1, 60))
def test_breakdown_parts_add_up(comp, comm, mem, lo, width):
    """compute + exposed comm + memcpy + idle == window length, exactly, for any inputs."""
    hi = lo + width
    c = iv.clip(iv.union(*comp), lo, hi)
    k = iv.clip(iv.union(*comm), lo, hi)
    m = iv.clip(iv.union(*mem), lo, hi)
    exposed = iv.subtract(k, c)
    overlapped = iv.intersect(k, c)
    memonly = iv.subtract(m, iv.union2(c, k))
    busy = iv.union2(iv.union2(c, k), m)
    idle = width - iv.total(busy)
    assert iv.total(c) + iv.total(exposed) + iv.total(memonly) + idle == width
    assert iv.total(overlapped) + iv.total(exposed) == iv.total(k)


def test_assign_windows():
    lo = np.array([0, 10, 30])
    hi = np.array([10, 20, 40])
    got = iv.assign_windows(np.array([-1, 0, 9, 10, 25, 39, 40]), lo, hi)
    assert got.tolist() == [-1, 0, 0, 1, -1, 2, -1]


def _sweep_intersect(a, b):
    """The previous `intersect` (a sweep over all boundaries, then `union`): the reference."""
    if a[0].size == 0 or b[0].size == 0:
        return iv.empty()
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate(
        [np.ones(a[0].size, np.int64), -np.ones(a[1].size, np.int64)]
        + [np.ones(b[0].size, np.int64), -np.ones(b[1].size, np.int64)]
    )
    order = np.lexsort((delta, pts))
    pts, level = pts[order], np.cumsum(delta[order])
    inside = level >= 2
    was = np.concatenate([[False], inside[:-1]])
    return iv.union(pts[inside & ~was], pts[~inside & was])


def _same(got, want):
    assert got[0].dtype == want[0].dtype == np.int64 and got[1].dtype == want[1].dtype == np.int64
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


big = st.lists(st.tuples(st.integers(-(1 << 61), 1 << 61), st.integers(0, 1 << 40)), max_size=30).map(
    lambda xs: iv.union(np.array([a for a, _ in xs], np.int64), np.array([a + d for a, d in xs], np.int64))
)


@settings(max_examples=300)
@given(st.one_of(ivs.map(lambda a: iv.union(*a)), big), st.one_of(ivs.map(lambda a: iv.union(*a)), big))
def test_intersect_equals_sweep(a, b):
    """The pairwise intersect gives exactly the sweep's arrays (touching, nested, equal and far intervals)."""
    _same(iv.intersect(a, b), _sweep_intersect(a, b))
    _same(iv.intersect(b, a), _sweep_intersect(b, a))
    c = iv.complement(b, -(1 << 62), 1 << 62)
    _same(iv.intersect(a, c), _sweep_intersect(a, c))


def test_intersect_equals_sweep_on_real_ranks():
    """Exposed / overlapped communication sets of real traces: the same arrays as the sweep."""
    from pathlib import Path

    from tracelens.analyze.rank.breakdown import class_sets
    from tracelens.ingest.kineto import read

    run = Path(__file__).parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"
    traces = sorted(run.glob("*.pt.trace.json*"))[:3]
    assert traces
    seen = 0
    for p in traces:
        for rs in class_sets(read(p).events).values():
            for x, y in ((rs.comm, rs.compute), (rs.compute, rs.memory), (rs.comm, rs.memory)):
                _same(iv.intersect(x, y), _sweep_intersect(x, y))
                seen += int(x[0].size > 0 and y[0].size > 0)
    assert seen
