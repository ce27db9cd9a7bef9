"""The critical path's compact representation (issue 15, scale): string codes, levels, the shared replay plan,
the path walk's predecessor lookup; each against an independent construction or hand-worked answers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelens.analyze.core.frame_cells import str_objects
from tracelens.analyze.critical import critical_keys as K
from tracelens.analyze.critical import critical_path as CP


@pytest.mark.parametrize("dictionary", [False, True])
def test_cells_are_the_object_cells(dictionary):
    rng = np.random.default_rng(3)
    vals = rng.choice(np.array(["mlp", "attention", "", "norm"], dtype=object), 500).tolist()
    vals = [None if i % 7 == 0 else v for i, v in enumerate(vals)]
    arr = pa.array(vals, pa.string())
    col = pa.chunked_array([arr[:200], arr[200:]])
    if dictionary:
        col = pa.chunked_array([c.dictionary_encode() for c in col.chunks])
    rows = rng.permutation(500)[:300]
    for r in (None, rows):
        c = K.cells(col, r)
        want = np.asarray(vals, dtype=object) if r is None else np.asarray(vals, dtype=object)[r]
        assert c.codes.dtype == np.int8  # five distinct cells (four strings and the null)
        assert c[np.arange(c.size)].tolist() == want.tolist() == str_objects(col, r).tolist()
        assert c[5] == want[5]
        assert c.mask("mlp").tolist() == [v == "mlp" for v in want]
        assert not c.mask("absent").any()


def test_coll_cells_defaults():
    coll = pa.table({"op": pa.array(["send", None, "allreduce"])})
    hit, src = np.array([1, 4]), np.array([2, 0])
    c = K.coll_cells(coll, "op", hit, src, 6)
    assert c[np.arange(6)].tolist() == ["", "allreduce", "", "", "send", ""]
    nogroup = K.coll_cells(coll, "group_key", hit, src, 6)  # no such column: "nan" for the matched kernels
    assert nogroup[np.arange(6)].tolist() == ["", "nan", "", "", "nan", ""]
    assert K.coll_cells(None, "op", hit[:0], src[:0], 3)[np.arange(3)].tolist() == ["", "", ""]


def test_code_type():
    assert [K.code_type(n) for n in (1, 128, 129, 2**15, 2**15 + 1, 2**31 + 1)] == [
        np.int8,
        np.int8,
        np.int16,
        np.int16,
        np.int32,
        np.int64,
    ]


class _Edges:
    """The arrays `_levels` reads and writes (a Graph's edges, node count and id type)."""

    def __init__(self, n, src, dst, s_src=(), s_dst=()):
        self.n_type = np.zeros(n, dtype=np.int8)
        self.n_first_k = np.zeros(n, dtype=np.int32)
        self.e_src, self.e_dst = np.asarray(src, np.int32), np.asarray(dst, np.int32)
        self.s_src, self.s_dst = np.asarray(s_src, np.int32), np.asarray(s_dst, np.int32)
        self.levels, self.level_edges = [], []

    @property
    def n_nodes(self):
        return int(self.n_type.size)


def _reference_levels(n, edges):
    """Longest path (in edges) from a source to each node, by a plain topological walk."""
    preds = {v: [] for v in range(n)}
    for u, v in edges:
        preds[v].append(u)
    level = {}

    def lv(v):
        if v not in level:
            level[v] = 1 + max((lv(u) for u in preds[v]), default=-1)
        return level[v]

    return [lv(v) for v in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_levels_are_longest_paths_and_level_edges_keep_edge_order(seed):
    rng = np.random.default_rng(seed)
    n = 300
    perm = rng.permutation(n)  # a DAG: edges go forward in a random order of the nodes
    a, b = rng.integers(0, n, 900), rng.integers(0, n, 900)
    keep = a != b
    lo, hi = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    src, dst = perm[lo], perm[hi]
    src, dst = np.r_[src, src[:50]], np.r_[dst, dst[:50]]  # repeated edges too
    sync = rng.choice(src.size, 20, replace=False)  # some edges only order (sync edges)
    main = np.setdiff1d(np.arange(src.size), sync)
    g = _Edges(n, src[main], dst[main], src[sync], dst[sync])
    CP._levels(g)
    want = _reference_levels(n, list(zip(src.tolist(), dst.tolist())))
    got = np.full(n, -1)
    for i, lv in enumerate(g.levels):
        assert lv.tolist() == sorted(lv.tolist())  # ascending node ids within a level
        got[lv] = i
    assert got.tolist() == want
    # each level's in-edges: the (non-sync) edges into its nodes, in their original order
    pairs = list(zip(src[main].tolist(), dst[main].tolist()))
    for i, (es, ed) in enumerate(g.level_edges):
        assert list(zip(es.tolist(), ed.tolist())) == [(u, v) for u, v in pairs if want[v] == i]


def test_levels_cycle():
    g = _Edges(3, [0, 1, 2], [1, 2, 1])
    with pytest.raises(CP.GraphCycleError, match="2 nodes unreached"):
        CP._levels(g)


def _two_rank_nodes():
    """Rank 0: compute [0,100], all-reduce [100,250], compute [250,300]; rank 1: compute [0,150], all-reduce
    [150,250], compute [250,290] (as in test_critical_path.two_rank_run)."""
    base = 10**15
    rows = [(0, 7, 0, 100, False), (0, 20, 100, 250, True), (0, 7, 250, 300, False),
            (1, 7, 0, 150, False), (1, 20, 150, 250, True), (1, 7, 250, 290, False)]  # fmt: skip
    nodes = pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "step": pa.array([1] * 6, pa.int32()),
            "stream": pa.array([r[1] for r in rows], pa.int32()),
            "start_ns": pa.array([base + r[2] for r in rows], pa.int64()),
            "end_ns": pa.array([base + r[3] for r in rows], pa.int64()),
            "launch_ns": pa.array([None] * 6, pa.int64()),
            "launch_tid": pa.array([None] * 6, pa.int64()),
            "is_comm": pa.array([r[4] for r in rows]),
            "label": pa.array(["mlp", None, "attention", "mlp", None, "mlp"], pa.string()),
        },
        schema=CP.NODES,
    )
    coll = pa.table(
        {
            "rank": pa.array([0, 1], pa.int32()),
            "start_ns": pa.array([base + 100, base + 150], pa.int64()),
            "end_ns": pa.array([base + 250, base + 250], pa.int64()),
            "instance": pa.array([0, 0], pa.int64()),
            "op": pa.array(["allreduce"] * 2),
            "group_key": pa.array(["pg:0"] * 2),
            "bytes": pa.array([4096, 4096], pa.int64()),
            "n_participants": pa.array([2, 2], pa.int32()),
            "latest_start_ns": pa.array([base + 150] * 2, pa.int64()),
            "end_aligned_ns": pa.array([base + 250] * 2, pa.int64()),
        }
    )
    return nodes, coll


