"""Read one PyTorch profiler (Kineto) Chrome-trace JSON file into Arrow tables (schema.EVENTS, schema.MEMORY).

How and why:
- The file is decompressed as a stream and the `traceEvents` array is cut into chunks at event boundaries,
  each decoded with msgspec typed Structs (only the fields we use; unknown keys are skipped by the decoder).
  Memory stays bounded by one chunk plus the finished columns; we never hold the Python objects of a whole
  trace.
- `ts`/`dur` are decoded as raw JSON text and converted to integer nanoseconds by an exact decimal parse
  (Arrow's decimal cast), so 3-decimal microsecond timestamps at epoch scale (1.7e18 ns > 2**53) stay exact.
- Columns are built per chunk with C-level `map`/`attrgetter` passes and numpy/Arrow, never a Python loop per
  event.
- Speed (docs/performance.md): gzip is inflated inline into one reused buffer; the garbage collector is paused
  while reading; `args` decode into a lean struct until a collective appears; on an idle multi-core machine
  a large file is decoded by two processes (_scan_split), the child's columns coming back as Arrow IPC in
  shared memory. Every fast path falls back to the careful one, with identical results.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import queue
import re
import signal
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import compress, repeat
from operator import attrgetter, eq, is_not
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest import comm_families
from tracelens.ingest import salvage as _salv

try:  # ISA-L's inflate (python-isal) is ~3x faster than zlib's and releases the GIL likewise; optional
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover (depends on the environment)
    _inflate = zlib
_INFLATE_ERRORS = tuple({zlib.error, _inflate.error})
#: ISA-L's gzip reader, which inflates into a caller's buffer (no new object per block): split reads use it.
_GzipReader = getattr(_inflate, "_GzipReader", None)

#: Decompressed bytes above which a gzip trace is refused (override with TRACELENS_MAX_DECOMPRESSED_BYTES).
DEFAULT_MAX_DECOMPRESSED = 64 * 1024**3
#: A compression ratio above this, once past RATIO_MIN_BYTES of output, is treated as a decompression bomb.
MAX_RATIO = 1000
RATIO_MIN_BYTES = 1024**3
#: Target size (bytes of JSON) of one decoded chunk of `traceEvents`.
CHUNK_BYTES = 1024 * 1024
#: Inflated block size. Larger blocks are allocated by mmap and fault their pages in afresh each time
#: (1 MiB blocks cost ~3,000 page faults, ~5 ms, per 25 MB of JSON); 256 KiB ones are reused from the heap.
_READ_BYTES = 256 * 1024
#: Arrow's allocator is asked to return freed memory to the OS after this many bytes of decoded JSON (not
#: after every chunk: mimalloc's collection costs ~0.3 ms a time and the pages it returns fault back in; not
#: much less often: at 16 MiB a split read's helper process held ~5 MB more at its peak).
RELEASE_BYTES = 4 * 1024 * 1024


# --------------------------------------------------------------------------------------------- typed structs
_RAW_NONE = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` keys of complete events tracelens uses; every other key is skipped by the decoder. Few
    fields, in Kineto's key order, make the decoder's key lookup cheaper (memory keys are in _MemArgs)."""

    # ids: int or str only (a float or bool sends the chunk to the loose decoder), so that numpy can read
    # them without truncating anything
    external_id: int | str | None = msgspec.field(name="External id", default=None)
    # autograd: a forward op and the backward node it recorded share this number (analyze.composition)
    sequence_nr: int | str | None = msgspec.field(name="Sequence number", default=None)
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | str | None = None
    collective: int | float | str | bool | None = msgspec.field(name="Collective name", default=None)
    pg_name: int | float | str | bool | None = msgspec.field(name="Process Group Name", default=None)
    pg_desc: int | float | str | bool | None = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: list[int] | int | float | str | bool | None = msgspec.field(
        name="Process Group Ranks", default=None
    )
    group_size: int | float | str | bool | None = msgspec.field(name="Group size", default=None)
    seq: int | float | str | bool | None = msgspec.field(name="Seq", default=None)
    in_nelems: int | float | str | bool | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: int | float | str | bool | None = msgspec.field(name="Out msg nelems", default=None)
    dtype: int | float | str | bool | None = None
    src_rank: int | float | str | bool | None = msgspec.field(name="Src Rank", default=None)
    dst_rank: int | float | str | bool | None = msgspec.field(name="Dst Rank", default=None)
    # shapes, kept as raw JSON text: decoded only for communication cpu ops (sizes of collectives whose
    # kernels carry no `In msg nelems`, PyTorch < ~2.3; comm_families.sizes_from_shapes)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_RAW_NONE)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_RAW_NONE)


class _MemArgs(msgspec.Struct, frozen=True, gc=False):
    """The `args` keys of `[memory]` instant events: int or str only, as the ids of _Args (numpy reads them
    at once); any other value type sends the chunk to the loose decoder."""

    device_id: int | str | None = msgspec.field(name="Device Id", default=None)
    bytes: int | str | None = msgspec.field(name="Bytes", default=None)
    total_allocated: int | str | None = msgspec.field(name="Total Allocated", default=None)
    total_reserved: int | str | None = msgspec.field(name="Total Reserved", default=None)


class _LooseArgs(msgspec.Struct, frozen=True, gc=False):
    """Fallback for `args` whose values have unexpected JSON types (objects, nested lists)."""

    external_id: Any = msgspec.field(name="External id", default=None)
    sequence_nr: Any = msgspec.field(name="Sequence number", default=None)
    correlation: Any = None
    device: Any = None
    stream: Any = None
    collective: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    src_rank: Any = msgspec.field(name="Src Rank", default=None)
    dst_rank: Any = msgspec.field(name="Dst Rank", default=None)
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=None)
    bytes: Any = msgspec.field(name="Bytes", default=None)
    device_id: Any = msgspec.field(name="Device Id", default=None)
    input_dims: Any = msgspec.field(name="Input Dims", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)


_EMPTY_ARGS = _Args()
_EMPTY_MEM_ARGS = _MemArgs()
_EMPTY_LOOSE_ARGS = _LooseArgs()


class _Event(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """A complete event (`ph: X`); `ts`/`dur` kept as raw JSON text for exact decimal conversion."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None  # no float: see _Args
    tid: int | str | None = None
    ts: msgspec.Raw = _RAW_NONE
    dur: msgspec.Raw = _RAW_NONE
    args: _Args = _EMPTY_ARGS


class _Instant(msgspec.Struct, tag="i", tag_field="ph", gc=False):
    """An instant event; only `[memory]` ones are kept."""

    name: str | None = None
    ts: msgspec.Raw = _RAW_NONE
    args: _MemArgs = _EMPTY_MEM_ARGS


class _InstantOld(_Instant, tag="I"):
    pass


class _EventInt(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """`_Event` for files whose timestamps are JSON integers (µs, as older Kineto writes them): decoding them
    as int is exact and cheaper than raw text. A float anywhere makes the chunk use `_Event`."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | None = None
    dur: int | None = None
    args: _Args = _EMPTY_ARGS


class _InstantInt(msgspec.Struct, tag="i", tag_field="ph", gc=False):
    name: str | None = None
    ts: int | None = None
    args: _MemArgs = _EMPTY_MEM_ARGS


class _InstantOldInt(_InstantInt, tag="I"):
    pass


class _ArgsLean(msgspec.Struct, frozen=True, gc=False):
    """_Args without the collective keys other than `Collective name`: a third of the fields, which makes
    the decoder ~15% faster and freeing ~35% faster. Used until a chunk holds a collective (that chunk is
    decoded again with _Args, and so is the rest of the file: _Hint.lean), so results are the same."""

    external_id: int | str | None = msgspec.field(name="External id", default=None)
    # autograd: a forward op and the backward node it recorded share this number (analyze.composition)
    sequence_nr: int | str | None = msgspec.field(name="Sequence number", default=None)
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | str | None = None
    collective: int | float | str | bool | None = msgspec.field(name="Collective name", default=None)


_EMPTY_ARGS_LEAN = _ArgsLean()


class _EventLean(_Event, tag="X"):
    args: _ArgsLean = _EMPTY_ARGS_LEAN  # type: ignore[assignment]


class _EventIntLean(_EventInt, tag="X"):
    args: _ArgsLean = _EMPTY_ARGS_LEAN  # type: ignore[assignment]


#: Every other Chrome-trace phase decodes to an empty struct: the decoder skips its content. A phase not
#: listed here makes the chunk fall back to the loose decoder, which handles anything.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{ord(t)}", [], tag=t, tag_field="ph", gc=False)
    for t in "BEbnestfPONDMRCcSTFpVv()"
)
_TAGGED = Union[(_Event, _Instant, _InstantOld, *_OTHER_PHASES)]  # noqa: UP007 (a runtime tuple of types)
_TAGGED_INT = Union[(_EventInt, _InstantInt, _InstantOldInt, *_OTHER_PHASES)]  # noqa: UP007
_TAGGED_LEAN = Union[(_EventLean, _Instant, _InstantOld, *_OTHER_PHASES)]  # noqa: UP007
_TAGGED_INT_LEAN = Union[(_EventIntLean, _InstantInt, _InstantOldInt, *_OTHER_PHASES)]  # noqa: UP007


class _LooseEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _RAW_NONE
    dur: msgspec.Raw = _RAW_NONE
    args: _LooseArgs | None = _EMPTY_LOOSE_ARGS


class _Top(msgspec.Struct):
    """Top-level keys of a Kineto file (metadata); `traceEvents` is None when the key is absent."""

    traceEvents: list[_TAGGED] | None = None  # type: ignore[valid-type]
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    host_name: Any = None
    trace_id: Any = None
    baseTimeNanoseconds: Any = None


class _TopLoose(msgspec.Struct):
    traceEvents: list[_LooseEvent] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    host_name: Any = None
    trace_id: Any = None
    baseTimeNanoseconds: Any = None


_DEC_EVENTS = msgspec.json.Decoder(list[_TAGGED])  # type: ignore[valid-type]
_DEC_EVENTS_INT = msgspec.json.Decoder(list[_TAGGED_INT])  # type: ignore[valid-type]
_DEC_EVENTS_LEAN = msgspec.json.Decoder(list[_TAGGED_LEAN])  # type: ignore[valid-type]
_DEC_EVENTS_INT_LEAN = msgspec.json.Decoder(list[_TAGGED_INT_LEAN])  # type: ignore[valid-type]
_DEC_EVENTS_LOOSE = msgspec.json.Decoder(list[_LooseEvent])
_DEC_TOP = msgspec.json.Decoder(_Top)
_DEC_TOP_LOOSE = msgspec.json.Decoder(_TopLoose)
_DEC_EVENT_LOOSE = msgspec.json.Decoder(_LooseEvent)
_DEC_EVENTS_RAW = msgspec.json.Decoder(list[msgspec.Raw])


class _TopRaw(_TopLoose):
    traceEvents: list[msgspec.Raw] | None = None  # type: ignore[assignment]


_DEC_TOP_RAW = msgspec.json.Decoder(_TopRaw)
_DEC_ANY = msgspec.json.Decoder()

_META_KEYS = (
    "schemaVersion",
    "deviceProperties",
    "distributedInfo",
    "host_name",
    "trace_id",
    "baseTimeNanoseconds",
)


