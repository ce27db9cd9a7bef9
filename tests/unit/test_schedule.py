"""Pipeline schedules (analyze/pipeline/schedule.py): the replayed expectation against the textbook formulas, and each
schedule of torch.distributed.pipelining recognised from the actions it annotates."""

from __future__ import annotations

import pytest

from tracelens._testing import events_table
from tracelens.analyze.layout import grid_from_layout
from tracelens.analyze.pipeline.schedule import (
    canonical_orders,
    replay,
    replay_bubble,
    schedule_from_actions,
    schedule_from_order,
)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (4, 4), (4, 8), (3, 7), (8, 16)])
def test_gpipe_and_1f1b_replay_to_the_formula(p, m):
    want = (p - 1) / (m + p - 1)
    for name in ("gpipe", "1f1b"):
        assert replay_bubble(canonical_orders(name, p, m), p) == pytest.approx(want)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 6), (8, 4, 16)])
def test_interleaved_and_looped_bfs_replay_to_their_formula(p, v, m):
    want = (p - 1) / (v * m + p - 1)
    for name in ("interleaved_1f1b", "looped_bfs"):
        assert replay_bubble(canonical_orders(name, p, m, v), p * v) == pytest.approx(want)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_zb_h1_replays_to_its_bubble(p, m):
    """ZB-H1 (interleaved zero bubble with one chunk) with F = I = W = 1: each rank is busy 3m and the window
    is 3m + (p - 1): the fill and drain shrink to one unit per stage, a third of 1F1B's F + B (Qi et al.)."""
    assert replay_bubble(canonical_orders("interleaved_zero_bubble", p, m, 1), p) == pytest.approx(
        (p - 1) / (3 * m + p - 1)
    )


def test_orders_reproduce_the_orders_pytorch_ran():
    """The generators give, action for action, the orders PyTorch 2.13's schedules ran (ORDERS, recorded)."""
    for name, want in ORDERS.items():
        got = canonical_orders(name, 2, 4, 2)
        assert got is not None
        text = {r: " ".join(f"{a[0]}{a[1]}{a[2]}" for u in acts for a in u) for r, acts in got.items()}
        assert text == want, name


def test_orders_not_run_are_none():
    assert canonical_orders("1f1b", 4, 4, 2) is None  # one chunk per rank only
    assert canonical_orders("zbv_zero_bubble", 4, 4, 3) is None  # two chunks, V-shaped
    assert canonical_orders("interleaved_1f1b", 4, 6, 2) is not None  # rounds of 6: PyTorch's flexible rule
    assert canonical_orders("interleaved_1f1b", 4, 9, 2) is None  # 9 microbatches in rounds of 2: no
    assert canonical_orders("dualpipe_v", 4, 8, 2) is None


def test_replay_with_costs_worked_by_hand():
    """Two stages, 1F1B, m = 2: stage 0's forward 1 and backward 2, stage 1's 2 and 4, a receive 0.5 paid by
    the consumer. By hand: s0 F0 [0,1], F1 [1,2]; s1 F0 [1,3.5], B0 [3.5,7.5], F1 [7.5,10], B1 [10,14];
    s0 B0 [7.5,10], B1 [14,16.5]."""
    cost = {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 2.0, (1, "B"): 4.0}
    got = replay(canonical_orders("1f1b", 2, 2), 2, lambda st, k: cost[(st, k)], lambda a, b: 0.5)
    assert got is not None
    assert got.end == {0: 16.5, 1: 14.0} and got.window == 16.5
    assert got.busy == {0: 7.0, 1: 13.0}
    assert got.in_flight == {0: 2, 1: 1}


def test_split_backward_holds_activations_until_the_weight_gradient():
    orders = {
        0: [((0, "F", 0),), ((0, "F", 1),), ((0, "I", 0),), ((0, "I", 1),), ((0, "W", 0),), ((0, "W", 1),)]
    }
    got = replay(orders, 1)
    assert got is not None and got.in_flight == {0: 2} and got.window == 6.0
    full = replay({0: [((0, "F", 0),), ((0, "B", 0),), ((0, "F", 1),), ((0, "B", 1),)]}, 1)
    assert full is not None and full.in_flight == {0: 1}


