"""A trace file's text encoding: UTF-8 (what every reader reads) or UTF-16 (Windows tools write it), told
from its first bytes. Imported by `sniff` and `kineto.stream`, and imports neither."""

from __future__ import annotations

import zlib
from pathlib import Path


def raw_head(path: Path, n: int) -> bytes:
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


def text_encoding(head: bytes) -> str | None:
    """'utf-16' (with its byte order mark), 'utf-16-le' or 'utf-16-be' (without one: a JSON text's first
    character is ASCII, so one of its two bytes is zero) when the content is UTF-16 text, else None (UTF-8:
    what every tracelens reader reads). Windows tools (PowerShell's `>`, Notepad) write UTF-16."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "utf-16"
    if len(head) >= 2 and head[1] == 0 and head[0] in b"{[ \t\r\n":
        return "utf-16-le"
    if len(head) >= 2 and head[0] == 0 and head[1] in b"{[ \t\r\n":
        return "utf-16-be"
    return None
