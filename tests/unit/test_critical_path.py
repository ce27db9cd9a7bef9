"""Critical path and replay on hand-built graphs (times in ns, known answers worked out by hand)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelens.analyze import critical_path as CP
from tracelens.analyze import whatif as W


def nodes(rows):
    """rows: (rank, stream, start, end, is_comm[, launch[, launch thread (default 1)]])."""
    cols = {f.name: [] for f in CP.NODES}
    for r in rows:
        rank, stream, s, e, comm = r[:5]
        cols["rank"].append(rank)
        cols["step"].append(1)
        cols["stream"].append(stream)
        cols["start_ns"].append(s)
        cols["end_ns"].append(e)
        cols["launch_ns"].append(r[5] if len(r) > 5 else None)
        cols["launch_tid"].append(r[6] if len(r) > 6 else (1 if len(r) > 5 else None))
        cols["is_comm"].append(comm)
        cols["label"].append(None)
    return pa.table(cols, schema=CP.NODES)


def colls(rows, offsets=None):
    """rows: (rank, start, end, instance) raw; aligned with offsets."""
    off = offsets or {}
    al = [(r, s - off.get(r, 0), e - off.get(r, 0), i) for r, s, e, i in rows]
    latest = {i: max(a[1] for a in al if a[3] == i) for i in {a[3] for a in al}}
    n = {i: sum(1 for a in al if a[3] == i) for i in latest}
    return pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "start_ns": pa.array([r[1] for r in rows], pa.int64()),
            "end_ns": pa.array([r[2] for r in rows], pa.int64()),
            "instance": pa.array([r[3] for r in rows], pa.int64()),
            "op": pa.array(["allreduce"] * len(rows)),
            "group_key": pa.array(["pg:0"] * len(rows)),
            "bytes": pa.array([1000] * len(rows), pa.int64()),
            "n_participants": pa.array([n[r[3]] for r in rows], pa.int32()),
            "latest_start_ns": pa.array([latest[a[3]] for a in al], pa.int64()),
            "end_aligned_ns": pa.array([a[2] for a in al], pa.int64()),
        }
    )


BASE = 10**15


def two_rank_run(shift1: int = 0):
    """Rank 0: compute [0,100], all-reduce [100,250], compute [250,300]; rank 1: compute [0,150],
    all-reduce [150,250], compute [250,290]. Rank 1's clock reads `shift1` ns ahead."""
    r0 = [(0, 7, 0, 100, False), (0, 20, 100, 250, True), (0, 7, 250, 300, False)]
    r1 = [(1, 7, 0, 150, False), (1, 20, 150, 250, True), (1, 7, 250, 290, False)]
    rows = [(r, st, BASE + s + (shift1 if r == 1 else 0), BASE + e + (shift1 if r == 1 else 0), c)
            for r, st, s, e, c in r0 + r1]  # fmt: skip
    c = colls([(0, BASE + 100, BASE + 250, 0), (1, BASE + 150 + shift1, BASE + 250 + shift1, 0)], {1: shift1})
    return nodes(rows), c, {0: 0, 1: shift1}


@pytest.mark.parametrize("shift", [0, 5_000])
def test_replay_reproduces_and_path(shift):
    n, c, off = two_rank_run(shift)
    cp = CP.analyze_critical_path(n, c, off, stage_of=None)
    assert cp.baseline.step_time == {1: 300.0}
    d = cp.to_dict()
    # path: rank 1's compute (last to arrive, 150) -> transfer 100 -> rank 0's compute 50
    assert d["by_rank_ms"] == {"0": 150 / 1e6, "1": 150 / 1e6}
    assert d["by_kind_ms"] == {"compute": 200 / 1e6, "transfer": 100 / 1e6}
    kinds = [(s["rank"], s["kind"], s["ms"] * 1e6) for s in d["segments"]]
    assert [(r, k, round(v)) for r, k, v in kinds] == [
        (1, "compute", 150),
        (0, "transfer", 100),
        (0, "compute", 50),
    ]


def test_straggler_compute_replay():
    n, c, off = two_rank_run()
    cp = CP.analyze_critical_path(n, c, off)
    ch = W.straggler_compute(cp.graph, 1, [0])
    rp = CP.replay(cp.graph, ch.dur, ch.release, ch.transfer)
    f = 150 / 190  # rank 0 computes 150 ns per step, rank 1 190
    arrive = max(100, 150 * f)
    assert rp.step_time[1] == pytest.approx(max(arrive + 100 + 50, arrive + 100 + 40 * f))
    out = W.what_if(cp, [{"code": "STRAGGLER", "cause": "compute", "ranks": [1]}], peers_of={0: 0, 1: 0})
    assert out[0]["saving_ms"] == pytest.approx((300 - rp.step_time[1]) / 1e6, abs=1e-6)
    assert out[-1]["change"] == "all fixed" or len(out) == 2


