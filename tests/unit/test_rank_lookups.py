"""Rank lookups by table (classify.rank_mask, Grid.stage_lookup) against np.isin and the per-rank loop they
replaced."""

from __future__ import annotations

import numpy as np
import pytest

from tracelens.analyze.layout import Grid, grid_from_layout
from tracelens.analyze.rank.classify import rank_mask


def old_stage_lookup(g: Grid, ranks: np.ndarray) -> np.ndarray:
    ranks = np.asarray(ranks, dtype=np.int64)
    if not g.coords or ranks.size == 0:
        return np.full(ranks.shape, -1, dtype=np.int64)
    hi = max(max(g.coords), int(ranks.max())) + 1
    lut = np.full(hi, -1, dtype=np.int64)
    for r, c in g.coords.items():
        if c[1] is not None:
            lut[r] = c[1]
    out = np.full(ranks.shape, -1, dtype=np.int64)
    ok = ranks >= 0
    out[ok] = lut[ranks[ok]]
    return out


def test_rank_mask_matches_isin():
    rng = np.random.default_rng(11)
    cases = [
        (np.array([], np.int64), {1, 2}),
        (np.array([0, 1, 2], np.int64), set()),
        (rng.integers(0, 1024, 10_000), set(rng.integers(0, 1200, 300).tolist())),
        (rng.integers(0, 8, 100).astype(np.int32), {0, 7, 9, -1}),
        (np.array([-3, -1, 0, 5]), {-1, 5}),  # negative ranks: np.isin
        (np.array([0, 2**40]), {2**40}),  # a wide range: np.isin
    ]
    for rank, want in cases:
        got = rank_mask(rank, want)
        assert got.dtype == bool
        assert np.array_equal(got, np.isin(rank, np.fromiter(want, np.int64, len(want))))
        assert np.array_equal(rank_mask(rank, np.array(sorted(want), np.int64)), got)


@pytest.mark.parametrize("layout", [(2, 4, 2), (8, 8, 16), (1, 3, 1)])
def test_stage_lookup_matches_loop(layout):
    tp, pp, dp = layout
    g = grid_from_layout(tp * pp * dp, tp=tp, pp=pp, dp=dp)
    rng = np.random.default_rng(pp)
    n = tp * pp * dp
    for ranks in (
        np.arange(n),
        rng.integers(0, n + 5, 1000),
        np.array([-1, 0, n - 1, n + 3]),
        np.array([], int),
    ):
        assert np.array_equal(g.stage_lookup(ranks), old_stage_lookup(g, ranks))
    # unknown stages (None) and ranks beyond the grid
    g.coords[n + 2] = (0, None, 0, 0)
    ranks = np.arange(n + 4)
    assert np.array_equal(g.stage_lookup(ranks), old_stage_lookup(g, ranks))
    assert np.array_equal(Grid().stage_lookup(ranks), old_stage_lookup(Grid(), ranks))
