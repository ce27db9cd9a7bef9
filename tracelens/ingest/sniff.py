"""Recognise an input file's format by its content (never by its name)."""

from __future__ import annotations

import zlib
from pathlib import Path

from tracelens.ingest.encoding import raw_head, text_encoding

HEAD_BYTES = 65536

KINETO = "kineto"
FR_JSON = "flight_recorder_json"
FR_PICKLE = "flight_recorder_pickle"
NCCL_PLUGIN = "nccl_plugin"
NCCL_LOG = "nccl_log"


#: Categories the NCCL example profiler plugin writes (print_event.cc), with and without the space after ':'.
_PLUGIN_CATS = tuple(
    fmt % c
    for c in (
        b"COLL",
        b"P2P",
        b"GROUP",
        b"PROXY",
        b"NET",
        b"COLL_API",
        b"P2P_API",
        b"GROUP_API",
        b"KERNEL_LAUNCH",
    )
    for fmt in (b'"cat": "%s"', b'"cat":"%s"')
)


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """First `n` bytes of the file's content, gunzipped when the file is gzip (by magic, not suffix), as
    UTF-8 when the content is UTF-16 (text_encoding)."""
    raw = raw_head(path, n)
    enc = text_encoding(raw)
    if enc is not None:
        import codecs

        return codecs.getincrementaldecoder(enc)(errors="replace").decode(raw).encode()
    return raw


def check_first_byte(path: Path, starts: bytes, message: str) -> None:
    """Fail fast, before a reader takes in the rest of the file: BadTraceError(`path: message`) when the first
    non-blank byte of the content (gunzipped, first HEAD_BYTES) is none of `starts`. A head that is all
    blank (or an empty file) passes: the reader's own checks decide."""
    from tracelens.errors import BadTraceError

    try:
        head = read_head(path).lstrip(b" \t\r\n")
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from err
    if head and head[0] not in starts:
        raise BadTraceError(f"{path}: {message} (starts with {head[:1]!r})")


def gunzip_bounded(raw: bytes, name: str | Path, limit: int | None = None) -> bytes:
    """Decompress gzip bytes (multi-member aware) under the same bomb limits as Kineto traces: at most
    `TRACELENS_MAX_DECOMPRESSED_BYTES` (default 64 GiB) and a ratio of 1000:1 beyond 1 GiB. A stream cut
    mid-write yields what precedes the cut (the readers salvage or reject it); corrupt data is a BadTraceError.
    """
    from tracelens.errors import BadTraceError
    from tracelens.ingest.kineto.stream import MAX_RATIO, RATIO_MIN_BYTES, max_decompressed_bytes

    limit = max_decompressed_bytes() if limit is None else min(limit, max_decompressed_bytes())
    out: list[bytes] = []
    total = 0
    pending = raw
    step = 1 << 20
    while pending:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while pending and not d.eof:
                piece = d.decompress(pending, step)
                pending = d.unconsumed_tail
                total += len(piece)
                if total > limit:
                    raise BadTraceError(
                        f"{name}: decompresses to more than {limit} bytes; "
                        "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                    )
                if total > RATIO_MIN_BYTES and total > MAX_RATIO * len(raw):
                    raise BadTraceError(
                        f"{name}: compression ratio above {MAX_RATIO}:1 (decompression bomb?); "
                        "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                    )
                out.append(piece)
        except zlib.error as err:
            raise BadTraceError(f"{name}: corrupt gzip data ({err})") from None
        if not d.eof:  # cut mid-write: keep what came before the cut
            break
        pending = d.unused_data.lstrip(b"\x00")
        if pending[:2] != b"\x1f\x8b":
            break  # trailing bytes that are not another gzip member: the stream before them is whole
    return b"".join(out)


#: UTF-8 byte order mark.
BOM = b"\xef\xbb\xbf"
_OWN_MARKS = (b'"schema": "tracelens.', b'"schema":"tracelens.')


def own_output(head: bytes) -> bool:
    """Whether a JSON file's first bytes mark it as written by tracelens (report export-trace, summary.json,
    compare.json): such a file in a run folder is not one of its traces."""
    return any(m in head[:4096] for m in _OWN_MARKS)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


#: Flight Recorder dump keys (torch.distributed `_dump_fr_trace_json`): top level and per entry
_FR_TOP = (b'"pg_config"', b'"pg_status"', b'"comm_lib_version"', b'"nccl_comm_state"')
_FR_ENTRY = (b'"profiling_name"', b'"collective_seq_id"', b'"record_id"', b'"process_group"', b'"pg_id"')


def _looks_like_fr_json(head: bytes) -> bool:
    """A Flight Recorder JSON dump by the format's real keys: a top-level FR key and, when `entries` shows,
    entries with FR entry keys (or none). Any JSON with an `entries` key is not enough."""
    top = any(k in head for k in _FR_TOP)
    if b'"entries"' not in head:
        return top and b'"version"' in head
    i = head.index(b'"entries"')
    after = head[i + 9 : i + 64].lstrip(b": \n\r\t")
    empty = after.startswith(b"[]") or after.startswith(b"[ ]")
    # a top-level FR key is FR enough: the reader judges the entries, and a broken dump is then named in
    # the run's warnings instead of left out silently
    return top or (b'"version"' in head and (empty or any(k in head for k in _FR_ENTRY)))


def detect_format(path: str | Path) -> str | None:
    """One of KINETO, FR_JSON, FR_PICKLE, NCCL_PLUGIN, NCCL_LOG, or None when not a trace we read."""
    path = Path(path)
    try:
        head = read_head(path)
    except OSError:
        return None
    if not head:
        return None
    head = head.removeprefix(BOM)  # a UTF-8 byte order mark (some editors and Windows tools write one)
    stripped = head.lstrip()
    if head[:1] == b"\x80":  # pickle protocol 2+
        return FR_PICKLE if b"entries" in head or b"pg_config" in head or b"version" in head else None
    if stripped[:1] == b"{":
        if own_output(head):
            return None  # tracelens' own outputs (an exported trace, a summary) are not inputs
        if b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head:
            return KINETO
        return FR_JSON if _looks_like_fr_json(head) else None
    if stripped[:1] == b"[":
        # NCCL profiler plugin: an array of async b/e events with the plugin's categories, or an empty "[{}]".
        if stripped.replace(b"\n", b"").replace(b" ", b"")[:4] == b"[{}]":
            return NCCL_PLUGIN
        if b'"ph"' in head and any(c in head for c in _PLUGIN_CATS):
            return NCCL_PLUGIN
        # not JSON: a log whose lines open with `[rank3]:`, `[date time] ` or `[pod/..] ` falls through
    if b" NCCL INFO " in head or b" NCCL WARN " in head:
        return NCCL_LOG
    return None


__all__ = [
    "FR_JSON",
    "FR_PICKLE",
    "KINETO",
    "NCCL_LOG",
    "NCCL_PLUGIN",
    "detect_format",
    "check_first_byte",
    "gunzip_bounded",
    "is_gzip",
    "read_head",
]
