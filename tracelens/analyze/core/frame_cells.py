"""Arrow columns as pandas cells without a Python object per row, and functions evaluated once per
distinct value: what the cross-rank collectives analysis (`tracelens.analyze.comm.collectives`) builds its
frames with. Null cells are None (or <NA> in nullable integer arrays), as `to_pylist` would give."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa


def is_strings(typ: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ))


def str_objects(col: pa.ChunkedArray | pa.Array, rows: np.ndarray | None = None) -> np.ndarray:
    """A string column's cells (of `rows`, when given) as an object array (str, None for null) holding one
    str object per distinct value: the same cells as `col.cast(string).to_numpy()`, 8 bytes a row instead of
    a string object each."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()  # (all rows: encoding before taking moves indices, not strings)
    idx = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    vals = np.empty(len(arr.dictionary) + 1, dtype=object)
    vals[:-1] = arr.dictionary.to_pylist()
    out: np.ndarray = vals[idx if rows is None else idx[rows]]
    return out


def rows_frame(events: pa.Table, mask: np.ndarray, cols: tuple[str, ...]) -> pd.DataFrame:
    """The masked rows of `cols` as a DataFrame with plain (non-categorical) values."""
    sub = events.select(list(cols)).filter(pa.array(mask))  # (only the columns asked for are copied)
    out = {}
    for name in cols:
        col = sub.column(name)
        if is_strings(col.type):
            out[name] = pd.Series(str_objects(col), dtype=object)
            continue
        if pa.types.is_dictionary(col.type):
            col = col.cast(pa.string())
        if pa.types.is_list(col.type):
            out[name] = pd.Series(list_tuples(col), dtype=object)
        elif pa.types.is_string(col.type):
            out[name] = pd.Series(col.to_numpy(zero_copy_only=False), dtype=object)
        elif pa.types.is_integer(col.type):
            # nullable Int64 keeps ns timestamps exact through merges (float64 would round them to 256 ns)
            out[name] = pd.Series(int64_array(col))
        else:
            out[name] = pd.Series(col.to_numpy(zero_copy_only=False))
    return pd.DataFrame(out)


def ranks_tuple(v: Any) -> tuple[int, ...] | None:
    """A pg_ranks cell as a tuple of ints (None for null / NaN / anything else)."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(int(x) for x in v)
    return None


def ranks_list_array(vals: Any, typ: pa.DataType) -> pa.Array:
    """pg_ranks cells -> a list array of `typ` (`ranks_tuple` of each cell), built once per distinct value."""
    d = distinct(vals)
    if d is None:
        return pa.array([ranks_tuple(v) for v in vals], typ)
    codes, uniq = d
    lists = pa.array([ranks_tuple(u) for u in uniq], typ)
    return (
        lists.take(pa.array(np.where(codes < 0, 0, codes), mask=codes < 0))
        if len(uniq)
        else pa.nulls(len(codes), typ)
    )


def isnull(v: Any) -> bool:
    if v is None or v is pd.NA:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def distinct(vals: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """pd.factorize of the cells (codes -1 for null / NaN), None when a cell is unhashable (a list)."""
    obj = vals.to_numpy(dtype=object) if isinstance(vals, pd.Series) else objects(vals)
    try:
        codes, uniq = factorize_objects(obj)
    except TypeError:
        return None
    return np.asarray(codes, dtype=np.int64), np.asarray(uniq, dtype=object)


def _addresses(obj: np.ndarray) -> np.ndarray:
    """The object pointers of a 1-D object array (`id` of every cell), read from its buffer when it has one."""
    if obj.flags.c_contiguous:
        try:
            return np.frombuffer(obj.data, dtype=np.uintp)
        except (TypeError, ValueError):  # (a numpy that exports no buffer of objects)
            pass
    return np.fromiter(map(id, obj), dtype=np.uintp, count=obj.size)


def factorize_objects(obj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize of a 1-D object array (codes in order of first appearance, -1 for null / NaN, the first
    cell of each value as its unique), hashing each distinct *object* once: cells that hold the same object
    (the one tuple or str per distinct value that Arrow columns are read into here) are grouped by address
    first, then their first cells by value. Raises TypeError for unhashable cells, as pd.factorize does."""
    if obj.size == 0:
        codes, uniq = pd.factorize(obj)
        return np.asarray(codes, dtype=np.int64), np.asarray(uniq, dtype=object)
    by_obj = np.asarray(pd.factorize(_addresses(obj))[0], dtype=np.int64)
    first = pd.Series(by_obj).drop_duplicates().index.to_numpy()  # first cell of each object, in order
    codes, uniq = pd.factorize(obj[first])
    out: np.ndarray = np.asarray(codes, dtype=np.int64)[by_obj]
    return out, np.asarray(uniq, dtype=object)


