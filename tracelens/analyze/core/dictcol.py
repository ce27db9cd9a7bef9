"""Vectorised lookups over dictionary-encoded (or string) Arrow columns."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


#: fn -> {value: fn(value) != 0}: a run's names repeat on every rank, so each predicate runs once per
#: distinct value and process (the functions given to `Columns.flag` are pure; bounded per function).
_FLAGS: dict[ValueFn, dict[str, bool]] = {}
_FLAGS_MAX = 1 << 16
_FLAGS_MAX_FNS = 256


def _flag_of(fn: ValueFn, memo: dict[str, bool], v: str | None) -> bool:
    if v is None:
        return False
    got = memo.get(v)
    if got is None:
        got = memo[v] = bool(fn(v))
    return got


class Columns:
    """Decoded columns of one events table, each computed at most once: numpy views of numeric columns,
    dictionary codes, and per-value flags (`flag`) and kind masks (`kinds`) over them.

    Several analyzers of one rank (classify, launch_link, steps, breakdown, composition, idle, the stage's
    cross-rank mask) read the same columns and the same lookups; given one `Columns` (`columns(events)`
    inside `sharing(events)`), each is decoded once. Every array handed out is read-only (shared)."""

    def __init__(self, events: pa.Table) -> None:
        self.events = events
        self._cache: dict[object, object] = {}

    def _get(self, key: object) -> object:
        return self._cache.get(key)

    def drop_rows(self) -> None:
        """Forget the row-sized arrays decoded so far (flags, kind masks, int64 copies, validity, ends): an
        analyzer that wants one again decodes it again, the same values. The dictionary codes and per-value
        tables are kept (the table's own indices, or one entry a distinct value). The per-rank stage calls it
        between its analyzers on a large table, so that what one analyzer needed is not held through the
        next ones' peaks (decoding again costs ~10-50 ms an array at 6.7 M rows)."""
        for key in list(self._cache):
            if not (isinstance(key, tuple) and key[0] in _KEPT):
                del self._cache[key]

    def _put(self, key: object, arr: np.ndarray) -> np.ndarray:
        arr.flags.writeable = False
        self._cache[key] = arr
        return arr

    def codes(self, col: str) -> tuple[list[str | None], np.ndarray]:
        """(distinct values, integer index of each row into them (the dictionary's own int32 indices where
        the column has no null); null rows -> len(values)) of a dictionary (or string) column, as
        `dict_lookup` decodes it."""
        key = ("codes", col)
        got = self._get(key)
        if got is None:
            c = self.events.column(col)
            arr = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
            if not pa.types.is_dictionary(arr.type):
                arr = pc.dictionary_encode(arr)
            values = arr.dictionary.to_pylist()
            if arr.null_count == len(arr):  # (all null: one index repeated, no memory a row)
                idx = _repeated(len(values), len(arr))
            else:
                ind = arr.indices.fill_null(len(values)) if arr.indices.null_count else arr.indices
                idx = ind.to_numpy(zero_copy_only=False)  # (int32: the table's own indices, no copy)
                idx.flags.writeable = False
            got = (values, idx)
            self._cache[key] = got
        return got  # type: ignore[return-value]

    def canonical(self, col: str) -> np.ndarray:
        """Per entry of `codes(col)`'s values and the null slot after them: the index of the first entry of equal
        value (a dictionary may repeat a value; the null slot -> the first null entry, else itself)."""
        key = ("canonical", col)
        got = self._get(key)
        if got is None:
            values, _ = self.codes(col)
            if None not in values and len(set(values)) == len(values):  # (the usual dictionary: all distinct)
                got = self._put(key, np.arange(len(values) + 1, dtype=np.int64))
            else:
                first: dict[str | None, int] = {}
                ids = [first.setdefault(v, i) for i, v in enumerate(values)]
                ids.append(first.setdefault(None, len(values)))
                got = self._put(key, np.array(ids, dtype=np.int64))
        return got  # type: ignore[return-value]

    def flag(self, col: str, fn: ValueFn) -> np.ndarray:
        """bool per row: `fn(value) != 0` of the row's value (False for null), i.e.
        `dict_lookup(col, fn).astype(bool)`. Cached per (column, function object), and `fn`'s answers per
        value for the process: pass a pure module-level function (a lambda made per call shares nothing)."""
        key = ("flag", col, fn)
        got = self._get(key)
        if got is None:
            values, idx = self.codes(col)
            if fn not in _FLAGS and len(_FLAGS) >= _FLAGS_MAX_FNS:  # e.g. a lambda made per call
                _FLAGS.clear()
            memo = _FLAGS.setdefault(fn, {})
            if len(memo) > _FLAGS_MAX:
                memo.clear()
            get = memo.get
            known = list(map(get, values))  # type: ignore[arg-type]  # (None: not asked yet, or a null value)
            if None in known:
                known = [_flag_of(fn, memo, v) if k is None else k for k, v in zip(known, values)]
            known.append(False)
            got = self._put(key, np.array(known, dtype=bool)[idx])
        return got  # type: ignore[return-value]

    def kinds(self, *names: str) -> np.ndarray:
        """bool per row: the row's `kind` is one of `names`."""
        key = ("kinds", names)
        got = self._get(key)
        if got is None:
            values, idx = self.codes("kind")
            wanted = set(names)
            table = np.array([v in wanted for v in values] + [False], dtype=bool)
            got = self._put(key, table[idx])
        return got  # type: ignore[return-value]

    def int64(self, col: str, fill: int | None = None) -> np.ndarray:
        """A numeric column as int64 (nulls as `fill`; with fill None the column must have no nulls)."""
        key = ("int64", col, fill)
        got = self._get(key)
        if got is None:
            c = self.events.column(col)
            if fill is not None and c.null_count == 0:  # (nothing to fill: the same array for every fill)
                got = self.int64(col)
                self._cache[key] = got
                return got
            if fill is not None and c.null_count == len(c) and pa.types.is_integer(c.type):  # (all null)
                got = _repeated(fill, len(c))
                self._cache[key] = got
                return got
            if fill is not None and c.null_count:
                c = c.fill_null(fill)
            if c.null_count == 0 and len(c) and pa.types.is_integer(c.type):
                lo_hi = pc.min_max(c)
                if lo_hi["min"] == lo_hi["max"]:  # (one value, as a rank's table's rank: no memory a row)
                    got = self._cache[key] = _repeated(int(lo_hi["min"].as_py()), len(c))
                    return got
            # (an int64 column without nulls is the table's own buffer, read-only as every cached array)
            got = self._put(key, c.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
        return got  # type: ignore[return-value]

    def int64_at(self, col: str, rows: np.ndarray, fill: int | None = None) -> np.ndarray:
        """`int64(col, fill)[rows]`, read at those rows only (a new array): no copy of the whole column is made
        or kept when it has not been decoded already."""
        got = self._get(("int64", col, fill))
        if got is not None:
            out: np.ndarray = got[rows]  # type: ignore[index]
            return out
        c = self.events.column(col)
        arr = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
        if not pa.types.is_integer(arr.type):
            out = self.int64(col, fill)[rows]
            return out
        if arr.null_count == 0:  # (the table's own values, zero-copy, read at the rows)
            out = arr.to_numpy(zero_copy_only=False)[rows].astype(np.int64)
            return out
        if fill is None:
            raise ValueError(f"column {col} has nulls and no fill was given")
        if arr.null_count == len(arr):
            return np.full(len(rows), fill, np.int64)
        validity, data = arr.buffers()[:2]
        pos = np.asarray(rows, np.int64) + arr.offset
        values: np.ndarray = np.frombuffer(data, arr.type.to_pandas_dtype())[pos].astype(np.int64)
        bits = np.frombuffer(validity, np.uint8)[pos >> 3] >> (pos & 7).astype(np.uint8)
        values[(bits & 1) == 0] = fill
        return values

    def end_at(self, rows: np.ndarray) -> np.ndarray:
        """`end()[rows]`, computed at those rows only when `end` has not been decoded already."""
        got = self._get("end")
        if got is not None:
            out: np.ndarray = got[rows]  # type: ignore[index]
            return out
        end = self.int64_at("ts_ns", rows)
        end += np.maximum(self.int64_at("dur_ns", rows, 0), 0)
        return end

    def valid(self, col: str) -> np.ndarray:
        """bool per row: the column is not null."""
        key = ("valid", col)
        got = self._get(key)
        if got is None:
            c = self.events.column(col)
            nulls = c.null_count
            if nulls == 0 or nulls == len(c):  # (no bitmap to read: all valid, or all null)
                got = _repeated(nulls == 0, len(c))
                self._cache[key] = got
            else:
                got = self._put(key, c.is_valid().to_numpy(zero_copy_only=False))
        return got  # type: ignore[return-value]

    def end(self) -> np.ndarray:
        """ts_ns + max(dur_ns, 0) (null duration: 0)."""
        got = self._get("end")
        if got is None:
            got = self._put("end", self.int64("ts_ns") + np.maximum(self.int64("dur_ns", 0), 0))
        return got  # type: ignore[return-value]

    def end_signed(self) -> np.ndarray:
        """ts_ns + dur_ns (null duration: 0; a negative duration is kept)."""
        got = self._get("end_signed")
        if got is None:
            dur = self.int64("dur_ns", 0)
            if dur.size == 0 or dur.min() >= 0:  # (no negative duration: `end` itself)
                got = self._cache["end_signed"] = self.end()
            else:
                got = self._put("end_signed", self.int64("ts_ns") + dur)
        return got  # type: ignore[return-value]


#: Entries of a `Columns` that `drop_rows` keeps: no memory a row beyond the table's own (or one a value).
_KEPT = ("codes", "canonical")


def _repeated(value: int | bool, n: int) -> np.ndarray:
    """A read-only array of n copies of `value` (int64, or bool for a bool) that takes no memory per row (a
    broadcast view): an all-null or all-valid column's answer."""
    dtype = np.bool_ if isinstance(value, (bool, np.bool_)) else np.int64
    return np.broadcast_to(np.array(value, dtype=dtype), (n,))


_SHARED: ContextVar[Columns | None] = ContextVar("tracelens_shared_columns", default=None)


def columns(events: pa.Table) -> Columns:
    """The shared `Columns` of `events` inside `sharing(events)` (the same table object), else a new one."""
    cur = _SHARED.get()
    if cur is not None and cur.events is events:
        return cur
    return Columns(events)


@contextmanager
def sharing(events: pa.Table) -> Iterator[Columns]:
    """Within this block, `columns(events)` returns one `Columns`: analyzers called on this table decode
    each column and lookup once (the per-rank stage runs every analyzer of a rank inside one)."""
    cols = Columns(events)
    token = _SHARED.set(cols)
    try:
        yield cols
    finally:
        _SHARED.reset(token)


#: per live object (by identity): results computed from it once (`per_object`).
_PER_OBJECT: dict[int, tuple[weakref.ref[object], dict[str, object]]] = {}


def per_object(obj: object) -> dict[str, object]:
    """A dict of results computed from `obj` (an events table, a graph), kept while `obj` lives and dropped
    with it. Callers store arrays there that they hand out read only. For the launch links
    (`launch_link`, `classify.comm_launched`: asked for twice over one cross-rank table) and the what-if's
    per (rank, step) compute (asked for once per finding over one graph)."""
    key = id(obj)
    got = _PER_OBJECT.get(key)
    if got is not None and got[0]() is obj:
        return got[1]

    def drop(ref: weakref.ref[object], key: int = key) -> None:
        cur = _PER_OBJECT.get(key)
        if cur is not None and cur[0] is ref:
            del _PER_OBJECT[key]

    memo: dict[str, object] = {}
    _PER_OBJECT[key] = (weakref.ref(obj, drop), memo)
    return memo