def test_launch_bound_kernel_is_host_on_path():
    # rank 0 alone: compute [0,100] launched at -4; next kernel launched at 496 -> starts at 500 (latency 4)
    n = nodes([(0, 7, BASE, BASE + 100, False, BASE - 4), (0, 7, BASE + 500, BASE + 600, False, BASE + 496)])
    cp = CP.analyze_critical_path(n, None)
    assert cp.baseline.step_time == {1: 600.0}  # from the first release (launch + latency = 0) to 600
    d = cp.to_dict()
    assert d["by_kind_ms"]["host"] == pytest.approx(500 / 1e6)  # the CPU until the second launch
    assert d["by_kind_ms"]["compute"] == pytest.approx(100 / 1e6)
    # a faster first kernel saves nothing: the second waits for its launch
    g = cp.graph
    rp = CP.replay(g, g.k_dur * np.array([0.5, 1.0]))
    assert rp.step_time[1] == 600.0


def test_host_gaps_removed_to_peers_median():
    # two ranks launching 2 kernels; rank 1's second launch is 400 ns late
    rows = []
    for r, late in ((0, 0), (1, 400)):
        rows.append((r, 7, BASE, BASE + 100, False, BASE - 4))
        rows.append((r, 7, BASE + 104 + late, BASE + 204 + late, False, BASE + 100 + late))
    cp = CP.analyze_critical_path(nodes(rows), None)
    assert cp.baseline.step_time[1] == pytest.approx(604.0)
    ch = W.host_gaps_removed(cp.graph, 1, [0])
    rp = CP.replay(cp.graph, ch.dur, ch.release, ch.transfer)
    assert rp.step_time[1] == pytest.approx(204.0)


def test_cycle_free_levels_and_segments_coarsened():
    # a chain of 50 kernels on one stream with nothing leaving it is one segment
    rows = [(0, 7, BASE + 10 * i, BASE + 10 * i + 10, False) for i in range(50)]
    cp = CP.analyze_critical_path(nodes(rows), None)
    assert cp.graph.n_nodes == 1
    assert cp.baseline.step_time == {1: 500.0}


def test_crossed_instances_are_left_out_not_the_whole_path():
    # rank 0 runs all-reduce A then B, rank 1 B then A: matched as given, A waits for rank 1's A, which runs
    # after rank 1's B, which waits for rank 0's B, which runs after rank 0's A: a cycle. A third instance C,
    # in the same order on both ranks, is consistent and must stay a rendezvous.
    r0 = [(0, 20, 0, 100, True), (0, 20, 100, 200, True), (0, 7, 200, 260, False), (0, 20, 260, 400, True)]
    r1 = [(1, 20, 0, 100, True), (1, 20, 100, 200, True), (1, 7, 200, 300, False), (1, 20, 300, 400, True)]
    rows = [(r, st, BASE + s, BASE + e, c) for r, st, s, e, c in r0 + r1]
    c = colls(
        [
            (0, BASE + 0, BASE + 100, 0),  # A
            (0, BASE + 100, BASE + 200, 1),  # B
            (0, BASE + 260, BASE + 400, 2),  # C: rank 0 enters at 260 and waits in the kernel
            (1, BASE + 0, BASE + 100, 1),  # B
            (1, BASE + 100, BASE + 200, 0),  # A
            (1, BASE + 300, BASE + 400, 2),  # C
        ]
    )
    with pytest.raises(CP.GraphCycleError):  # the graph as matched has no topological order
        g = CP._build_graph(nodes(rows), c, None, None, np.empty(0, dtype=np.int64))
        CP._levels(g)
    cp = CP.analyze_critical_path(nodes(rows), c)
    assert cp.graph.dropped_instances == 2
    assert sorted(set(cp.graph.k_instance[cp.graph.k_instance >= 0].tolist())) == [2]
    assert cp.baseline.step_time == {1: 400.0}  # the replay still reproduces the observed step
    # C's rendezvous stays: rank 0 (ready at 260) waits for rank 1 (ready at 300)
    d = cp.to_dict()
    assert d["by_rank_ms"] == pytest.approx({"0": 100 / 1e6, "1": 300 / 1e6})
    assert d["by_kind_ms"] == pytest.approx({"compute": 300 / 1e6, "transfer": 100 / 1e6})
