"""The recorded shapes of CPU operators (`Input Dims`, `Input type`, `Concrete Inputs`) of one Kineto trace.

Kept apart from the events table on purpose: shapes are read only for the few ranks the per-op view looks
at (one per pipeline stage by default, tracelens.ops_view), so the main ingest and its cache stay as they
are. `read(path)` -> OP_SHAPES (one row per cpu op that carries `Input Dims`, keyed by `External id`).
Traces recorded without `record_shapes=True` give an empty table.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

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
    opener = gzip.open if magic == b"\x1f\x8b" else open
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
    try:
        fast = _DEC_FAST.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _read_loose(text)
    rows: dict[str, list] = {f.name: [] for f in OP_SHAPES}
    # raw JSON text -> (is a list, the text as msgspec writes it); the same shapes recur on every layer
    canon: dict[bytes, tuple[bool, str | None]] = {}

    def as_text(raw: msgspec.Raw) -> tuple[bool, str | None]:
        b = bytes(raw)
        hit = canon.get(b)
        if hit is None:
            v = _DEC_ANY.decode(b) if b else None
            hit = canon[b] = (isinstance(v, list), None if v is None else _ENC.encode(v).decode())
        return hit

    ext_of, name_of = rows["external_id"], rows["name"]
    dims_of, types_of, conc_of = rows["input_dims"], rows["input_types"], rows["concrete_inputs"]
    for ev in fast.traceEvents or []:
        a = ev.args
        if a is None or not len(a.dims) or ev.cat != "cpu_op":
            continue
        ext = _external_id(a.external_id)
        is_list, dims = as_text(a.dims)
        if ext is None or not is_list:
            continue
        ext_of.append(ext)
        name_of.append(ev.name if isinstance(ev.name, str) else None)
        dims_of.append(dims)
        types_of.append(as_text(a.types)[1])
        conc_of.append(as_text(a.concrete)[1])
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
        _add(rows, ev.name, a)
    return _table(rows)


def _external_id(ext: Any) -> int | None:
    if isinstance(ext, str) and ext.strip().lstrip("-").isdigit():
        ext = int(ext)
    return ext if isinstance(ext, int) and not isinstance(ext, bool) else None


def _add(rows: dict[str, list], name: Any, a: _ShapeArgs) -> None:
    ext = _external_id(a.external_id)
    if ext is None or not isinstance(a.dims, list):
        return
    rows["external_id"].append(ext)
    rows["name"].append(name if isinstance(name, str) else None)
    rows["input_dims"].append(_ENC.encode(a.dims).decode())
    rows["input_types"].append(None if a.types is None else _ENC.encode(a.types).decode())
    rows["concrete_inputs"].append(None if a.concrete is None else _ENC.encode(a.concrete).decode())


def _table(rows: dict[str, list]) -> pa.Table:
    return pa.table({f.name: pa.array(rows[f.name], f.type) for f in OP_SHAPES}, schema=OP_SHAPES)
