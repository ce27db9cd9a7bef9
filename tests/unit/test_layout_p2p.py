"""Global peers of gloo's group-local sends and receives (analyze/layout/p2p.resolve_peers), worked by hand."""

from __future__ import annotations

import json

import numpy as np
from pipeline_tables import metadata_table

from tracelens._testing import events_table
from tracelens.analyze.layout.p2p import chains, p2p_edges, resolve_peers, send_first_ranks
from tracelens.engine import kept as engine_kept


def _p2p(rank: int, send: bool, local: int, ts: int) -> dict:
    return {
        "rank": rank,
        "kind": "cpu_op",
        "name": "c10d::send" if send else "c10d::recv_",
        "ts_ns": ts,
        "dur_ns": 10,
        "step": 1,
        "peer_local": local,
    }


def _mesh_pp_dp() -> dict[int, list[tuple[str, list[int]]]]:
    """A (pp=2, dp=2) DeviceMesh, rank = dp + 2*pp: mesh_pp [0,2], [1,3]; mesh_dp [0,1], [2,3]; the world."""
    out = {}
    for r in range(4):
        pp_g = [0, 2] if r % 2 == 0 else [1, 3]
        dp_g = [0, 1] if r < 2 else [2, 3]
        out[r] = [("default_pg", [0, 1, 2, 3]), ("mesh_pp", pp_g), ("mesh_dp", dp_g)]
    return out


def test_a_local_peer_two_groups_could_mean_is_the_one_the_other_side_confirms():
    # stage 0 ranks (0, 1) send activations to local peer 1 of their pp group and receive gradients from it;
    # rank 0's "1" could be rank 1 (world, dp group) or rank 2 (pp group): only rank 2 receives from rank 0
    # through the same group
    rows = []
    for k in range(3):
        t = 100 * k
        rows += [
            _p2p(0, True, 1, t),
            _p2p(2, False, 0, t + 5),
            _p2p(2, True, 0, t + 50),
            _p2p(0, False, 1, t + 60),
        ]
        rows += [
            _p2p(1, True, 1, t + 1),
            _p2p(3, False, 0, t + 6),
            _p2p(3, True, 0, t + 51),
            _p2p(1, False, 1, t + 61),
        ]
    ev = events_table(rows)
    out, stats = resolve_peers(ev, metadata_table(4, _mesh_pp_dp()))
    assert stats == {"resolved": len(rows), "ambiguous": 0, "unmapped": 0}
    df = out.to_pandas()
    sends = df[df["name"] == "c10d::send"].groupby("rank")["dst_rank"].unique()
    recvs = df[df["name"] == "c10d::recv_"].groupby("rank")["src_rank"].unique()
    assert {r: list(v) for r, v in sends.items()} == {0: [2], 1: [3], 2: [0], 3: [1]}
    assert {r: list(v) for r, v in recvs.items()} == {0: [2], 1: [3], 2: [0], 3: [1]}
    src, dst, first, _ = p2p_edges(out)
    got, problems = chains(src, dst, first)
    assert got == [[0, 2], [1, 3]] and not problems  # stage 0 sends first


def test_the_world_alone_maps_local_peers_as_they_are():
    rows = [_p2p(0, True, 1, 0), _p2p(1, False, 0, 5), _p2p(1, True, 2, 10), _p2p(2, False, 1, 15)]
    md = metadata_table(3, {r: [("default_pg", [0, 1, 2])] for r in range(3)})
    out, stats = resolve_peers(events_table(rows), md)
    assert stats["resolved"] == 4
    assert out.column("dst_rank").to_pylist() == [1, None, 2, None]
    assert out.column("src_rank").to_pylist() == [None, 0, None, 1]


def test_a_tie_is_left_unknown_and_rows_with_a_global_peer_are_kept():
    # rank 0 sends to local 1 of either of two groups, and both candidates receive from rank 0 through that
    # same group: nothing tells them apart
    groups = {0: [("a", [0, 1]), ("b", [0, 2])], 1: [("a", [0, 1])], 2: [("b", [0, 2])]}
    rows = [_p2p(0, True, 1, 0), _p2p(1, False, 0, 5), _p2p(2, False, 0, 6)]
    rows.append(
        {"rank": 0, "kind": "cpu_op", "name": "record_param_comms", "ts_ns": 1, "dur_ns": 1, "dst_rank": 2}
    )
    out, stats = resolve_peers(events_table(rows), metadata_table(3, groups))
    assert stats["ambiguous"] == 1 and stats["resolved"] == 2
    assert out.column("dst_rank").to_pylist() == [None, None, None, 2]


