"""Collective extraction, matching, clock alignment and wait/transfer on hand-built event tables."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens import schema
from tracelens._testing import events_table, table_from_rows
from tracelens.analyze.comm import collectives as C
from tracelens.analyze.comm import wait_transfer as WT
from tracelens.analyze.core import frame_cells as FC
from tracelens.analyze.rank.breakdown import breakdown, class_sets


def nccl(rank, ts, dur, *, op="allreduce", seq=None, pg="0", ranks=(0, 1), ext=None, nel=1000, dtype="Float",
         step=0, src=None, dst=None, kernel=None):  # fmt: skip
    """One NCCL kernel row with the args Kineto copies from record_param_comms."""
    return {
        "rank": rank, "kind": "kernel", "name": kernel or "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ts_ns": ts, "dur_ns": dur, "external_id": ext, "step": step, "collective": op, "pg_name": pg,
        "pg_ranks": list(ranks), "group_size": len(ranks), "seq": seq, "in_nelems": nel, "out_nelems": nel,
        "dtype": dtype, "src_rank": src, "dst_rank": dst, "device": 0, "stream": 20,
    }  # fmt: skip


def meta(ranks, hosts=None, pg_config=None):
    rows = []
    for r in ranks:
        rows.append(
            {
                "rank": r,
                "host_name": (hosts or {}).get(r),
                "pg_config_json": json.dumps(pg_config) if pg_config is not None else None,
            }
        )
    return table_from_rows(rows, schema.METADATA)


@pytest.mark.parametrize(
    ("raw", "op"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "allreduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "allgather"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reducescatter"),
        ("ncclDevKernel_SendRecv", "sendrecv"),
        ("_allgather_base", "allgather"),
        ("reduce_scatter_tensor_coalesced", "reducescatter"),
        ("all_to_allv", "alltoall"),
        ("c10d::allreduce_", "allreduce"),
        ("c10d::recv_", "recv"),
        ("c10d::send", "send"),
        ("gloo:all_reduce", "allreduce"),
        ("gloo:broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("reduce", "reduce"),
        ("aten::mm", None),
        (None, None),
    ],
)
def test_normalize_op(raw, op):
    assert C.normalize_op(raw) == op


def test_busbw_factors_follow_nccl_tests():
    assert C.busbw_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    assert C.busbw_factor("allgather", 4) == pytest.approx(3 / 4)
    assert C.busbw_factor("reducescatter", 2) == pytest.approx(1 / 2)
    assert C.busbw_factor("alltoall", 4) == pytest.approx(3 / 4)
    assert C.busbw_factor("broadcast", 8) == 1.0
    assert C.busbw_factor("send", 2) == 1.0


def test_gpu_rows_take_enqueue_from_record_param_comms_and_fill_missing_args():
    rows = [
        # rank 0: kernel with args, linked cpu op by External id
        nccl(0, 1_000, 500, seq=1, ext=7),
        {
            "rank": 0,
            "kind": "cpu_op",
            "name": "record_param_comms",
            "ts_ns": 1_795_970_240_278_990_001,  # epoch-sized: must stay exact
            "dur_ns": 30,
            "external_id": 7,
            "collective": "allreduce",
            "seq": 1,
            "pg_name": "0",
        },
        # rank 1: kernel without args (older Kineto); everything comes from the cpu op
        {
            "rank": 1,
            "kind": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "ts_ns": 1_200,
            "dur_ns": 300,
            "external_id": 9,
            "step": 0,
            "device": 0,
        },
        {
            "rank": 1,
            "kind": "cpu_op",
            "name": "record_param_comms",
            "ts_ns": 250,
            "dur_ns": 30,
            "external_id": 9,
            "collective": "allreduce",
            "seq": 1,
            "pg_name": "0",
            "pg_ranks": [0, 1],
            "group_size": 2,
            "in_nelems": 1000,
            "out_nelems": 1000,
            "dtype": "Float",
        },
        {"rank": 1, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 100, "device": 0},
        # rank 2: no linked cpu op at all; epoch-sized timestamps must stay exact
        nccl(2, 1_795_970_240_278_991_403, 777, seq=1, ranks=(0, 1, 2), ext=None),
    ]
    coll = C.collectives_from_events(events_table(rows))
    r2 = [r for r in coll.to_pylist() if r["rank"] == 2]
    assert r2[0]["start_ns"] == 1_795_970_240_278_991_403 and r2[0]["end_ns"] == 1_795_970_240_278_992_180
    assert r2[0]["enqueue_ns"] is None
    coll = coll.filter(pc.not_equal(coll["rank"], 2))
    assert coll.schema.equals(schema.COLLECTIVES)
    got = {r["rank"]: r for r in coll.to_pylist()}
    assert sorted(got) == [0, 1]
    assert (
        got[0]["enqueue_ns"] == 1_795_970_240_278_990_001
        and got[0]["start_ns"] == 1_000
        and got[0]["end_ns"] == 1_500
    )
    assert got[1]["enqueue_ns"] == 250 and got[1]["seq"] == 1 and got[1]["pg_name"] == "0"
    assert got[1]["pg_ranks"] == [0, 1] and got[1]["group_size"] == 2
    for r in (0, 1):
        assert got[r]["op"] == "allreduce" and got[r]["bytes"] == 4000 and got[r]["source"] == "kineto"
        assert got[r]["order"] == 0 and got[r]["is_p2p"] is False


def test_match_by_seq_and_type_mismatch_finding():
    rows = [nccl(r, 100 * s + r, 50, seq=s) for r in (0, 1) for s in (1, 2, 3)]
    rows[-1] = nccl(1, 303, 50, seq=3, op="allgather", kernel="ncclDevKernel_AllGather_RING_LL")
    coll = C.collectives_from_events(events_table(rows))
    df, findings = C.match_with_findings(coll)
    by = df.groupby("instance")["rank"].apply(sorted)
    assert len(by) == 3 and all(v == [0, 1] for v in by)
    assert [f["code"] for f in findings] == ["COLLECTIVE_MISMATCH"]
    assert findings[0]["severity"] == "error" and "allgather" in findings[0]["message"]


def test_match_by_order_without_seq_and_count_mismatch():
    g = (0, 1, 2)
    rows = [nccl(r, 100 * k + r, 50, ranks=g) for r in g for k in range(3)]
    rows.append(nccl(1, 900, 50, ranks=g))  # rank 1 issued one more allreduce on the same group
    coll = C.collectives_from_events(events_table(rows))
    df, findings = C.match_with_findings(coll)
    sizes = df.groupby("instance").size().sort_values().tolist()
    assert sizes == [1, 3, 3, 3]
    assert findings and findings[0]["code"] == "COLLECTIVE_MISMATCH" and findings[0]["ranks"] == [1]
    assert "rank 1 issued 4" in findings[0]["message"] and "peers issued 3" in findings[0]["message"]
    # two ranks, one count each: the rank that issued fewer is named (a call went missing)
    two = [x for x in rows if x["rank"] in (0, 1)]
    _, f2 = C.match_with_findings(C.collectives_from_events(events_table(two)))
    assert f2[0]["ranks"] == [0] and "rank 0 issued 3 while its peers issued 4" in f2[0]["message"]


def test_agreement_check_sees_both_kinds_of_mismatch():
    g = (0, 1, 2)
    rows = [nccl(r, 100 * k + r, 50, ranks=g) for r in g for k in range(3)]
    df, findings = C.match_with_findings(C.collectives_from_events(events_table(rows)))
    cols = ["instance", "op", "rank", "seq", "group_key"]
    assert findings == [] and C._agree(df[cols])
    extra = rows + [nccl(1, 900, 50, ranks=g)]  # a count mismatch
    df, findings = C.match_with_findings(C.collectives_from_events(events_table(extra)))
    assert not C._agree(df[cols]) and [f["severity"] for f in findings] == ["warning"]
    seq = [nccl(r, 100 * s + r, 50, seq=s) for r in (0, 1) for s in (1, 2)]
    df, _ = C.match_with_findings(C.collectives_from_events(events_table(seq)))
    assert C._agree(df[cols])
    other = df[cols].assign(op=["allreduce"] * (len(df) - 1) + ["allgather"])  # an instance with two ops
    assert not C._agree(other)
    assert not C._agree(df[cols].assign(op=[None] + ["allreduce"] * (len(df) - 1)))  # null: pandas decides


def test_p2p_matched_by_src_dst_order():
    k = "ncclDevKernel_SendRecv"
    rows = [
        nccl(0, 100, 10, op="send", dst=1, kernel=k, ranks=(0, 1)),
        nccl(0, 200, 10, op="send", dst=2, kernel=k, ranks=(0, 2)),
        nccl(0, 300, 10, op="send", dst=1, kernel=k, ranks=(0, 1)),
        nccl(1, 150, 10, op="recv", src=0, kernel=k, ranks=(0, 1)),
        nccl(1, 310, 10, op="recv", src=0, kernel=k, ranks=(0, 1)),
        nccl(2, 205, 10, op="recv", src=0, kernel=k, ranks=(0, 2)),
    ]
    coll = C.collectives_from_events(events_table(rows))
    df, findings = C.match_with_findings(coll)
    assert findings == []
    pairs = df.sort_values("start_ns").groupby("instance")["start_ns"].apply(list).tolist()
    assert sorted(pairs) == [[100, 150], [200, 205], [300, 310]]
    assert set(df["peer"].astype(int)) == {0, 1, 2}


def test_clock_offsets_recovered_per_host_and_robust_to_an_outlier():
    # 4 ranks on 2 hosts; host B's clock runs 2.5 ms ahead. Ends coincide up to a few hundred ns.
    off_b = 2_500_000
    rng = np.random.default_rng(3)
    rows = []
    for s in range(20):
        base = 1_000_000 * s
        arrive = base + rng.integers(0, 50_000, 4)
        end = base + 80_000
        for r in range(4):
            shift = off_b if r >= 2 else 0
            e = end + int(rng.integers(0, 300)) + (400_000 if (s == 5 and r == 3) else 0)  # one bad end
            rows.append(nccl(r, int(arrive[r]) + shift, e - int(arrive[r]), seq=s, ranks=(0, 1, 2, 3)))
    coll = C.collectives_from_events(events_table(rows))
    df, _ = C.match_with_findings(coll)
    md = meta(range(4), hosts={0: "a", 1: "a", 2: "b", 3: "b"})
    clock = C.clock_offsets(df, md)
    assert clock.offsets_ns[0] == clock.offsets_ns[1] == 0
    assert clock.offsets_ns[2] == clock.offsets_ns[3]
    assert abs(clock.offsets_ns[2] - off_b) < 400
    f = C.clock_findings(clock, 100_000)
    assert [x["code"] for x in f] == ["CLOCK_SKEW"] and f[0]["ranks"] == [2, 3]
    assert f[0]["max_skew_ms"] == pytest.approx(2.5, abs=0.001)
    # same host everywhere: no offsets at all
    same = C.clock_offsets(df, meta(range(4), hosts=dict.fromkeys(range(4), "a")))
    assert set(same.offsets_ns.values()) == {0} and C.clock_findings(same, 100_000) == []


def test_wait_transfer_skew_blame_and_busbw():
    # arrivals 0, 10, 30 (ns x1000); all end at 50: transfer 20 each; waits 30, 20, 0
    rows = [
        nccl(r, a * 1000, (50 - a) * 1000, seq=1, ranks=(0, 1, 2), nel=3000)
        for r, a in enumerate((0, 10, 30))
    ]
    df, _ = C.match_with_findings(C.collectives_from_events(events_table(rows)))
    w = WT.wait_transfer(df, {0: 0, 1: 0, 2: 0}).sort_values("rank")
    assert w["transfer_ns"].tolist() == [20_000] * 3
    assert w["wait_ns"].tolist() == [30_000, 20_000, 0]
    assert w["arrival_skew_ns"].tolist() == [30_000] * 3
    assert w["lag_ns"].tolist() == [0, 10_000, 30_000]
    assert w["is_last"].tolist() == [False, False, True]
    assert w["blame_ns"].tolist() == [0, 0, 20_000]
    algbw = 12_000 / 20_000  # bytes / ns = GB/s
    assert w["algbw_gbps"].tolist() == pytest.approx([algbw] * 3)
    assert w["busbw_gbps"].tolist() == pytest.approx([algbw * 4 / 3] * 3)


def test_wait_transfer_uses_aligned_starts():
    # rank 1's clock is 1 ms ahead: raw starts say it arrived late, aligned starts say it arrived first
    rows = [nccl(0, 10_000, 20_000, seq=1), nccl(1, 1_000_000 + 5_000, 25_000, seq=1)]
    df, _ = C.match_with_findings(C.collectives_from_events(events_table(rows)))
    w = WT.wait_transfer(df, {0: 0, 1: 1_000_000}).sort_values("rank")
    assert w["is_last"].tolist() == [True, False]
    assert w["wait_ns"].tolist() == [0, 5_000] and w["transfer_ns"].tolist() == [20_000] * 2


def test_gloo_pairs_c10d_with_gloo_and_infers_groups_and_peers():
    # 4 CPU ranks, dp groups {0,1} and {2,3} allreduce at different times; pipeline pairs 0->2, 1->3.
    rows = []

    base = 1_795_970_240_278_991_403  # real epoch ns: exact through every merge (float64 would round)

    def op(rank, name, kind, ts, dur, tid):
        rows.append(
            {
                "rank": rank,
                "kind": kind,
                "name": name,
                "ts_ns": base + ts,
                "dur_ns": dur,
                "tid": tid,
                "step": 1,
            }
        )

    for r in range(4):
        op(r, "ProfilerStep#1", "user_annotation", 0, 10_000_000, 100 + r)
    for k, t in enumerate((1_000_000, 4_000_000)):
        for src, dst in ((0, 2), (1, 3)):
            j = 7_000 * src
            op(src, "c10d::send", "cpu_op", t + j, 50_000, 100 + src)
            op(src, "gloo:send", "user_annotation", t + j + 50_000, 200_000, 100 + src)
            op(dst, "c10d::recv_", "cpu_op", t - 300_000 + j, 20_000, 100 + dst)
            op(dst, "gloo:recv", "user_annotation", t - 280_000 + j, 530_000 + k, 100 + dst)
    # a gloo annotation whose c10d call fell before the profiling window (unpaired: kept, times exact)
    op(0, "gloo:broadcast", "user_annotation", 9_000_001, 1_000, 900)
    for grp, t in (((0, 1), 6_000_000), ((2, 3), 8_000_000)):
        for i, r in enumerate(grp):
            op(r, "c10d::allreduce_", "cpu_op", t + 100_000 * i, 40_000, 100 + r)
            op(
                r,
                "gloo:all_reduce",
                "user_annotation",
                t + 100_000 * i + 10_000,
                900_000 - 100_000 * i,
                900 + r,
            )
    ev = events_table(rows)
    groups = ([0, 1, 2, 3], [0, 1], [2, 3], [0, 2], [1, 3], [0, 3])
    cfg = [{"pg_name": str(i), "ranks": g} for i, g in enumerate(groups)]
    coll = C.collectives_from_events(ev)
    assert coll.num_rows == 4 * 2 + 4 + 1
    bc = [r for r in coll.to_pylist() if r["op"] == "broadcast"]
    assert bc[0]["start_ns"] == base + 9_000_001 and bc[0]["end_ns"] == base + 9_001_001
    ar = [r for r in coll.to_pylist() if r["op"] == "allreduce"]
    # arrival = the c10d call; end = the end of the gloo work
    r1 = next(r for r in ar if r["rank"] == 1)
    assert r1["start_ns"] == r1["enqueue_ns"] == base + 6_100_000
    assert r1["end_ns"] == base + 6_110_000 + 800_000
    df, findings = C.match_with_findings(coll, meta(range(4), pg_config=cfg))
    assert findings == []
    groups = df[df["op"] == "allreduce"].groupby("instance")["rank"].apply(sorted).tolist()
    assert sorted(groups) == [[0, 1], [2, 3]]
    peers = dict(
        zip(df.loc[df["op"] == "send", "rank"].astype(int), df.loc[df["op"] == "send", "peer"].astype(int))
    )
    assert peers == {0: 2, 1: 3}
    sends = df[df["is_p2p"]].groupby("instance")["rank"].apply(sorted).tolist()
    assert sorted(sends) == [[0, 2], [0, 2], [1, 3], [1, 3]]
    # without pg_config the allreduce ranks form one default group, as documented
    df2, _ = C.match_with_findings(coll, None)
    assert df2[df2["op"] == "allreduce"].groupby("instance").size().tolist() == [4]


def test_exposed_split_adds_up_exactly():
    # rank 0: compute [0,100), allreduce [100,300) waiting until 250 (rank 1 arrives then), compute [300,350)
    # rank 1: compute [0,250), allreduce [250,300)
    rows = [
        {"rank": 0, "kind": "user_annotation", "name": "ProfilerStep#0", "ts_ns": 0, "dur_ns": 400, "tid": 1},
        {"rank": 1, "kind": "user_annotation", "name": "ProfilerStep#0", "ts_ns": 0, "dur_ns": 400, "tid": 1},
        {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 100, "device": 0, "step": 0},
        {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 300, "dur_ns": 50, "device": 0, "step": 0},
        # an overlapping compute kernel on another stream hides [120, 150) of the wait
        {"rank": 0, "kind": "kernel", "name": "gemm2", "ts_ns": 120, "dur_ns": 30, "device": 0, "step": 0},
        {"rank": 1, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 250, "device": 0, "step": 0},
        nccl(0, 100, 200, seq=1),
        nccl(1, 250, 50, seq=1),
    ]
    ev = events_table(rows)
    sets = class_sets(ev)
    bd = breakdown(ev, sets=sets)
    df, _ = C.match_with_findings(C.collectives_from_events(ev))
    df = WT.wait_transfer(df, {0: 0, 1: 0})
    split = C.exposed_split(df, bd, sets).to_pylist()
    got = {r["rank"]: r for r in split}
    assert got[0]["exposed_comm_ns"] == 170 and got[0]["exposed_wait_ns"] == 120
    assert got[0]["exposed_transfer_ns"] == 50
    assert (
        got[1]["exposed_comm_ns"] == 50
        and got[1]["exposed_wait_ns"] == 0
        and got[1]["exposed_transfer_ns"] == 50
    )
    exp = {r["rank"]: r["exposed_comm_ns"] for r in bd.to_pylist()}
    for r in split:
        assert r["exposed_wait_ns"] + r["exposed_transfer_ns"] == exp[r["rank"]]


def test_empty_events_give_empty_tables():
    ev = events_table([{"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 5, "device": 0}])
    coll = C.collectives_from_events(ev)
    assert coll.num_rows == 0 and coll.schema.equals(schema.COLLECTIVES)
    matched = C.match(coll)
    assert matched.num_rows == 0
    assert isinstance(matched, pa.Table)


def test_op_falls_back_to_the_kernel_name_then_other():
    rows = [
        nccl(0, 100, 10, op="coalesced", kernel="ncclDevKernel_SendRecv"),
        nccl(0, 200, 10, op="mystery_op", kernel="ncclDevKernel_Generic"),
        {
            "rank": 0,
            "kind": "kernel",
            "name": "ncclDevKernel_Generic",
            "ts_ns": 300,
            "dur_ns": 10,
            "device": 0,
        },
    ]
    coll = C.collectives_from_events(events_table(rows))
    assert coll.column("op").cast(pa.string()).to_pylist() == ["sendrecv", "other"]
    assert coll.column("is_p2p").to_pylist() == [True, False]


def test_order_matching_counts_within_steps_so_a_cut_call_only_affects_its_step():
    # no Seq; rank 1's trace lost the first all-reduce of step 0 (cut at the window edge)
    rows = [nccl(r, 1000 * (10 * s + k) + r, 50, step=s) for r in (0, 1) for s in (0, 1) for k in range(3)]
    rows = [x for x in rows if not (x["rank"] == 1 and x["step"] == 0 and x["ts_ns"] == 1001)]
    df, findings = C.match_with_findings(C.collectives_from_events(events_table(rows)))
    step1 = df[df["step"] == 1].groupby("instance")["start_ns"].apply(sorted).tolist()
    assert sorted(step1) == [[10_000, 10_001], [11_000, 11_001], [12_000, 12_001]]
    assert [f["code"] for f in findings] == ["COLLECTIVE_MISMATCH"] and findings[0]["ranks"] == [1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_wait_transfer_invariants(instances):
    """Random instances (arrival, duration per participant): the split is a partition of each duration."""
    rows = []
    for seq, parts in enumerate(instances):
        ranks = tuple(range(len(parts)))
        for r, (arrive, dur) in enumerate(parts):
            rows.append(nccl(r, arrive, dur, seq=seq, ranks=ranks))
    df, _ = C.match_with_findings(C.collectives_from_events(events_table(rows)))
    w = WT.wait_transfer(df, {})
    assert (w["wait_ns"] >= 0).all() and (w["transfer_ns"] >= 0).all()
    assert ((w["wait_ns"] + w["transfer_ns"]) == (w["end_ns"] - w["start_ns"]).astype("int64")).all()
    assert (w["arrival_skew_ns"] >= 0).all() and (w["blame_ns"] >= 0).all()
    assert (w["blame_ns"] <= w["arrival_skew_ns"]).all() and (w["lag_ns"] <= w["arrival_skew_ns"]).all()
    last = w.groupby("instance")["is_last"].sum()
    size = w.groupby("instance").size()
    assert ((last == 1) | (size == 1)).all() and (last[size == 1] == 0).all()


# ----------------------------------------------------------------------------------------------------
# vectorised helpers against the per-row Python they replace
# ----------------------------------------------------------------------------------------------------
def test_list_tuples_matches_per_row_tuples():
    col = pa.chunked_array(
        [
            pa.array([[0, 1], None, [], [0, 1]], pa.list_(pa.int32())),
            pa.array([[3], [0, 1], None], pa.list_(pa.int32())),
        ]
    )
    got = FC.list_tuples(col)
    assert got.dtype == object
    assert list(got) == [(0, 1), None, (), (0, 1), (3,), (0, 1), None]
    assert all(type(x) is int for t in got if t for x in t)
    # a slice (offsets into a longer values buffer) and wider / narrower element types: the same lists
    wide = pa.array([[9], [2**40, -1], None, [], [2**40, -1], [7, 7]], pa.list_(pa.int64())).slice(1, 4)
    assert list(FC.list_tuples(wide)) == [(2**40, -1), None, (), (2**40, -1)]
    narrow = pa.array([[1, 2], [0, 1], [1, 2], [2, 1]], pa.list_(pa.uint8()))
    assert list(FC.list_tuples(narrow)) == [(1, 2), (0, 1), (1, 2), (2, 1)]
    # null items inside a list: the per-row path
    odd = pa.array([[1, None], [2]], pa.list_(pa.int64()))
    assert list(FC.list_tuples(odd)) == [(1, None), (2,)]


def test_ranks_tuples_and_list_array():
    cells = [(0, 1), None, [2, 3], np.array([4]), float("nan"), (0, 1), "x"]
    want = [FC.ranks_tuple(v) for v in cells]  # the reference: one row at a time
    assert list(FC.ranks_tuples(cells)) == want == [(0, 1), None, (2, 3), (4,), None, (0, 1), None]
    hashable = [(0, 1), None, (5,), (0, 1), float("nan")]
    typ = pa.list_(pa.int32())
    assert FC.ranks_list_array(hashable, typ).equals(pa.array([FC.ranks_tuple(v) for v in hashable], typ))
    assert FC.ranks_list_array(cells, typ).to_pylist() == [list(t) if t is not None else None for t in want]
    assert FC.ranks_list_array([None, None], typ).to_pylist() == [None, None]


def test_per_distinct_calls_once_per_value_tuple():
    import pandas as pd

    calls = []

    def fn(a, b):
        calls.append((a, b))
        return f"{a}/{b}"

    a = pd.Series(["x", "y", "x", None, "x", None], dtype=object)
    b = np.array([1, 1, 1, 2, 2, 2])
    got = FC.per_distinct(fn, a, b)
    assert list(got) == ["x/1", "y/1", "x/1", "None/2", "x/2", "None/2"]
    assert len(calls) == 4  # (x,1) (y,1) (None,2) (x,2)
    assert list(FC.row_codes(a, b)) == [0, 1, 0, 2, 3, 2]
    assert len(FC.per_distinct(fn, a[:0], b[:0])) == 0


def test_int64_array_exact_with_nulls():
    big = 1_700_000_000_123_456_789  # a ns timestamp float64 would round
    col = pa.chunked_array([pa.array([big, None], pa.int64()), pa.array([-3], pa.int64())])
    got = FC.int64_array(col)
    assert str(got.dtype) == "Int64"
    assert got.tolist()[0] == big and got.tolist()[2] == -3 and got.isna().tolist() == [False, True, False]


def test_exposed_split_per_rank_slices_match_reference():
    """Ranks interleaved in the breakdown and the collectives: each rank's windows get its own waits."""
    import pandas as pd

    from tracelens.analyze.core import intervals as iv
    from tracelens.schema import RankSets

    def ivs(*pairs):
        return iv.union(np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))

    # rank 1: comm [0,100) exposed, waits [10,40); rank 0: comm [50,150), compute [50,60), waits [70,90) + [140,200)
    sets = {
        0: RankSets(0, "", ivs((50, 60)), ivs((50, 150)), ivs()),
        1: RankSets(1, "", ivs(), ivs((0, 100)), ivs()),
    }
    bd = pa.table(
        {
            "rank": pa.array([1, 0, 1, 0], pa.int32()),
            "step": pa.array([0, 0, 1, 1], pa.int32()),
            "window_start_ns": [0, 0, 50, 100],
            "window_end_ns": [50, 100, 100, 200],
            "exposed_comm_ns": [50, 40, 50, 50],
        }
    )
    df = pd.DataFrame(
        {
            "rank": [0, 1, 0],
            "start_ns": pd.array([70, 10, 140], dtype="Int64"),
            "end_ns": pd.array([95, 60, 210], dtype="Int64"),
            "wait_ns": [20, 30, 60],
            "n_participants": [2, 2, 2],
            "n_expected": pd.array([2, 2, 2], dtype="Int64"),
        }
    )
    got = C.exposed_split(df, bd, sets).to_pylist()
    # by hand: rank 0 exposed = [60,150); waits [70,90) and [140,200) -> step 0 [0,100): 20; step 1 [100,200): 10
    # rank 1 exposed = [0,100); wait [10,40) -> step 0 [0,50): 30; step 1 [50,100): 0
    assert got == [
        {"rank": 0, "step": 0, "exposed_comm_ns": 40, "exposed_wait_ns": 20, "exposed_transfer_ns": 20},
        {"rank": 0, "step": 1, "exposed_comm_ns": 50, "exposed_wait_ns": 10, "exposed_transfer_ns": 40},
        {"rank": 1, "step": 0, "exposed_comm_ns": 50, "exposed_wait_ns": 30, "exposed_transfer_ns": 20},
        {"rank": 1, "step": 1, "exposed_comm_ns": 50, "exposed_wait_ns": 0, "exposed_transfer_ns": 50},
    ]
    # rank 0's second collective has no peer in the traces: its step's split is unknown (null), not 0
    df2 = df.assign(n_participants=[2, 2, 1])
    got2 = C.exposed_split(df2, bd, sets).to_pylist()
    assert got2[1]["exposed_wait_ns"] is None and got2[1]["exposed_transfer_ns"] is None
    assert got2[0]["exposed_wait_ns"] == 20 and got2[2]["exposed_wait_ns"] == 30


