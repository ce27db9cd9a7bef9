"""NumPy arrays in one file of the cache, read back memory-mapped: for results derived from a whole run that
are costly to compute again (the critical path's dependency graph: `store.runs.read_graph`).

Layout: the 8 bytes `MAGIC`, the length of a JSON header (8 bytes, little endian), the header, then each
array's bytes at an offset aligned to 64 bytes. The header gives every array's dtype, shape and offset, and
the caller's `meta` (a JSON value). Reading maps the file copy-on-write (`mmap.ACCESS_COPY`): the arrays
cost no read and no copy, their pages come from the page cache as they are touched, and writing into one
never changes the file.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracelens.store.atomic import write_atomic

MAGIC = b"TLARR\x001\n"
_ALIGN = 64


def write_arrays(dest: str | Path, arrays: dict[str, np.ndarray], meta: Any = None) -> None:
    """Write `arrays` (any shape, any fixed-size dtype) and the JSON value `meta` to `dest`, atomically."""
    spec: dict[str, list[Any]] = {}
    offset = 0
    for name, a in arrays.items():
        if a.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects: not storable")
        offset = -(-offset // _ALIGN) * _ALIGN
        spec[name] = [a.dtype.str, list(a.shape), offset]
        offset += a.nbytes
    header = json.dumps({"arrays": spec, "meta": meta}).encode()
    base = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for name, a in arrays.items():
                f.seek(base + spec[name][2])
                f.write(np.ascontiguousarray(a).data.cast("B"))
            f.truncate(base + offset)

    write_atomic(dest, write)


def read_arrays(
    path: str | Path, own: Callable[[str], bool] | None = None
) -> tuple[dict[str, np.ndarray], Any]:
    """(arrays, meta) of a file `write_arrays` wrote; the arrays are writable views of a private mapping of
    it, except those whose name `own` accepts: read into memory of their own (file reads, never through the
    mapping), for arrays dropped long before the others. Touched pages of the mapping stay resident while
    any view of it lives; an array of its own is handed back when freed. OSError when the file is missing,
    ValueError when it is not such a file or is cut short."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < len(MAGIC) + 8:
            raise ValueError(f"{path}: not an array file")
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        spans, meta = layout(lambda lo, hi: mm[lo:hi], size, path)
        out: dict[str, np.ndarray] = {}
        for name, (dt, shape, start, count) in spans.items():
            if own is not None and own(name):
                a = np.empty(count, dtype=dt)
                f.seek(start)
                if f.readinto(a.data.cast("B")) != a.nbytes:
                    raise ValueError(f"{path}: array {name!r} cut short")
                out[name] = a.reshape(shape)
            else:
                out[name] = np.frombuffer(mm, dtype=dt, count=count, offset=start).reshape(shape)
    return out, meta


def layout(
    read: Callable[[int, int], bytes], size: int, path: str | Path
) -> tuple[dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]], Any]:
    """Where the arrays of a file `write_arrays` wrote lie: (name -> (dtype, shape, first byte in the file,
    element count), meta), from `read(lo, hi)` (the file's bytes lo..hi) and its `size`; for a reader that maps
    the file its own way (`store.stages` reads Arrow IPC images kept as byte arrays). ValueError when it is not
    such a file, or is cut short or grown (the last array ends the file)."""
    head_at = len(MAGIC) + 8
    if size < head_at or read(0, len(MAGIC)) != MAGIC:
        raise ValueError(f"{path}: not an array file")
    n = int.from_bytes(read(len(MAGIC), head_at), "little")
    base = -(-(head_at + n) // _ALIGN) * _ALIGN
    out: dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
    try:
        head = json.loads(read(head_at, head_at + n))
        end = base
        for name, (dtype, shape, offset) in head["arrays"].items():
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            start = base + int(offset)
            if start + count * dt.itemsize > size or start < base:
                raise ValueError(f"array {name!r} out of the file")
            out[name] = (dt, tuple(int(v) for v in shape), start, count)
            end = max(end, start + count * dt.itemsize)
        if end != size:
            raise ValueError("cut short or grown")
        meta = head["meta"]
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # (JSON errors are ValueErrors)
        raise ValueError(f"{path}: not a whole array file ({err})") from err
    return out, meta


def table_digest(table: pa.Table | None) -> str:
    """A digest of a table's schema and every buffer of its columns (with their offsets and lengths): equal
    digests mean equal contents; equal contents laid out in other chunks may give another digest."""
    h = hashlib.sha1()
    if table is None:
        return "none"
    h.update(str(table.schema).encode())
    for col in table.columns:
        for chunk in col.chunks:
            _array_digest(h, chunk)
    return h.hexdigest()


def _array_digest(h: Any, arr: pa.Array) -> None:
    t = arr.type
    h.update(f"|{t}|{arr.offset}|{len(arr)}|".encode())
    bufs = arr.buffers()
    children: list[pa.Array] = []
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        bufs, children = bufs[:2], [arr.values]  # (validity, offsets; the values with their own offset)
    elif pa.types.is_struct(t):
        bufs, children = bufs[:1], [arr.field(i) for i in range(t.num_fields)]
    elif pa.types.is_dictionary(t):
        bufs, children = bufs[:2], [arr.dictionary]  # (the indices' buffers)
    for b in bufs:
        h.update(b"-" if b is None else memoryview(b))
    for c in children:
        _array_digest(h, c)


def text_digest(parts: Iterable[str]) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


__all__ = ["MAGIC", "layout", "read_arrays", "table_digest", "text_digest", "write_arrays"]
