"""Arrow tables -> pandas DataFrames for the notebook API (tracelens.api).

Conventions (the same for every DataFrame the API returns):

- Strings are usable with pandas' `.str`: dictionary-encoded Arrow strings (event names, categories,
  kinds) become `category` columns (cheap, and `.str.contains` works on them); plain strings become
  `string[pyarrow]`. Numbers keep Arrow dtypes (`pd.ArrowDtype`), so integers stay exact and nulls
  stay null (never 0).
- Every table with a `rank` column has a `stage` column next to it: the pipeline stage of the rank
  under the layout the findings use (null when the run has no pipeline stages or the layout is unknown).
- Units are in column names. Event-level tables (events, kernels, memory, collectives) keep exact integer
  nanoseconds (`ts_ns`, `dur_ns`): they are timestamps. Per-step and per-rank tables (breakdown,
  bubbles, arrival_lag, stages, stragglers) are in milliseconds (`*_ms`, float), the numbers of
  summary.json.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def _mapper(t: pa.DataType):
    """Arrow dtype for everything but dictionaries (those become pandas categoricals)."""
    if pa.types.is_dictionary(t):
        return None
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pd.StringDtype("pyarrow")
    return pd.ArrowDtype(t)


def stage_column(ranks: pa.ChunkedArray | pa.Array, stage_of: Mapping[int, int | None] | None) -> pa.Array:
    """Stage of each rank (int64, null where unknown), vectorized through a lookup table."""
    r = (
        pc.fill_null(ranks, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        if len(ranks)
        else np.zeros(0, np.int64)
    )
    known = {int(k): int(v) for k, v in (stage_of or {}).items() if v is not None}
    if not known or r.size == 0:
        return pa.nulls(len(r), pa.int64())
    size = max(max(known), int(r.max(initial=0))) + 1
    lut = np.full(size, -1, np.int64)
    for k, v in known.items():
        if k >= 0:
            lut[k] = v
    st = np.where(r >= 0, lut[np.clip(r, 0, size - 1)], -1)
    return pa.array(st, pa.int64(), mask=st < 0)


def to_frame(table: pa.Table, stage_of: Mapping[int, int | None] | None = None) -> pd.DataFrame:
    """A DataFrame under the conventions above; a `stage` column is added after `rank` when missing."""
    if "rank" in table.column_names and "stage" not in table.column_names:
        at = table.column_names.index("rank") + 1
        table = table.add_column(at, "stage", stage_column(table.column("rank"), stage_of))
    df = table.to_pandas(types_mapper=_mapper)
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_dictionary(col.type) and not isinstance(df[name].dtype, pd.CategoricalDtype):
            df[name] = df[name].astype("category")  # pragma: no cover - pyarrow gives categoricals already
    return df


#: name parts of timestamp columns: they stay exact integer ns (a float ms would lose them)
_TIMESTAMP = ("ts_", "start", "end", "begin")


def ns_to_ms(table: pa.Table) -> pa.Table:
    """Every duration `*_ns` column as float milliseconds named `*_ms` (per-step tables, like
    summary.json); timestamps (`start_ns`, `end_ns`, ...) stay integer ns."""
    cols, names = [], []
    for name, col in zip(table.column_names, table.columns):
        if name.endswith("_ns") and not any(t in name for t in _TIMESTAMP):
            col = pc.divide(pc.cast(col, pa.float64()), 1e6)
            name = name[:-3] + "_ms"
        cols.append(col)
        names.append(name)
    return pa.table(cols, names=names)
