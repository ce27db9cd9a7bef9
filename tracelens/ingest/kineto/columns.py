"""Decoded events -> columns: event kinds (Kineto categories -> schema.KINDS codes), exact decimal
timestamps, value coercion, one chunk's columns (_Chunk) and their concatenation.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import compress, repeat
from operator import attrgetter, eq, is_not
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens import schema
from tracelens.ingest import comm_families
from tracelens.ingest.kineto.decode import (
    _DEC_ANY,
    _EMPTY_LOOSE_ARGS,
    _ArgsLean,
    _Event,
    _EventInt,
    _EventIntLean,
    _EventLean,
    _Instant,
    _InstantInt,
    _InstantOld,
    _InstantOldInt,
    _LooseEvent,
)

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
    off, data = _joined_offsets(raws)
    if off is not None:
        valid = off[1:] > off[:-1]
        every = bool(valid.all())
        vbuf = None if every else pa.py_buffer(np.packbits(valid, bitorder="little"))
        strs = pa.StringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(data), vbuf)
        try:
            dec = pc.cast(strs, _DEC_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            dec = None
        if dec is not None:
            words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset : 2 * (dec.offset + n)]
            lo, hi = words[0::2], words[1::2]
            if every:
                if (hi == (lo >> 63)).all():  # every value fits in int64 ns
                    return lo.copy(), valid
            elif (hi[valid] == (lo[valid] >> 63)).all():
                return np.where(valid, lo, 0), valid
    return parse_us_to_ns_numpy(raws)


def _joined_offsets(raws: list) -> tuple[np.ndarray | None, bytes]:
    """The texts concatenated, with their int32 Arrow offsets (None when they do not fit in int32). The
    lengths come from one join with a comma between the texts and a vectorised search for the commas (no
    len() per text); texts that hold a comma themselves (a JSON array or object where a number belongs, never
    a valid timestamp) make it measure each text instead."""
    n = len(raws)
    joined = b",".join(raws)
    seps = np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == 44)
    if seps.size == n - 1:
        if len(joined) - (n - 1) >= 2**31:
            return None, b""
        starts = np.empty(n + 1, dtype=np.int64)
        starts[0] = 0
        starts[1:n] = seps + 1
        starts[n] = len(joined) + 1
        starts -= np.arange(n + 1)  # (value i starts after the i commas before it)
        return starts.astype(np.int32), joined.replace(b",", b"")
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    if lens.sum() >= 2**31:
        return None, b""
    off = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=off[1:])
    return off, b"".join(raws)


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


def _int_array(values: Sequence, type_: pa.DataType) -> pa.Array:
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
_PH_CODE: dict[str | None, int] = {"X": 1, "i": 2, "I": 2}  # looked up with None too
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


#: The fields of a complete event (every X struct, typed or loose, has them) and of its args that _columns
#: reads for every row.
_EV_FIELDS = ("cat", "name", "pid", "tid", "ts", "dur", "args")
_ARG_FIELDS = ("external_id", "sequence_nr", "device", "stream", "correlation", "collective")
_ARG_GETS = tuple(map(attrgetter, _ARG_FIELDS))
_SRC, _DST = attrgetter("src_rank"), attrgetter("dst_rank")
_astuple = msgspec.structs.astuple


def _struct_columns(objs: Sequence, fields: tuple[str, ...]) -> list[Any]:
    """`fields` of msgspec structs that are all of one type, as one tuple of values per field: each struct's
    values as a tuple (msgspec.structs.astuple), transposed by zip: two C-level passes instead of one
    attribute lookup per field and struct (~2.4x fewer instructions for the 7 fields of an event)."""
    order = type(objs[0]).__struct_fields__
    cols = list(zip(*map(_astuple, objs)))
    return [cols[order.index(f)] for f in fields]


class _NeedFullArgs(Exception):
    """A chunk decoded with _ArgsLean holds a collective: it must be decoded with _Args."""


def _columns(evs: list) -> _Chunk:
    """Build the columns of one chunk of decoded events (C-level passes; no per-event Python code)."""
    one_x_type = False  # (set below for the tagged decoders: every complete event is of one struct type)
    if evs and type(evs[0]) is _LooseEvent:  # the loose decoder keeps `ph` as a field
        phs = [p if isinstance(p, str) else None for p in map(_get["ph"], evs)]  # any JSON value here
        ph = np.fromiter(map(_PH_CODE.get, phs, repeat(0)), dtype=np.int8, count=len(phs))
        xs = list(compress(evs, (ph == 1).tolist()))
        inst = list(compress(evs, (ph == 2).tolist())) if (ph == 2).any() else []
    else:  # the tagged decoders tell phases apart by type
        types = list(map(type, evs))
        kinds = set(types)  # (few distinct: which phases the chunk has, one pass of cheap hashes)
        xs = list(compress(evs, map(_X_TYPES.__contains__, types))) if kinds & _X_TYPES else []
        inst = list(compress(evs, map(_I_TYPES.__contains__, types))) if kinds & _I_TYPES else []
        one_x_type = len(kinds & _X_TYPES) == 1
        del types
    mem = None
    if inst:
        names = map(_get["name"], inst)
        is_mem = np.fromiter(map(eq, names, repeat(_MEMORY_NAME)), dtype=bool, count=len(inst))
        if is_mem.any():
            mem = _memory_columns(list(compress(inst, is_mem.tolist())))
    n = len(xs)
    loose = bool(n) and type(xs[0]) is _LooseEvent
    if n and not loose and one_x_type:
        # one typed struct for every event (one decoder per chunk): its fields in one pass (_struct_columns)
        cats, name_vals, pids, tids, ts_vals, dur_vals, args = _struct_columns(xs, _EV_FIELDS)
        arg_cols = _struct_columns(args, _ARG_FIELDS)
        int_ts = type(xs[0]) in _INT_TS_TYPES
    else:
        cats, name_vals, pids, tids, ts_vals, dur_vals, args = (list(map(_get[f], xs)) for f in _EV_FIELDS)
        if loose and None in args:  # only the loose decoder lets `args: null` through
            args = [_EMPTY_LOOSE_ARGS if a is None else a for a in args]
        arg_cols = [list(map(g, args)) for g in _ARG_GETS]
        int_ts = bool(n) and type(xs[0]) in _INT_TS_TYPES
    ext_vals, seqnr_vals, device_vals, stream_vals, corr_vals, coll_vals = arg_cols
    kind = _kind_codes_from(cats) if not loose else _kind_codes(list(cats))
    names = _dict_encode(_str_array(name_vals))
    ts, ts_valid = _int_us_to_ns(ts_vals) if int_ts else parse_us_to_ns(ts_vals)
    dur, dur_valid = _int_us_to_ns(dur_vals) if int_ts else parse_us_to_ns(dur_vals)
    coll_rows = np.zeros(0, dtype=np.int64)
    coll: dict = {}
    comm_op = _comm_op_rows(names) if n else None
    # a row with a peer and no collective name (a P2P kernel's stripped args) carries a collective too, as
    # the compiled decoder reads it (any collective key makes a collective row); lean args hold no peer (a
    # chunk whose text holds one is decoded with the full args: decode.PEER_KEY)
    peers = None
    if n and type(args[0]) is not _ArgsLean:
        peers = np.fromiter(map(is_not, map(_SRC, args), repeat(None)), dtype=bool, count=n)
        peers |= np.fromiter(map(is_not, map(_DST, args), repeat(None)), dtype=bool, count=n)
        if not peers.any():
            peers = None
    if n and (loose or comm_op is not None or peers is not None or set(coll_vals) != {None}):
        if type(args[0]) is _ArgsLean:
            raise _NeedFullArgs()
        has_coll = np.fromiter(map(is_not, coll_vals, repeat(None)), dtype=bool, count=n)
        if peers is not None:
            has_coll |= peers
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
    gpu_devices = device_vals if gpu_rows.size == n else list(compress(device_vals, gpu.tolist()))
    return _Chunk(
        n=n,
        kind=kind,
        name=names,
        pid=_int_values(pids, pa.int64(), loose, lowcard=True),
        tid=_int_values(tids, pa.int64(), loose, lowcard=True),
        device=_scatter(_int_values(gpu_devices, pa.int32(), loose), n, gpu_rows),
        # (all rows: a Triton launch cpu_op carries `args.stream`, which HTA counts as a GPU kernel)
        stream=_int_values(stream_vals, pa.int32(), loose),
        ts=ts,
        ts_valid=ts_valid,
        dur=dur,
        dur_valid=dur_valid,
        correlation=_int_values(corr_vals, pa.int64(), loose),
        external_id=_int_values(ext_vals, pa.int64(), loose),
        sequence_nr=_int_values(seqnr_vals, pa.int64(), loose),
        coll_rows=coll_rows,
        coll=coll,
        mem=mem,
    )


class _CommOpMemo(dict[Any, bool]):
    """name -> comm_families.is_comm_cpu_op(name), computed on a miss (bounded): a run's names repeat in
    every chunk and rank, so the regex runs once per distinct name and process and a chunk's lookups are
    one C-level pass."""

    def __missing__(self, name: Any) -> bool:
        hit = comm_families.is_comm_cpu_op(name)
        if len(self) < _COMM_OP_MAX:
            self[name] = hit
        return hit


_COMM_OP_MAX = 1 << 16
_COMM_OP = _CommOpMemo()


def _comm_op_rows(names: pa.Array) -> np.ndarray | None:
    """Rows whose name is a communication cpu op (comm_families.COMM_CPU_OP), or None when there is none
    (a memoised regex per distinct name of the chunk)."""
    d = names.dictionary.to_pylist()
    hit = np.fromiter(map(_COMM_OP.__getitem__, d), dtype=bool, count=len(d))
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


#: `cat` string -> kind code, filled as new categories are seen (bounded; misses are computed per chunk).
_CAT_CODES: dict = {None: _OTHER}
_CAT_CACHE_MAX = 4096


def _kind_codes_from(cats: Sequence) -> np.ndarray:
    """Kind codes of typed events' `cat` values (str or None) via a dict lookup per event; only categories
    not seen before go through normalise_kind."""
    n = len(cats)
    codes = np.fromiter(map(_CAT_CODES.get, cats, repeat(-1)), dtype=np.int8, count=n)
    miss = codes < 0
    if miss.any():
        rows = np.flatnonzero(miss)
        missed = [cats[i] for i in rows.tolist()]
        lut = {c: _KIND_INDEX[normalise_kind(c)] for c in set(missed)}
        codes[rows] = np.fromiter(map(lut.__getitem__, missed), dtype=np.int8, count=len(missed))
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
    """An integer column from one attribute of decoded structs (_int_values)."""
    return _int_values(list(map(get, objs)), type_, loose, lowcard)


def _int_values(vals: Sequence, type_: pa.DataType, loose: bool, lowcard: bool = False) -> pa.Array:
    """An integer column from the values of one field of decoded structs. Typed structs hold int, str or
    None there (never a float, which numpy would truncate), so numpy reads a column without None at once;
    anything else (None, "0x1f", "Spans") goes through _int_array / _lowcard_int_array. A `lowcard` column
    (pid, tid: few distinct values, where a string such as "Spans" is usually the last value) is first
    checked by its distinct values, so that numpy does not read it only to fail at its end."""
    if not loose:
        if lowcard:
            try:
                uniq = dict.fromkeys(vals)
            except TypeError:
                uniq = None
            if uniq is not None and not (
                len(uniq) * 4 <= len(vals) + 64 and all(type(v) is int for v in uniq)
            ):
                return _lowcard_int_array(vals, uniq)
        try:
            arr = pa.array(np.fromiter(vals, dtype=np.int64, count=len(vals)))
            return arr if type_ == pa.int64() else pc.cast(arr, type_, safe=False)
        except (TypeError, ValueError, OverflowError):
            pass
    return _lowcard_int_array(vals) if lowcard else _int_array(vals, type_)


def _lowcard_int_array(values: Sequence, uniq: dict | None = None) -> pa.Array:
    """Like _int_array(values, int64) for columns with few distinct values (pid, tid): each distinct value
    is coerced once (strings such as "Spans" become null, "0x1f" 31) and the column is taken from them by
    its codes (two C-level passes: the distinct values, the codes). `uniq`: dict.fromkeys(values), when the
    caller has it."""
    if uniq is None:
        try:
            uniq = dict.fromkeys(values)
        except TypeError:  # unhashable values (loose decoder)
            return _int_array(values, pa.int64())
    if len(uniq) * 4 > len(values) + 64:  # not few distinct values after all
        return _int_array(values, pa.int64())
    # (a dict key compares equal across int / bool / float: 1, True and 1.0 share one entry, so the
    # distinct values are coerced by the type of each row's value only when the types agree)
    if not all(type(v) is int or v is None or type(v) is str for v in uniq):
        return _int_array(values, pa.int64())
    code = {v: i for i, v in enumerate(uniq)}
    dist = pa.array([_coerce_int(v) for v in uniq], type=pa.int64())
    idx = np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values))
    return dist.take(pa.array(idx))


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


def null_array(tp: pa.DataType, n: int) -> pa.Array:
    """n nulls of type `tp` over one zero buffer that the OS fills lazily: no memory page is touched, so an
    all-null column (the collective fields of a trace without collectives) costs no resident memory,
    whatever the trace's length (`pa.nulls` writes its zeros: ~1.5 bytes an event for each such column)."""
    if n == 0:
        return pa.nulls(0, tp)
    zero = pa.py_buffer(bytes(8 * (n + 1)))  # (calloc'd: untouched pages are not resident)
    if pa.types.is_dictionary(tp):
        idx = pa.Array.from_buffers(tp.index_type, n, [zero, zero], null_count=n)
        return pa.DictionaryArray.from_arrays(idx, pa.array([], tp.value_type))
    if pa.types.is_list(tp):
        return pa.Array.from_buffers(
            tp, n, [zero, zero], null_count=n, children=[pa.array([], tp.value_type)]
        )
    if pa.types.is_primitive(tp) and tp.bit_width <= 64:
        return pa.Array.from_buffers(tp, n, [zero, zero], null_count=n)
    return pa.nulls(n, tp)