def test_nothing_to_resolve_returns_the_same_table():
    ev = events_table([{"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 0, "dur_ns": 1}])
    out, stats = resolve_peers(ev, None)
    assert out is ev and stats == {"resolved": 0, "ambiguous": 0, "unmapped": 0}


def test_peer_local_read_from_concrete_inputs(tmp_path):
    """The ingester reads gloo's group-local peer from `Concrete Inputs` (dst / src is the third input)."""
    from tracelens.ingest.kineto import read

    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0,
         "args": {"External id": 7, "Input Dims": [[[2, 3]], [], [], []], "Concrete Inputs": ["", "", "3", "0"]}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::recv_", "pid": 1, "tid": 1, "ts": 20.0, "dur": 1.0,
         "args": {"External id": 8, "Input Dims": [[[2, 3]], [], [], []], "Concrete Inputs": ["", "", "0", "0"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 30.0, "dur": 1.0,
         "args": {"External id": 9, "Input Dims": [[2, 3], [3, 4]], "Concrete Inputs": ["", ""]}},
    ]  # fmt: skip
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 1, "world_size": 4}}))
    t = read(p).events
    got = dict(zip(t.column("name").to_pylist(), t.column("peer_local").to_pylist()))
    assert got == {"c10d::send": 3, "c10d::recv_": 0, "aten::mm": None}
    assert np.all(t.column("dst_rank").is_null().to_numpy(zero_copy_only=False))


def test_memo_collectives_get_the_resolved_peers(tmp_path):
    """The run memo's collectives (computed before the peers were known) with the resolved peers filled in
    equal the collectives computed from the resolved events."""
    from pathlib import Path

    from tracelens.analyze.comm.collectives import collectives_from_events
    from tracelens.analyze.layout.p2p import fill_collective_peers
    from tracelens.run_analysis import Options, analyze_run

    run = Path(__file__).resolve().parents[2] / "sample_traces" / "cpu-gloo-4rank"
    a = analyze_run(run, Options(cache_dir=str(tmp_path / "cache")))
    x = a._xevents
    assert a.p2p_peers["resolved"] > 0
    memo = engine_kept.cross_collectives(a.run.stages)
    assert memo.column("peer").null_count > 0  # (before: gloo records no peer)
    filled = fill_collective_peers(memo, x)
    assert filled.equals(collectives_from_events(x))


def test_a_ring_starts_at_the_rank_that_sends_before_it_receives():
    """Interleaved schedules close the P2P chain into a ring (the last stage sends chunk 0's output to stage
    0). The CPU issues sends far ahead of the GPU, so the ring's earliest send across ranks can be any
    stage's; stage 0 is the one rank whose first P2P op is a send (it receives nothing before its first
    forward). Here ranks 1-3 issue their first sends before rank 0 does: without that rule the ring started
    at rank 1."""

    def op(rank: int, peer: int, send: bool, ts: int) -> dict:
        return {"rank": rank, "kind": "cpu_op", "name": "nccl:send" if send else "nccl:recv", "ts_ns": ts,
                "dur_ns": 10, "step": 1, "collective": "send" if send else "recv",
                "dst_rank": peer if send else rank, "src_rank": rank if send else peer}  # fmt: skip

    rows = []
    order = [0, 1, 2, 3]
    for i, r in enumerate(order):
        nxt, prv = order[(i + 1) % 4], order[i - 1]
        if r == 0:
            rows += [op(0, nxt, True, 1_000), op(0, prv, False, 2_000)]
        else:
            rows += [op(r, prv, False, 100 * i), op(r, nxt, True, 100 * i + 50)]
    ev = events_table(rows)
    src, dst, first, _ = p2p_edges(ev)
    assert chains(src, dst, first)[0] != [[0, 1, 2, 3]]  # the earliest send (rank 1's) misleads
    got, problems = chains(src, dst, first, send_first_ranks(ev))
    assert got == [[0, 1, 2, 3]] and not problems
    assert send_first_ranks(ev) == {0}