def test_graph_compact_arrays_and_shared_plan():
    nodes, coll = _two_rank_nodes()
    cp = CP.analyze_critical_path(nodes, coll)
    g = cp.graph
    # no launch follows a sync: the sync arrays are empty, the replay has no sync term
    assert g.k_sync_x.size == g.k_sync_ret.size == g.n_sync_src.size == g.n_sync_end.size == 0
    assert cp.baseline.S.size == cp.baseline.s_kernel.size == 0
    # kernels by (step, rank, stream, start): each rank's two computes (stream 7), then its all-reduce
    assert g.k_op[np.arange(6)].tolist() == ["", "", "allreduce", "", "", "allreduce"]
    assert g.k_group.mask("pg:0").tolist() == [False, False, True, False, False, True]
    assert [g.k_label[k] for k in range(6)] == ["mlp", "attention", None, "mlp", "mlp", None]
    assert g.ck_bytes.tolist() == [4096.0, 4096.0]  # the two collective kernels
    assert cp.baseline.step_time == {1: 300.0}
    plan = CP.replay_plan(g)
    # rank 1's first compute halved (75): the all-reduce starts when rank 0 arrives (100), ends at 200, rank 0's
    # last compute ends at 250; the same with the plan shared as with a fresh one
    dur = g.k_dur.copy()
    dur[3] = 75.0
    for p in (plan, None, plan):
        assert CP.replay(g, dur, plan=p).step_time == {1: 250.0}
    # transfer halved (50): ends at 200, step 250; rank 1's first compute released late (at 200): it arrives at
    # 350, the all-reduce ends at 450, rank 0's last compute at 500
    tr = g.k_transfer * 0.5
    assert CP.replay(g, transfer=tr, plan=plan).step_time == {1: 250.0}
    rel = g.k_release.copy()
    rel[3] = 200.0
    assert CP.replay(g, release=rel, plan=plan).step_time == {1: 500.0}
    assert CP.replay(g, plan=plan).step_time == {1: 300.0}


def test_label_most_frequent_smallest_on_tie():
    g = type("G", (), {})()
    vals = ["mlp", "attention", None, "norm"]
    g.k_label = K.cells(pa.array(vals + ["mlp", "attention", None, None, None], pa.string()))
    assert CP._label(g, 0, 0) == "mlp"
    assert CP._label(g, 2, 2) == "compute"  # no label
    assert CP._label(g, 6, 8) == "compute"
    assert CP._label(g, 0, 1) == "attention"  # a tie: the smallest
    assert CP._label(g, 0, 4) == "mlp"  # 2 x mlp
    assert CP._label(g, 1, 8) == "attention"  # attention 2, mlp 1, norm 1


