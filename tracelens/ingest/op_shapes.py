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


_DEC_DOC = msgspec.json.Decoder(_Doc)
_DEC_EV = msgspec.json.Decoder(_ShapeEvent)
_DEC_ARGS = msgspec.json.Decoder(_ShapeArgs)
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
    """OP_SHAPES rows of one trace file (empty when it has no shapes or cannot be decoded)."""
    try:
        doc = _DEC_DOC.decode(_text(Path(path)))
    except (OSError, EOFError, msgspec.DecodeError, ValueError):
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
        ext = a.external_id
        if isinstance(ext, str) and ext.strip().lstrip("-").isdigit():
            ext = int(ext)
        if not isinstance(ext, int) or isinstance(ext, bool) or not isinstance(a.dims, list):
            continue
        rows["external_id"].append(ext)
        rows["name"].append(ev.name if isinstance(ev.name, str) else None)
        rows["input_dims"].append(_ENC.encode(a.dims).decode())
        rows["input_types"].append(None if a.types is None else _ENC.encode(a.types).decode())
        rows["concrete_inputs"].append(None if a.concrete is None else _ENC.encode(a.concrete).decode())
    return pa.table({f.name: pa.array(rows[f.name], f.type) for f in OP_SHAPES}, schema=OP_SHAPES)
