"""The compiled chunk decoder (_native.c); tracelens.ingest.kineto.native wraps it."""

def scan(
    chunk: bytes | bytearray | memoryview, /
) -> (
    tuple[int, list[str], bytes, list[str], bytes, bytes, bytes, bytes, int, bytes, bytes, int, list[str]]
    | None
): ...
