"""`figures._group_slices` (hashed groups) against the sorted cut it replaced (a stable lexsort of the three
keys, cut at each change), and `collective_rows` against rows computed independently of it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelens.report import figures


def _lexsort_slices(op_code: np.ndarray, gs_of: np.ndarray, nb_of: np.ndarray) -> list[np.ndarray]:
    """The previous implementation (report/figures.py before the hashed groups)."""
    order = np.lexsort((nb_of, gs_of, op_code))
    k_op, k_gs, k_nb = op_code[order], gs_of[order], nb_of[order]

    def changed(a: np.ndarray) -> np.ndarray:
        x, y = a[1:], a[:-1]
        return ~((x == y) | (np.isnan(x) & np.isnan(y)))

    bounds = np.flatnonzero((k_op[1:] != k_op[:-1]) | changed(k_gs) | changed(k_nb)) + 1
    return np.split(order, bounds)


@pytest.mark.parametrize("seed", range(8))
def test_group_slices_match_sorted_cut(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    op = rng.integers(0, 4, n)
    gs = rng.choice([2.0, 8.0, 16.0, np.nan], n)
    nb = rng.choice([0.0, 1024.0, 2.0**20, 3e9, np.nan], n)
    got = figures._group_slices(op, gs, nb)
    want = _lexsort_slices(op, gs, nb)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tolist() == w.tolist()


def test_group_slices_one_row_and_all_missing():
    op = np.array([0, 0, 0])
    nan = np.full(3, np.nan)
    assert [x.tolist() for x in figures._group_slices(op, nan, nan)] == [[0, 1, 2]]
    one = figures._group_slices(np.array([1]), np.array([4.0]), np.array([np.nan]))
    assert [x.tolist() for x in one] == [[0]]


def test_collective_rows_values():
    t = pa.table(
        {
            "op": pa.array(
                ["all_reduce", "all_reduce", "all_gather", "all_reduce", None]
            ).dictionary_encode(),
            "group_size": pa.array([8, 8, 8, 8, 2], pa.int32()),
            "bytes": pa.array([100, 100, 50, 200, None], pa.int64()),
            "start_ns": pa.array([0, 10, 0, 0, 0], pa.int64()),
            "end_ns": pa.array([1_000_000, 3_000_010, 500_000, 4_000_000, 2_000_000], pa.int64()),
            "instance": pa.array([7, 7, 3, 9, -1], pa.int64()),
        }
    )
    rows = figures.collective_rows(t)
    key = {(r["op"], r["group_size"], r["bytes"]): r for r in rows}
    ar = key[("all_reduce", 8, 100)]
    assert (ar["calls"], ar["rows"], ar["total_ms"], ar["median_ms"]) == (1, 2, 4.0, 2.0)
    assert key[("all_reduce", 8, 200)]["total_ms"] == 4.0
    assert key[("all_gather", 8, 50)]["calls"] == 1
    assert key[("nan", 2, None)]["calls"] == 1  # a null op, instance -1: one call
    assert [r["total_ms"] for r in rows] == [4.0, 4.0, 2.0, 0.5]
    # equal totals keep the sorted group order: (all_reduce, 8, 100) before (all_reduce, 8, 200)
    assert [(r["op"], r["bytes"]) for r in rows[:2]] == [("all_reduce", 100), ("all_reduce", 200)]
