"""comm_by_layer.sizes_from_flight_recorder's `size_source` column, built from an Arrow array, against the
column the per-row `np.where(bytes known, "trace", None)` gives (values and dtype), with and without a
Flight Recorder that fills sizes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tracelens.analyze.comm.comm_by_layer import sizes_from_flight_recorder


def _coll(rng: np.random.Generator, n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": rng.integers(0, 4, n).astype(np.int32),
            "op": pd.Categorical(rng.choice(["allreduce", "send"], n)),
            "enqueue_ns": np.arange(n, dtype=np.int64) * 1000,
            "bytes": np.where(rng.random(n) < 0.6, 4096.0, np.nan),
            "dtype": pd.array([None] * n, dtype=object),
        }
    )


@pytest.mark.parametrize("seed", range(5))
def test_size_source_as_the_per_row_column(seed: int) -> None:
    rng = np.random.default_rng(seed)
    coll = _coll(rng, int(rng.integers(1, 300)))
    out = sizes_from_flight_recorder(coll, None)
    want = pd.Series(np.where(coll["bytes"].notna(), "trace", np.array(None)), name="size_source")
    pd.testing.assert_series_equal(out["size_source"], want)
    assert "size_source" not in coll.columns


def test_size_source_after_the_flight_recorder() -> None:
    coll = pd.DataFrame(
        {
            "rank": np.array([0, 0, 0], np.int32),
            "op": pd.Categorical(["allreduce"] * 3),
            "enqueue_ns": np.array([1000, 2000, 3000], np.int64),
            "bytes": [8.0, np.nan, np.nan],
        }
    )
    fr = pa.table(
        {"rank": [0, 0], "op": ["allreduce"] * 2, "enqueue_ns": [2000, 3000], "bytes": [16.0, 32.0]}
    )
    out = sizes_from_flight_recorder(coll, fr)
    assert out["size_source"].tolist() == ["trace", "flight_recorder", "flight_recorder"]
    assert out["bytes"].tolist() == [8.0, 16.0, 32.0]
    assert sizes_from_flight_recorder(coll.iloc[:0], None)["size_source"].tolist() == []
