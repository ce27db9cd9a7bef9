"""Vectorised lookups over dictionary-encoded (or string) Arrow columns."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class ValueFn(Protocol):
    """`fn(value) -> int` for one distinct string value (a protocol, not a Callable, so that lambdas binding
    a loop variable as a default argument, `lambda v, k=k: ...`, are accepted)."""

    def __call__(self, value: str, /) -> int: ...


def dict_lookup(col: pa.ChunkedArray | pa.Array, fn: ValueFn) -> np.ndarray:
    """Apply `fn(str) -> int` to each distinct value of a dictionary (or string) column, vectorised by index."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary.to_pylist()
    table = np.array([fn(v) if v is not None else 0 for v in values] + [0], dtype=np.int8)
    idx = arr.indices.to_numpy(zero_copy_only=False)
    idx = np.where(arr.indices.is_null().to_numpy(zero_copy_only=False), len(values), idx)
    return table[idx.astype(np.int64)]