def test_level_edges_give_each_nodes_predecessors_in_edge_order(sample_cp):
    # the path walk reads a node's predecessors from its level's in-edges: the same list, in the same order, as
    # all edges into that node
    g = sample_cp.graph
    preds: dict[int, list[int]] = {}
    for u, v in zip(g.e_src.tolist(), g.e_dst.tolist()):
        preds.setdefault(v, []).append(u)
    seen = 0
    for lv, (es, ed) in zip(g.levels, g.level_edges):
        for v in lv[:: max(1, lv.size // 7)].tolist():
            assert es[ed == v].tolist() == preds.get(v, [])
            seen += 1
    assert seen > 100


def test_shared_plan_replays_as_a_fresh_one_on_a_run(sample_cp):
    g = sample_cp.graph
    plan = CP.replay_plan(g)
    rng = np.random.default_rng(1)
    dur = g.k_dur * rng.uniform(0.5, 1.0, g.k_dur.size)
    rel = g.k_release - rng.uniform(0, 1000, g.k_dur.size)
    a, b = CP.replay(g, dur, rel, g.k_transfer * 0.7, plan), CP.replay(g, dur, rel, g.k_transfer * 0.7)
    for f in ("finish", "entry", "D", "Q", "q_kernel", "S", "s_kernel"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.step_time == b.step_time
    assert CP.replay(g, plan=plan).step_time == sample_cp.baseline.step_time
    # the latest finish per step, as a group-by over the nodes' steps gives it
    fin = {int(s): float(a.finish[g.n_step == s].max() - g.step_origin[int(s)]) for s in np.unique(g.n_step)}
    assert a.step_time == fin


@pytest.mark.parametrize("step", [1, 20_000])
def test_cross_stream_predecessor_only_where_the_start_is_unexplained(step):
    # rank 0, stream 7: [0,1000] [3000,4000] [4000,5000]; stream 8: [1000,2992] [3504,3992]. [3000,4000] waits
    # for stream 8 (ends 2992, after its stream predecessor's 1000); [4000,5000] starts when its stream
    # predecessor ends (nothing to explain, although [3504,3992] ended 8 ns before). Step 20,000: (step, rank)
    # ids past 2**13, the keys not known exact, every kernel looked up (times are multiples of 8: still exact)
    base = 10**15
    rows = [(7, 0, 1000), (7, 3000, 4000), (7, 4000, 5000), (8, 1000, 2992), (8, 3504, 3992)]
    n = len(rows)
    nodes = pa.table(
        {
            "rank": pa.array([0] * n, pa.int32()),
            "step": pa.array([step] * n, pa.int32()),
            "stream": pa.array([r[0] for r in rows], pa.int32()),
            "start_ns": pa.array([base + r[1] for r in rows], pa.int64()),
            "end_ns": pa.array([base + r[2] for r in rows], pa.int64()),
            "launch_ns": pa.array([None] * n, pa.int64()),
            "launch_tid": pa.array([None] * n, pa.int64()),
            "is_comm": pa.array([False] * n),
            "label": pa.array([None] * n, pa.string()),
        },
        schema=CP.NODES,
    )
    cp = CP.analyze_critical_path(nodes, None)
    g = cp.graph
    assert cp.baseline.step_time == {step: 5000.0}
    # graph order: stream 7's three, then stream 8's two; [3000,4000] and [4000,5000] one segment (no edge
    # enters the second); edges between the kernels' nodes: stream order and the two cross-stream waits
    node = g.k_node.tolist()
    assert node[1] == node[2] and len(set(node)) == 4
    edges = sorted(zip(g.e_src.tolist(), g.e_dst.tolist()))
    assert edges == sorted([(node[0], node[1]), (node[3], node[4]), (node[0], node[3]), (node[3], node[1])])
    assert g.k_res.tolist() == [0.0, 8.0, 0.0, 0.0, 512.0]
    # stream 8's first kernel halved (ends 1996): [3000,4000] runs 2004-3004, [4000,5000] 3004-4004
    dur = g.k_dur.copy()
    dur[3] = 996.0
    assert CP.replay(g, dur).step_time == {step: 4004.0}


@pytest.mark.parametrize("vals", [(-3, 40), (0, 7), (0, 10**9)])
def test_unique_inverse_is_numpys(vals):
    rng = np.random.default_rng(5)
    for dt in (np.int32, np.int64):
        a = rng.integers(vals[0], vals[1], 2000).astype(dt)
        u, inv = K.unique_inverse(a)
        want_u, want_inv = np.unique(a, return_inverse=True)
        assert u.dtype == want_u.dtype and u.tolist() == want_u.tolist()
        assert inv.tolist() == want_inv.reshape(-1).tolist()
