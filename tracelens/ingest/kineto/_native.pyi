"""The compiled chunk decoder (_native.c); tracelens.ingest.kineto.native wraps it."""

from typing import Any

def scan(
    chunk: bytes | bytearray | memoryview, /
) -> (
    tuple[
        int,  # n
        list[str],  # cats
        bytes,  # cat_idx
        list[str],  # names
        bytes,  # name_idx
        bytes,  # ints
        bytes,  # valid
        bytes,  # coll
        int,  # m
        bytes,  # mem_ints
        bytes,  # mem_valid
        int,  # stop
        list[str],  # strs
        bytes,  # crow
        tuple[list[Any], ...],  # cvals
    ]
    | None
): ...
