"""Straggler verdicts on small hand-built runs whose truth is known by construction.

`run()` builds a 4-rank GPU run (TP groups {0,1}, {2,3}; DP groups {0,2}, {1,3}): per step, L layers of
(compute kernel, blocking TP all-reduce), then a blocking DP all-reduce. A blocking collective ends on every
member at the latest arrival + transfer, so early ranks wait inside the kernel, exactly the behaviour the
analysis must see through. Faults: compute factor per rank, CPU stall before the first kernel, slow link.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from tracelens import schema
from tracelens._testing import events_table, table_from_rows
from tracelens.analyze.comm import stragglers as S

TP = [(0, 1), (2, 3)]
DP = [(0, 2), (1, 3)]


def run(
    *,
    steps: int = 6,
    layers: int = 4,
    compute_ns: int = 1_000_000,
    xfer_ns: int = 200_000,
    factor: dict | None = None,
    factor_steps: set | None = None,
    stall: dict | None = None,
    link: dict | None = None,
    stage_compute: dict | None = None,
    seed: int = 0,
):
    """Events table and per-step step times (max over ranks) of the toy run."""
    rng = np.random.default_rng(seed)
    factor, stall, link, stage_compute = factor or {}, stall or {}, link or {}, stage_compute or {}
    rows, seq, step_times = [], {}, []
    t = 1_000_000

    def coll(members, arrive, name, layer_bytes):
        x = xfer_ns * max(link.get(r, 1.0) for r in members) * rng.lognormal(0, 0.02)
        end = max(arrive[r] for r in members) + int(x)
        key = name
        seq[key] = seq.get(key, 0) + 1
        for r in members:
            rows.append(
                {
                    "rank": r,
                    "kind": "kernel",
                    "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                    "device": 0,
                    "stream": 20,
                    "ts_ns": arrive[r],
                    "dur_ns": end + int(rng.integers(0, 500)) - arrive[r],
                    "step": s,
                    "collective": "allreduce",
                    "pg_name": name,
                    "pg_ranks": list(members),
                    "group_size": len(members),
                    "seq": seq[key],
                    "in_nelems": layer_bytes,
                    "out_nelems": layer_bytes,
                    "dtype": "BFloat16",
                }  # fmt: skip
            )
        return end

    for s in range(steps):
        cur = {r: t + int(stall.get(r, 0)) for r in range(4)}
        for _ in range(layers):
            for r in range(4):
                f = factor.get(r, 1.0) if (factor_steps is None or s in factor_steps) else 1.0
                d = int(compute_ns * f * stage_compute.get(r, 1.0) * rng.lognormal(0, 0.02))
                rows.append({"rank": r, "kind": "kernel", "name": "gemm", "device": 0, "stream": 7,
                             "ts_ns": cur[r], "dur_ns": d, "step": s})  # fmt: skip
                cur[r] += d
            for i, g in enumerate(TP):
                end = coll(g, cur, f"tp{i}", 1 << 20)
                for r in g:
                    cur[r] = end
        ends = {}
        for i, g in enumerate(DP):
            end = coll(g, cur, f"dp{i}", 1 << 20)
            for r in g:
                ends[r] = end
        stop = max(ends.values()) + 50_000
        for r in range(4):
            rows.append({"rank": r, "kind": "user_annotation", "name": f"ProfilerStep#{s}", "tid": 1,
                         "ts_ns": t, "dur_ns": stop - t, "step": s})  # fmt: skip
        step_times.append(stop - t)
        t = stop + 100_000
    md = table_from_rows([{"rank": r, "host_name": "node0"} for r in range(4)], schema.METADATA)
    return events_table(rows), md, np.array(step_times)


def verdicts(res):
    return {s["rank"]: s["cause"] for s in res.stragglers}


def test_clean_run_has_no_straggler():
    ev, md, _ = run()
    res = S.analyze_cross_rank(ev, md)
    assert res.stragglers == [] and res.one_line() == "no straggler"
    assert not [f for f in res.findings if f["code"] == "STRAGGLER"]


@pytest.mark.parametrize("rank", [0, 3])
def test_compute_straggler_found_with_cost_close_to_the_step_time_it_adds(rank):
    ev, md, slow = run(factor={rank: 1.3})
    _, _, clean = run()
    res = S.analyze_cross_rank(ev, md)
    assert verdicts(res) == {rank: "compute"}
    s = res.stragglers[0]
    assert s["steps_flagged"] == s["steps_total"] == 6
    assert s["evidence"]["compute_ratio"] == pytest.approx(1.3, abs=0.05)
    true_cost_ms = float(np.mean(slow - clean)) / 1e6  # 0.3 x 4 layers x 1 ms
    assert s["cost_ms"] == pytest.approx(true_cost_ms, rel=0.15)
    assert res.one_line().startswith(f"straggler: rank {rank} (compute, +3")
    f = [f for f in res.findings if f["code"] == "STRAGGLER"]
    assert len(f) == 1 and f[0]["ranks"] == [rank]


def test_the_straggler_has_the_least_exposed_wait():
    """The pitfall: the straggler's own collectives are the shortest; its peers look communication-bound."""
    ev, md, _ = run(factor={2: 1.3})
    res = S.analyze_cross_rank(ev, md)
    split = res.exposed_split.to_pandas().groupby("rank")["exposed_wait_ns"].sum()
    assert split.idxmin() == 2
    comm = res.collectives.to_pandas().groupby("rank")["end_ns"].count()
    assert set(comm.index) == {0, 1, 2, 3}
    assert verdicts(res) == {2: "compute"}


