"""The compiled chunk decoder (`_native.c`): one chunk of `traceEvents` -> its columns (`_Chunk`) without a
Python object per event, or None when the chunk needs the Python decoders (decode.py, columns.py).

The C code reads the text once: the complete events' cat and name (distinct strings, codes a row), pid, tid,
exact ns timestamps, the five integer args (strings there are coerced here by the Python path's rule), whether
a collective is named, the collective keys' values of the rows that have them (the Python objects msgspec
makes) and where each row's args object is; and the `[memory]` instants. Whatever it does not take as is (a
float where an int belongs, an exponent in a timestamp, an escaped or repeated key, a JSON error) makes it
return None, and the chunk goes through msgspec as before: the columns are the same whichever path made
them. Only communication cpu ops without message sizes (PyTorch < ~2.3) have their args decoded by msgspec,
from the text, for their shapes.

Off when the extension was not built (no C compiler at install time) or `TRACELENS_NATIVE=0`.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.ingest.kineto.columns import (
    _COLL_FIELDS,
    _IS_GPU,
    _OTHER,
    _Chunk,
    _coerce_int,
    _columns,
    _comm_op_rows,
    _kind_codes_from,
    _sizes_from_shapes,
)
from tracelens.ingest.kineto.decode import _EMPTY_ARGS, _Args

try:
    from tracelens.ingest.kineto import _native
except ImportError:  # not compiled: the Python decoders do all the work
    _native = None  # type: ignore[assignment]

#: Whether the compiled decoder is built and not turned off (`TRACELENS_NATIVE=0`).
AVAILABLE = _native is not None and os.environ.get("TRACELENS_NATIVE", "1") != "0"

_DEC_ARGS = msgspec.json.Decoder(_Args)
#: Complete events' int64 columns in the C result (`ints`), the first nine with a validity row (`valid`).
_PID, _TID, _TS, _DUR, _EXT, _SEQNR, _DEVICE, _STREAM, _CORR, _ALO, _AHI = range(11)
_NVALID = 9


def scan(part: bytes | bytearray | memoryview) -> tuple[_Chunk, int] | None:
    """The columns of the JSON array of events at the start of `part`, and the offset just after the array's
    closing `]`; None when the compiled decoder is off or leaves this chunk to the Python decoders."""
    if not AVAILABLE:
        return None
    r = _native.scan(part)
    if r is None:
        return None
    n, cats, cat_idx, names, name_idx, ints, valid, coll_flag, m, mints, mvalid, stop, strs, crow, cvals = r
    iv = np.frombuffer(ints, dtype=np.int64).reshape(11, n)
    ok = np.frombuffer(valid, dtype=np.uint8).reshape(_NVALID, n)
    ints_of = _Ints(strs)
    if n == 0:  # no complete event (a chunk of memory samples, of metadata events): the Python path's columns
        empty = _columns([])
        empty.mem = _memory(m, mints, mvalid, ints_of) if m else None
        return empty, stop
    ci = np.frombuffer(cat_idx, dtype=np.int32)
    lut = np.append(_kind_codes_from(cats), np.int8(_OTHER)) if cats else np.array([_OTHER], dtype=np.int8)
    kind = lut[ci]  # (code -1, no category: the last entry, "other")
    ni = np.frombuffer(name_idx, dtype=np.int32)
    codes = pa.array(ni) if (ni >= 0).all() else pa.array(ni, mask=ni < 0)
    name = pa.DictionaryArray.from_arrays(codes, pa.array(names, type=pa.string()))
    coll_rows = np.zeros(0, dtype=np.int64)
    coll: dict[str, list[Any]] = {}
    comm_op = _comm_op_rows(name)
    has_coll = np.frombuffer(coll_flag, dtype=np.bool_)
    crows = np.frombuffer(crow, dtype=np.int64)
    if crows.size:  # a row with a peer and no collective name carries a collective too (columns._columns)
        src, dst = cvals[_COLL_FIELDS.index("src_rank")], cvals[_COLL_FIELDS.index("dst_rank")]
        peer = np.fromiter(
            (a is not None or b is not None for a, b in zip(src, dst)), dtype=bool, count=crows.size
        )
        if peer.any() and not has_coll[crows[peer]].all():
            has_coll = has_coll.copy()
            has_coll[crows[peer]] = True
    if comm_op is not None or has_coll.any():
        if comm_op is not None:
            has_coll = has_coll | comm_op
        coll_rows = np.flatnonzero(has_coll)
        got = _collectives(part, iv, coll_rows, crows, cvals, name, comm_op)
        if got is None:
            return None
        coll = got
    gpu = _IS_GPU[kind]
    chunk = _Chunk(
        n=n,
        kind=kind,
        name=name,
        pid=ints_of(iv[_PID], ok[_PID]),
        tid=ints_of(iv[_TID], ok[_TID]),
        device=ints_of(iv[_DEVICE], ok[_DEVICE], pa.int32(), gpu),
        stream=ints_of(iv[_STREAM], ok[_STREAM], pa.int32()),
        ts=iv[_TS].copy(),
        ts_valid=ok[_TS] == 1,
        dur=iv[_DUR].copy(),
        dur_valid=ok[_DUR] == 1,
        correlation=ints_of(iv[_CORR], ok[_CORR]),
        external_id=ints_of(iv[_EXT], ok[_EXT]),
        sequence_nr=ints_of(iv[_SEQNR], ok[_SEQNR]),
        coll_rows=coll_rows,
        coll=coll,
        mem=_memory(m, mints, mvalid, ints_of) if m else None,
    )
    return chunk, stop


def _collectives(
    part: bytes | bytearray | memoryview,
    iv: np.ndarray,
    rows: np.ndarray,
    crow: np.ndarray,
    cvals: tuple[list[Any], ...],
    name: pa.Array,
    comm_op: np.ndarray | None,
) -> dict[str, list[Any]] | None:
    """The collective columns (columns._COLL_FIELDS) of the chunk's rows `rows`, as columns._columns makes
    them: the values the C code took from the rows whose args hold a collective's keys (`crow`, `cvals`),
    None for other rows; the sizes of communication cpu ops without any from their `Input Dims` (msgspec
    decodes those rows' args from the text). None when msgspec refuses one of those args."""
    if crow.size == rows.size and np.array_equal(crow, rows):
        coll = {f: list(v) for f, v in zip(_COLL_FIELDS, cvals)}
    else:
        at = np.minimum(np.searchsorted(crow, rows), max(crow.size - 1, 0))
        pos = [
            p if ok else -1 for p, ok in zip(at.tolist(), (crow[at] == rows).tolist() if crow.size else [])
        ]
        if not crow.size:
            pos = [-1] * rows.size
        coll = {f: [v[p] if p >= 0 else None for p in pos] for f, v in zip(_COLL_FIELDS, cvals)}
    if comm_op is None:
        return coll
    # rows without message sizes (PyTorch < ~2.3): sizes from their shapes, as the Python path finds them
    need = [
        i for i, (a, b) in enumerate(zip(coll["in_nelems"], coll["out_nelems"])) if a is None and b is None
    ]
    if not need:
        return coll
    words = name.dictionary.to_pylist() + [None]  # (the last: a null name)
    codes = name.indices.fill_null(len(words) - 1).to_numpy()
    names: list[Any] = [None] * rows.size  # (None: a row _sizes_from_shapes skips)
    sub: list[Any] = [None] * rows.size
    for i in need:
        r = int(rows[i])
        if words[codes[r]]:
            names[i] = words[codes[r]]
            lo, hi = int(iv[_ALO][r]), int(iv[_AHI][r])
            try:
                sub[i] = _DEC_ARGS.decode(part[lo:hi]) if lo >= 0 else _EMPTY_ARGS
            except msgspec.ValidationError:
                return None
    _sizes_from_shapes(coll, sub, names)
    return coll


class _Ints:
    """Integer columns from the C result: values with a validity byte (0 null, 1 an int, 2 the index of a
    string in `strs`, coerced as the Python path coerces any value: columns._coerce_int)."""

    def __init__(self, strs: list[str]) -> None:
        coerced = [_coerce_int(s) for s in strs]
        self.values = np.array([0 if v is None else v for v in coerced], dtype=np.int64)
        self.valid = np.array([v is not None for v in coerced], dtype=np.bool_)

    def __call__(
        self,
        values: np.ndarray,
        ok: np.ndarray,
        type_: pa.DataType | None = None,
        keep: np.ndarray | None = None,
    ) -> pa.Array:
        """The Arrow array of one column, null where not valid (or not `keep`), cast to `type_` as the Python
        path casts (int32 columns wrap: `safe=False`)."""
        valid = ok == 1
        is_str = ok == 2
        if self.values.size and is_str.any():
            at = values[is_str]
            values = values.copy()
            values[is_str] = self.values[at]
            valid[is_str] = self.valid[at]
        if keep is not None:
            valid &= keep
        arr = pa.array(values) if valid.all() else pa.array(values, mask=~valid)
        return arr if type_ is None or type_ == arr.type else pc.cast(arr, type_, safe=False)


def _memory(m: int, mints: bytes, mvalid: bytes, ints_of: _Ints) -> dict[str, Any]:
    """The `[memory]` instants' columns, as columns._memory_columns makes them."""
    iv = np.frombuffer(mints, dtype=np.int64).reshape(5, m)
    ok = np.frombuffer(mvalid, dtype=np.uint8).reshape(5, m)
    return {
        "ts": iv[0].copy(),
        "valid": ok[0] == 1,
        "device": ints_of(iv[1], ok[1], pa.int32()),
        "bytes": ints_of(iv[2], ok[2]),
        "total_allocated": ints_of(iv[3], ok[3]),
        "total_reserved": ints_of(iv[4], ok[4]),
    }


__all__ = ["AVAILABLE", "scan"]
