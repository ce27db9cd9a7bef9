"""The recorded shapes of CPU operators (`Input Dims`, `Input type`, `Concrete Inputs`) of one Kineto trace.

Kept apart from the events table on purpose: shapes are read only for the few ranks the per-op view looks
at (one per pipeline stage by default, tracelens.ops_view), so the main ingest and its cache stay as they
are. `read(path)` -> OP_SHAPES (one row per cpu op that carries `Input Dims`, keyed by `External id`).
Traces recorded without `record_shapes=True` give an empty table.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

_gzip: types.ModuleType  # isal.igzip or gzip (the same API and errors)
try:  # ISA-L's inflate is ~4x faster than zlib's (as in tracelens.ingest.kineto.stream); optional
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover (depends on the environment)
    import gzip as _gzip

OP_SHAPES = pa.schema(
    [
        ("external_id", pa.int64()),
        ("name", pa.string()),
        ("input_dims", pa.string()),  # JSON text of the recorded list
        ("input_types", pa.string()),
        ("concrete_inputs", pa.string()),
    ]
)


class _ShapeArgs(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(name="External id", default=None)
    dims: Any = msgspec.field(name="Input Dims", default=None)
    types: Any = msgspec.field(name="Input type", default=None)
    concrete: Any = msgspec.field(name="Concrete Inputs", default=None)


class _ShapeEvent(msgspec.Struct, gc=False):
    cat: Any = None
    name: Any = None
    args: Any = None


class _Doc(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None


_RAW_NONE = msgspec.Raw(b"")


class _FastArgs(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(name="External id", default=None)
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_RAW_NONE)
    types: msgspec.Raw = msgspec.field(name="Input type", default=_RAW_NONE)
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_RAW_NONE)


class _FastEvent(msgspec.Struct, gc=False):
    cat: Any = None
    name: Any = None
    args: _FastArgs | None = None


class _FastDoc(msgspec.Struct):
    traceEvents: list[_FastEvent] | None = None


_DEC_FAST = msgspec.json.Decoder(_FastDoc)
_DEC_DOC = msgspec.json.Decoder(_Doc)
_DEC_EV = msgspec.json.Decoder(_ShapeEvent)
_DEC_ARGS = msgspec.json.Decoder(_ShapeArgs)
_DEC_ANY = msgspec.json.Decoder()
_ENC = msgspec.json.Encoder()


def _text(path: Path) -> bytes:
    from tracelens.ingest.kineto.stream import max_decompressed_bytes

    limit = max_decompressed_bytes()
    with open(path, "rb") as fh:
        magic = fh.read(2)
    opener = _gzip.open if magic == b"\x1f\x8b" else open
    parts, total = [], 0
    with opener(path, "rb") as fh:
        while total <= limit:
            block = fh.read(1 << 20)
            if not block:
                break
            parts.append(block)
            total += len(block)
    if total > limit:
        raise ValueError("trace larger than the decompression limit")
    return b"".join(parts)


#: Bytes of the trace's text decoded at a time (`_read_pieces`): the text is never held whole.
PIECE_BYTES = 8 << 20
#: How far into the text `traceEvents` must start for the piecewise read (a Kineto header is a few KB).
_HEAD_BYTES = 64 << 20


class _Whole(Exception):
    """The piecewise read does not apply (no `traceEvents` array where expected, a piece that does not
    decode): the whole document is decoded instead."""


def read(path: str | Path) -> pa.Table:
    """OP_SHAPES rows of one trace file (empty when it has no shapes or cannot be decoded).

    The text is streamed and cut at event boundaries into pieces of ~`PIECE_BYTES`; only pieces that can
    hold a shape key are decoded (typed: msgspec skips every key but the four shape fields), so memory is
    one piece whatever the file's size. A file the pieces do not fit (an odd layout, an `args` that is not
    an object, a damaged event) is decoded whole as before (`_read_whole`)."""
    from tracelens.errors import TracelensError
    from tracelens.ingest.kineto.stream import _Truncated

    try:
        return _read_pieces(Path(path))
    except (_Whole, _Truncated, TracelensError, OSError, EOFError, ValueError):
        return _read_whole(path)  # (which also gives a damaged file's answer: no rows)


def _read_pieces(path: Path) -> pa.Table:
    from tracelens.ingest.kineto.stream import _TE_KEY, _blocks
    from tracelens.ingest.salvage import first_boundary

    rows: dict[str, list] = {f.name: [] for f in OP_SHAPES}
    canon: dict[bytes, tuple[bool, str | None]] = {}
    buf = bytearray()
    started = False
    for block in _blocks(path):
        buf += block
        if not started:
            m = _TE_KEY.search(buf)
            if m is None:
                if len(buf) > _HEAD_BYTES:
                    raise _Whole()
                continue
            del buf[: m.end()]
            started = True
        pos = 0  # where the next piece starts
        while len(buf) - pos > PIECE_BYTES:
            fb = first_boundary(buf, pos + PIECE_BYTES)
            if fb is None:
                break  # (the piece's last event goes on in the next block)
            if _may_hold_shapes(buf, pos, fb[0]):
                _decode_piece(b'{"traceEvents": [' + buf[pos : fb[0]] + b"]}", rows, canon)
            pos = fb[1]
        del buf[:pos]
    if not started:
        raise _Whole()
    if _may_hold_shapes(buf, 0, len(buf)):
        _decode_piece(b'{"traceEvents": [' + buf, rows, canon)  # (the last piece holds the document's end)
    return _table(rows)


def _may_hold_shapes(buf: bytearray, lo: int, hi: int) -> bool:
    """buf[lo:hi] names a shape key, or holds an escape that could spell one (searched in place)."""
    if buf.find(b"Input Dims", lo, hi) >= 0:
        return True
    return buf.find(b"\\", lo, hi) >= 0 and buf.find(b"\\u", lo, hi) >= 0


def _decode_piece(text: bytes, rows: dict[str, list], canon: dict[bytes, tuple[bool, str | None]]) -> None:
    """Add the shape rows of one piece (a document of its events); raises _Whole when it does not decode."""
    try:
        fast = _DEC_FAST.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise _Whole() from None
    _add_fast(fast, rows, canon)


def _add_fast(fast: _FastDoc, rows: dict[str, list], canon: dict[bytes, tuple[bool, str | None]]) -> None:
    def as_text(raw: msgspec.Raw) -> tuple[bool, str | None]:
        b = bytes(raw)
        hit = canon.get(b)
        if hit is None:
            hit = canon[b] = _value_text(_DEC_ANY.decode(b) if b else None)
        return hit

    for ev in fast.traceEvents or []:
        a = ev.args
        if a is not None and len(a.dims) and ev.cat == "cpu_op":
            _add(rows, ev.name, a.external_id, as_text(a.dims), as_text(a.types), as_text(a.concrete))


def _read_whole(path: str | Path) -> pa.Table:
    """OP_SHAPES rows from one typed decode of the whole document (`read`'s route for the files its pieces
    do not fit), event by event when the document does not fit the typed structs."""
    try:
        text = _text(Path(path))
    except (OSError, EOFError, ValueError):
        return OP_SHAPES.empty_table()
    if b"Input Dims" not in text and (b"\\" not in text or b"\\u" not in text):
        # no shape key anywhere (recorded without record_shapes, and no escape that could spell it): no
        # row either way, without decoding the document
        return OP_SHAPES.empty_table()
    try:
        fast = _DEC_FAST.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _read_loose(text)
    rows: dict[str, list] = {f.name: [] for f in OP_SHAPES}
    _add_fast(fast, rows, {})
    return _table(rows)


def _read_loose(text: bytes) -> pa.Table:
    try:
        doc = _DEC_DOC.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return OP_SHAPES.empty_table()
    rows: dict[str, list] = {f.name: [] for f in OP_SHAPES}
    for raw in doc.traceEvents or []:
        if b"Input Dims" not in bytes(raw):  # (cheap test before decoding: most events carry none)
            continue
        try:
            ev = _DEC_EV.decode(raw)
            if ev.cat != "cpu_op" or not isinstance(ev.args, dict):
                continue
            a = msgspec.convert(ev.args, _ShapeArgs)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        _add(rows, ev.name, a.external_id, _value_text(a.dims), _value_text(a.types), _value_text(a.concrete))
    return _table(rows)


def _external_id(ext: Any) -> int | None:
    if isinstance(ext, str) and ext.strip().lstrip("-").isdigit():
        ext = int(ext)
    return ext if isinstance(ext, int) and not isinstance(ext, bool) else None


def _value_text(v: Any) -> tuple[bool, str | None]:
    """(whether a decoded shape field is a list, its JSON text as msgspec writes it; None for null)."""
    return isinstance(v, list), None if v is None else _ENC.encode(v).decode()


def _add(
    rows: dict[str, list],
    name: Any,
    external_id: Any,
    dims: tuple[bool, str | None],
    types: tuple[bool, str | None],
    concrete: tuple[bool, str | None],
) -> None:
    """One OP_SHAPES row (fields as `_value_text` pairs), unless the id is not an integer or the dims no list."""
    ext = _external_id(external_id)
    if ext is None or not dims[0]:
        return
    rows["external_id"].append(ext)
    rows["name"].append(name if isinstance(name, str) else None)
    rows["input_dims"].append(dims[1])
    rows["input_types"].append(types[1])
    rows["concrete_inputs"].append(concrete[1])


def _table(rows: dict[str, list]) -> pa.Table:
    return pa.table({f.name: pa.array(rows[f.name], f.type) for f in OP_SHAPES}, schema=OP_SHAPES)