def _dict_from_values(values: list, n: int, rows: np.ndarray, index: pa.Array | None = None) -> pa.Array:
    """Sparse string values at `rows` -> a length-n dictionary column, null elsewhere (`index`: the
    rows' _scatter_index, when the caller has it)."""
    if len(rows) == 0 and n:
        return null_array(schema.DICT_STR, n)
    # encoded first, then placed: the dictionary (values in order of first appearance) is the same, and
    # only the few values are hashed
    return _scatter(_dict_encode(_str_array(values)), n, rows, index)


def _scatter_index(n: int, rows: np.ndarray) -> pa.Array | None:
    """The take indices that place len(rows) values at `rows` of a length-n array, null elsewhere (None
    when there is nothing to place or every row is placed): built once for the columns of the same rows."""
    if len(rows) == n or len(rows) == 0:
        return None
    idx = np.full(n, -1, dtype=np.int64)
    idx[rows] = np.arange(len(rows))
    return pa.array(idx, mask=idx < 0)


def _scatter(vals: pa.Array, n: int, rows: np.ndarray, index: pa.Array | None = None) -> pa.Array:
    """Place `vals` at `rows` of a length-n array; other rows null (`index`: _scatter_index(n, rows))."""
    if len(rows) == n:
        return vals
    if len(rows) == 0:
        return null_array(vals.type, n)
    return vals.take(_scatter_index(n, rows) if index is None else index)


