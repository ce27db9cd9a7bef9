"""analyze/core/blas.py: small LAPACK calls on one OpenBLAS thread give the bits the threaded library gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tracelens.analyze.comm import clock
from tracelens.analyze.core.blas import _openblas, one_blas_thread


def test_thread_count_restored():
    fns = _openblas()
    if fns is None:
        pytest.skip("numpy's BLAS is not OpenBLAS here: one_blas_thread is a no-op")
    get, put = fns
    before = get()
    with one_blas_thread():
        assert get() == 1
    assert get() == before
    with pytest.raises(RuntimeError), one_blas_thread():
        raise RuntimeError
    assert get() == before


@pytest.mark.parametrize("shape", [(343, 128), (40, 7), (1000, 64)])
def test_lstsq_same_bits(shape):
    rng = np.random.default_rng(shape[0])
    a = rng.normal(size=shape)
    b = rng.normal(size=shape[0]) * 1e6
    want = np.linalg.lstsq(a, b, rcond=None)[0]
    with one_blas_thread():
        got = np.linalg.lstsq(a, b, rcond=None)[0]
    assert np.array_equal(got, want)


def test_clock_offsets_many_hosts():
    """128 hosts of 8 ranks with planted offsets, ends jittered: the fit gives the offsets the threaded fit
    gives, and recovers the planted ones."""
    rng = np.random.default_rng(7)
    hosts, per = 128, 8
    planted = rng.integers(-2_000_000, 2_000_000, hosts)
    planted -= planted[0]
    rows = []
    for inst in range(300):
        members = rng.choice(hosts * per, 16, replace=False)
        t = 1_000_000_000 + inst * 10_000_000
        for r in members:
            rows.append((int(r), t + int(planted[r // per]) + int(rng.integers(0, 500)), inst))
    df = pd.DataFrame(rows, columns=["rank", "end_ns", "instance"])
    import pyarrow as pa

    ranks = list(range(hosts * per))
    md = pa.table({"rank": ranks, "host_name": [f"h{r // per:03d}" for r in ranks]})
    got = clock.clock_offsets(df, md)
    orig = clock.one_blas_thread
    try:  # the threaded library's answer (the fit as it ran before)
        from contextlib import nullcontext

        clock.one_blas_thread = nullcontext  # type: ignore[assignment]
        want = clock.clock_offsets(df, md)
    finally:
        clock.one_blas_thread = orig  # type: ignore[assignment]
    assert got == want
    r0 = min(got.offsets_ns)
    for r, off in got.offsets_ns.items():
        assert abs((off - got.offsets_ns[r0]) - (planted[r // per] - planted[r0 // per])) < 1_000
