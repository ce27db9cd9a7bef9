"""Damaged copies of the cache's own container files (store.arrays' array files, store.stages' stage files: a
magic, a header length, a JSON header, then the data), for the tests that check they are refused."""

from __future__ import annotations

from pathlib import Path

#: The ways `damage` knows.
WAYS = ("cut", "magic", "header", "empty")


def damage(path: Path, how: str, cut: int = 8) -> None:
    """Damage the file at `path` in place: `cut` (its last `cut` bytes dropped), `magic` (its first byte
    changed), `header` (three bytes of its JSON header made invalid) or `empty`."""
    raw = path.read_bytes()
    if how == "cut":
        path.write_bytes(raw[: len(raw) - cut])
    elif how == "magic":
        path.write_bytes(b"X" + raw[1:])
    elif how == "header":  # (the JSON header starts at byte 16: 8 of magic, 8 of its length)
        path.write_bytes(raw[:20] + b"{{{" + raw[23:])
    elif how == "empty":
        path.write_bytes(b"")
    else:
        raise ValueError(f"unknown damage {how!r}")
