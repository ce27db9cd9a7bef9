"""Critical path and replay on hand-built graphs (times in ns, known answers worked out by hand)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.critical_graphs import colls
from tracelens.analyze.critical import critical_path as CP
from tracelens.analyze.critical import whatif as W


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


# ---- sync edges: a CPU blocked on the GPU launches what follows when the work it waited for ends ----------
def syncs(rows):
    """rows: (rank, tid, start, end[, name])."""
    return pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "tid": pa.array([r[1] for r in rows], pa.int64()),
            "start_ns": pa.array([r[2] for r in rows], pa.int64()),
            "end_ns": pa.array([r[3] for r in rows], pa.int64()),
            "name": pa.array([r[4] if len(r) > 4 else "cudaStreamSynchronize" for r in rows]),
        },
        schema=CP.SYNCS,
    )


def synced_run():
    """Rank 0: K1 [0,1000] launched at -4 (latency 4); cudaStreamSynchronize [10,1005] on the launching thread
    waits for it (returns 5 ns after its end); K2 launched at 1100 -> [1104,1204]."""
    n = nodes(
        [(0, 7, BASE, BASE + 1000, False, BASE - 4), (0, 7, BASE + 1104, BASE + 1204, False, BASE + 1100)]
    )
    return n, syncs([(0, 1, BASE + 10, BASE + 1005)])


def test_sync_edge_path_goes_compute_host_compute():
    n, sy = synced_run()
    cp = CP.analyze_critical_path(n, None, syncs=sy)
    g = cp.graph
    assert g.n_syncs == 1
    assert g.k_sync_x.tolist() == [-1, 0]  # K2 follows the sync that waited for K1
    assert cp.baseline.step_time == {1: 1204.0}  # observed: first release 0 to K2's end
    d = cp.to_dict()
    segs = [
        (s["kind"], s["op"], round(s["ms"] * 1e6), round(s["start_ms"] * 1e6 - BASE)) for s in d["segments"]
    ]
    # K1 (1000) -> the CPU from K1's end to K2's release (104) -> K2 (100); no host stretch from the step start
    assert segs == [
        ("compute", "compute", 1000, 0),
        ("host", "after sync", 104, 1000),
        ("compute", "compute", 100, 1104),
    ]
    assert d["by_kind_ms"] == pytest.approx({"compute": 1100 / 1e6, "host": 104 / 1e6})
    # without the sync the path is one host stretch from the step's start to K2's release
    d0 = CP.analyze_critical_path(n, None).to_dict()
    assert d0["by_kind_ms"] == pytest.approx({"compute": 100 / 1e6, "host": 1104 / 1e6})


def test_sync_edge_shorter_kernel_moves_the_later_launch_by_the_saving():
    n, sy = synced_run()
    g = CP.analyze_critical_path(n, None, syncs=sy).graph
    dur = g.k_dur.copy()
    dur[0] = 600  # K1 400 ns shorter: the sync returns 400 ns earlier, K2 is launched 400 ns earlier
    rp = CP.replay(g, dur)
    assert rp.step_time[1] == 804.0
    assert rp.finish[g.k_node[1]] == 804.0
    # a longer K1 delays K2 alike
    dur[0] = 1300
    assert CP.replay(g, dur).step_time[1] == 1504.0
    # with releases fixed on the CPU clock (no sync edges) the saving is lost
    g0 = CP.analyze_critical_path(n, None).graph
    assert CP.replay(g0, np.array([600.0, 100.0])).step_time[1] == 1204.0


@pytest.mark.parametrize(
    "calls",
    [
        [],
        [(0, 1, BASE + 1010, BASE + 1015)],  # after K1 ended: nothing ended inside the call, it did not block
        [(0, 1, BASE + 10, BASE + 1000 + CP.SYNC_TOL_NS + 1)],  # returned too long after K1's end
        [(0, 2, BASE + 10, BASE + 1005)],  # another thread blocked, not the one that launches K2
    ],
)
def test_no_blocking_sync_leaves_the_graph_as_without_syncs(calls):
    n, _ = synced_run()
    cp = CP.analyze_critical_path(n, None, syncs=syncs(calls) if calls else None)
    ref = CP.analyze_critical_path(n, None)
    assert (cp.graph.k_sync_x >= 0).sum() == 0
    assert cp.graph.n_nodes == ref.graph.n_nodes
    assert cp.baseline.step_time == ref.baseline.step_time == {1: 1204.0}
    assert cp.to_dict() == ref.to_dict()
    rp = CP.replay(cp.graph, np.array([600.0, 100.0]))
    assert rp.step_time[1] == 1204.0


def test_sync_splits_segments_and_replays_observed_times():
    # one stream: K1 [0,100], K2 [100,400] (launched early, queued), sync [150,405] waits for K2;
    # K3 launched 500 -> [504,600], K4 queued behind it [600,700]: K1+K2 | K3+K4 are two segments, K2 is X
    n = nodes(
        [
            (0, 7, BASE, BASE + 100, False, BASE - 4),
            (0, 7, BASE + 100, BASE + 400, False, BASE + 20),
            (0, 7, BASE + 504, BASE + 600, False, BASE + 500),
            (0, 7, BASE + 600, BASE + 700, False, BASE + 520),
        ]
    )
    cp = CP.analyze_critical_path(n, None, syncs=syncs([(0, 1, BASE + 150, BASE + 405)]))
    g = cp.graph
    assert g.k_sync_x.tolist() == [-1, -1, 1, 1]
    assert g.n_nodes == 2 and g.k_node.tolist() == [0, 0, 1, 1]
    assert cp.baseline.step_time == {1: 700.0}
    assert cp.baseline.finish.tolist() == [400.0, 700.0]
    # K2 200 ns shorter: K3 launched 200 ns earlier (K4 queued behind it)
    assert CP.replay(g, np.array([100.0, 100.0, 96.0, 100.0])).step_time[1] == 500.0


def test_host_gaps_removed_with_sync_cuts_each_gap_once():
    # per rank: Ka [0,100]; Kb (900 ns) waited for by a sync; Kc launched 95 ns after the sync returned.
    # Rank 1 launches Kb 400 ns late (a host gap before the sync); its sync and Kc follow 400 ns later.
    rows, calls = [], []
    for r, late in ((0, 0), (1, 400)):
        rows += [
            (r, 7, BASE, BASE + 100, False, BASE - 4),
            (r, 7, BASE + 100 + late, BASE + 1000 + late, False, BASE + 96 + late),
            (r, 7, BASE + 1104 + late, BASE + 1204 + late, False, BASE + 1100 + late),
        ]
        calls.append((r, 1, BASE + 110 + late, BASE + 1005 + late))
    cp = CP.analyze_critical_path(nodes(rows), None, syncs=syncs(calls))
    g = cp.graph
    assert g.n_syncs == 2
    assert cp.baseline.step_time[1] == 1604.0
    ch = W.host_gaps_removed(g, 1, [0])
    rp = CP.replay(g, ch.dur, ch.release, ch.transfer)
    # the 400 ns gap is cut once: Kb released at 100, so the sync returns and Kc starts 400 ns earlier
    kc1 = int(np.flatnonzero(g.k_rank == 1)[-1])
    assert rp.finish[g.k_node[kc1]] == 1204.0
    assert rp.step_time[1] == 1204.0


def test_sync_calls_from_events():
    names = ["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync", "cudaMemcpyAsync",
             "hipMemcpyWithStream", "Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)",
             "Memcpy DtoH (Device -> Pageable)", "cudaEventSynchronize"]  # fmt: skip
    kinds = ["cuda_runtime", "cuda_runtime", "cuda_runtime", "cuda_runtime", "cuda_runtime", "gpu_memcpy",
             "gpu_memcpy", "gpu_memcpy", "cuda_runtime"]  # fmt: skip
    ts = [0, 100, 200, 300, 400, 210, 320, 405, 500]
    dur = [5, 50, 30, 10, 20, 5, 5, 5, 10]
    corr = [1, 2, 3, 4, 5, 3, 4, 5, 6]
    tid = [9, 9, 9, 9, 9, None, None, None, None]  # the last sync has no numeric thread: unusable
    ev = pa.table(
        {
            "rank": pa.array([0] * 9, pa.int32()),
            "kind": pa.array(kinds).dictionary_encode(),
            "name": pa.array(names).dictionary_encode(),
            "tid": pa.array(tid, pa.int64()),
            "ts_ns": pa.array(ts, pa.int64()),
            "dur_ns": pa.array(dur, pa.int64()),
            "correlation": pa.array(corr, pa.int64()),
        }
    )
    out = CP.sync_calls(ev)
    # the synchronize; the D2H copy whose copy [210,215] ended inside the call [200,230]; hipMemcpyWithStream
    # whose copy ended at 410 inside [400,420]; not the H2D copy that ended after its call returned
    assert out.column("name").to_pylist() == [
        "cudaStreamSynchronize",
        "cudaMemcpyAsync",
        "hipMemcpyWithStream",
    ]
    assert out.column("start_ns").to_pylist() == [100, 200, 400]
    assert out.column("end_ns").to_pylist() == [150, 230, 420]


def test_instance_where_a_participant_ended_before_the_last_arrived_is_no_rendezvous():
    # rank 0's "send" [0,20000] ends before rank 1's "recv" [30000,50000] starts (an eager send, or a wrong
    # match): as a rendezvous rank 0 would end at 30000 + transfer, 10 µs late; left out, every node replays
    # at its observed time
    rows = [
        (0, 20, BASE, BASE + 20_000, True),
        (0, 7, BASE + 20_000, BASE + 25_000, False),
        (1, 7, BASE, BASE + 30_000, False),
        (1, 20, BASE + 30_000, BASE + 50_000, True),
    ]
    c = colls([(0, BASE, BASE + 20_000, 0), (1, BASE + 30_000, BASE + 50_000, 0)])
    cp = CP.analyze_critical_path(nodes(rows), c)
    g = cp.graph
    assert g.early_instances == 1 and (g.k_instance >= 0).sum() == 0
    assert cp.baseline.step_time == {1: 50_000.0}
    seg = g.n_type == CP.SEG
    assert np.array_equal(cp.baseline.finish[seg], g.k_end[g.n_last_k[seg]])


def test_balanced_split_stretches_launches_after_a_sync_from_its_return():
    # synced_run with half the compute: K1 500 ns, so the sync returns 500 ns earlier; K2's launch, 95 ns after
    # the sync's return (1009 in release units: return 1005 + latency 4), comes 47.5 ns after it
    n, sy = synced_run()
    g = CP.analyze_critical_path(n, None, syncs=sy).graph
    assert g.k_sync_ret.tolist()[1] == 1009.0
    ch = W.split_compute(g, {0: [0]}, current=[2], suggested=[1], per_layer_ns=550.0)  # 1100 -> 550 per step
    assert ch.dur.tolist() == [500.0, 50.0]
    assert ch.release.tolist() == [0.0, 1009.0 + 95 * 0.5]
    rp = CP.replay(g, ch.dur, ch.release, ch.transfer)
    assert rp.step_time[1] == pytest.approx(1056.5 - 500 + 50)


@pytest.mark.parametrize("late", [0, 2**41])  # a kernel 2^41 ns (~37 min) later takes the per-rank search
def test_kernel_labels_are_the_latest_enclosing_span_of_their_rank(late):
    import pandas as pd

    from tracelens.analyze.critical.critical_nodes import _labels

    spans = pa.table(
        {
            "rank": pa.array([0, 0, 0, 1, 1], pa.int32()),
            "gpu_start_ns": pa.array([100, 100, 300, 100, None], pa.int64()),
            "gpu_end_ns": pa.array([500, 200, 400, 170 + late, 900], pa.int64()),
            "module": ["layers.0", "layers.0.attn", "layers.1", "layers.5", "layers.9"],
        }
    )
    d = pd.DataFrame(
        {
            "rank": [0, 0, 0, 0, 1, 1, 1, 2],
            "start_ns": [50, 150, 250, 350, 120, 160 + late, 200 + late, 120],
        }
    )
    # 50: before every span; 150: the later listed of the two starting at 100; 250: layers.0.attn ended at
    # 200, so nothing (the latest start at or before is layers.0.attn); 350: layers.1; rank 1: 120 in
    # layers.5, 160+late inside it too, 200+late after it (layers.9 has no GPU start); rank 2 has no spans
    assert _labels(d, spans) == [None, "layers.0.attn", None, "layers.1", "layers.5", "layers.5", None, None]


@pytest.mark.parametrize("big", [False, True])
def test_first_of_keys_finds_the_first_equal_pair(big):
    """The CPU launch lookup of device_nodes: the first (rank, correlation) key equal to each query; queries
    with a negative correlation, an unknown rank or an unknown correlation are not found. `big`: values so
    large that the one-int64 key cannot hold them (the fallback)."""
    from tracelens.analyze.critical.critical_nodes import _first_of_keys

    off = 2**61 if big else 0
    k_rank = np.array([0, 0, 1, 0, 1, 1])
    k_val = np.array([5, 7, 5, 5, 9, 5]) + off
    q_rank = np.array([0, 1, 0, 1, 2, 0, 1])
    q_val = np.array([5, 5, 7, 9, 5, -1, 8]) + np.array([off] * 5 + [0, off])
    hit, first = _first_of_keys(k_rank, k_val, q_rank, q_val)
    assert hit.tolist() == [True, True, True, True, False, False, False]
    assert first.tolist() == [0, 2, 1, 4]  # (0, 5) first at 0, not 3; (1, 5) first at 2, not 5
