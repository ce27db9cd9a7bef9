"""What-if helpers (tracelens.analyze.critical.whatif): the vectorised per (rank, step) sums and factor lookups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


class _Kernels:
    """The per-kernel arrays the what-if helpers read (a Graph's k_rank, k_step, k_dur, k_comm)."""

    def __init__(self, rng, n, n_ranks, steps):
        self.k_rank = rng.integers(0, n_ranks, n).astype(np.int32)
        self.k_step = rng.choice(np.array(steps, np.int32), n)
        self.k_dur = rng.integers(0, 10**7, n).astype(np.float64)
        self.k_comm = rng.random(n) < 0.3


@pytest.mark.parametrize("seed", range(3))
def test_per_rank_step_compute_and_factors_match_pandas(seed):
    # the bincount sums and the dense / sorted factor lookups against the group-by and MultiIndex reindex
    # they replaced; a second call on the same graph (the memo) gives the same, and a new graph its own
    from tracelens.analyze.critical import whatif as W

    rng = np.random.default_rng(seed)
    g = _Kernels(rng, 5000, 12, [-1, 2, 3, 7])
    m = ~g.k_comm
    want = pd.Series(g.k_dur[m]).groupby([g.k_rank[m], g.k_step[m]]).sum()
    for _ in range(2):
        got = W._per_rank_step_compute(g)
        pd.testing.assert_series_equal(got, want, check_exact=True, check_names=False)
        assert got.index.equals(want.index)
    g2 = _Kernels(rng, 300, 3, [0])
    assert W._per_rank_step_compute(g2).sum() == g2.k_dur[~g2.k_comm].sum()
    pairs = list(want.index[:: 2 + seed]) + [(99, 2), (3, 40)]  # pairs no kernel has, too
    factor_of = {(int(r), int(s)): 0.25 + 0.01 * i for i, (r, s) in enumerate(pairs)}
    ref = (
        pd.Series(factor_of, dtype=float).reindex(pd.MultiIndex.from_arrays([g.k_rank, g.k_step])).to_numpy()
    )
    np.testing.assert_array_equal(W._factor_per_kernel(g, factor_of), ref)
    far = {**factor_of, (10**9, 2): 0.5}  # a rank far away: the sorted lookup instead of the dense table
    ref = pd.Series(far, dtype=float).reindex(pd.MultiIndex.from_arrays([g.k_rank, g.k_step])).to_numpy()
    np.testing.assert_array_equal(W._factor_per_kernel(g, far), ref)


def test_per_rank_step_compute_with_far_apart_steps():
    # step numbers a billion apart: a dense (rank, step) table would not fit, the group-by answers instead
    from tracelens.analyze.critical import whatif as W

    rng = np.random.default_rng(7)
    g = _Kernels(rng, 2000, 8, [3, 10**9])
    m = ~g.k_comm
    want = pd.Series(g.k_dur[m]).groupby([g.k_rank[m], g.k_step[m]]).sum()
    got = W._compute_sums(g)
    pd.testing.assert_series_equal(got, want, check_exact=True, check_names=False)
