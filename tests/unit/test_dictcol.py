"""Shared column decoding (tracelens.analyze.core.dictcol.Columns / sharing) against dict_lookup and Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelens.analyze.core.dictcol import Columns, columns, dict_lookup, sharing


def _is_x(v: str) -> bool:
    return v.startswith("x")


def _table() -> pa.Table:
    # two chunks whose dictionaries differ (and repeat a value), nulls in the name and in the durations
    a = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2], pa.int32()), pa.array(["xa", "b", "xa"]))
    b = pa.DictionaryArray.from_arrays(pa.array([1, 0], pa.int32()), pa.array(["c", "xd"]))
    kind = pa.chunked_array(
        [pa.array(["kernel", "cpu_op", "kernel", "other"]), pa.array(["cpu_op", "kernel"])]
    )
    return pa.table(
        {
            "name": pa.chunked_array([a, b]),
            "kind": kind.dictionary_encode(),
            "ts_ns": pa.chunked_array([[10, 20, 30, 40], [50, 60]], pa.int64()),
            "dur_ns": pa.chunked_array([[5, None, -3, 1], [None, 2]], pa.int64()),
        }
    )


def test_flags_kinds_and_numbers_match_the_per_call_decoding():
    t = _table()
    c = Columns(t)
    assert (
        c.flag("name", _is_x).tolist()
        == dict_lookup(t.column("name"), lambda v: int(_is_x(v))).astype(bool).tolist()
    )
    assert c.flag("name", _is_x).tolist() == [True, False, False, True, True, False]
    assert c.kinds("kernel", "other").tolist() == [True, False, True, True, False, True]
    assert c.int64("dur_ns", 0).tolist() == [5, 0, -3, 1, 0, 2]
    assert c.end().tolist() == [15, 20, 30, 41, 50, 62]  # negative durations count as 0
    assert c.end_signed().tolist() == [15, 20, 27, 41, 50, 62]
    assert c.valid("dur_ns").tolist() == [True, False, True, True, False, True]
    values, idx = c.codes("name")
    assert [values[i] if i < len(values) else None for i in idx] == t.column("name").to_pylist()


def test_sharing_gives_one_decoding_per_table_and_read_only_arrays():
    t = _table()
    other = _table()
    assert columns(t) is not columns(t)  # outside a sharing block: a new one per call
    with sharing(t) as shared:
        assert columns(t) is shared
        assert columns(other) is not shared  # an equal but different table is not shared
        assert columns(t).int64("ts_ns") is shared.int64("ts_ns")
        with pytest.raises(ValueError):
            shared.int64("ts_ns")[0] = 1
    assert columns(t) is not shared
    assert np.array_equal(Columns(t).int64("ts_ns"), [10, 20, 30, 40, 50, 60])


def test_constant_and_null_columns_take_no_memory_a_row_and_keep_their_values():
    """A one-value column (a rank's table's rank), an all-null one (the collective fields of a trace
    without collectives) and fills of a column without nulls: the same values as decoding each, as
    read-only arrays that hold no memory a row (broadcast views) or are shared between fills."""
    n = 1000
    t = pa.table(
        {
            "rank": pa.array(np.full(n, 3, np.int32)),
            "step": pa.array(np.arange(n, dtype=np.int32)),
            "seq": pa.nulls(n, pa.int64()),
            "collective": pa.nulls(n, pa.dictionary(pa.int32(), pa.string())),
            "dur_ns": pa.array(np.arange(n, dtype=np.int64)),
            "ts_ns": pa.array(np.arange(n, dtype=np.int64) * 10),
        }
    )
    c = Columns(t)
    for col, fill, want in [("rank", None, [3] * n), ("rank", -1, [3] * n), ("seq", -1, [-1] * n),
                            ("step", -1, list(range(n)))]:  # fmt: skip
        got = c.int64(col, fill)
        assert got.dtype == np.int64 and got.tolist() == want and not got.flags.writeable
    assert c.int64("rank").strides == (0,) and c.int64("seq", -1).strides == (0,)
    assert c.int64("step", -1) is c.int64("step")  # (no null to fill: one array)
    values, idx = c.codes("collective")
    assert values == [] and idx.tolist() == [0] * n and idx.strides == (0,)
    assert c.valid("seq").tolist() == [False] * n and c.valid("rank").tolist() == [True] * n
    assert c.valid("seq").strides == (0,)
    assert c.end_signed() is c.end()  # (no negative duration)
    assert c.end().tolist() == (np.arange(n) * 11).tolist()


def test_values_at_rows_equal_the_whole_column_read_there_without_keeping_it():
    """int64_at / end_at: at any rows (repeated, unordered, of a sliced column with nulls across the
    bitmap's bytes), the values int64 / end give there; nothing is kept for the whole column."""
    n = 37
    vals = np.arange(n, dtype=np.int64) * 7 - 50
    mask = np.arange(n) % 3 == 1  # nulls
    corr = pa.array(vals, mask=mask).slice(3)  # (an offset into the bitmap)
    small = pa.array(np.arange(n, dtype=np.int32) + 1000, mask=np.arange(n) % 5 == 0).slice(3)
    t = pa.table(
        {
            "correlation": corr,
            "stream": small,
            "step": pa.array(np.arange(n - 3, dtype=np.int32)),
            "ts_ns": pa.array(np.arange(n - 3, dtype=np.int64) * 100),
            "dur_ns": pa.array(np.where(np.arange(n - 3) % 4 == 0, None, np.arange(n - 3) - 5), pa.int64()),
        }
    )
    rows = np.array([0, 33, 5, 5, 1, 2, 17, 8, 9, 16])
    c = Columns(t)
    for col, fill in [("correlation", -1), ("stream", -7), ("step", None), ("step", -1), ("ts_ns", None)]:
        got = c.int64_at(col, rows, fill)
        want = [(fill if v is None else v) for v in (t.column(col).to_pylist()[i] for i in rows)]
        assert got.dtype == np.int64 and got.tolist() == want
    end = [
        ts + max(d or 0, 0) for ts, d in zip(t.column("ts_ns").to_pylist(), t.column("dur_ns").to_pylist())
    ]
    assert c.end_at(rows).tolist() == [end[i] for i in rows]
    assert c._cache.keys() <= {("int64", "ts_ns", None)}  # (no whole-column copy made or kept)
    with pytest.raises(ValueError):
        c.int64_at("correlation", rows)  # nulls and no fill
    # a decoded column is read from there: the same values
    assert c.int64("stream", -7)[rows].tolist() == c.int64_at("stream", rows, -7).tolist()
    assert c.end()[rows].tolist() == c.end_at(rows).tolist()


def test_drop_rows_forgets_the_row_arrays_and_decodes_the_same_values_again():
    t = _table()
    c = Columns(t)
    first = (c.flag("name", _is_x), c.kinds("kernel"), c.int64("dur_ns", 0), c.end(), c.valid("dur_ns"))
    codes = c.codes("name")
    c.drop_rows()
    assert c.codes("name") is codes  # (the dictionary codes are kept)
    again = (c.flag("name", _is_x), c.kinds("kernel"), c.int64("dur_ns", 0), c.end(), c.valid("dur_ns"))
    for a, b in zip(first, again):
        assert a is not b and a.tolist() == b.tolist()