def test_cumcount_counts_earlier_calls_of_the_same_rank_and_key():
    """Position among the rank's rows of the same key in (rank, start) order: ties keep table order and
    a row without a start comes last."""
    import pandas as pd

    from tracelens.analyze.comm.collectives import _cumcount

    rank = np.array([1, 0, 0, 1, 0, 0, 1])
    key = np.array([5, 5, 5, 5, 7, 5, 5])
    start = pd.Series([30, 20, 10, None, 0, 10, 30], dtype="Int64")
    # rank 0, key 5: rows 2 (t=10), 5 (t=10, later in the table), 1 (t=20); key 7: row 4
    # rank 1, key 5: rows 0 (t=30), 6 (t=30), 3 (no start)
    assert _cumcount(rank, key, start).tolist() == [0, 2, 0, 2, 0, 1, 1]
    tmp = pd.DataFrame({"rank": rank, "k": key, "t": start}).sort_values(["rank", "t"], kind="stable")
    assert _cumcount(rank, key, start).tolist() == tmp.groupby(["rank", "k"]).cumcount().sort_index().tolist()


def test_row_codes_of_many_wide_columns_and_string_dtype():
    """Tuple codes in order of first appearance, also when the columns' value counts multiply past int64
    (re-coded on the way) and for pandas string columns (nulls one value)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    cols = [rng.integers(0, 70_000, 5_000) for _ in range(7)]
    cols[2] = cols[0].copy()  # repeated tuples too
    cols[3][::2] = 7
    want = pd.factorize(pd.Series(list(zip(*cols))))[0]
    assert FC.row_codes(*cols).tolist() == want.tolist()
    s = pd.Series(["a", None, "b", "a", None], dtype="str")
    o = pd.Series(["a", None, "b", "a", None], dtype=object)
    assert FC.row_codes(s, np.zeros(5)).tolist() == FC.row_codes(o, np.zeros(5)).tolist() == [0, 1, 2, 0, 1]


def _bare_allreduce(rank, a, pg="0"):
    """An all-reduce kernel of 2 ranks that records no group size (older PyTorch, sampled traces)."""
    row = nccl(rank, a * 1000, (50 - a) * 1000, seq=1, pg=pg, ranks=(), nel=3000)
    row["group_size"] = None
    row["pg_ranks"] = None
    return row


def _meta_ws(ranks, world, pg_config=None):
    rows = [
        {
            "rank": r,
            "world_size": world,
            "pg_config_json": None if pg_config is None else json.dumps(pg_config),
        }
        for r in ranks
    ]
    return table_from_rows(rows, schema.METADATA)


@pytest.mark.parametrize(
    ("group_size", "pg_config", "world", "n", "source"),
    [
        (8, [{"pg_name": "0", "pg_size": 16, "ranks": []}], 128, 8, "group_size"),  # the call says it
        (None, [{"pg_name": "0", "pg_size": 16, "ranks": []}], 128, 16, "pg_size"),  # its group's pg_size
        (None, None, 128, 128, "world_size"),  # only distributedInfo's world size
        (None, None, None, 2, "traced_ranks"),  # nothing stated: the traced participants
    ],
)
def test_bus_bandwidth_n_is_the_stated_group_size_of_a_sampled_job(group_size, pg_config, world, n, source):
    # 2 of the job's ranks traced; transfer 20 µs of 12,000 bytes after the last arrival at 30 µs
    rows = [_bare_allreduce(r, a) for r, a in enumerate((0, 30))]
    for r in rows:
        r["group_size"] = group_size
    md = _meta_ws([0, 1], world, pg_config)
    df, _ = C.match_with_findings(C.collectives_from_events(events_table(rows)), md)
    w = WT.wait_transfer(df, {0: 0, 1: 0})
    assert w["bus_n"].tolist() == [n, n]
    assert w["bus_n_from"].tolist() == [source, source]
    algbw = 12_000 / 20_000
    assert w["busbw_gbps"].tolist() == pytest.approx([algbw * 2 * (n - 1) / n] * 2)
    t = WT.to_table(w)
    assert t.column("bus_n").to_pylist() == [n, n] and t.column("bus_n_from").to_pylist() == [source] * 2
