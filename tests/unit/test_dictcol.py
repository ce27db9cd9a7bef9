"""Shared column decoding (tracelens.analyze.dictcol.Columns / sharing) against dict_lookup and Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelens.analyze.dictcol import Columns, columns, dict_lookup, sharing


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
