"""Axes of process groups from structure and traffic (tracelens/analyze/layout/groups.py), interleaved-schedule
arithmetic (analyze/pipeline/schedule_infer.py) and communication per layer type (analyze/comm/comm_by_layer.py), on
hand-built groups, records and spans whose answers are known by construction."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tracelens.analyze.comm.comm_by_layer import comm_by_layer_type, sizes_from_flight_recorder
from tracelens.analyze.layout.groups import GroupInfo, name_axis, structural_axes
from tracelens.analyze.pipeline.schedule_infer import expected_warmup


def _grid_groups(tp: int, dp: int, pp: int) -> dict[str, list[tuple[int, ...]]]:
    """Megatron tp-dp-pp groups: rank = t + tp*(d + dp*s)."""
    r = lambda t, d, s: t + tp * (d + dp * s)  # noqa: E731
    return {
        "tp": [tuple(r(t, d, s) for t in range(tp)) for d in range(dp) for s in range(pp)],
        "dp": [tuple(r(t, d, s) for d in range(dp)) for t in range(tp) for s in range(pp)],
        "pp": [tuple(r(t, d, s) for s in range(pp)) for t in range(tp) for d in range(dp)],
    }


@pytest.mark.parametrize(
    "desc,axis",
    [
        ("tp_stage0_dp1", "tp"),
        ("dp_stage0_tp1", "dp"),
        ("pp_dp0_tp0", "pp"),
        ("cp_dp0", "cp"),
        ("dp_stage1", "dp"),
        ("TENSOR_MODEL_PARALLEL_GROUP", "tp"),
        ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
        ("dp_shard", "dp"),
        ("EXPERT_MODEL_PARALLEL_GROUP", None),
        ("default_pg", None),
        (None, None),
    ],
)
def test_name_axis_reads_the_axis_not_the_coordinates(desc, axis):
    assert name_axis(desc) == axis


def _infos(groups: dict[str, list[tuple[int, ...]]], calls: dict[str, Counter], names: bool) -> dict:
    out = {}
    for axis, gs in groups.items():
        for i, g in enumerate(gs):
            gi = GroupInfo(tuple(sorted(g)), names={f"grp{i}x"} if not names else {f"{axis}_x{i}"})
            gi.calls = Counter(calls.get(axis, {}))
            gi.members_seen = set(g) if calls.get(axis) else set()
            out[gi.ranks] = gi
    return out


def test_tp_pp_dp_from_traffic_alone_with_meaningless_names():
    groups = _grid_groups(2, 2, 2)
    calls = {"tp": Counter(reduce=256), "dp": Counter(reduce=8)}  # pp groups carry nothing (gloo P2P)
    by_axis, ev = structural_axes(_infos(groups, calls, names=False), 8, any_p2p=True)
    for a in ("tp", "dp", "pp"):
        assert by_axis[a] == set(groups[a]), a
        assert ev[a]["basis"] == "traffic"
    assert (ev["tp"]["stride"], ev["dp"]["stride"], ev["pp"]["stride"]) == (1, 2, 4)


def test_traffic_beats_a_misleading_name():
    groups = _grid_groups(2, 2, 2)
    infos = _infos(groups, {"tp": Counter(reduce=256), "dp": Counter(reduce=8)}, names=True)
    for g in groups["tp"]:
        infos[tuple(sorted(g))].names = {"dp_wrong"}
    by_axis, ev = structural_axes(infos, 8, any_p2p=True)
    assert by_axis["tp"] == set(groups["tp"]) and ev["tp"]["names_agree"] is False


def test_all_to_all_family_is_cp_and_lone_reducer_is_dp():
    cp = [(0, 1), (2, 3), (4, 5), (6, 7)]
    dp = [(0, 2, 4, 6), (1, 3, 5, 7)]
    infos = _infos({"cp": cp, "dp": dp}, {"cp": Counter(a2a=128), "dp": Counter(reduce=8)}, names=False)
    by_axis, ev = structural_axes(infos, 8, any_p2p=False)
    assert by_axis == {"cp": set(cp), "dp": set(dp)}
    assert "all_to_all" in ev["cp"]["traffic"]


def test_without_traffic_names_label_the_families():
    groups = _grid_groups(2, 2, 2)
    by_axis, ev = structural_axes(_infos(groups, {}, names=True), 8, any_p2p=True)
    assert by_axis["tp"] == set(groups["tp"]) and ev["tp"]["basis"] == "names"


def test_overlapping_or_irregular_groups_are_not_a_family():
    infos = {g: GroupInfo(g, calls=Counter(reduce=5), members_seen=set(g)) for g in [(0, 1), (1, 2), (0, 3)]}
    by_axis, _ = structural_axes(infos, 4, any_p2p=False)
    assert by_axis == {}


def test_megatron_interleaved_warmup_counts():
    assert [expected_warmup(4, s, 2, 8) for s in range(4)] == [10, 8, 6, 4]
    assert [expected_warmup(4, s, 1, 8) for s in range(4)] == [3, 2, 1, 0]
    assert expected_warmup(4, 0, 2, 2) == 4  # capped at v*m


def _coll(rows):
    df = pd.DataFrame(rows, columns=["rank", "op", "enqueue_ns", "start_ns", "end_ns", "step", "bytes"])
    for c in ("in_nelems", "out_nelems", "dtype", "pg_name", "pg_desc"):
        df[c] = None
    df["bytes"] = df["bytes"].astype(object)
    return df


def test_sizes_from_flight_recorder_by_contiguous_run_of_records():
    # recorder: 6 all-to-alls at t = 0,10,...,50 ms with sizes 100..600; profiled: the last 3 (+0.3 ms jitter)
    ms = 1_000_000
    fr = pa.table(
        {
            "rank": [0] * 6,
            "op": ["alltoall"] * 6,
            "enqueue_ns": [i * 10 * ms for i in range(6)],
            "bytes": [100 * (i + 1) for i in range(6)],
            "in_nelems": [25 * (i + 1) for i in range(6)],
            "out_nelems": [25 * (i + 1) for i in range(6)],
            "dtype": ["Float"] * 6,
            "pg_name": ["1"] * 6,
            "pg_desc": ["cp_dp0"] * 6,
        }
    )
    coll = _coll([[0, "alltoall", (30 + 10 * k) * ms + 300_000, None, None, 2, None] for k in range(3)])
    out = sizes_from_flight_recorder(coll, fr)
    assert list(out["bytes"]) == [400, 500, 600]
    assert list(out["pg_desc"]) == ["cp_dp0"] * 3
    assert set(out["size_source"]) == {"flight_recorder"}


def test_comm_attributed_to_the_enclosing_layer_type_and_backward_twins():
    spans = pa.table(
        {
            "rank": pa.array([0, 0], pa.int32()),
            "step": pa.array([0, 0], pa.int32()),
            "layer": pa.array([0, 1], pa.int32()),
            "module": ["linear_attention", "full_attention"],
            "backward": [False, False],
            "gpu_start_ns": pa.array([0, 100], pa.int64()),
            "gpu_end_ns": pa.array([90, 200], pa.int64()),
            "compute_ns": pa.array([50, 50], pa.int64()),
        }
    )
    # two forward all-to-alls inside full attention, two backward ones (outside every span), same size;
    # one all-reduce outside every span of a size no span holds: not attributed
    coll = _coll(
        [
            [0, "alltoall", 110, 110, 120, 0, 64],
            [0, "alltoall", 150, 150, 170, 0, 64],
            [0, "alltoall", 300, 300, 305, 0, 64],
            [0, "alltoall", 320, 320, 330, 0, 64],
            [0, "allreduce", 400, 400, 500, 0, 1024],
        ]
    )
    res = comm_by_layer_type(coll, spans, {0: 1})
    assert set(res) == {"full_attention"}
    rec = res["full_attention"]["alltoall"]
    assert rec["calls_per_step"] == 4 and rec["bytes_per_step"] == 256
    assert (rec["in_span_calls"], rec["inferred_calls"]) == (2, 2)
    assert rec["ms_per_step"] == pytest.approx((10 + 20 + 5 + 10) / 1e6)
    assert np.isfinite(rec["ms_per_step"])


def test_training_virtual_stages_and_schedule_in_tracelens_toml(tmp_path):
    from tracelens.config import parse_config, read_run_config
    from tracelens.errors import BadConfigError
    from tracelens.run_analysis import Options

    (tmp_path / "tracelens.toml").write_text('[training]\nschedule = "Interleaved"\nvirtual_stages = 2\n')
    opts = read_run_config(tmp_path)
    assert (opts["schedule"], opts["virtual_stages"]) == ("interleaved_1f1b", 2)  # the older spelling
    assert Options().merged_with_config(tmp_path).virtual_stages == 2
    with pytest.raises(BadConfigError):
        parse_config("[training]\nvirtual_stages = 0\n")
    with pytest.raises(BadConfigError):
        parse_config('[training]\nvirtual_stages = "two"\n')


def test_expected_bubble_uses_given_virtual_stages():
    from tracelens.analyze.pipeline.pipeline import expected_bubble_fraction

    assert expected_bubble_fraction(4, 8, "interleaved_1f1b", 2) == pytest.approx(3 / 19)
    assert expected_bubble_fraction(4, 8, "1f1b", 1) == pytest.approx(3 / 11)


def test_group_traffic_from_trace_events_with_list_ranks():
    """record_param_comms rows carry pg_ranks as a list column: each (group, op) counts its calls and the
    ranks that made them (the kernel copies of the same calls are not counted twice)."""
    from tracelens.analyze.layout.groups import collect_groups

    rows = []
    for rank in range(4):
        tp = [0, 1] if rank < 2 else [2, 3]
        for kind in ("cpu_op", "kernel"):
            rows += [(rank, "allreduce", tp, "tp", kind)] * 3
            rows += [(rank, "send", [rank % 2, rank % 2 + 2], "pp", kind)]
    rank, coll, pg_ranks, desc, kind = zip(*rows, strict=True)
    events = pa.table(
        {
            "rank": pa.array(rank, pa.int32()),
            "collective": pa.array(coll, pa.string()).dictionary_encode(),
            "pg_ranks": pa.array(pg_ranks, pa.list_(pa.int32())),
            "pg_desc": pa.array(desc, pa.string()),
            "kind": pa.array(kind, pa.string()).dictionary_encode(),
        }
    )
    groups = collect_groups([], events, None)
    assert set(groups) == {(0, 1), (2, 3), (0, 2), (1, 3)}
    assert groups[(0, 1)].calls == Counter({"reduce": 6}) and groups[(0, 1)].members_seen == {0, 1}
    assert groups[(0, 1)].names == {"tp"}
    assert groups[(1, 3)].calls == Counter({"p2p": 2}) and groups[(1, 3)].members_seen == {1, 3}


def test_event_groups_group_rows_by_exact_rank_lists_and_names():
    """One record per distinct (pg_ranks, collective, pg_desc) of the cpu ops, with its row count and ranks;
    lists that share a prefix, are a permutation or are empty stay apart; nulls read "nan"."""
    from tracelens.analyze.core.frame_cells import list_codes, list_tuples
    from tracelens.analyze.layout.groups import _event_groups

    lists = [[0, 1], [0, 1], [1, 0], [0, 1, 2], [0], [], [0, 1], [0, 1, 2], [0, 1]]
    table = pa.table(
        {
            "kind": pa.array(["cpu_op"] * 8 + ["kernel"]).dictionary_encode(),
            "pg_ranks": pa.array(lists, pa.list_(pa.int32())),
            "collective": pa.array(
                [
                    "allreduce",
                    "allreduce",
                    "allreduce",
                    None,
                    "send",
                    "barrier",
                    "allgather",
                    None,
                    "allreduce",
                ]
            ).dictionary_encode(),  # fmt: skip
            "pg_desc": pa.array(["tp", "tp", "tp", "w", None, None, "tp", "w", "tp"]).dictionary_encode(),
            "rank": pa.array([0, 1, 1, 2, 0, 3, 1, 0, 5], pa.int32()),
        }
    )
    got = _event_groups(table)
    assert got == [
        ((), "barrier", "nan", 1, {3}),
        ((0,), "send", "nan", 1, {0}),
        ((0, 1), "allgather", "tp", 1, {1}),
        ((0, 1), "allreduce", "tp", 2, {0, 1}),
        ((0, 1, 2), "nan", "w", 2, {0, 2}),
        ((1, 0), "allreduce", "tp", 1, {1}),
    ]
    codes, first = list_codes(table.column("pg_ranks").combine_chunks())
    assert codes.tolist() == [0, 0, 1, 2, 3, 4, 0, 2, 0] and first.tolist() == [0, 2, 3, 4, 5]
    with_null = pa.array([[0, 1], None, [], [0, 1], [1]], pa.list_(pa.int32()))
    assert list_tuples(with_null).tolist() == [(0, 1), None, (), (0, 1), (1,)]


def _pg_events(rows: list[tuple]) -> pa.Table:
    """schema.EVENTS rows from (rank, kind, pg_name, pg_desc, pg_ranks, group_size, collective) tuples."""
    from tracelens import schema

    keys = ("rank", "kind", "pg_name", "pg_desc", "pg_ranks", "group_size", "collective")
    return schema.table_from_rows(
        [dict(zip(keys, r), name="record_param_comms", ts_ns=i) for i, r in enumerate(rows)], schema.EVENTS
    )


def test_pg_rows_merge_equal_rows_into_their_first_with_their_count():
    """`pg_rows`: one row per distinct combination of what the grid inference reads, its first row (in row
    order) with the number of rows; rows without pg_ranks are left out; a null and "" or a null group size
    and a size stay apart; lists holding a null are kept one row each."""
    from tracelens.analyze.layout.groups import pg_rows

    tp, pp = [0, 1], [0, 2]
    rows = [
        (0, "cpu_op", "1", "tp", tp, 2, "allreduce"),
        (0, "kernel", "1", "tp", tp, 2, "allreduce"),
        (0, "cpu_op", "1", "tp", tp, 2, "allreduce"),
        (0, "cpu_op", "2", "pp", pp, 2, "send"),
        (0, "cpu_op", None, None, None, None, "barrier"),  # (no rank list: not a group row)
        (1, "cpu_op", "1", "tp", tp, 2, "allreduce"),
        (0, "cpu_op", "1", "tp", tp, None, "allreduce"),
        (0, "cpu_op", "1", "", tp, 2, "allreduce"),
        (0, "cpu_op", "1", None, tp, 2, "allreduce"),
        (0, "cpu_op", "1", "tp", [1, 0], 2, "allreduce"),
        (0, "cpu_op", "1", "tp", tp, 2, "allreduce"),
        (0, "cpu_op", "2", "pp", pp, 2, "send"),
    ]
    got = pg_rows(_pg_events(rows))
    assert got.column("rows").to_pylist() == [3, 1, 2, 1, 1, 1, 1, 1]
    keep = [0, 1, 3, 5, 6, 7, 8, 9]  # the first row of each
    want = [rows[i] for i in keep]
    assert [tuple(r.values())[:7] for r in got.drop_columns(["rows"]).to_pylist()] == [
        (r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in want
    ]
    with_null = _pg_events([(0, "cpu_op", "1", "tp", [0, None], 2, "allreduce")] * 2)
    assert pg_rows(with_null).column("rows").to_pylist() == [1, 1]
    assert pg_rows(_pg_events(rows[4:5])).num_rows == 0


def test_groups_from_pg_rows_equal_those_from_the_events():
    """collect_groups and the names read from the events (`groups.groups_from_events`) find the same from
    `pg_rows(events)` as from the events: calls counted once per op (the CPU rows), members, names."""
    from tracelens.analyze.layout.groups import collect_groups, pg_rows
    from tracelens.analyze.layout.groups import groups_from_events as _groups_from_events

    rows = []
    for rank in range(4):
        tp = [0, 1] if rank < 2 else [2, 3]
        pp = [rank % 2, rank % 2 + 2]
        for kind in ("cpu_op", "kernel"):
            rows += [(rank, kind, f"tp{tp[0]}", "tp", tp, 2, "allreduce")] * 3
            rows += [(rank, kind, f"pp{pp[0]}", "pp", pp, 2, "send")]
        rows += [(rank, "cpu_op", "0", "default_pg", [0, 1, 2, 3], 4, "barrier")]
    events = _pg_events(rows)
    pg = pg_rows(events)
    assert pg.num_rows == 4 * (2 * 2 + 1) and pg.column("rows").to_pylist()[:5] == [3, 1, 3, 1, 1]
    got = collect_groups([], None, None, pg)
    assert got == collect_groups([], events, None)
    assert got[(0, 1)].calls == Counter({"reduce": 6}) and got[(0, 1)].members_seen == {0, 1}
    assert got[(1, 3)].calls == Counter({"p2p": 2}) and got[(0, 1, 2, 3)].calls == Counter({"other": 4})
    assert _groups_from_events(None, pg) == _groups_from_events(events)
    assert [d for d, _ in _groups_from_events(events)] == ["tp", "pp", "default_pg"] * 4


@pytest.mark.parametrize("high", [3, 1000, 2**40])
def test_matrix_row_codes_group_equal_rows(high: int):
    """Equal rows share a code and unequal ones do not, through both ways (digits of one key, and the
    sort for columns too wide for one), against numpy's unique rows."""
    from tracelens.analyze.layout.groups import _matrix_row_codes

    rng = np.random.default_rng(7)
    for k in (1, 2, 5, 17):
        m = rng.integers(-high, high, (300, k))
        m = np.vstack([m, m[::3]])
        got = _matrix_row_codes(m)
        want = np.unique(m, axis=0, return_inverse=True)[1].reshape(-1)
        pairs = set(zip(got.tolist(), want.tolist()))
        assert len(pairs) == len(set(got.tolist())) == len(set(want.tolist())) > 1
    assert _matrix_row_codes(np.zeros((0, 3), np.int64)).size == 0