def test_replay_of_an_impossible_order_is_unknown():
    # rank 1 runs its backward before the forward it needs: a dependency never met
    orders = {0: [((0, "F", 0),), ((0, "B", 0),)], 1: [((1, "B", 0),), ((1, "F", 0),)]}
    assert replay_bubble(orders, 2) is None


def _annotated(orders: dict[int, list[str]], p: int) -> list[dict]:
    rows = []
    for r, names in orders.items():
        rows.append({"rank": r, "kind": "user_annotation", "name": "ProfilerStep#3", "ts_ns": 0, "dur_ns": 10**6,
                     "step": 3})  # fmt: skip
        for i, n in enumerate(names):
            rows.append({"rank": r, "kind": "user_annotation", "name": n, "ts_ns": 10 + 10 * i, "dur_ns": 5,
                         "step": 3})  # fmt: skip
    return rows


def _pp(seq: str) -> list[str]:
    return [f"PP:{a}" for a in seq.split()]


# the orders PyTorch 2.13's schedules ran on two ranks with four microbatches (recorded runs)
ORDERS = {
    "interleaved_1f1b": {
        0: "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        1: "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    },
    "looped_bfs": {
        0: "0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0",
        1: "1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0",
    },
    "interleaved_zero_bubble": {
        0: "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        1: "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3",
    },
    "zbv_zero_bubble": {
        0: "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        1: "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
    },
}


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_multi_stage_schedules_recognised_from_their_actions(name):
    grid = grid_from_layout(2, pp=2)
    ev = events_table(_annotated({r: _pp(s) for r, s in ORDERS[name].items()}, 2))
    got = schedule_from_actions(ev, grid)
    assert (got.name, got.v, got.m) == (name, 2, 4)
    assert got.placement == ("v" if name == "zbv_zero_bubble" else "loop")
    assert 0 <= got.expected_bubble_fraction < 1 / 3  # every one of them below 1F1B's (p-1)/(m+p-1)
    if name in ("interleaved_1f1b", "looped_bfs"):
        assert got.expected_bubble_fraction == pytest.approx(1 / 9)  # (p-1)/(v*m+p-1)


def test_dualpipe_v_from_overlapped_actions_and_gpipe_from_its_labels():
    grid = grid_from_layout(2, pp=2)
    dual = {
        0: ["PP:0F0", "PP:0F1", "PP:3F0", "PP:3B0", "PP:(0F2;3B1)OVERLAP_F_B", "PP:3F1", "PP:0B0", "PP:0B1",
            "PP:0F3", "PP:3F2", "PP:3B2", "PP:3F3", "PP:3B3", "PP:0B2", "PP:0B3"],
        1: ["PP:1F0", "PP:2F0", "PP:1F1", "PP:2B0", "PP:2F1", "PP:1B0", "PP:2B1", "PP:1B1", "PP:1F2", "PP:2F2",
            "PP:1F3", "PP:2B2", "PP:2F3", "PP:1B2", "PP:2B3", "PP:1B3"],
    }  # fmt: skip
    got = schedule_from_actions(events_table(_annotated(dual, 2)), grid)
    assert (got.name, got.v, got.m, got.placement) == ("dualpipe_v", 2, 4, "v")
    gp = {r: [f"Forward {i}" for i in range(4)] + [f"Backward {i}" for i in range(4)] for r in range(2)}
    got = schedule_from_actions(events_table(_annotated(gp, 2)), grid)
    assert (got.name, got.v, got.m) == ("gpipe", 1, 4)
    assert got.expected_bubble_fraction == pytest.approx(1 / 5)


def test_unannotated_order_gives_gpipe_or_1f1b():
    assert schedule_from_order({0: 8}, 4, 8) == "gpipe"  # every forward before the first backward, m > p
    assert schedule_from_order({0: 4}, 4, 8) == "1f1b"  # PyTorch's 1F1B warms up min(m, p - s)
    assert schedule_from_order({0: 4}, 4, 4) == "1f1b"  # m <= p: the same order, the same bubble
    assert schedule_from_order({}, 4, 4) is None
