"""Recognise an input file's format by its content (never by its name)."""

from __future__ import annotations

import zlib
from pathlib import Path

HEAD_BYTES = 65536

KINETO = "kineto"
FR_JSON = "flight_recorder_json"
FR_PICKLE = "flight_recorder_pickle"
NCCL_PLUGIN = "nccl_plugin"
NCCL_LOG = "nccl_log"


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """First `n` bytes of the file's content, gunzipped when the file is gzip (by magic, not suffix)."""
    with open(path, "rb") as fh:
        raw = fh.read(n)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            return d.decompress(raw, n)
        except zlib.error:
            return b""
    return raw


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def detect_format(path: str | Path) -> str | None:
    """One of KINETO, FR_JSON, FR_PICKLE, NCCL_PLUGIN, NCCL_LOG, or None when not a trace we read."""
    path = Path(path)
    try:
        head = read_head(path)
    except OSError:
        return None
    if not head:
        return None
    stripped = head.lstrip()
    if head[:1] == b"\x80":  # pickle protocol 2+
        return FR_PICKLE if b"entries" in head or b"pg_config" in head or b"version" in head else None
    if stripped[:1] == b"{":
        if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
            return KINETO
        if b'"entries"' in head or b'"pg_status"' in head or (b'"pg_config"' in head and b'"version"' in head):
            return FR_JSON
        return None
    if stripped[:1] == b"[":
        if b'"ph"' in head and (b'"cat"' in head or stripped[:2] == b"[]" or b"ncclProfiler" in head):
            return NCCL_PLUGIN
        if b'"ph"' in head:
            return NCCL_PLUGIN
        return None
    if b"NCCL INFO" in head or b"NCCL WARN" in head:
        return NCCL_LOG
    return None


__all__ = ["detect_format", "read_head", "is_gzip", "KINETO", "FR_JSON", "FR_PICKLE", "NCCL_PLUGIN", "NCCL_LOG"]
