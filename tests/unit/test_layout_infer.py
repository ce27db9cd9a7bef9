"""Rank grid: layouts, Megatron ordering, inference from process groups and P2P peers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_tables import events_table, megatron_groups, metadata_table

from tracelens.analyze.layout import (
    grid_for_run,
    grid_from_layout,
    infer_grid,
    name_axis,
    parse_layout,
    parse_order,
)
from tracelens.errors import BadConfigError


def test_parse_layout_and_errors():
    assert parse_layout("tp=4,pp=4,dp=2,cp=1") == {"tp": 4, "pp": 4, "dp": 2, "cp": 1}
    assert parse_layout("tp=2 pp=2") == {"tp": 2, "pp": 2, "dp": None, "cp": None}
    for bad in ("", "tp=0", "tp=2,tp=2", "xx=3", "tp=a"):
        with pytest.raises(BadConfigError):
            parse_layout(bad)


def test_parse_order():
    assert parse_order("tp-cp-dp-pp") == ("tp", "cp", "dp", "pp")
    assert parse_order("tp-cp-ep-dp-pp") == ("tp", "cp", "dp", "pp")
    assert parse_order("tp-dp") == ("tp", "dp", "cp", "pp")
    with pytest.raises(BadConfigError):
        parse_order("tp-tp-dp-pp")
    with pytest.raises(BadConfigError):
        parse_order("tp-xx")


def test_megatron_order_first_axis_fastest():
    g = grid_from_layout(16, tp=2, pp=4, dp=2, cp=1)
    # rank = tp + 2*(dp + 2*pp)
    assert g.coords[0] == (0, 0, 0, 0)
    assert g.coords[1] == (0, 0, 1, 0)
    assert g.coords[2] == (1, 0, 0, 0)
    assert g.coords[4] == (0, 1, 0, 0)
    assert g.coords[15] == (1, 3, 1, 0)
    assert g.stage_of(5) == 1
    assert g.ranks_of_stage(3) == [12, 13, 14, 15]
    assert g.pipelines()[0] == [0, 4, 8, 12]
    assert g.to_dict() == {"tp": 2, "pp": 4, "dp": 2, "cp": 1, "order": "tp-cp-dp-pp", "source": "config"}
    # pp fastest instead
    g2 = grid_from_layout(8, tp=2, pp=4, order="pp-tp-cp-dp")
    assert [g2.stage_of(r) for r in range(4)] == [0, 1, 2, 3]
    assert g2.coords[4] == (0, 0, 1, 0)


def test_layout_dp_fills_world_and_mismatch_errors():
    assert grid_from_layout(32, tp=4, pp=4).dp == 2
    with pytest.raises(BadConfigError):
        grid_from_layout(30, tp=4, pp=4)
    with pytest.raises(BadConfigError):
        grid_from_layout(16, tp=4, pp=4, dp=2)


def test_name_axis_of_a_non_string_description_is_none():
    # `pg_desc: true` in a damaged trace (found by the fuzz test): no axis, no AttributeError
    for v in (True, 5, 2.5, ["tp"], {"tp": 1}):
        assert name_axis(v) is None


def test_name_axis():
    assert name_axis("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert name_axis("PIPELINE_MODEL_PARALLEL_GROUP") == "pp"
    assert name_axis("DATA_PARALLEL_GROUP") == "dp"
    assert name_axis("CONTEXT_PARALLEL_GROUP") == "cp"
    assert name_axis("mesh_tp") == "tp"
    assert name_axis("dp_stage0") == "dp"
    assert name_axis("dp_shard") == "dp"  # torchtitan's FSDP mesh dimension
    for other in (
        "DATA_PARALLEL_GROUP_WITH_CP",
        "MODEL_PARALLEL_GROUP",
        "default_pg",
        "EMBEDDING_GROUP",
        "TENSOR_AND_DATA_PARALLEL_GROUP",
        "EXPERT_MODEL_PARALLEL_GROUP",
        None,
        "",
    ):
        assert name_axis(other) is None


@pytest.mark.parametrize("tp,pp,dp,cp", [(2, 4, 1, 1), (2, 2, 2, 2), (4, 2, 2, 1), (1, 3, 2, 1)])
def test_infer_from_megatron_groups_equals_layout(tp, pp, dp, cp):
    world = tp * pp * dp * cp
    meta = metadata_table(world, megatron_groups(tp, pp, dp, cp))
    grid, findings = infer_grid(None, meta)
    truth = grid_from_layout(world, tp, pp, dp, cp)
    assert findings == []
    assert grid.source == "inferred"
    assert (grid.tp, grid.pp, grid.dp, grid.cp) == (tp, pp, dp, cp)
    assert grid.coords == truth.coords
    assert grid.order == "tp-cp-dp-pp"


def _p2p_rows(chains, t0=1000):
    """Forward sends along each chain (stage s -> s+1) then backward sends (s+1 -> s), with the recvs."""
    rows, t = [], t0
    for chain in chains:
        for i in range(len(chain) - 1):
            a, b = chain[i], chain[i + 1]
            rows.append(
                {
                    "rank": a,
                    "kind": "kernel",
                    "name": "ncclDevKernel_SendRecv",
                    "ts_ns": t + 100 * i,
                    "dur_ns": 10,
                    "collective": "send",
                    "dst_rank": b,
                }
            )
            rows.append(
                {
                    "rank": b,
                    "kind": "kernel",
                    "name": "ncclDevKernel_SendRecv",
                    "ts_ns": t + 100 * i,
                    "dur_ns": 10,
                    "collective": "recv",
                    "src_rank": a,
                }
            )
        for i in reversed(range(len(chain) - 1)):
            a, b = chain[i], chain[i + 1]
            rows.append(
                {
                    "rank": b,
                    "kind": "kernel",
                    "name": "ncclDevKernel_SendRecv",
                    "ts_ns": t + 10_000 - 100 * i,
                    "dur_ns": 10,
                    "collective": "send",
                    "dst_rank": a,
                }
            )
    return rows


def test_infer_pipeline_from_p2p_only():
    # tp=2, pp=4 with no labelled groups: the P2P chains give pp and the stage order; nothing names the
    # other axis, so the remaining factor is assumed to be data parallel (and said so in notes)
    truth = grid_from_layout(8, tp=2, pp=4)
    meta = metadata_table(8, {r: [("default_pg", list(range(8)))] for r in range(8)})
    ev = events_table(_p2p_rows(truth.pipelines()))
    grid, findings = infer_grid(ev, meta)
    assert findings == []
    assert (grid.pp, grid.dp, grid.tp, grid.cp) == (4, 2, 1, 1)
    assert {r: grid.stage_of(r) for r in range(8)} == {r: truth.stage_of(r) for r in range(8)}
    assert grid.pipelines() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.notes and "tp" in grid.notes[0]
    # with the tensor-parallel groups present the full layout comes back
    tp_groups = {r: [("TENSOR_MODEL_PARALLEL_GROUP", [r - r % 2, r - r % 2 + 1])] for r in range(8)}
    grid, findings = infer_grid(ev, metadata_table(8, tp_groups))
    assert findings == [] and grid.coords == truth.coords and grid.order == "tp-cp-dp-pp"


def test_p2p_direction_gives_stage_zero():
    # a pipeline whose stage 0 is the highest rank: the first sender is stage 0
    ev = events_table(_p2p_rows([[3, 2, 1, 0]]))
    grid, _ = infer_grid(ev, metadata_table(4, {}))
    assert grid.pp == 4
    assert [grid.stage_of(r) for r in (3, 2, 1, 0)] == [0, 1, 2, 3]


def test_gloo_dp_groups_and_unpeered_sends():
    # the real gloo example: groups dp_stage0=[0,2], dp_stage1=[1,3]; c10d::send without peers
    groups = {
        0: [("dp_stage0", [0, 2])],
        2: [("dp_stage0", [0, 2])],
        1: [("dp_stage1", [1, 3])],
        3: [("dp_stage1", [1, 3])],
    }
    ev = events_table(
        [
            {
                "rank": r,
                "kind": "cpu_op",
                "name": "c10d::send" if r % 2 == 0 else "c10d::recv_",
                "ts_ns": 10,
                "dur_ns": 5,
            }
            for r in range(4)
        ]
    )
    grid, findings = infer_grid(ev, metadata_table(4, groups))
    assert findings == []
    assert (grid.dp, grid.pp, grid.tp) == (2, 2, 1)
    assert grid.ranks_of_stage(0) == [0, 2] and grid.ranks_of_stage(1) == [1, 3]


def test_pure_dp_without_p2p_gives_pp1():
    ev = events_table(
        [
            {
                "rank": r,
                "kind": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                "ts_ns": 10,
                "dur_ns": 5,
                "collective": "allreduce",
            }
            for r in range(4)
        ]
    )
    meta = metadata_table(4, {r: [("default_pg", [0, 1, 2, 3])] for r in range(4)})
    grid, _ = infer_grid(ev, meta)
    assert (grid.pp, grid.dp, grid.tp, grid.cp) == (1, 4, 1, 1)
    assert all(grid.stage_of(r) == 0 for r in range(4))


def test_nothing_to_infer_is_none():
    grid, findings = infer_grid(
        events_table(
            [
                {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 1},
                {"rank": 1, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 1},
            ]
        ),
        None,
    )
    assert grid.source == "none" and grid.pp is None and findings == []
    assert grid.to_dict()["source"] == "none"


def test_inconsistent_evidence_is_a_finding():
    groups = megatron_groups(2, 2, 1)
    groups[0].append(("TENSOR_MODEL_PARALLEL_GROUP", [0, 1, 2]))  # a tp group of the wrong size
    grid, findings = infer_grid(None, metadata_table(4, groups))
    assert [f["code"] for f in findings] == ["LAYOUT_INCONSISTENT"]
    assert grid.pp == 2  # the rest is still used

    # P2P chains that disagree with the pipeline groups
    meta = metadata_table(8, megatron_groups(2, 4, 1))
    ev = events_table(_p2p_rows([[0, 1, 2, 3], [4, 5, 6, 7]]))
    grid, findings = infer_grid(ev, meta)
    assert any("P2P" in f["message"] for f in findings)
    assert all(f["severity"] == "warning" for f in findings)


def test_given_layout_checked_against_traces():
    meta = metadata_table(8, megatron_groups(2, 4, 1))
    grid, findings = grid_for_run(None, meta, {"tp": 2, "pp": 4, "dp": None, "cp": None})
    assert grid.source == "config" and findings == []
    # a layout that contradicts what only the groups' names suggest: the user's layout is used, and the
    # disagreement reported
    grid, findings = grid_for_run(None, meta, {"tp": 4, "pp": 2, "dp": None, "cp": None})
    assert grid.source == "config" and (grid.tp, grid.pp) == (4, 2)
    assert findings and findings[0]["code"] == "LAYOUT_INCONSISTENT" and findings[0]["used"] == "given"
    # ... one the traffic contradicts (sends chain all 8 ranks: pp=8): the evidence's layout, unless forced
    sends = [
        {"rank": r, "kind": "cpu_op", "name": "record_param_comms", "collective": "send", "ts_ns": 10 * r,
         "dur_ns": 1, "src_rank": r, "dst_rank": r + 1}
        for r in range(7)
    ]  # fmt: skip
    world = metadata_table(8, {})
    ev = events_table(sends)
    grid, findings = grid_for_run(ev, world, {"tp": 2, "pp": 4, "dp": None, "cp": None})
    assert grid.source == "inferred" and grid.pp == 8
    assert findings[0]["code"] == "LAYOUT_INCONSISTENT" and findings[0]["used"] == "inferred"
    grid, findings = grid_for_run(ev, world, {"tp": 2, "pp": 4, "dp": None, "cp": None}, force=True)
    assert grid.source == "config" and grid.pp == 4 and findings[0]["used"] == "given"
    grid, findings = grid_for_run(None, meta, {"tp": 2, "pp": 4, "dp": None, "cp": None}, order="pp-tp-cp-dp")
    assert findings and "order" in findings[0]["message"] and grid.order == "tp-cp-dp-pp"
    grid, findings = grid_for_run(
        None, meta, {"tp": 2, "pp": 4, "dp": None, "cp": None}, order="pp-tp-cp-dp", force=True
    )
    assert grid.order == "pp-tp-cp-dp" and "--force-layout" in findings[0]["message"]


def test_single_rank():
    grid, _ = infer_grid(None, metadata_table(1, {}))
    assert grid.to_dict() == {
        "tp": 1,
        "pp": 1,
        "dp": 1,
        "cp": 1,
        "order": "tp-cp-dp-pp",
        "source": "inferred",
    }


def _groups_for(grid):
    """Megatron-described groups of every axis of `grid`, each listed in coordinate order, per member rank."""
    names = {
        "tp": "TENSOR_MODEL_PARALLEL_GROUP",
        "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
        "dp": "DATA_PARALLEL_GROUP",
        "cp": "CONTEXT_PARALLEL_GROUP",
    }
    pos = {"dp": 0, "pp": 1, "tp": 2, "cp": 3}
    out = {r: [("default_pg", sorted(grid.coords))] for r in grid.coords}
    for axis, i in pos.items():
        buckets = {}
        for r, c in grid.coords.items():
            buckets.setdefault(c[:i] + c[i + 1 :], []).append((c[i], r))
        for members in buckets.values():
            ranks = [r for _, r in sorted(members)]
            for r in ranks:
                out[r].append((names[axis], ranks))
    return out


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 3]),
    dp=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2]),
    order=st.permutations(["tp", "cp", "dp", "pp"]),
)
def test_inference_round_trips_any_layout_and_order(tp, pp, dp, cp, order):
    truth = grid_from_layout(None, tp, pp, dp, cp, order="-".join(order))
    grid, findings = infer_grid(None, metadata_table(truth.world_size, _groups_for(truth)))
    assert findings == []
    assert (grid.tp, grid.pp, grid.dp, grid.cp) == (tp, pp, dp, cp)
    assert grid.coords == truth.coords
    # the order found reproduces the layout (axes of degree 1 may sit anywhere)
    again = grid_from_layout(truth.world_size, tp, pp, dp, cp, order=grid.order)
    assert again.coords == truth.coords