def test_host_stall_is_cause_host():
    ev, md, slow = run(stall={1: 1_500_000})
    _, _, clean = run()
    res = S.analyze_cross_rank(ev, md)
    assert verdicts(res) == {1: "host"}
    s = res.stragglers[0]
    assert s["evidence"]["idle_excess_ms"] == pytest.approx(1.5, rel=0.05)
    assert s["cost_ms"] == pytest.approx(float(np.mean(slow - clean)) / 1e6, rel=0.15)
    assert "host, device idle +1.5 ms/step" in res.one_line()


def test_slow_link_is_localised_to_the_rank_common_to_the_slow_groups():
    ev, md, slow = run(link={3: 4.0})
    res = S.analyze_cross_rank(ev, md)
    assert verdicts(res) == {3: "communication"}
    s = res.stragglers[0]
    assert s["evidence"]["transfer_ratio"] == pytest.approx(4.0, rel=0.1)
    assert s["cost_ms"] > 0


def test_transient_slowness_is_not_a_straggler():
    ev, md, _ = run(factor={2: 1.5}, factor_steps={3})
    res = S.analyze_cross_rank(ev, md)
    assert res.stragglers == []


def test_immaterial_slowness_is_not_a_straggler():
    ev, md, _ = run(factor={2: 1.01})
    assert S.analyze_cross_rank(ev, md).stragglers == []


def test_stage_peers_come_from_stage_of():
    # ranks 2, 3 hold a heavier stage: not stragglers when compared with their own stage
    ev, md, _ = run(stage_compute={2: 1.5, 3: 1.5})
    res = S.analyze_cross_rank(ev, md, stage_of={0: 0, 1: 0, 2: 1, 3: 1})
    assert res.stragglers == []
    # ... and a slow rank inside that stage is still found, with its stage
    ev, md, _ = run(stage_compute={2: 1.5, 3: 1.5}, factor={3: 1.3})
    res = S.analyze_cross_rank(ev, md, stage_of={0: 0, 1: 0, 2: 1, 3: 1})
    assert verdicts(res) == {3: "compute"}
    assert res.stragglers[0]["stage"] == 1 and res.stragglers[0]["evidence"]["peers"] == [2]
    assert "vs stage peers" in res.one_line()


def test_exposed_wait_plus_transfer_is_exposed_comm_and_lag_table():
    ev, md, _ = run(factor={0: 1.2}, link={1: 1.5})
    res = S.analyze_cross_rank(ev, md)
    t = res.exposed_split
    assert pc.all(
        pc.equal(pc.add(t["exposed_wait_ns"], t["exposed_transfer_ns"]), t["exposed_comm_ns"])
    ).as_py()
    lag = res.arrival_lag.to_pandas()
    assert set(lag.columns) >= {"rank", "step", "lag_ns", "blame_ns", "last_count"}
    assert lag.groupby("rank")["blame_ns"].sum().idxmax() == 0
    assert res.collectives.num_rows > 0 and "wait_ns" in res.collectives.column_names


def test_config_thresholds_are_honoured():
    ev, md, _ = run(factor={2: 1.3})
    strict = S.StragglerConfig(min_cost_fraction=0.5)
    assert S.analyze_cross_rank(ev, md, config=strict).stragglers == []


def test_no_collectives_and_no_metadata():
    rows = [
        {
            "rank": r,
            "kind": "kernel",
            "name": "gemm",
            "device": 0,
            "ts_ns": 0,
            "dur_ns": 100 * (r + 1),
            "step": 0,
        }
        for r in range(2)
    ]
    res = S.analyze_cross_rank(events_table(rows), None)
    assert res.stragglers == [] and res.collectives.num_rows == 0 and res.arrival_lag.num_rows == 0
    assert res.offsets_ns == {}
    assert res.exposed_split.column("exposed_wait_ns").to_pylist() == [0, 0]


