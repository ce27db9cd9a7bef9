"""Arrays kept in one cache file and read back memory-mapped (store.arrays), and the digests that key them."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.damage import WAYS, damage
from tracelens.store.arrays import read_arrays, table_digest, write_arrays

ARRAYS = {
    "i8": np.array([-3, 0, 7], dtype=np.int8),
    "i16": np.arange(5, dtype=np.int16) * -300,
    "i32": np.array([2**31 - 1, -(2**31)], dtype=np.int32),
    "f8": np.array([0.5, np.nan, -np.inf, 1e300]),
    "b": np.array([True, False, True]),
    "empty": np.empty(0, dtype=np.int64),
    "grid": np.arange(12, dtype=np.int64).reshape(3, 4),
    "strided": np.arange(20, dtype=np.int32)[::3],  # (not contiguous: written as its values)
    "last_empty": np.empty(0, dtype=np.float64),
}


def test_round_trip_keeps_values_dtypes_shapes_and_meta(tmp_path: Path):
    meta = {"version": 1, "cells": {"op": ["allreduce", None, "nan"]}, "x": [[1, 2.5]]}
    write_arrays(tmp_path / "a.bin", ARRAYS, meta)
    got, got_meta = read_arrays(tmp_path / "a.bin")
    assert list(got) == list(ARRAYS)
    for name, a in ARRAYS.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        np.testing.assert_array_equal(got[name], a)
    assert got_meta == meta


def test_arrays_start_aligned_and_writes_stay_out_of_the_file(tmp_path: Path):
    p = tmp_path / "a.bin"
    write_arrays(p, ARRAYS)
    before = p.read_bytes()
    got, _ = read_arrays(p)
    for a in got.values():
        if a.size:
            assert a.ctypes.data % 64 == 0
    got["i32"][:] = 0  # (copy-on-write: the arrays are writable, the file does not change)
    assert p.read_bytes() == before
    assert read_arrays(p)[0]["i32"].tolist() == ARRAYS["i32"].tolist()


def test_arrays_read_into_memory_of_their_own(tmp_path: Path):
    """`own`: those arrays are read (equal values, dtypes and shapes), not views of the mapping."""
    p = tmp_path / "a.bin"
    write_arrays(p, ARRAYS)
    mapped, _ = read_arrays(p)
    got, _ = read_arrays(p, own=lambda name: name in ("grid", "f8", "empty"))
    for name, a in ARRAYS.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        np.testing.assert_array_equal(got[name], a)
    for name in ("grid", "f8", "empty"):
        assert got[name].base is None or got[name].base.base is None  # (its own buffer)
    for arrays, name in ((got, "i32"), (mapped, "grid")):  # (views of the mapping)
        assert (
            isinstance(arrays[name].base.base, memoryview)
            and arrays[name].base.base.obj.__class__ is mmap.mmap
        )
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) - 8])  # (the last array cut short: an error for a read one too)
    with pytest.raises(ValueError):
        read_arrays(p, own=lambda name: True)


@pytest.mark.parametrize("how", WAYS)
def test_a_damaged_file_is_an_error_not_wrong_arrays(tmp_path: Path, how: str):
    p = tmp_path / "a.bin"
    write_arrays(p, {"x": np.arange(1000, dtype=np.int64)})
    damage(p, how)
    with pytest.raises(ValueError):
        read_arrays(p)
    with pytest.raises(OSError):
        read_arrays(tmp_path / "missing.bin")


def test_object_arrays_are_refused(tmp_path: Path):
    with pytest.raises(TypeError):
        write_arrays(tmp_path / "a.bin", {"o": np.array(["a", None], dtype=object)})
    assert not (tmp_path / "a.bin").exists()


def _table(ranks: list[list[int] | None], op: list[str]) -> pa.Table:
    return pa.table(
        {
            "n": pa.array(range(len(op)), pa.int64()),
            "pg_ranks": pa.array(ranks, pa.list_(pa.int32())),
            "op": pa.array(op).dictionary_encode(),
        }
    )


def test_table_digest_follows_every_value():
    t = _table([[0, 1], [2, 3], None], ["allreduce", "send", "allreduce"])
    d = table_digest(t)
    assert d == table_digest(_table([[0, 1], [2, 3], None], ["allreduce", "send", "allreduce"]))
    assert d != table_digest(_table([[0, 1], [2, 4], None], ["allreduce", "send", "allreduce"]))
    assert d != table_digest(_table([[0, 1], [2, 3], []], ["allreduce", "send", "allreduce"]))
    assert d != table_digest(_table([[0, 1], [2, 3], None], ["allreduce", "recv", "allreduce"]))
    assert d != table_digest(t.slice(1))
    # a list column sliced inside its values: the same buffers, other rows
    vals = pa.array([0, 1, 2, 3, 4, 5], pa.int32())
    a = pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), vals)
    b = pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), vals.slice(1, 4))
    assert a.to_pylist() != b.to_pylist()
    assert table_digest(pa.table({"l": a})) != table_digest(pa.table({"l": b}))
    assert table_digest(None) != table_digest(t)