@dataclass
class KinetoTrace:
    """One rank's trace: `events` (schema.EVENTS), `memory` (schema.MEMORY), `metadata` (a schema.METADATA
    row as a dict)."""

    events: pa.Table
    memory: pa.Table
    metadata: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- kinds
_KIND_INDEX = {k: i for i, k in enumerate(schema.KINDS)}
_OTHER = _KIND_INDEX["other"]
_KIND_ALIASES = {
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "hip_runtime": "cuda_runtime",
    "privateuse1_runtime": "cuda_runtime",
    "mtia_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "driver": "cuda_driver",
    "hip_driver": "cuda_driver",
    "privateuse1_driver": "cuda_driver",
    "mtia_ccp_events": "kernel",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
}
#: Kinds that run on the device: device/stream come from their args, their step from their CPU launch.
GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
_GPU_CODES = np.array([_KIND_INDEX[k] for k in GPU_KINDS], dtype=np.int8)
_LAUNCH_CODES = np.array([_KIND_INDEX["cuda_runtime"], _KIND_INDEX["cuda_driver"]], dtype=np.int8)
_STEP_CODES = np.array([_KIND_INDEX["user_annotation"], _KIND_INDEX["cpu_op"]], dtype=np.int8)


def _kind_table(codes: np.ndarray) -> np.ndarray:
    """Kind code -> whether it is one of `codes` (indexing this table is cheaper than np.isin)."""
    table = np.zeros(len(schema.KINDS), dtype=bool)
    table[codes] = True
    return table


_IS_GPU = _kind_table(_GPU_CODES)
_IS_LAUNCH = _kind_table(_LAUNCH_CODES)
_IS_STEP = _kind_table(_STEP_CODES)


def normalise_kind(cat: Any) -> str:
    """Kineto `cat` -> one of schema.KINDS (case-insensitive; older, ROCm and MTIA names folded in)."""
    if not isinstance(cat, str):
        return "other"
    return _KIND_ALIASES.get(cat.strip().lower(), "other")


def _kind_codes(cats: list) -> np.ndarray:
    """`cat` values -> int8 codes into schema.KINDS (dictionary-encoded in Arrow; Python only per unique)."""
    enc = pc.dictionary_encode(_str_array(cats))
    uniq = enc.dictionary.to_pylist()
    lut = np.array([_KIND_INDEX[normalise_kind(c)] for c in uniq] + [_OTHER], dtype=np.int8)
    idx = enc.indices.fill_null(len(uniq)).to_numpy(zero_copy_only=False)
    return lut[idx]


# ------------------------------------------------------------------------------- exact decimal parse
_POW10 = np.array([10**i for i in range(19)], dtype=np.int64)
_ALLOWED = np.zeros(256, dtype=bool)
_ALLOWED[[ord(c) for c in '0123456789.-+" ']] = True


_DEC_TYPE = pa.decimal128(22, 3)


def parse_us_to_ns(raws: list) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond JSON number texts (msgspec.Raw/bytes; empty = absent) -> (int64 ns, valid mask), exact.

    Fast path: the texts become one Arrow string array (no per-value Python objects) cast to decimal(22, 3),
    whose unscaled integer is the value in ns. Texts that cast refuses (null, quoted, more than 3 decimals,
    exponents) make the whole batch go through `parse_us_to_ns_numpy`, which rounds and handles them.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    valid = lens > 0
    if lens.sum() < 2**31:
        off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=off[1:])
        vbuf = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        strs = pa.StringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(b"".join(raws)), vbuf)
        try:
            dec = pc.cast(strs, _DEC_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            dec = None
        if dec is not None:
            words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset : 2 * (dec.offset + n)]
            lo, hi = words[0::2], words[1::2]
            if (hi[valid] == (lo[valid] >> 63)).all():  # every value fits in int64 ns
                return np.where(valid, lo, 0), valid
    return parse_us_to_ns_numpy(raws)


def parse_us_to_ns_numpy(raws: list) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond JSON number texts (msgspec.Raw/bytes) -> (int64 ns, valid mask), exact to the nanosecond.

    Vectorised over all characters: each digit contributes digit * 10**(its power in ns); per-value sums via
    np.add.reduceat. Decimals beyond the third are rounded half-up. Texts numpy cannot handle (exponents,
    more than 16 integer digits) go through Decimal one by one; `null`/absent values are invalid.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    joined = b",".join(raws)
    buf = np.frombuffer(joined, dtype=np.uint8)
    is_sep = buf == 44
    sep_pos = np.flatnonzero(is_sep)
    if sep_pos.size != n - 1:  # a value that is a JSON array or object (holds commas): not a timestamp
        raws = [b"" if b"," in bytes(r) else r for r in raws]
        joined = b",".join(raws)
        buf = np.frombuffer(joined, dtype=np.uint8)
        is_sep = buf == 44
        sep_pos = np.flatnonzero(is_sep)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = sep_pos + 1
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = sep_pos
    ends[-1] = buf.size
    tok = np.cumsum(is_sep, dtype=np.int64)
    dot_chars = np.flatnonzero(buf == 46)
    pos = np.arange(buf.size, dtype=np.int64)
    # without a dot, the units digit is the token's last digit (a quoted "50" ends with a quote)
    is_digit = (buf >= 48) & (buf <= 57)
    last_digit = np.maximum.reduceat(np.append(np.where(is_digit, pos + 1, 0), 0), starts)
    has_digit = last_digit > starts
    dotpos = np.where(has_digit, last_digit, ends)
    dotpos[tok[dot_chars]] = dot_chars
    tdot = dotpos[tok]
    power = tdot - pos
    power -= pos < tdot
    power += 3
    d = buf.astype(np.int64) - 48
    digit = (d >= 0) & (d <= 9)
    main = digit & (power >= 0)
    contrib = np.where(main, d * _POW10[np.clip(power, 0, 18)], 0)
    contrib += digit & (power == -1) & (d >= 5)  # round half-up at the 4th decimal
    contrib = np.append(contrib, 0)  # so that an empty last token has a valid reduceat index
    values = np.add.reduceat(contrib, starts)
    values[starts == ends] = 0
    wrapped = values < 0  # a sum of non-negative digit terms is negative only when it overflowed int64
    neg_chars = np.flatnonzero(buf == 45)
    neg = np.zeros(n, dtype=bool)
    neg[tok[neg_chars]] = True
    values[neg] *= -1
    valid = (ends > starts) & has_digit  # a quoted "" or a lone "-" is no number
    # tokens with characters a plain decimal does not have, two dots, or too many integer digits
    bad = np.zeros(n, dtype=bool)
    bad_chars = np.flatnonzero(~_ALLOWED[buf] & ~is_sep)
    bad[tok[bad_chars]] = True
    ndots = np.bincount(tok[dot_chars], minlength=n) if dot_chars.size else np.zeros(n, np.int64)
    bad |= ndots > 1
    bad |= (dotpos - starts) > 16  # beyond int64 ns (year 2262)
    bad |= wrapped  # 16 integer digits past 9223372036854775.807 µs: the exact parse marks them invalid
    if bad.any():
        for i in np.flatnonzero(bad):
            v = _parse_one(bytes(joined[starts[i] : ends[i]]))
            if v is None:
                valid[i] = False
                values[i] = 0
            else:
                values[i] = v
    return values, valid


def _parse_one(text: bytes) -> int | None:
    """Slow path of parse_us_to_ns for one value: exponent notation, quoted strings, null."""
    t = text.strip().strip(b'"').strip()
    if not t or t in (b"null", b"true", b"false"):
        return None
    try:
        v = Decimal(t.decode("ascii")) * 1000
        if not v.is_finite():
            return None
        iv = int(v.to_integral_value(rounding="ROUND_HALF_UP"))
    except (InvalidOperation, UnicodeDecodeError, ValueError):
        return None
    return iv if -(2**63) <= iv < 2**63 else None


# ------------------------------------------------------------------------------------ value coercion
def _coerce_int(v: Any) -> int | None:
    """One JSON value -> int or None (ints, integral floats, decimal or 0x-hex strings)."""
    if v is None or isinstance(v, bool):
        return None if v is None else int(v)
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and abs(v) < 2**63 and v == int(v) else None
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s, 0) if s[:2].lower() in ("0x", "0o", "0b") else int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                return None
            return _coerce_int(f)
    return None


_INT_OR_NONE = frozenset({int, type(None)})


def _rank_int(v: Any, lo: int = 0) -> int | None:
    """A rank (lo=0) or world size (lo=1) from distributedInfo: an int in [lo, 2**31), else None (ignored)."""
    i = _coerce_int(v)
    return i if i is not None and lo <= i < 2**31 else None


def _int_array(values: list, type_: pa.DataType) -> pa.Array:
    """Python values -> Arrow integer array; the fast path is pa.array, odd values are coerced one by one."""
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        # coerce only the odd values (strings such as "Spans" or "0x1f", floats); found with C-level passes
        plain = np.fromiter(map(_INT_OR_NONE.__contains__, map(type, values)), dtype=bool, count=len(values))
        values = list(values)
        for i in np.flatnonzero(~plain).tolist():
            values[i] = _coerce_int(values[i])
        try:
            arr = pa.array(values, type=pa.int64())
        except OverflowError:  # an int beyond int64: null, like any other value that is no int64
            arr = pa.array([_coerce_int(v) for v in values], type=pa.int64())
    if type_ == pa.int64():
        return arr
    return pc.cast(arr, type_, safe=False) if arr.null_count < len(arr) else pa.nulls(len(arr), type_)


def _str_array(values: list) -> pa.Array:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([v if isinstance(v, str) or v is None else str(v) for v in values], type=pa.string())


_ranks_cache: dict[Any, list[int] | None] = {}


def parse_pg_ranks(v: Any) -> list[int] | None:
    """`Process Group Ranks` ("[0, 1, 2]" or a list) -> list of ints; None when truncated ("...") or bad."""
    if isinstance(v, list):
        return [int(x) for x in v] if all(isinstance(x, int) and not isinstance(x, bool) for x in v) else None
    if not isinstance(v, str):
        return None
    if v in _ranks_cache:
        return _ranks_cache[v]
    out: list[int] | None
    s = v.strip()
    if "..." in s or not (s.startswith("[") and s.endswith("]")):
        out = None
    else:
        body = s[1:-1].strip()
        try:
            out = [int(x) for x in body.split(",")] if body else []
        except ValueError:
            out = None
    if len(_ranks_cache) < 10000:
        _ranks_cache[v] = out
    return out


