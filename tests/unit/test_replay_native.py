"""The compiled level loop of the critical path's replay (analyze/critical/_replay.c) against the Python loop it
replaces: the same finish, entry and sync terms bit for bit, on graphs of real and simulated runs (with and
without sync terms), under changed durations, releases and transfers, with NaN; and a damaged plan raises
instead of reading out of bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.critical import critical_replay as cr
from tracelens.run_analysis import Options, analyze_run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"

pytestmark = pytest.mark.skipif(
    cr._replay is None, reason="the replay extension is not built (no C compiler)"
)


def _same(a: cr.Replay, b: cr.Replay) -> None:
    for name in ("level_finish", "level_entry", "level_S"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x.view(np.int64), y.view(np.int64)), name  # (bit for bit: NaN, signed zeros)
    assert list(a.step_time) == list(b.step_time)
    assert np.array_equal(list(a.step_time.values()), list(b.step_time.values()), equal_nan=True)


@pytest.fixture(
    scope="module",
    params=[
        SAMPLES / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew",  # (~2,500 levels, no sync terms)
        SAMPLES / "h200-qwen35-block-seq4k",  # (a recorded GPU trace: kernels launched after syncs)
        SHARED / "hta" / "df_index_resolver",  # (313 levels with sync terms)
    ],
    ids=lambda p: p.name,
)
def graph(request):
    where: Path = request.param
    if not where.exists():
        pytest.skip(f"{where} is absent")
    crit = analyze_run(where, Options(no_cache=True)).critical
    assert crit is not None
    return crit.graph


def test_compiled_loop_gives_the_python_loops_values(graph):
    plan = cr.replay_plan(graph)
    _same(cr.replay(graph, plan=plan), cr.replay(graph, plan=plan, native=False))
    rng = np.random.default_rng(7)
    n_k = graph.k_dur.size
    # changed durations, releases (some dropped) and transfers, one change at a time and all together
    dur = graph.k_dur * rng.uniform(0.5, 1.5, n_k)
    rel = np.where(rng.random(n_k) < 0.2, cr.NEG, graph.k_release + rng.uniform(-5e3, 5e3, n_k))
    tr = graph.k_transfer * 3.0
    for args in ((dur, None, None), (None, rel, None), (None, None, tr), (dur, rel, tr)):
        _same(cr.replay(graph, *args, plan=plan), cr.replay(graph, *args, plan=plan, native=False))
    # NaN durations propagate as NumPy's maximum propagates them
    nan = graph.k_dur.copy()
    nan[rng.integers(0, n_k, max(1, n_k // 50))] = np.nan
    a, b = cr.replay(graph, nan, plan=plan), cr.replay(graph, nan, plan=plan, native=False)
    assert np.isnan(a.level_finish).any()
    _same(a, b)


def test_sync_terms_are_replayed_compiled(graph, request):
    plan = cr.replay_plan(graph)
    has_sync = any(s is not None for s in plan.sync)
    assert has_sync == ("straggler" not in request.node.callspec.id)  # (the recorded traces have syncs)
    r = cr.replay(graph, plan=plan)
    assert bool(r.level_S.size) == has_sync and (not has_sync or (r.level_S > cr.NEG / 2).any())
    _same(r, cr.replay(graph, plan=plan, native=False))


def test_flat_levels_cover_the_plan(graph):
    plan = cr.replay_plan(graph)
    lv, rs, sync = cr.flat_levels(plan)
    assert cr.flat_levels(plan)[0] is lv  # (made once a plan)
    rows = lv.reshape(-1, 6)
    assert len(rows) == len(plan.levels) and rs.size == sum(t[5].size for t in plan.levels)
    for (a, m, b, e0, e1, r0), t in zip(rows.tolist(), plan.levels):
        assert (a, m, b, e0, e1) == t[:5] and np.array_equal(rs[r0 : r0 + m - a], t[5])
    if sync is not None:
        cut, slot, x, x_end = sync
        for i, sy in enumerate(plan.sync):
            got = (slot[cut[i] : cut[i + 1]], x[cut[i] : cut[i + 1]], x_end[cut[i] : cut[i + 1]])
            if sy is None:
                assert all(v.size == 0 for v in got)
            else:
                assert all(np.array_equal(p, q) for p, q in zip(got, sy))


def _arrays(n: int = 4):
    finish, entry = np.full(n, cr.NEG), np.full(n, cr.NEG)
    D, Q = np.ones(n), np.zeros(n)
    return finish, entry, D, Q


@pytest.mark.parametrize(
    "lv, rs, e_src",
    [
        ([0, 1, 2, 0, 1, 0, 2, 3, 4, 1, 2, 1], [0, 0], [0, 9]),  # an edge from node 9 of 4
        ([0, 1, 2, 0, 1, 0, 2, 3, 4, 1, 2, 1], [0, 5], [0, 1]),  # a reduceat start past the level's edges
        ([0, 1, 9, 0, 1, 0], [0], [0]),  # a level past the nodes
        ([0, 1, 2, 0, 5, 0], [0], [0]),  # edges past the edge array
        ([0, 1, 2, 0, 1, 3], [0], [0]),  # reduceat starts past theirs
        ([2, 1, 2, 0, 1, 0], [0], [0]),  # a > m
    ],
)
def test_a_damaged_plan_raises_instead_of_reading_out_of_bounds(lv, rs, e_src):
    finish, entry, D, Q = _arrays()
    lv_a, rs_a, src = np.array(lv, np.int64), np.array(rs, np.int32), np.array(e_src, np.int32)
    with pytest.raises(ValueError):
        cr._replay.levels(finish, entry, D, Q, src, lv_a, rs_a, None)


def test_damaged_sync_entries_raise():
    finish, entry, D, Q = _arrays()
    lv, rs, src = np.array([0, 0, 4, 0, 0, 0], np.int64), np.empty(0, np.int32), np.empty(0, np.int32)
    S, Qs = np.full(4, cr.NEG), np.zeros(4)
    for slot, x in ((7, 0), (0, 11), (-1, 0)):
        sync = (
            S,
            Qs,
            np.array([0, 1], np.int64),
            np.array([slot], np.int64),
            np.array([x], np.int64),
            np.zeros(1),
        )
        with pytest.raises(ValueError):
            cr._replay.levels(finish, entry, D, Q, src, lv, rs, sync)
    with pytest.raises(TypeError):  # (float64 arrays only where floats belong)
        cr._replay.levels(finish.astype(np.float32), entry, D, Q, src, lv, rs, None)


def test_a_hand_built_graph_level_by_level():
    """Three levels: 0 and 1 start the graph, 2 waits for both (max), 3 waits for 2 and has a sync term on 0."""
    finish, entry, D = np.full(4, cr.NEG), np.full(4, cr.NEG), np.array([5.0, 7.0, 2.0, 1.0])
    Q = np.array([10.0, 1.0, cr.NEG, cr.NEG])
    lv = np.array([0, 0, 2, 0, 0, 0, 2, 3, 3, 0, 2, 0, 3, 4, 4, 2, 3, 1], np.int64)
    rs, e_src = np.array([0, 0], np.int8), np.array([0, 1, 2], np.int64)
    S, Qs = np.full(4, cr.NEG), np.array([0.0, 0.0, 0.0, 30.0])
    sync = (
        S,
        Qs,
        np.array([0, 0, 0, 1], np.int64),
        np.array([0], np.int64),
        np.array([0], np.int64),
        np.array([4.0]),
    )
    cr._replay.levels(finish, entry, D, Q, e_src, lv, rs, sync)
    # 0: max(NEG + 5, 10) = 10; 1: max(NEG + 7, 1) = 1; 2: max(10, 1) + 2 = 12; 3: max(12 + 1, 30 + 10 - 4)
    assert finish.tolist() == [10.0, 1.0, 12.0, 36.0] and entry[2:].tolist() == [10.0, 12.0]
    assert S[3] == 36.0