def objects(vals: Any) -> np.ndarray:
    """A 1-D object array of the given cells (tuples stay cells, not rows of a 2-D array)."""
    vals = list(vals)
    out = np.empty(len(vals), dtype=object)
    for i, v in enumerate(vals):
        out[i] = v
    return out


def ranks_tuples(vals: Any) -> np.ndarray:
    """`ranks_tuple` of every cell (an object array), computed once per distinct value."""
    d = distinct(vals)
    if d is None:
        return objects(ranks_tuple(v) for v in vals)
    codes, uniq = d
    conv = objects([ranks_tuple(u) for u in uniq] + [None])
    out: np.ndarray = conv[codes]
    return out


def native(c: Any) -> bool:
    """A numeric or boolean Series / array: factorized in its own type (the same codes as its Python
    objects get, nulls -1 in both, without making an object per row)."""
    dt = getattr(c, "dtype", None)
    if dt is None or isinstance(dt, pd.CategoricalDtype):
        return False
    return bool(pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt))


def string_series(c: Any) -> bool:
    """A pandas string-dtype Series: factorized as it is (the same codes as its Python str objects get, nulls
    -1 in both, without making an object per row)."""
    return isinstance(c, pd.Series) and isinstance(c.dtype, pd.StringDtype)


def _small_ints(c: Any) -> tuple[np.ndarray, int] | None:
    """(value - min, max - min + 2) of a numpy integer or boolean array whose values span little more than
    its length (ranks, steps, counters): a one-to-one code without hashing; None for anything else."""
    if not isinstance(c, np.ndarray) or c.ndim != 1 or c.size == 0:
        return None
    if c.dtype == bool:
        return c.astype(np.int64), 3
    if not np.issubdtype(c.dtype, np.integer) or c.dtype == np.uint64:
        return None
    lo, hi = int(c.min()), int(c.max())
    if hi - lo > 2 * c.size + 1024:
        return None
    return c.astype(np.int64) - lo, hi - lo + 2


def row_codes(*cols: Any) -> np.ndarray:
    """Dense codes (in order of first appearance) of the rows' tuples of values; null is one value."""
    n = len(cols[0])
    acc = np.zeros(n, dtype=np.int64)
    bound = 1  # acc < bound: the columns so far in mixed radix, exact (re-coded densely before overflowing)
    for c in cols:
        plain = not isinstance(c, pd.Series) or native(c) or string_series(c)
        c = c if plain else c.to_numpy(dtype=object)
        small = _small_ints(c)
        if small is not None:  # (any one-to-one coding of a column will do: the last factorize orders them)
            codes, radix = small
        elif isinstance(c, np.ndarray) and c.dtype == object and c.ndim == 1:
            codes, uniq = factorize_objects(c)
            radix = len(uniq) + 1
        else:
            codes, uniq = pd.factorize(c)
            radix = len(uniq) + 1
        if bound * radix >= 1 << 62:
            acc = np.asarray(pd.factorize(acc)[0], dtype=np.int64)
            bound = int(acc.max(initial=-1)) + 1
        acc = acc * radix + (np.asarray(codes, dtype=np.int64) + 1)
        bound *= radix
    return np.asarray(pd.factorize(acc)[0], dtype=np.int64)