# ----------------------------------------------------------------------------------- chunk -> columns
_PH_CODE = {"X": 1, "i": 2, "I": 2}
_TYPE_CODE = {_Event: 1, _Instant: 2, _InstantOld: 2}
_MEMORY_NAME = "[memory]"
_get = {f: attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")}
_COLL_FIELDS = (
    "collective",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "group_size",
    "seq",
    "in_nelems",
    "out_nelems",
    "dtype",
    "src_rank",
    "dst_rank",
)


@dataclass
class _Chunk:
    """Columns of the complete and memory events of one decoded chunk (timestamps relative to the file)."""

    n: int
    kind: np.ndarray
    name: pa.Array
    pid: pa.Array
    tid: pa.Array
    device: pa.Array
    stream: pa.Array
    ts: np.ndarray
    ts_valid: np.ndarray
    dur: np.ndarray
    dur_valid: np.ndarray
    correlation: pa.Array
    external_id: pa.Array
    sequence_nr: pa.Array
    coll_rows: np.ndarray  # row indices (within the chunk) that carry collective args
    coll: dict  # field -> Python list aligned with coll_rows
    mem: dict | None


_X_TYPES = frozenset({_Event, _EventInt, _EventLean, _EventIntLean})
_I_TYPES = frozenset({_Instant, _InstantOld, _InstantInt, _InstantOldInt})
_INT_TS_TYPES = frozenset({_EventInt, _EventIntLean, _InstantInt, _InstantOldInt})


class _NeedFullArgs(Exception):
    """A chunk decoded with _ArgsLean holds a collective: it must be decoded with _Args."""


def _columns(evs: list) -> _Chunk:
    """Build the columns of one chunk of decoded events (C-level passes; no per-event Python code)."""
    if evs and type(evs[0]) is _LooseEvent:  # the loose decoder keeps `ph` as a field
        phs = [p if isinstance(p, str) else None for p in map(_get["ph"], evs)]  # any JSON value here
        ph = np.fromiter(map(_PH_CODE.get, phs, repeat(0)), dtype=np.int8, count=len(phs))
        xs = list(compress(evs, (ph == 1).tolist()))
        inst = list(compress(evs, (ph == 2).tolist())) if (ph == 2).any() else []
    else:  # the tagged decoders tell phases apart by type
        types = list(map(type, evs))
        xs = list(compress(evs, map(_X_TYPES.__contains__, types)))
        inst = list(compress(evs, map(_I_TYPES.__contains__, types))) if len(xs) < len(evs) else []
        del types
    mem = None
    if inst:
        names = map(_get["name"], inst)
        is_mem = np.fromiter(map(eq, names, repeat(_MEMORY_NAME)), dtype=bool, count=len(inst))
        if is_mem.any():
            mem = _memory_columns(list(compress(inst, is_mem.tolist())))
    n = len(xs)
    loose = bool(n) and type(xs[0]) is _LooseEvent
    kind = _kind_codes_of(xs) if not loose else _kind_codes(list(map(_get["cat"], xs)))
    names = _dict_encode(_str_array(list(map(_get["name"], xs))))
    args = list(map(_get["args"], xs))
    if loose and None in args:  # only the loose decoder lets `args: null` through
        args = [_EMPTY_LOOSE_ARGS if a is None else a for a in args]
    ts, ts_valid = _times_ns(xs, "ts")
    dur, dur_valid = _times_ns(xs, "dur")
    coll_rows = np.zeros(0, dtype=np.int64)
    coll: dict = {}
    comm_op = _comm_op_rows(names) if n else None
    if n and (loose or comm_op is not None or set(map(_get_coll, args)) != {None}):  # (a set of Nones: cheap)
        if type(args[0]) is _ArgsLean:
            raise _NeedFullArgs()
        has_coll = np.fromiter(map(is_not, map(_get_coll, args), repeat(None)), dtype=bool, count=n)
        if comm_op is not None:
            has_coll |= comm_op
        coll_rows = np.flatnonzero(has_coll)
        if coll_rows.size:
            sub = [args[i] for i in coll_rows.tolist()]
            for f in _COLL_FIELDS:
                coll[f] = list(map(attrgetter(f), sub))
            if comm_op is not None:
                _sizes_from_shapes(coll, sub, names.take(pa.array(coll_rows)).to_pylist())
    # device/stream matter only for device events (elsewhere _assemble nulls them)
    gpu = _IS_GPU[kind]
    gpu_rows = np.flatnonzero(gpu)
    gpu_args = args if gpu_rows.size == n else list(compress(args, gpu.tolist()))
    return _Chunk(
        n=n,
        kind=kind,
        name=names,
        pid=_ints(_get["pid"], xs, pa.int64(), loose, lowcard=True),
        tid=_ints(_get["tid"], xs, pa.int64(), loose, lowcard=True),
        device=_scatter(_ints(_get_device, gpu_args, pa.int32(), loose), n, gpu_rows),
        # (all rows: a Triton launch cpu_op carries `args.stream`, which HTA counts as a GPU kernel)
        stream=_ints(_get_stream, args, pa.int32(), loose),
        ts=ts,
        ts_valid=ts_valid,
        dur=dur,
        dur_valid=dur_valid,
        correlation=_ints(_get_corr, args, pa.int64(), loose),
        external_id=_ints(_get_ext, args, pa.int64(), loose),
        sequence_nr=_ints(_get_seqnr, args, pa.int64(), loose),
        coll_rows=coll_rows,
        coll=coll,
        mem=mem,
    )


def _comm_op_rows(names: pa.Array) -> np.ndarray | None:
    """Rows whose name is a communication cpu op (comm_families.COMM_CPU_OP), or None when there is none
    (one regex per distinct name of the chunk)."""
    d = names.dictionary.to_pylist()
    hit = np.fromiter((comm_families.is_comm_cpu_op(v) for v in d), dtype=bool, count=len(d))
    if not hit.any():
        return None
    idx = names.indices.fill_null(len(d)).to_numpy(zero_copy_only=False)
    return np.r_[hit, False][idx]


def _shape_value(v: Any) -> Any:
    """An `Input Dims` / `Input type` value: raw JSON text (typed decoders) or already decoded (loose)."""
    if isinstance(v, msgspec.Raw):
        if not len(v):
            return None
        try:
            return _DEC_ANY.decode(v)
        except (msgspec.DecodeError, RecursionError):
            return None
    return v


def _sizes_from_shapes(coll: dict, args: list, names: list) -> None:
    """Fill in_nelems / out_nelems / dtype of communication cpu ops that carry no message sizes from their
    `Input Dims` / `Input type` (in place, rows aligned with `args`); the raw shape texts are dropped."""
    for i, (a, name) in enumerate(zip(args, names)):
        if coll["in_nelems"][i] is not None or coll["out_nelems"][i] is not None or not name:
            continue
        dims = _shape_value(getattr(a, "input_dims", None))
        if dims is None:
            continue
        n_in, n_out, dtype = comm_families.sizes_from_shapes(name, dims, _shape_value(a.input_type))
        coll["in_nelems"][i], coll["out_nelems"][i] = n_in, n_out
        if coll["dtype"][i] is None:
            coll["dtype"][i] = dtype


_get_coll = attrgetter("collective")
_get_device = attrgetter("device")
_get_stream = attrgetter("stream")
_get_corr = attrgetter("correlation")
_get_ext = attrgetter("external_id")
_get_seqnr = attrgetter("sequence_nr")
#: `cat` string -> kind code, filled as new categories are seen (bounded; misses are computed per chunk).
_CAT_CODES: dict = {None: _OTHER}
_CAT_CACHE_MAX = 4096


def _kind_codes_of(xs: list) -> np.ndarray:
    """Kind codes of typed events (`cat` is str or None) via a dict lookup per event; only categories not
    seen before go through normalise_kind."""
    n = len(xs)
    codes = np.fromiter(map(_CAT_CODES.get, map(_get["cat"], xs), repeat(-1)), dtype=np.int8, count=n)
    miss = codes < 0
    if miss.any():
        rows = np.flatnonzero(miss)
        cats = list(map(_get["cat"], (xs[i] for i in rows.tolist())))
        lut = {c: _KIND_INDEX[normalise_kind(c)] for c in set(cats)}
        codes[rows] = np.fromiter(map(lut.__getitem__, cats), dtype=np.int8, count=len(cats))
        if len(_CAT_CODES) + len(lut) <= _CAT_CACHE_MAX:
            _CAT_CODES.update(lut)
    return codes


def _times_ns(evs: list, f: str) -> tuple[np.ndarray, np.ndarray]:
    """`ts`/`dur` of decoded events -> (int64 ns, valid), exact: integer µs (the int decoders) are
    multiplied by 1000, raw texts go through parse_us_to_ns."""
    vals = list(map(_get[f], evs))
    if evs and type(evs[0]) in _INT_TS_TYPES:
        return _int_us_to_ns(vals)
    return parse_us_to_ns(vals)


_US_MAX = (2**63 - 1) // 1000


def _int_us_to_ns(vals: list) -> tuple[np.ndarray, np.ndarray]:
    """Integer microseconds (Python ints or None only: what the int decoders give; numpy would truncate a
    float) -> (int64 ns, valid mask); values whose ns do not fit in int64 are invalid, as in parse_us_to_ns."""
    n = len(vals)
    try:  # the common case, every value present (the decoder guarantees ints): numpy reads them fastest
        us = np.fromiter(vals, dtype=np.int64, count=n)
    except (TypeError, OverflowError, ValueError):
        us = None
    if us is not None:
        valid = np.ones(n, dtype=bool)
        big = (us > _US_MAX) | (us < -_US_MAX)
        if big.any():
            valid &= ~big
            us = np.where(big, 0, us)
        return us * 1000, valid
    try:
        arr = pa.array(vals, type=pa.int64())
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        ok = [v if type(v) is int and -_US_MAX <= v <= _US_MAX else None for v in vals]
        arr = pa.array(ok, type=pa.int64())
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        us = arr.fill_null(0).to_numpy()
    else:
        valid = np.ones(n, dtype=bool)
        us = arr.to_numpy()
    big = (us > _US_MAX) | (us < -_US_MAX)
    if big.any():
        valid = valid & ~big
        us = np.where(big, 0, us)
    return us * 1000, valid


def _ints(get: Any, objs: list, type_: pa.DataType, loose: bool, lowcard: bool = False) -> pa.Array:
    """An integer column from one attribute of decoded structs. Typed structs hold int, str or None there
    (never a float, which numpy would truncate), so numpy reads a column without None at once; anything
    else (None, "0x1f", "Spans") goes through _int_array / _lowcard_int_array."""
    if not loose:
        try:
            arr = pa.array(np.fromiter(map(get, objs), dtype=np.int64, count=len(objs)))
            return arr if type_ == pa.int64() else pc.cast(arr, type_, safe=False)
        except (TypeError, ValueError, OverflowError):
            pass
    vals = list(map(get, objs))
    return _lowcard_int_array(vals) if lowcard else _int_array(vals, type_)


def _lowcard_int_array(values: list) -> pa.Array:
    """Like _int_array(values, int64) for columns with few distinct values (pid, tid): when odd values
    (strings such as "Spans") are present, each distinct value is coerced once instead of each row."""
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    try:
        uniq = dict.fromkeys(values)
    except TypeError:  # unhashable values (loose decoder)
        return _int_array(values, pa.int64())
    lut = {v: _coerce_int(v) for v in uniq}
    return pa.array(list(map(lut.__getitem__, values)), type=pa.int64())


def _memory_columns(mems: list) -> dict:
    args = list(map(_get["args"], mems))
    loose = type(mems[0]) is _LooseEvent
    if loose and None in args:  # (`in` compares every struct: loose events only)
        args = [_EMPTY_LOOSE_ARGS if a is None else a for a in args]
    ts, valid = _times_ns(mems, "ts")
    return {
        "ts": ts,
        "valid": valid,
        "device": _ints(_get_device_id, args, pa.int32(), loose),
        "bytes": _ints(_get_bytes, args, pa.int64(), loose),
        "total_allocated": _ints(_get_total_allocated, args, pa.int64(), loose),
        "total_reserved": _ints(_get_total_reserved, args, pa.int64(), loose),
    }


_get_device_id = attrgetter("device_id")
_get_bytes = attrgetter("bytes")
_get_total_allocated = attrgetter("total_allocated")
_get_total_reserved = attrgetter("total_reserved")


# ------------------------------------------------------------------------------------------ reading
def max_decompressed_bytes() -> int:
    """Decompressed-size limit for gzip traces (env TRACELENS_MAX_DECOMPRESSED_BYTES, default 64 GiB)."""
    v = os.environ.get("TRACELENS_MAX_DECOMPRESSED_BYTES")
    if v:
        try:
            return int(float(v))
        except ValueError:
            pass
    return DEFAULT_MAX_DECOMPRESSED


class _Truncated(Exception):
    """The gzip stream ended before its end marker (a file cut mid-write)."""


def _blocks(path: Path, out_bytes: int = _READ_BYTES) -> Generator[bytes, None, None]:
    """Decompressed content of `path` in blocks of at most ~`out_bytes` (gzip by magic bytes, multi-member
    aware, size-bounded against decompression bombs). Raises _Truncated after the last block of a cut gzip."""
    limit = max_decompressed_bytes()
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic != b"\x1f\x8b":
            while True:
                b = fh.read(out_bytes)
                if not b:
                    return
                yield b
        d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
        total_in = total_out = 0
        pending = b""
        exhausted = False
        while True:
            if not pending and not exhausted:
                pending = fh.read(max(out_bytes // 8, 16))
                exhausted = not pending
                total_in += len(pending)
            cut = False
            try:
                out = d.decompress(pending, out_bytes)
                if exhausted and not out and not d.eof:
                    # input used up before the end marker; ISA-L may still hold decoded bytes: take them
                    out = d.flush()
                    cut = True
            except _INFLATE_ERRORS as err:
                raise BadTraceError(f"{path}: corrupt gzip data ({err})") from None
            pending = d.unconsumed_tail
            total_out += len(out)
            if total_out > limit:
                raise BadTraceError(
                    f"{path}: decompresses to more than {limit} bytes; "
                    "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                )
            if total_out > RATIO_MIN_BYTES and total_out > MAX_RATIO * total_in:
                raise BadTraceError(
                    f"{path}: compression ratio above {MAX_RATIO}:1 (decompression bomb?); "
                    "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                )
            if out:
                yield out
            if cut:
                raise _Truncated()
            if d.eof:
                rest = d.unused_data
                if rest.lstrip(b"\x00")[:2] == b"\x1f\x8b":  # another gzip member follows
                    d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
                    pending = rest.lstrip(b"\x00")
                elif rest.lstrip(b"\x00") or exhausted:
                    return  # the end, or trailing bytes that are not a gzip member (the trace before is whole)
                else:
                    pending = b""


def _reused_blocks(path: Path, out_bytes: int) -> Generator[memoryview | bytes, None, None]:
    """Decompressed content of `path` for the fast paths (split reads, serial reads without salvage): like
    _blocks (same limits), but inflated inline by ISA-L's gzip reader into one reused buffer, so no block is
    allocated (fresh pages fault in: ~5 ms per 25 MB in a forked child) and no thread hands blocks over (the
    decoder holds the GIL for a chunk at a time, so a background inflater mostly waits for it). A block is
    valid only until the next one is requested (_scan_blocks copies it). Any error, a cut file included,
    raises _SplitFailed: the careful path (_blocks) then reads the file and reports it precisely. Falls back
    to _blocks without python-isal."""
    if _GzipReader is None or not _is_gzip(path):
        yield from _blocks(path, out_bytes)
        return
    limit = max_decompressed_bytes()
    buf = memoryview(bytearray(out_bytes))
    total = 0
    try:
        with open(path, "rb") as fh:
            reader = _GzipReader(fh, out_bytes)
            while True:
                n = reader.readinto(buf)
                if not n:
                    return
                total += n
                if total > limit or (total > RATIO_MIN_BYTES and total > MAX_RATIO * fh.tell()):
                    raise _SplitFailed()
                yield buf[:n]
    except (EOFError, OSError, *_INFLATE_ERRORS):
        raise _SplitFailed() from None


def _prefetch(it: Iterator[bytes], depth: int = 4) -> Generator[bytes, None, None]:
    """Run a block iterator in a background thread (zlib and file reads release the GIL, so decompression
    overlaps decoding); at most `depth` blocks wait in the queue. Exceptions are re-raised in the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for b in it:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as err:  # noqa: BLE001 (handed to the consumer)
            q.put(err)

    th = threading.Thread(target=work, name="tracelens-gunzip", daemon=True)
    th.start()
    try:
        while True:
            b = q.get()
            if b is done:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()
        while th.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                th.join(0.05)


_TE_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"


def _last_boundary(buf: bytes | bytearray, lo: int, hi: int | None = None) -> tuple[int, int] | None:
    """Last `}` , `{` separator in buf[lo:hi]: (index just after `}`, index of `{`), or None."""
    p = len(buf) if hi is None else hi
    while True:
        p = buf.rfind(b"{", lo, p)
        if p <= lo:
            return None
        q = p - 1
        while q > lo and buf[q] in _WS:
            q -= 1
        if buf[q] == 44:  # ','
            r = q - 1
            while r > lo and buf[r] in _WS:
                r -= 1
            if buf[r] == 125:  # '}'
                return r + 1, p


# the first `}` , `{` event separator at or after an offset (depends only on the bytes, so both parts of a
# split read agree; None when the separator may continue in the next block): one implementation, salvage's
_first_boundary = _salv.first_boundary


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


@dataclass
class _Hint:
    """Carried from chunk to chunk: whether integer timestamps are still worth trying, and whether the lean
    args struct still is (no collective seen yet)."""

    int_ts: bool = True
    lean: bool = True


def _decode_events(piece: bytes | memoryview, hint: _Hint | None = None) -> list:
    """Typed decode of a JSON array of events: integer-timestamp structs first (unless a previous chunk had
    fractional timestamps), then raw-text timestamps, then the loose structs for odd value types."""
    lean = hint is not None and hint.lean
    if hint is None or hint.int_ts:
        try:
            return (_DEC_EVENTS_INT_LEAN if lean else _DEC_EVENTS_INT).decode(piece)
        except msgspec.ValidationError:
            pass
    try:
        evs = (_DEC_EVENTS_LEAN if lean else _DEC_EVENTS).decode(piece)
    except msgspec.ValidationError:
        try:
            return _DEC_EVENTS_LOOSE.decode(piece)
        except msgspec.ValidationError:
            return _loose_each(_DEC_EVENTS_RAW.decode(piece))
    if hint is not None:
        hint.int_ts = False  # the typed decode failed only on ts/dur: this file writes fractional µs
    return evs


def _loose_each(raws: list) -> list:
    """Events decoded one by one (loose), skipping array elements that are not event objects (a number, a
    string, an object whose `args` is not an object): the last fallback for damaged files."""
    out = []
    for r in raws:
        try:
            out.append(_DEC_EVENT_LOOSE.decode(r))
        except msgspec.ValidationError:
            continue
    return out


def _decode_top(doc: bytes) -> Any:
    try:
        return _DEC_TOP.decode(doc)
    except msgspec.ValidationError:
        pass
    try:
        return _DEC_TOP_LOOSE.decode(doc)
    except msgspec.ValidationError:
        # still failing when traceEvents is not an array at all (the caller reports it)
        top = _DEC_TOP_RAW.decode(doc)
    if top.traceEvents is not None:
        top.traceEvents = _loose_each(top.traceEvents)
    return top


@dataclass
class _Scan:
    meta: dict
    chunks: list
    bytes_total: int
    bytes_parsed: int
    salvaged: bool
    split_at: int | None = None  # first part of a split read: where the second part starts
    helper: int | None = None  # a split read's child process, to be reaped (_reap)
    damage: _salv.Damage = field(default_factory=_salv.Damage)  # events mended or skipped (salvage.py)
    dropped: int = 0  # events without a usable timestamp (absent, invalid, beyond int64 ns), set by _assemble


def _utf8_replaced(blocks: Iterator[bytes]) -> Generator[bytes, None, None]:
    """The blocks with invalid UTF-8 sequences replaced by U+FFFD (a sequence split across blocks is kept)."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        for b in blocks:
            yield dec.decode(b).encode()
        yield dec.decode(b"", final=True).encode()
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def _scan(path: Path, salvage: bool, chunk_bytes: int, utf8_replace: bool = False) -> _Scan:
    """Stream the file: metadata from the keys around `traceEvents`, events decoded chunk by chunk.
    `utf8_replace` reads a file with invalid UTF-8 (a corrupt name) with those bytes replaced."""
    if not salvage and not utf8_replace:
        sc = _scan_split(path, chunk_bytes)
        if sc is not None:
            return sc
        blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
        try:
            return _scan_blocks(path, blocks, salvage, chunk_bytes)
        except _SplitFailed:  # a cut or corrupt gzip stream: read again below, for the precise error
            pass
        finally:
            blocks.close()
    blocks = _blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
    if _is_gzip(path):
        blocks = _prefetch(blocks)
    if utf8_replace:
        blocks = _utf8_replaced(blocks)
    try:
        return _scan_blocks(path, blocks, salvage, chunk_bytes)
    finally:
        blocks.close()  # stops the decompression thread at once when decoding failed


class _SplitFailed(Exception):
    """A split read cannot be used (no boundary near the middle, odd layout, an error in either part):
    the file is read serially instead, which also gives the precise error."""


#: Decompressed size from which one file may be decoded by two processes (opt-in, see _can_split).
SPLIT_MIN_BYTES = 32 * 1024**2
#: Share of the decompressed bytes this process decodes in a split read (the child decodes the rest). The
#: child first inflates and skips this share (~5 ms per 25 MB) and this process assembles the table after
#: (~10 ms), while Kineto writes the small, dense CPU events first (more events per byte in the first
#: half): on df_index_resolver both parts end within a few ms of each other at 0.5 (0.42-0.50 measured).
SPLIT_SHARE = 0.5


def _split_point(path: Path) -> int | None:
    """Where a split read cuts the decompressed stream of a file worth splitting (SPLIT_SHARE of its size),
    else None. For gzip the size is the trailer's ISIZE (exact for one member under 4 GiB; when it is wrong
    the split is uneven but still correct)."""
    size = path.stat().st_size
    raw = size
    with open(path, "rb") as fh:
        if fh.read(2) == b"\x1f\x8b":
            fh.seek(-4, os.SEEK_END)
            raw = int.from_bytes(fh.read(4), "little")
            if raw < size:  # more than 4 GiB, several members or not a gzip trailer
                return None
    return int(raw * SPLIT_SHARE) if raw >= SPLIT_MIN_BYTES else None


def _can_split() -> bool:
    """Whether to fork a helper process. TRACELENS_SPLIT: `auto` (the default: only when a CPU is idle,
    1-minute load average below CPUs - 0.5), `1` (always when applicable) or `0` (never). A split read costs
    more CPU in total, so it pays only with an idle core (docs/performance.md); pool workers (the loader's
    one rank per worker) run with TRACELENS_SPLIT=0.
    Also required: Linux, (for `auto`) at least 2 usable CPUs, not inside a worker process of a pool (the loader already
    runs one rank per worker), no other Python thread in this process. (numpy's BLAS and Arrow start idle
    native pool threads at import; both libraries re-initialise them in a forked child, as for
    multiprocessing's fork start method.)"""
    mode = os.environ.get("TRACELENS_SPLIT", "auto").strip().lower()
    if mode not in ("1", "yes", "on", "true", "auto") or not sys.platform.startswith("linux"):
        return False  # fork is only used where it is the platform's norm
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    if threading.active_count() != 1:
        return False
    if mode == "auto":
        if cpus < 2:
            return False  # nothing to gain on one CPU; TRACELENS_SPLIT=1 still splits (correct, not faster)
        try:
            if os.getloadavg()[0] > cpus - 0.5:
                return False
        except OSError:
            return False
    # a pool's worker process has imported multiprocessing (importing it here would cost ~1 ms)
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None


#: Bytes of the shared memory through which the child hands its columns back, beyond its share of the JSON
#: (only the pages written are allocated; larger columns go through the pipe).
_SHM_SLACK = 16 * 1024**2
_EV_COLS = (
    "kind",
    "name",
    "pid",
    "tid",
    "device",
    "stream",
    "ts",
    "ts_valid",
    "dur",
    "dur_valid",
    "correlation",
    "external_id",
    "sequence_nr",
)
_MEM_COLS = ("ts", "valid", "device", "bytes", "total_allocated", "total_reserved")
_NP_COLS = frozenset({"kind", "ts", "ts_valid", "dur", "dur_valid", "valid"})  # numpy in a _Chunk
_HDR = (
    41  # message header: kind byte, then 5 int64 (extra length, events offset/length, memory offset/length)
)


def _part_message(sc: _Scan, shm: Any) -> bytes:
    """The second part of a split read as the child's message to the parent: its columns (merged into one
    chunk) as Arrow IPC streams written into the shared mapping `shm` (kind `M`), or after the header when
    they do not fit (kind `P`); everything else (metadata, collective args) as msgpack (JSON values only,
    so exact). No pickle: the parent reads plain data."""
    c = _merge_chunks(sc.chunks)
    sc.chunks = []  # the per-chunk columns are copies now: freed (and returned) before the IPC copy
    pa.default_memory_pool().release_unused()

    def arrow(v: Any) -> pa.Array:
        return pa.array(v.view(np.uint8) if v.dtype == bool else v) if isinstance(v, np.ndarray) else v

    batches = [pa.RecordBatch.from_arrays([arrow(getattr(c, f)) for f in _EV_COLS], names=list(_EV_COLS))]
    if c.mem is not None:
        batches.append(
            pa.RecordBatch.from_arrays([arrow(c.mem[f]) for f in _MEM_COLS], names=list(_MEM_COLS))
        )
    extra = msgspec.msgpack.encode(
        {
            "meta": sc.meta,
            "n": c.n,
            "coll_rows": c.coll_rows.tolist(),
            "coll": c.coll,
            "bytes_total": sc.bytes_total,
            "split_at": sc.split_at,
        }
    )
    spans = [0, 0, 0, 0]
    try:
        kind, sink = b"M", pa.FixedSizeBufferWriter(pa.py_buffer(shm))
        for i, batch in enumerate(batches):
            spans[2 * i] = sink.tell()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            spans[2 * i + 1] = sink.tell() - spans[2 * i]
        body = b""
    except OSError:  # larger than the mapping
        kind, sink = b"P", pa.BufferOutputStream()
        for i, batch in enumerate(batches):
            spans[2 * i] = sink.tell()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            spans[2 * i + 1] = sink.tell() - spans[2 * i]
        body = sink.getvalue().to_pybytes()
    return kind + np.array([len(extra), *spans], dtype=np.int64).tobytes() + extra + body


def _part_from_message(msg: bytes, shm: Any) -> _Scan | None:
    """The child's message (_part_message) -> its _Scan with one chunk; the columns read from the shared
    mapping are not copied (they are copied once, when the parts are concatenated). None when malformed."""
    if len(msg) < _HDR or msg[:1] not in (b"M", b"P"):
        return None
    n_extra, ev_off, ev_len, mem_off, mem_len = np.frombuffer(msg, dtype=np.int64, count=5, offset=1).tolist()
    extra = msgspec.msgpack.decode(msg[_HDR : _HDR + n_extra])
    src = pa.py_buffer(shm) if msg[:1] == b"M" else pa.py_buffer(msg).slice(_HDR + n_extra)

    def columns(off: int, length: int) -> dict:
        batch = pa.ipc.open_stream(src.slice(off, length)).read_next_batch()
        out: dict = {}
        for name, col in zip(batch.schema.names, batch.columns):
            if name in _NP_COLS:
                arr = col.to_numpy()
                out[name] = arr.view(bool) if name in ("ts_valid", "dur_valid", "valid") else arr
            else:
                out[name] = col
        return out

    ev = columns(ev_off, ev_len)
    chunk = _Chunk(
        n=extra["n"],
        coll_rows=np.array(extra["coll_rows"], dtype=np.int64),
        coll=extra["coll"],
        mem=columns(mem_off, mem_len) if mem_len else None,
        **ev,
    )
    return _Scan(extra["meta"], [chunk], extra["bytes_total"], extra["bytes_total"], False, extra["split_at"])


def _scan_split(path: Path, chunk_bytes: int) -> _Scan | None:
    """Decode one large file with two processes: this one decodes the events of the first part of the
    decompressed stream (SPLIT_SHARE), a forked child those of the rest (it decompresses the first part
    again and skips it) and hands its columns back as Arrow IPC in an anonymous shared mapping (the pipe
    carries a small message: _part_message). None when not applicable or when anything went wrong (the
    caller then reads serially). On success the child may still be exiting: its pid is in `_Scan.helper`,
    for _reap once the table is built."""
    try:
        cut = _split_point(path)
    except OSError:
        return None
    if cut is None or not _can_split():
        return None
    import mmap
    import select

    t0 = time.perf_counter()
    try:
        shm = mmap.mmap(-1, max(4096, int(cut / SPLIT_SHARE) - cut + _SHM_SLACK))
        r, w = os.pipe()
    except (OSError, ValueError, OverflowError):
        return None
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about forking while native threads exist (the idle BLAS/Arrow pools, see
            # _can_split); the child only decodes and writes to the pipe, and the parent bounds its wait.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:  # e.g. a process limit: read serially
        os.close(r)
        os.close(w)
        shm.close()
        return None
    if pid == 0:  # child: never returns
        try:
            os.close(r)
            try:
                blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
                try:
                    found: list[int] = []
                    sc = _scan_blocks(path, blocks, False, chunk_bytes, start_at=cut, found=found)
                    sc.split_at = found[0]
                finally:
                    blocks.close()
                msg = _part_message(sc, shm)
            except BaseException:  # noqa: BLE001 (reported as an empty message; the parent reads serially)
                msg = b""
            with os.fdopen(w, "wb") as fh:
                fh.write(msg)
        finally:
            os._exit(0)
    os.close(w)
    done = False
    try:
        with os.fdopen(r, "rb") as fh:
            # inflated inline, as in the child: with both cores decoding, a third (inflating) thread only
            # adds GIL hand-offs
            blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
            try:
                mine = _scan_blocks(path, blocks, False, chunk_bytes, stop_at=cut)
            except (_SplitFailed, BadTraceError, msgspec.DecodeError):
                return None
            finally:
                blocks.close()
            if mine.split_at is None:  # the file was shorter than its trailer said: all read here
                return mine
            # the child does about as much as this process did; a child that hangs is given up on
            if not select.select([fh], [], [], max(60.0, 20 * (time.perf_counter() - t0)))[0]:
                return None
            msg = fh.read()  # up to the child closing its end
        done = True
        theirs = _part_from_message(msg, shm)
        if theirs is None or theirs.split_at != mine.split_at:  # both parts must agree on the boundary
            return None
        meta = dict(mine.meta)
        meta.update(theirs.meta)
        sc = _Scan(
            meta, mine.chunks + theirs.chunks, theirs.bytes_total, theirs.bytes_total, False, helper=pid
        )
        pid = None  # reaped by the caller, after the assembly (the child is exiting meanwhile)
        return sc
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException, msgspec.DecodeError):
        return None
    finally:
        # the mapping stays while columns read from it live (they are copied when the parts are joined)
        with contextlib.suppress(BufferError):
            shm.close()
        if pid is not None:
            if not done:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            _reap(pid)


def _reap(pid: int | None) -> None:
    """Wait for a split read's child (it has sent its columns and is exiting)."""
    if pid is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _scan_blocks(
    path: Path,
    blocks: Iterator[bytes],
    salvage: bool,
    chunk_bytes: int,
    stop_at: int | None = None,
    start_at: int | None = None,
    found: list[int] | None = None,
) -> _Scan:
    """Decode the stream's events chunk by chunk. For a split read (_scan_split), `stop_at` makes this the
    first part: events up to the first boundary at or after that offset of the decompressed stream (the
    rest of the file is not read); `start_at` makes it the second part: events from that boundary on (its
    offset is appended to `found`)."""
    meta: dict = {}
    chunks: list[_Chunk] = []
    buf = bytearray()
    state = "head" if start_at is None else "seek"
    off = 0  # offset of buf[0] in the decompressed stream
    total = 0
    parsed = 0
    truncated = False
    eof = False
    head_from = 0
    hint = _Hint()
    dmg = _salv.Damage()
    released = 0  # `parsed` when Arrow's allocator last returned memory
    while not eof:
        try:
            b = next(blocks)
            total += len(b)
            buf += b
        except StopIteration:
            eof = True
        except _Truncated:
            eof = True
            truncated = True
        if state == "whole":
            continue
        if state == "seek":  # second part of a split read: skip to the split boundary
            fb = _first_boundary(buf, max(0, start_at - off))
            if fb is None:
                if eof:
                    raise _SplitFailed()
                if off + len(buf) < start_at:
                    off += len(buf)
                    buf.clear()
                continue
            off += fb[1] - 1
            parsed = off
            if found is not None:
                found.append(off + 1)
            del buf[: fb[1] - 1]
            buf[0] = 91  # "["
            state = "events"
        if state == "head":
            if head_from == 0 and buf[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte order mark
                del buf[:3]
                off += 3
                parsed += 3
            m = _TE_KEY.search(buf, head_from)
            if m is None:
                _bound_head(path, buf, off)
                head_from = max(0, len(buf) - 64)
                continue
            head = bytes(buf[: m.end()]) + b"]}"
            try:
                top = _decode_top(head)
            except msgspec.DecodeError:
                state = "whole"  # "traceEvents" matched inside something else: decode the whole document
                continue
            _merge_meta(meta, top)
            parsed += m.end() - 1
            off += m.end() - 1
            del buf[: m.end() - 1]  # buf[0] is now the array's "["
            state = "events"
            if stop_at is not None and off >= stop_at:
                raise _SplitFailed()  # the events do not start before the split point
        if state == "events" and stop_at is not None and off + len(buf) > stop_at:
            # first part of a split read: the last piece ends at the first boundary at/after stop_at
            fb = _first_boundary(buf, stop_at - off)
            if fb is None:
                if eof:
                    raise _SplitFailed()
                continue
            chunk = _decode_in_place(buf, fb[0], hint)
            if chunk is None:
                raise _SplitFailed()  # not a boundary between whole events
            chunks.append(chunk)
            if dmg.any:
                raise _SplitFailed()  # the serial read counts the damage
            return _Scan(meta, chunks, off + fb[1], off + fb[1], False, split_at=off + fb[1])
        while state == "events" and len(buf) >= chunk_bytes and not eof:
            cut = _last_boundary(buf, 1)
            if cut is None:
                _bound_event(path, buf, off, chunk_bytes)
                break
            errs: list[Exception] = []
            chunk = _decode_in_place(buf, cut[0], hint, errs)
            if chunk is None:
                p = _salv.error_at(errs[0], bytes(buf[: cut[0]])) if errs else None
                if p is None or p >= cut[0]:
                    break  # the cut fell inside a string or nested value: read more, retry
                # a local error (an invalid byte, NaN, a flipped separator) in the middle of the data
                nxt = _read_past(path, buf, p, errs[0], hint, chunks, dmg, off, salvage, stop_at, start_at)
                if nxt is None:
                    break  # the damaged region runs past the data read so far
                if nxt:
                    parsed += nxt - 1
                    off += nxt - 1
                    del buf[: nxt - 1]
                    buf[0] = 91  # "["
                continue
            chunks.append(chunk)
            parsed += cut[1] - 1
            if parsed - released >= RELEASE_BYTES:
                pa.default_memory_pool().release_unused()
                released = parsed
            off += cut[1] - 1
            del buf[: cut[1] - 1]
            buf[0] = 91  # "["
            break
    if state == "seek" or (stop_at is not None and state != "events"):
        raise _SplitFailed()
    if state in ("head", "whole"):
        # No (usable) traceEvents key: decode what we have as one document for a precise error or result.
        if truncated and not salvage:
            raise BadTraceError(f"{path}: truncated gzip stream (file cut mid-write?)")
        rest = bytes(buf)
        if not rest.strip():
            raise BadTraceError(f"{path}: empty file")
        try:
            top = _decode_top(rest)
        except msgspec.DecodeError as err:
            raise BadTraceError(f"{path}: not a valid Kineto JSON trace ({err})") from None
        if top.traceEvents is None:
            raise BadTraceError(f"{path}: no traceEvents array (not a PyTorch profiler trace?)")
        _merge_meta(meta, top)
        if top.traceEvents:
            chunks.append(_columns(top.traceEvents))
        return _Scan(meta, chunks, total, total, False)
    # Last piece: the remaining events, the `]` closing the array and the top-level keys after it.
    while True:
        tail = b'{"traceEvents":' + bytes(buf)
        try:
            top = _decode_top(tail)
            break
        except msgspec.DecodeError as err:
            p = _salv.error_at(err, tail)
            p = None if p is None or p < 16 else p - 15  # index in buf
            if not _salv.is_cut(buf, p):
                assert p is not None
                nxt = _read_past(path, buf, p, err, hint, chunks, dmg, off, salvage, stop_at, start_at)
                if nxt == 0:
                    continue  # mended in place
                if nxt is not None:
                    parsed += nxt - 1
                    off += nxt - 1
                    del buf[: nxt - 1]
                    buf[0] = 91  # "["
                    continue
                # the damage is in the last event: drop it when the array is closed after it
                start = _salv.keep_before(buf, p, _keeper(chunks, hint))
                parsed += start - 1
                off += start - 1
                del buf[1:start]
                if _salv.drop_last_event(buf, 1, p - (start - 1), dmg, off):
                    continue
                p = len(buf)
            if not salvage:
                why = "truncated gzip stream" if truncated else f"not valid JSON ({err})"
                raise BadTraceError(f"{path}: {why}; the file may have been cut mid-write") from None
            evs = _salvage_tail(buf, len(buf) if p is None else p)
            if evs:
                chunks.append(_columns(evs[0]))
                parsed += evs[1]
            return _Scan(meta, chunks, total, parsed, True, damage=dmg)
    _merge_meta(meta, top)
    if top.traceEvents:
        chunks.append(_columns(top.traceEvents))
    if not chunks and not top.traceEvents:
        raise BadTraceError(f"{path}: traceEvents is empty (nothing was recorded)")
    return _Scan(meta, chunks, total, total, False, damage=dmg)


#: Bytes before the `traceEvents` key (metadata) beyond which a file is not taken for a Kineto trace, and
#: bytes one event may take (beyond a chunk): both bound what the reader holds whatever the input.
MAX_HEAD_BYTES = 256 * 1024**2
MAX_EVENT_BYTES = 256 * 1024**2
#: A run of whitespace at least this long at the end of the buffer is collapsed (JSON between tokens).
_WS_RUN = 64 * 1024


def _collapse_ws(buf: bytearray) -> int:
    """Collapse a long run of whitespace at the end of buf to one byte (whitespace between JSON tokens is
    insignificant; a trace padded with gigabytes of it, a 229:1 gzip, must not be held). Returns bytes
    removed."""
    n = len(buf)
    if n < _WS_RUN or buf[n - 1] not in _WS or bytes(buf[n - _WS_RUN :]).strip(_WS):
        return 0
    q = n - _WS_RUN  # buf[q:] is whitespace: find where the run starts, a slice at a time (C speed)
    while q > 0:
        lo = max(0, q - _WS_RUN)
        keep = len(bytes(buf[lo:q]).rstrip(_WS))
        q = lo + keep
        if keep:
            break
    removed = n - q - 1
    del buf[q + 1 :]
    return removed


def _bound_head(path: Path, buf: bytearray, off: int) -> None:
    """Before the `traceEvents` key: fail fast on bytes no JSON object starts with (a file of zeros, a
    binary), collapse whitespace padding, and give up past MAX_HEAD_BYTES of metadata."""
    first = bytes(buf[:4096]).lstrip(_WS)[:1]
    if first and first != b"{":
        raise BadTraceError(f"{path}: not a valid Kineto JSON trace (starts with {first!r}, not a JSON object)")
    _collapse_ws(buf)
    if len(buf) > MAX_HEAD_BYTES:
        raise BadTraceError(
            f"{path}: no traceEvents key in the first {MAX_HEAD_BYTES >> 20} MiB (not a Kineto trace?)"
        )


def _bound_event(path: Path, buf: bytearray, off: int, chunk_bytes: int) -> None:
    """Between event boundaries: collapse whitespace padding; an event longer than MAX_EVENT_BYTES (or
    bytes that never reach a boundary) is not a trace we can hold."""
    _collapse_ws(buf)
    if len(buf) > chunk_bytes + MAX_EVENT_BYTES:
        raise BadTraceError(
            f"{path}: no event boundary in {MAX_EVENT_BYTES >> 20} MiB after byte {off} of the decompressed "
            "data (an event that large is not a Kineto trace)"
        )


def _keeper(chunks: list, hint: _Hint) -> Any:
    """salvage.keep_before's decode: the whole events of buf[:end] become a chunk."""

    def decode(buf: bytearray, end: int) -> bool:
        chunk = _decode_in_place(buf, end, hint)
        if chunk is None:
            return False
        chunks.append(chunk)
        return True

    return decode


def _read_past(
    path: Path,
    buf: bytearray,
    p: int,
    err: Exception,
    hint: _Hint,
    chunks: list,
    dmg: _salv.Damage,
    off: int,
    salvage: bool,
    stop_at: int | None,
    start_at: int | None,
) -> int | None:
    """A local decode error at buf[p] (buf[0] == "["), followed by more data. Mended in place (returns 0:
    decode again), or, with salvage, the whole events before the damaged one become chunks and the index of
    the `{` of the first whole event after it is returned (the caller drops buf up to there); None when no
    event boundary follows the error in buf (the caller reads more, or at the end of the data drops the
    last event). Without salvage a damaged event is a BadTraceError at once."""
    if _salv.mend(buf, p, err):
        if stop_at is not None or start_at is not None:
            raise _SplitFailed()  # the serial read counts the damage
        dmg.mended += 1
        dmg.note(off + p)
        return 0
    if not salvage:
        raise BadTraceError(
            f"{path}: invalid JSON at byte {off + p} of the decompressed data "
            f"({_salv._POS.sub('', str(err)).strip()}); "
            "salvage (the CLI's default) skips the damaged event"
        )
    if _salv.first_boundary(buf, p) is None:
        return None
    start = _salv.keep_before(buf, p, _keeper(chunks, hint))
    return _salv.skip_to_next(buf, start, p, dmg, off)


def _decode_in_place(
    buf: bytearray, end: int, hint: _Hint | None = None, errors: list | None = None
) -> _Chunk | None:
    """Decode the events in buf[0:end] (buf[0] == "[") as a JSON array without copying: the separator byte
    at buf[end] is overwritten with "]" (restored on failure). None when buf[:end] is not whole events."""
    saved = buf[end]
    buf[end] = 93  # "]"
    mv = memoryview(buf)
    try:
        part = mv[: end + 1]
        try:
            evs = _decode_events(part, hint)
        except msgspec.DecodeError as err:
            part.release()
            buf[end] = saved
            if errors is not None:
                errors.append(err.with_traceback(None))  # (its frames would hold `part`)
            return None
        try:
            chunk = _columns(evs)
        except _NeedFullArgs:  # a collective: this chunk and the rest of the file with the full args
            assert hint is not None  # (only _decode_events with a hint decodes lean structs)
            hint.lean = False
            del evs
            evs = _decode_events(part, hint)
            chunk = _columns(evs)
        del evs
        try:
            part.release()
        except BufferError:
            # decoded objects (raw timestamps reference the buffer) are still held by a reference cycle,
            # which the paused cyclic collector (see read) has not freed: free it now
            gc.collect()
            part.release()
    finally:
        mv.release()
    return chunk


def _salvage_tail(buf: bytearray, hi: int) -> tuple[list, int] | None:
    """Complete events at the start of a cut-off remainder (buf[0] == "[") before buf[hi] (where the data
    ends or turns bad): try event boundaries from the last one back (a bounded number of times: the
    remainder is at most about two chunks, so this costs a bounded time)."""
    for _ in range(64):
        cut = _last_boundary(buf, 1, hi)
        if cut is None:
            break
        try:
            return _decode_events(bytes(buf[: cut[0]]) + b"]"), cut[0]
        except msgspec.DecodeError:
            hi = cut[0] - 1
    # a single complete event before the cut?
    end = buf.rfind(b"}", 0, hi)
    for _ in range(64):
        if end <= 0:
            break
        try:
            return _decode_events(bytes(buf[: end + 1]) + b"]"), end + 1
        except msgspec.DecodeError:
            end = buf.rfind(b"}", 0, end)
    return None


def _merge_meta(meta: dict, top: Any) -> None:
    for k in _META_KEYS:
        v = getattr(top, k)
        if v is not None:
            meta[k] = v


# ------------------------------------------------------------------------------------------ assembly
def _concat_np(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _concat_pa(parts: list[pa.Array], type_: pa.DataType) -> pa.Array:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pa.array([], type=type_)
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def _dict_encode(arr: pa.Array) -> pa.Array:
    """string -> dictionary<int32, string>."""
    out = pc.dictionary_encode(arr)
    if out.type != schema.DICT_STR:
        out = out.cast(schema.DICT_STR)
    return out


def _concat_dict(parts: list[pa.Array]) -> pa.Array:
    """Concatenate dictionary<int32, string> arrays whose dictionaries differ (unified first)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pa.array([], type=pa.string()).dictionary_encode().cast(schema.DICT_STR)
    if len(parts) == 1:
        return parts[0]
    return pa.chunked_array(parts, type=schema.DICT_STR).unify_dictionaries().combine_chunks()


def _dict_from_values(values: list, n: int, rows: np.ndarray) -> pa.Array:
    """Sparse string values at `rows` -> a length-n dictionary column, null elsewhere."""
    if len(rows) == 0 and n:
        return pa.nulls(n, schema.DICT_STR)
    vals = _str_array(values)
    return _dict_encode(_scatter(vals, n, rows))


def _scatter(vals: pa.Array, n: int, rows: np.ndarray) -> pa.Array:
    """Place `vals` at `rows` of a length-n array; other rows null."""
    if len(rows) == n:
        return vals
    if len(rows) == 0:
        return pa.nulls(n, vals.type)
    idx = np.full(n, -1, dtype=np.int64)
    idx[rows] = np.arange(len(rows))
    return vals.take(pa.array(idx, mask=idx < 0))


def step_of_name(names: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """For a dictionary `name` column: (is ProfilerStep#N, N) per row (N = -1 when not a step)."""
    d = names.dictionary.to_pylist()
    nums = np.full(len(d) + 1, -1, dtype=np.int64)
    for i, s in enumerate(d):
        if isinstance(s, str) and s.startswith("ProfilerStep#"):
            tail = s[len("ProfilerStep#") :]
            if tail.isascii() and tail.isdigit() and len(tail) <= 9:  # as classify.STEP: fits int32
                nums[i] = int(tail)
    idx = names.indices.fill_null(len(d)).to_numpy(zero_copy_only=False)
    num = nums[idx]
    return num >= 0, num


def assign_steps(
    kind: np.ndarray, names: pa.Array, ts: np.ndarray, dur: np.ndarray, corr: pa.Array
) -> np.ndarray:
    """Step of each event (-1 = none): CPU events by the enclosing ProfilerStep#N window, device events by
    the step of the cuda_runtime/cuda_driver launch with the same correlation id (else by their own start)."""
    n = len(kind)
    is_step, num = step_of_name(names)
    is_step &= _IS_STEP[kind]
    if not is_step.any():
        return np.full(n, -1, dtype=np.int64)
    s_num = num[is_step]
    s_start = ts[is_step]
    s_end = s_start + np.maximum(dur[is_step], 0)
    # one window per step number (a step may appear as both user_annotation and cpu_op)
    uniq, inv = np.unique(s_num, return_inverse=True)
    w_start = np.full(uniq.size, np.iinfo(np.int64).max, dtype=np.int64)
    w_end = np.full(uniq.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(w_start, inv, s_start)
    np.maximum.at(w_end, inv, s_end)
    order = np.argsort(w_start, kind="stable")
    w_start, w_end, uniq = w_start[order], w_end[order], uniq[order]
    # every event by its own start (device events keep it when no launch matches)
    # (in place where possible: each new full-length array is ~1 MB of fresh pages to fault in)
    j = np.searchsorted(w_start, ts, side="right")
    j -= 1
    np.maximum(j, 0, out=j)
    inside = ts < w_end[j]
    inside &= ts >= w_start[0]
    step = uniq[j]
    step[~inside] = -1
    is_gpu = _IS_GPU[kind]
    if is_gpu.any():
        corr_np = corr.fill_null(-1).to_numpy(zero_copy_only=False)
        launch = _IS_LAUNCH[kind] & (corr_np >= 0)
        if launch.any():
            l_corr = corr_np[launch]
            l_step = step[launch]
            o = np.argsort(l_corr, kind="stable")
            l_corr, l_step = l_corr[o], l_step[o]
            g_corr = corr_np[is_gpu]
            j = np.searchsorted(l_corr, g_corr)
            jc = np.minimum(j, l_corr.size - 1)
            hit = (j < l_corr.size) & (l_corr[jc] == g_corr) & (g_corr >= 0)
            step[is_gpu] = np.where(hit, l_step[jc], step[is_gpu])
    return step


_MEM_INT_TYPES = {
    "device": pa.int32(),
    "bytes": pa.int64(),
    "total_allocated": pa.int64(),
    "total_reserved": pa.int64(),
}


def _merge_chunks(ch: list[_Chunk]) -> _Chunk:
    """Several chunks' columns as one chunk (concatenated in order). A split read's child merges its chunks
    before sending them: one Arrow IPC batch to write, and less of the assembly left to the parent."""
    if len(ch) == 1:
        return ch[0]
    offs = np.cumsum([0] + [c.n for c in ch])
    coll: dict[str, list] = {}
    if any(c.coll for c in ch):
        coll = {f: [] for f in _COLL_FIELDS}
        for c in ch:
            for f in _COLL_FIELDS:
                coll[f].extend(c.coll.get(f, ()))
    mems = [c.mem for c in ch if c.mem is not None]
    mem = None
    if mems:
        mem = {
            "ts": _concat_np([m["ts"] for m in mems], np.int64),
            "valid": _concat_np([m["valid"] for m in mems], bool),
        }
        for f, t in _MEM_INT_TYPES.items():
            mem[f] = _concat_pa([m[f] for m in mems], t)
    return _Chunk(
        n=int(offs[-1]),
        kind=_concat_np([c.kind for c in ch], np.int8),
        name=_concat_dict([c.name for c in ch]),
        pid=_concat_pa([c.pid for c in ch], pa.int64()),
        tid=_concat_pa([c.tid for c in ch], pa.int64()),
        device=_concat_pa([c.device for c in ch], pa.int32()),
        stream=_concat_pa([c.stream for c in ch], pa.int32()),
        ts=_concat_np([c.ts for c in ch], np.int64),
        ts_valid=_concat_np([c.ts_valid for c in ch], bool),
        dur=_concat_np([c.dur for c in ch], np.int64),
        dur_valid=_concat_np([c.dur_valid for c in ch], bool),
        correlation=_concat_pa([c.correlation for c in ch], pa.int64()),
        external_id=_concat_pa([c.external_id for c in ch], pa.int64()),
        sequence_nr=_concat_pa([c.sequence_nr for c in ch], pa.int64()),
        coll_rows=_concat_np([c.coll_rows + o for c, o in zip(ch, offs)], np.int64),
        coll=coll,
        mem=mem,
    )


def _assemble(sc: _Scan, rank: int) -> tuple[pa.Table, pa.Table]:
    base = _coerce_int(sc.meta.get("baseTimeNanoseconds")) or 0
    c = _merge_chunks(sc.chunks)
    sc.chunks = []  # their columns are in `c` now: freed (a split read's child columns unmap with them)
    ts, ts_valid, dur, dur_valid, kind, names = c.ts, c.ts_valid, c.dur, c.dur_valid, c.kind, c.name
    n, corr, rows = c.n, c.correlation, c.coll_rows
    coll = {f: c.coll.get(f, []) for f in _COLL_FIELDS}
    step = assign_steps(kind, names, ts, dur, corr)
    is_gpu = _IS_GPU[kind]
    device, stream, pid, tid = c.device, c.stream, c.pid, c.tid
    gpu_mask = pa.array(is_gpu)
    # device events: device/stream from args, else Kineto's convention pid = device, tid = stream
    device = pc.if_else(
        gpu_mask, pc.coalesce(device, pc.cast(pid, pa.int32(), safe=False)), pa.scalar(None, pa.int32())
    )
    # cpu ops keep an `args.stream` of their own (Triton launches; analyze.hta_compat); other rows: null
    cpu_op = pa.array(kind == _KIND_INDEX["cpu_op"])
    stream = pc.if_else(
        gpu_mask,
        pc.coalesce(stream, pc.cast(tid, pa.int32(), safe=False)),
        pc.if_else(cpu_op, stream, pa.scalar(None, pa.int32())),
    )
    # an absolute time (base + ts) or an end (+ dur) beyond int64 would wrap around: such an event is
    # dropped like one without a timestamp (and counted in the metadata)
    wraps = _wraps(ts, dur, dur_valid, base)
    if wraps is not None:
        ts_valid = ts_valid & ~wraps
        ts = np.where(wraps, 0, ts)
    sc.dropped = int(n - np.count_nonzero(ts_valid))
    if ts.flags.writeable:  # (the merged copy: adding the base in place spares a full-length array)
        ts_ns = ts
        ts_ns += base
    else:
        ts_ns = ts + base
    kinds = pa.DictionaryArray.from_arrays(
        pa.array(kind.astype(np.int32)), pa.array(list(schema.KINDS), type=pa.string())
    )
    cols = {
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "kind": kinds,
        "name": names,
        "pid": pid,
        "tid": tid,
        "device": device,
        "stream": stream,
        "ts_ns": pa.array(ts_ns, mask=None if ts_valid.all() else ~ts_valid),
        # a missing or non-numeric dur: 0 (an instant)
        "dur_ns": pa.array(dur if dur_valid.all() else np.where(dur_valid, dur, 0)),
        "correlation": corr,
        "external_id": c.external_id,
        "sequence_nr": c.sequence_nr,
        "step": pa.array(step.astype(np.int32), mask=step < 0),
        "collective": _dict_from_values(coll["collective"], n, rows),
        "pg_name": _dict_from_values(coll["pg_name"], n, rows),
        "pg_desc": _dict_from_values(coll["pg_desc"], n, rows),
        "pg_ranks": _scatter(
            pa.array([parse_pg_ranks(v) for v in coll["pg_ranks"]], type=pa.list_(pa.int32())), n, rows
        ),
        "group_size": _scatter(_int_array(coll["group_size"], pa.int32()), n, rows),
        "seq": _scatter(_int_array(coll["seq"], pa.int64()), n, rows),
        "in_nelems": _scatter(_int_array(coll["in_nelems"], pa.int64()), n, rows),
        "out_nelems": _scatter(_int_array(coll["out_nelems"], pa.int64()), n, rows),
        "dtype": _dict_from_values(coll["dtype"], n, rows),
        "src_rank": _scatter(_int_array(coll["src_rank"], pa.int32()), n, rows),
        "dst_rank": _scatter(_int_array(coll["dst_rank"], pa.int32()), n, rows),
    }
    events = pa.Table.from_arrays([cols[f.name] for f in schema.EVENTS], schema=schema.EVENTS)
    if not ts_valid.all():
        events = events.filter(pa.array(ts_valid))
    m = c.mem
    if m is not None:
        mts, mvalid = m["ts"], m["valid"]
        memory = pa.Table.from_arrays(
            [
                pa.array(np.full(len(mts), rank, dtype=np.int32)),
                pa.array(mts + base, mask=~mvalid),
                m["device"],
                m["bytes"],
                m["total_allocated"],
                m["total_reserved"],
            ],
            schema=schema.MEMORY,
        )
        if not mvalid.all():
            memory = memory.filter(pa.array(mvalid))
    else:
        memory = schema.MEMORY.empty_table()
    pa.default_memory_pool().release_unused()
    return events, memory


_I64 = np.iinfo(np.int64)


def _wraps(ts: np.ndarray, dur: np.ndarray, dur_valid: np.ndarray, base: int) -> np.ndarray | None:
    """Events whose absolute start (base + ts) or end (+ dur) does not fit in int64 ns, or None."""
    if not len(ts):
        return None
    hi = _I64.max - max(base, 0)
    lo = _I64.min - min(base, 0)
    d = np.where(dur_valid, np.maximum(dur, 0), 0)
    # ts + d overflows only when ts > hi - d (both sides computed without overflow: 0 <= d, hi >= 0)
    bad = (ts > hi - d) | (ts < lo)
    return bad if bad.any() else None


def _json_text(v: Any) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), default=str)


def _metadata(path: Path, rank: int, meta: dict, n_events: int, sc: _Scan) -> dict:
    di = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    dp = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else None
    gpu_name = None
    if dp and isinstance(dp[0], dict) and dp[0].get("name") is not None:
        gpu_name = str(dp[0]["name"])
    ws = _rank_int(di.get("world_size"), 1) if di else None
    return {
        "rank": rank,
        "path": str(path),
        "world_size": ws,
        "backend": None if not di or di.get("backend") is None else str(di.get("backend")),
        "host_name": None if meta.get("host_name") is None else str(meta["host_name"]),
        "trace_id": None if meta.get("trace_id") is None else str(meta["trace_id"]),
        "base_time_ns": _coerce_int(meta.get("baseTimeNanoseconds")),
        "gpu_name": gpu_name,
        "num_devices": len(dp) if dp is not None else None,
        "pg_config_json": _json_text(di.get("pg_config")) if di else None,
        "distributed_info_json": _json_text(di),
        "device_properties_json": _json_text(dp),
        "events": n_events,
        "salvaged": sc.salvaged,
        "salvaged_fraction": min(1.0, sc.bytes_parsed / sc.bytes_total if sc.bytes_total else 0.0)
        if sc.salvaged
        else None,
        "damaged_events": sc.damage.skipped,
        "dropped_events": sc.dropped,
        "mended_strings": sc.damage.mended,
    }


def metadata_table(rows: list[dict]) -> pa.Table:
    """Metadata row dicts -> a schema.METADATA table."""
    return pa.Table.from_pylist(rows, schema=schema.METADATA)


def read(
    path: str | Path, rank: int | None = None, *, salvage: bool = False, chunk_bytes: int = CHUNK_BYTES
) -> KinetoTrace:
    """Read one Kineto trace (`.json` or gzip) into events, memory and a metadata row.

    `rank` overrides the trace's own (`distributedInfo.rank`, else a `rank<N>` file name, else 0).
    `salvage=True` keeps the complete events of a file cut mid-write instead of raising BadTraceError.

    Python's cyclic garbage collector is paused while reading (and re-enabled after, when it was on): the
    decode allocates and frees millions of objects without cycles, and a full collection triggered by them
    would scan every object of the process (~25 ms with pyarrow and pandas loaded) for nothing.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _read(Path(path), rank, salvage, chunk_bytes)
    finally:
        if paused:
            gc.enable()


def _read(path: Path, rank: int | None, salvage: bool, chunk_bytes: int) -> KinetoTrace:
    try:
        try:
            sc = _scan(path, salvage, chunk_bytes)
        except BadTraceError as err:
            if "UTF-8" not in str(err):
                raise
            sc = _scan(path, salvage, chunk_bytes, utf8_replace=True)  # invalid bytes in a name: replace
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from None
    except RecursionError:
        raise BadTraceError(f"{path}: not a valid Kineto JSON trace (nested too deeply)") from None
    if rank is None:
        di = sc.meta.get("distributedInfo")
        rank = _rank_int(di.get("rank")) if isinstance(di, dict) else None
        if rank is None:
            rank = rank_from_name(path)
        if rank is None:
            rank = 0
    try:
        events, memory = _assemble(sc, int(rank))
    finally:
        _reap(sc.helper)
    device_lost = False
    if sc.salvaged:
        device_lost = _salv.uncovered_steps(events)[1]
        events = drop_incomplete_steps(events)
    meta = _metadata(path, int(rank), sc.meta, events.num_rows, sc)
    meta["device_events_lost"] = device_lost
    return KinetoTrace(events=events, memory=memory, metadata=meta)


#: In a salvaged trace, a step holding less than this share of the rank's fullest step's events of one
#: family (CPU ops, launches, device work) lost events after the cut.
INCOMPLETE_STEP_SHARE = 0.5
_FAMILIES = (
    ("cpu_op", "user_annotation", "python_function"),
    ("cuda_runtime", "cuda_driver"),
    GPU_KINDS,
)


def incomplete_steps(events: pa.Table, share: float = INCOMPLETE_STEP_SHARE) -> list[int]:
    """Steps of one rank's salvaged trace whose analysis would be wrong because events were lost at the cut.

    Kineto does not write events in time order (CPU ops first, device activities after, in buffer order), so
    the cut does not fall at one instant. A step lost events when, for one family of events (CPU ops, runtime
    launches, device work), it holds fewer than `share` of the count of the rank's fullest step. The device
    work of a step runs late (into the next steps' windows, by up to the largest spill seen in the complete
    steps), so a step whose window such lost work may reach is incomplete as well.
    """
    step = events.column("step")
    if events.num_rows == 0 or step.null_count == events.num_rows:
        return []
    kinds = events.column("kind").cast(pa.string())
    steps_all = sorted(set(pc.unique(step.drop_null()).to_pylist()))
    # a step with a launch whose device work is missing is not covered by the trace (salvage.py)
    bad: set[int] = set(_salv.uncovered_steps(events)[0]) & set(steps_all)
    if len(steps_all) < 2:
        return sorted(bad)
    for fam in _FAMILIES:
        sub = step.filter(pc.is_in(kinds, pa.array(fam)))
        if len(sub) == 0:
            continue
        vc = pc.value_counts(sub.drop_null())
        counts = dict(zip(vc.field(0).to_pylist(), vc.field(1).to_pylist()))
        top = max(counts.values(), default=0)
        if top == 0:
            continue
        bad.update(s for s in steps_all if counts.get(s, 0) < share * top)
    if not bad:
        return []
    # step windows (ProfilerStep#N markers) and how far each step's events run past its window's end
    is_step, num = step_of_name(events.column("name").combine_chunks())
    ts = events.column("ts_ns").fill_null(0).to_numpy()
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(), 0)
    win: dict[int, tuple[int, int]] = {}
    for n, a, b in zip(num[is_step].tolist(), ts[is_step].tolist(), end[is_step].tolist()):
        lo, hi = win.get(n, (a, b))
        win[n] = (min(lo, a), max(hi, b))
    g = pa.table({"step": step, "end": pa.array(end)}).group_by("step").aggregate([("end", "max")])
    last_end = dict(zip(g.column("step").to_pylist(), g.column("end_max").to_pylist()))
    spill = max(
        (max(0, last_end[s] - win[s][1]) for s in steps_all if s not in bad and s in win and s in last_end),
        default=0,
    )
    lost = [(win[b][0], win[b][1] + spill) for b in bad if b in win]  # (window start, reach of its work)
    late = {s for s in steps_all if s in win and any(a < win[s][0] < r for a, r in lost)}
    return sorted(bad | late)


def drop_incomplete_steps(events: pa.Table) -> pa.Table:
    """Leave the incomplete steps of a salvaged trace out of the step analysis (salvage.leave_out_steps:
    their events get step null, their CPU `ProfilerStep#N` markers stay as kind `other`, so that they still
    bound the kept steps' windows)."""
    return _salv.leave_out_steps(events, incomplete_steps(events))


# ------------------------------------------------------------------------------------------- peek
_RANK_RE = re.compile(r"(?<![a-z])rank[-_]?(\d+)", re.IGNORECASE)
_DI_KEY = re.compile(rb'"distributedInfo"\s*:\s*')
PEEK_HEAD = 1024 * 1024
PEEK_TAIL = 256 * 1024


def rank_from_name(path: str | Path) -> int | None:
    """Rank from a file name such as `rank-3`, `rank_3`, `rank3` (case-insensitive), else None."""
    m = _RANK_RE.search(Path(path).name)
    return int(m.group(1)) if m and len(m.group(1)) < 10 and int(m.group(1)) < 2**31 else None


def _json_value_at(buf: bytes, start: int) -> Any:
    """Decode the JSON object/array starting at buf[start] (finds its end by a string-aware bracket scan)."""
    if start >= len(buf) or buf[start : start + 1] not in (b"{", b"["):
        # a scalar (e.g. null): decode up to the next delimiter
        m = re.compile(rb"[^,}\]]*").match(buf, start)
        try:
            return _DEC_ANY.decode(buf[start : m.end()].strip()) if m else None
        except msgspec.DecodeError:
            return None
    depth = 0
    in_str = False
    for m in re.finditer(rb'["\\{}\[\]]', buf[start:]):
        c = m.group()
        if in_str:
            if c == b"\\":
                continue
            if c == b'"':
                # count preceding backslashes
                j = start + m.start() - 1
                nb = 0
                while buf[j] == 92:
                    nb += 1
                    j -= 1
                if nb % 2 == 0:
                    in_str = False
            continue
        if c == b'"':
            in_str = True
        elif c in (b"{", b"["):
            depth += 1
        elif c in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                try:
                    return _DEC_ANY.decode(buf[start : start + m.end()])
                except (msgspec.DecodeError, RecursionError):
                    return None
    return None


def _find_distributed_info(buf: bytes) -> tuple[bool, Any]:
    m = _DI_KEY.search(buf)
    if m is None:
        return False, None
    return True, _json_value_at(buf, m.end())


def _tail_bytes(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        magic = fh.read(2)
        if magic != b"\x1f\x8b":
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read()
    keep = bytearray()
    try:
        for b in _blocks(path):
            keep += b
            if len(keep) > 2 * n:
                del keep[: len(keep) - n]
    except _Truncated:
        pass
    return bytes(keep[-n:])


def peek(path: str | Path) -> dict:
    """Rank metadata of a Kineto file without decoding its events.

    Reads the head of the file (decompressed, up to the `traceEvents` key, at most 1 MiB) for
    `distributedInfo`; when the file puts it after `traceEvents`, reads the last 256 KiB instead (for gzip
    this streams the file once). Returns {rank, world_size, backend, distributed_info, base_time_ns};
    missing values are None (`base_time_ns` only when it precedes `traceEvents` or the tail was read).
    """
    path = Path(path)
    head = bytearray()
    try:
        for b in _blocks(path, 65536):  # usually a few KiB suffice: stop at the `traceEvents` key
            head += b
            if len(head) >= PEEK_HEAD or _TE_KEY.search(head, max(0, len(head) - len(b) - 32)):
                break
    except _Truncated:
        pass
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from None
    head_b = bytes(head[:PEEK_HEAD])
    te = _TE_KEY.search(head_b)
    region = head_b[: te.start()] if te else head_b
    found, di = _find_distributed_info(region)
    base_m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', region)
    if not found and (te is not None or len(head) >= PEEK_HEAD):
        tail = _tail_bytes(path, PEEK_TAIL)
        found, di = _find_distributed_info(tail)
        if base_m is None:
            base_m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', tail)
    di = di if isinstance(di, dict) else None
    return {
        "rank": _rank_int(di.get("rank")) if di else None,
        "world_size": _rank_int(di.get("world_size"), 1) if di else None,
        "backend": None if not di or di.get("backend") is None else str(di["backend"]),
        "distributed_info": di,
        "base_time_ns": int(base_m.group(1)) if base_m else None,
    }


__all__ = [
    "GPU_KINDS",
    "KinetoTrace",
    "assign_steps",
    "max_decompressed_bytes",
    "metadata_table",
    "normalise_kind",
    "parse_pg_ranks",
    "parse_us_to_ns",
    "peek",
    "rank_from_name",
    "read",
]
