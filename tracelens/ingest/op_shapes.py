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


def read(path: str | Path) -> pa.Table:
    """OP_SHAPES rows of one trace file (empty when it has no shapes or cannot be decoded).

    One typed decode of the whole document (msgspec skips every key but the four shape fields); a file it
    does not fit (an `args` that is not an object, a damaged event) is read event by event instead, leaving
    out the events that do not decode."""
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
    canon: dict[bytes, tuple[bool, str | None]] = {}  # raw text -> _value_text; shapes recur every layer

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