def _pg_ranks_array(values: list) -> pa.Array:
    """`Process Group Ranks` values -> list<int32> (parse_pg_ranks); the typed decoders' text values are
    parsed once per distinct text and the column is taken from them."""
    try:
        uniq = dict.fromkeys(values)  # (a list value, from the loose decoder, is unhashable)
    except TypeError:
        uniq = None
    if uniq is None or not all(v is None or type(v) is str for v in uniq):
        return pa.array([parse_pg_ranks(v) for v in values], type=pa.list_(pa.int32()))
    code = {v: i for i, v in enumerate(uniq)}
    dist = pa.array([parse_pg_ranks(v) for v in uniq], type=pa.list_(pa.int32()))
    return dist.take(pa.array(np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values))))


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

    def take(field: str, concat: Any, *args: Any) -> Any:
        """One field of every chunk concatenated, then dropped from the chunks: the merge holds the chunks
        and one merged column, never a second copy of all of them."""
        out = concat([getattr(c, field) for c in ch], *args)
        for c in ch:
            setattr(c, field, None)
        return out

    return _Chunk(
        n=int(offs[-1]),
        kind=take("kind", _concat_np, np.int8),
        name=take("name", _concat_dict),
        pid=take("pid", _concat_pa, pa.int64()),
        tid=take("tid", _concat_pa, pa.int64()),
        device=take("device", _concat_pa, pa.int32()),
        stream=take("stream", _concat_pa, pa.int32()),
        ts=take("ts", _concat_np, np.int64),
        ts_valid=take("ts_valid", _concat_np, bool),
        dur=take("dur", _concat_np, np.int64),
        dur_valid=take("dur_valid", _concat_np, bool),
        correlation=take("correlation", _concat_pa, pa.int64()),
        external_id=take("external_id", _concat_pa, pa.int64()),
        sequence_nr=take("sequence_nr", _concat_pa, pa.int64()),
        coll_rows=_concat_np([c.coll_rows + o for c, o in zip(ch, offs)], np.int64),
        coll=coll,
        mem=mem,
    )