def unique_inverse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(x, return_inverse=True)` of a 1-D integer array; by a table of its span (no sort, no
    hash) when the values span little more than their number (ranks, instance ids, small codes)."""
    x = np.asarray(x)
    if x.size and x.dtype.kind in "iu" and x.dtype != np.uint64:
        lo, hi = int(x.min()), int(x.max())
        if hi - lo <= 2 * x.size + 1024:
            off = x.astype(np.int64) - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[off] = True
            uniq = (np.flatnonzero(present) + lo).astype(x.dtype)
            inverse: np.ndarray = (np.cumsum(present) - 1)[off]
            return uniq, inverse
    u, inv = np.unique(x, return_inverse=True)
    return u, np.asarray(inv).reshape(-1)


def first_rows(codes: np.ndarray) -> np.ndarray:
    """`np.unique(codes, return_index=True)[1]` of dense codes in order of first appearance (0, 1, 2, ...,
    as `row_codes` and pd.factorize give them): where each code appears first, without a sort."""
    codes = np.asarray(codes)
    if codes.size == 0:
        return np.zeros(0, dtype=np.int64)
    seen = np.maximum.accumulate(codes)
    out: np.ndarray = np.flatnonzero(np.r_[True, codes[1:] > seen[:-1]])
    return out


def as_objects(c: Any) -> np.ndarray:
    out: np.ndarray = c.to_numpy(dtype=object) if isinstance(c, pd.Series) else np.asarray(c, dtype=object)
    return out


def per_distinct(fn: Any, *cols: Any) -> np.ndarray:
    """fn(*row) for every row (an object array), called once per distinct tuple of values (the
    function must give equal results for equal values; null cells are passed as the first such row's)."""
    codes, vals = per_distinct_codes(fn, *cols)
    out: np.ndarray = vals[codes]
    return out


def per_distinct_codes(fn: Any, *cols: Any) -> tuple[np.ndarray, np.ndarray]:
    """`per_distinct` as (code of each row, fn's value of each code): the codes are `row_codes`'."""
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.empty(0, dtype=object)
    coded = [c if native(c) or string_series(c) else as_objects(c) for c in cols]
    codes = row_codes(*coded)
    first = first_rows(codes)
    # the first row of each tuple as Python objects (what converting every row would give at those rows)
    arrs = [as_objects(c.iloc[first] if isinstance(c, pd.Series) else np.asarray(c)[first]) for c in coded]
    vals = objects(fn(*(a[j] for a in arrs)) for j in range(first.size))
    return codes, vals


#: The dtype pandas gives a column of Python (or numpy) strings.
STR_DTYPE = pd.Series(np.array([""])).dtype


def str_series(codes: np.ndarray, words: Any, index: Any = None) -> pd.Series:
    """pd.Series(np.asarray(words)[codes].astype(str)) (all words str), without a string object a row when
    pandas keeps its strings in Arrow: the distinct words taken by code."""
    words = list(words)
    if getattr(STR_DTYPE, "storage", None) != "pyarrow" or not all(type(w) is str for w in words):
        return pd.Series(objects(words)[codes].astype(str), index=index)
    arr = pa.array(words, pa.large_string()).take(pa.array(np.asarray(codes, dtype=np.int64)))
    return pd.Series(pd.array(arr, dtype=STR_DTYPE), index=index)


def list_tuples(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A list<int> column as an object array of tuples (None for null), built once per distinct list."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0 or arr.flatten().null_count or not pa.types.is_integer(arr.type.value_type):
        return objects(tuple(v) if v is not None else None for v in arr.to_pylist())
    # each list's elements as one binary cell (its bytes in the values buffer: equal bytes, equal lists),
    # dictionary-encoded: a tuple per distinct list, without turning every element into text
    vals = np.ascontiguousarray(arr.values.to_numpy(zero_copy_only=False))
    offs = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64) * vals.itemsize
    raw = pa.Array.from_buffers(
        pa.large_binary(), len(arr), [None, pa.py_buffer(offs), pa.py_buffer(vals.view(np.uint8))]
    )
    enc = raw.dictionary_encode()
    idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    idx = np.where(arr.is_null().to_numpy(zero_copy_only=False), -1, idx)
    conv = objects(
        [tuple(int(x) for x in np.frombuffer(b, dtype=vals.dtype)) for b in enc.dictionary.to_pylist()]
        + [None]
    )
    out: np.ndarray = conv[idx]
    return out


def list_codes(pr: pa.ListArray) -> tuple[np.ndarray, np.ndarray] | None:
    """(code per row, first row of each code) grouping the rows of an integer list column by their exact
    contents, without a Python object a row: a positional hash groups them, then every row is compared
    with its group's first row element by element (None when the column has nulls inside its lists)."""
    vals = pr.values
    if vals.null_count or not pa.types.is_integer(vals.type):
        return None
    offs = pr.offsets.to_numpy().astype(np.int64)
    v = vals.to_numpy(zero_copy_only=False).astype(np.int64)
    n = offs.size - 1
    lo, hi = offs[:-1], offs[1:]
    length = hi - lo
    total = int(length.sum())
    row = np.repeat(np.arange(n), length)
    pos = np.arange(total) - np.repeat(np.cumsum(length) - length, length)  # position within its list
    elem = np.repeat(lo, length) + pos
    with np.errstate(over="ignore"):
        w = (pos.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) | np.uint64(1)
        term = (v[elem].astype(np.uint64) + np.uint64(0x632BE59BD9B4E019)) * w
        h = np.zeros(n, dtype=np.uint64)
        full = length > 0
        if total:  # the sum of each non-empty list's terms (their starts increase strictly)
            h[full] = np.add.reduceat(term, (np.cumsum(length) - length)[full])
    code_h = pd.factorize(h)[0].astype(np.int64) * (int(length.max(initial=0)) + 1) + length
    codes = np.asarray(pd.factorize(code_h)[0], dtype=np.int64)
    first = first_rows(codes)
    rep = first[codes]
    if not np.array_equal(v[elem], v[lo[rep][row] + pos]):  # a hash collision: not one list after all
        return None
    return codes, first


def int64_array(col: pa.ChunkedArray | pa.Array) -> pd.api.extensions.ExtensionArray:
    """An integer Arrow column as a nullable Int64 array (exact; nulls as <NA>)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type) or not pa.types.is_integer(arr.type):
        return pd.array(arr.to_pylist(), dtype="Int64")
    if arr.null_count == 0:  # (no mask to read, nothing to fill)
        vals = np.array(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
        return pd.arrays.IntegerArray(vals, np.zeros(len(arr), dtype=bool))
    mask = arr.is_null().to_numpy(zero_copy_only=False)
    vals = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return pd.arrays.IntegerArray(vals, mask.astype(bool))


def nullable_ints(arr: pa.Array) -> Any:
    """An integer Arrow array as pandas' nullable Int64 (what `pd.array(arr.to_pylist(), dtype="Int64")`
    gives, without the Python list); other types through that list."""
    if pa.types.is_integer(arr.type):
        return int64_array(arr)
    return pd.array(arr.to_pylist(), dtype="Int64")


__all__ = [
    "as_objects",
    "distinct",
    "factorize_objects",
    "first_rows",
    "unique_inverse",
    "int64_array",
    "is_strings",
    "isnull",
    "list_codes",
    "list_tuples",
    "native",
    "nullable_ints",
    "objects",
    "per_distinct",
    "per_distinct_codes",
    "ranks_list_array",
    "ranks_tuple",
    "ranks_tuples",
    "row_codes",
    "rows_frame",
    "str_objects",
    "str_series",
    "string_series",
]