def test_peer_groups_inferred_from_collectives_leave_out_groups_spanning_a_p2p_pair():
    import pandas as pd

    df = pd.DataFrame(
        {
            "rank": [0, 1, 2, 3, 0, 1, 2, 3, 1, 3],
            "group_key": ["tp0", "tp0", "tp1", "tp1"] + ["world"] * 4 + ["p2p", "p2p"],
            "is_p2p": [False] * 8 + [True, True],
            "peer": [None] * 8 + [3, 1],
        }
    )
    groups = S.infer_peer_groups(df, [0, 1, 2, 3])
    assert groups[0] == groups[1] != groups[2] == groups[3]


def test_whole_slow_group_becomes_slow_group_not_rank_stragglers():
    import pandas as pd

    from tracelens.analyze.comm.stragglers import group_verdicts

    def v(r, cause="communication"):
        return {"rank": r, "cause": cause, "cost_ms": 10.0 + r, "evidence": {"transfer_ratio": 1.5}}

    df = pd.DataFrame(
        {
            "rank": [6, 7, 4, 5],
            "is_p2p": [False] * 4,
            "group_key": ["g:dp3", "g:dp3", "g:dp2", "g:dp2"],
            "pg_desc": ["dp_stage3", "dp_stage3", "dp_stage2", "dp_stage2"],
        }
    )
    kept, found = group_verdicts([v(6), v(7), v(4), v(1, "compute")], df)
    assert [f["code"] for f in found] == ["SLOW_GROUP"]
    assert found[0]["ranks"] == [6, 7] and found[0]["group"] == "dp_stage3" and found[0]["cost_ms"] == 17.0
    assert sorted(s["rank"] for s in kept) == [1, 4]  # rank 4's group has a healthy member: still a rank


def test_pre_arrival_idle_slices_each_ranks_rows_when_interleaved():
    """Breakdown rows of ranks interleaved (and a rank without interval sets): each rank's windows are measured
    against its own busy time up to its own last arrival."""
    import pandas as pd
    import pyarrow as pa

    from tracelens.analyze.core import intervals as iv
    from tracelens.schema import RankSets

    def ivs(*pairs):
        return iv.union(np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))

    sets = {
        0: RankSets(0, "", ivs((0, 30)), ivs((60, 80)), ivs()),  # busy [0,30) and [60,80)
        1: RankSets(1, "", ivs((10, 20)), ivs(), ivs((120, 130))),  # busy [10,20) and [120,130)
    }
    bd = pa.table(
        {
            "rank": pa.array([1, 0, 2, 1, 0], pa.int32()),
            "step": pa.array([0, 0, 0, 1, 1], pa.int32()),
            "window_start_ns": [0, 0, 0, 100, 100],
            "window_end_ns": [100, 100, 100, 200, 200],
        }
    )
    df = pd.DataFrame(
        {
            "rank": [0, 1, 0, 1],
            "step": pd.array([0, 0, 1, 1], dtype="Int64"),
            "start_ns": [70, 50, 150, 125],
            "is_p2p": [False, False, False, False],
        }
    )
    got = S.pre_arrival_idle(bd, sets, df)
    # rank 1 step 0: [0,50) minus busy 10 = 40; rank 0 step 0: [0,70) minus 30 + 10 = 30;
    # rank 2 (no sets): the whole window 100; rank 1 step 1: [100,125) minus 5 = 20; rank 0 step 1: [100,150) = 50
    assert got["rank"].tolist() == [1, 0, 2, 1, 0]
    assert got["pre_idle_ns"].tolist() == [40, 30, 100, 20, 50]


def test_waited_counts_only_collectives_a_frame_launched_and_waited_for():
    """`cpu_evidence._waited`: a frame [0, 100) with a child op [10, 20); communication spans [5, 60)
    (launched and completed inside the frame: waited for), [-10, 30) (already in flight when it began) and
    [90, 130) (still in flight when it ended). Its waited self time is [5, 60) minus the child: 45."""
    import numpy as np

    from tracelens.analyze.rank.cpu_evidence import _self_times, _waited

    s, e = np.array([0, 10]), np.array([100, 20])
    self_t, parent = _self_times(s, e)
    assert list(self_t) == [90, 10] and list(parent) == [-1, 0]
    cs, ce = np.array([-10, 5, 90]), np.array([30, 60, 130])
    assert list(_waited(s, e, parent, np.array([0]), cs, ce)) == [45]
    assert list(_waited(s, e, parent, np.array([0]), cs[[0, 2]], ce[[0, 2]])) == [0]
