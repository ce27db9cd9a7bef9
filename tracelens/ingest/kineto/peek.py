"""`peek(path)`: rank metadata of a Kineto file without decoding its events.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from tracelens.errors import BadTraceError
from tracelens.ingest.kineto.columns import _rank_int
from tracelens.ingest.kineto.decode import _DEC_ANY
from tracelens.ingest.kineto.stream import _TE_KEY, _blocks, _Truncated

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
