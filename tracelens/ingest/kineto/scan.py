"""The streaming scan: the `traceEvents` array cut into chunks at event boundaries and decoded in
place, bounded in memory, with the salvage of damaged or cut files (salvage.py).

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import pyarrow as pa

from tracelens.errors import BadTraceError
from tracelens.ingest import salvage as _salv
from tracelens.ingest.kineto.columns import _Chunk, _columns, _NeedFullArgs
from tracelens.ingest.kineto.decode import _META_KEYS, COLL_KEY, PEER_KEY, _decode_events, _decode_top, _Hint
from tracelens.ingest.kineto.native import scan as _native_scan
from tracelens.ingest.kineto.stream import (
    _TE_KEY,
    _WS,
    _first_boundary,
    _last_boundary,
    _SplitFailed,
    _Truncated,
)

#: Arrow's allocator is asked to return freed memory to the OS after this many bytes of decoded JSON (not
#: after every chunk: mimalloc's collection costs ~0.3 ms a time and the pages it returns fault back in; not
#: much less often: at 16 MiB a split read's helper process held ~5 MB more at its peak).
RELEASE_BYTES = 4 * 1024 * 1024


@dataclass
class _Scan:
    meta: dict
    chunks: list
    bytes_total: int
    bytes_parsed: int
    salvaged: bool
    split_at: int | None = None  # first part of a split read: where the second part starts
    helper: int | None = None  # a split read's child process, to be reaped (_reap)
    damage: _salv.Damage = field(default_factory=_salv.Damage)  # events mended or skipped (salvage.py)
    dropped: int = 0  # events without a usable timestamp (absent, invalid, beyond int64 ns), set by _assemble


def _scan_blocks(
    path: Path,
    blocks: Iterator[bytes | memoryview],
    salvage: bool,
    chunk_bytes: int,
    stop_at: int | None = None,
    start_at: int | None = None,
    found: list[int] | None = None,
) -> _Scan:
    """Decode the stream's events chunk by chunk. For a split read (_scan_split), `stop_at` makes this the
    first part: events up to the first boundary at or after that offset of the decompressed stream (the
    rest of the file is not read); `start_at` makes it the second part: events from that boundary on (its
    offset is appended to `found`)."""
    meta: dict = {}
    chunks: list[_Chunk] = []
    buf = bytearray()
    state = "head" if start_at is None else "seek"
    off = 0  # offset of buf[0] in the decompressed stream
    total = 0
    parsed = 0
    truncated = False
    eof = False
    head_from = 0
    hint = _Hint()
    dmg = _salv.Damage()
    released = 0  # `parsed` when Arrow's allocator last returned memory
    while not eof:
        try:
            b = next(blocks)
            total += len(b)
            buf += b
        except StopIteration:
            eof = True
        except _Truncated:
            eof = True
            truncated = True
        if state == "whole":
            continue
        if state == "seek":  # second part of a split read: skip to the split boundary
            seek_at = cast(int, start_at)  # the state is "seek" only with a start_at
            fb = _first_boundary(buf, max(0, seek_at - off))
            if fb is None:
                if eof:
                    raise _SplitFailed()
                if off + len(buf) < seek_at:
                    off += len(buf)
                    buf.clear()
                continue
            off += fb[1] - 1
            parsed = off
            if found is not None:
                found.append(off + 1)
            del buf[: fb[1] - 1]
            buf[0] = 91  # "["
            state = "events"
        if state == "head":
            if head_from == 0 and buf[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte order mark
                del buf[:3]
                off += 3
                parsed += 3
            m = _TE_KEY.search(buf, head_from)
            if m is None:
                _bound_head(path, buf, off)
                head_from = max(0, len(buf) - 64)
                continue
            head = bytes(buf[: m.end()]) + b"]}"
            try:
                top = _decode_top(head)
            except msgspec.DecodeError:
                # damage in the metadata (a lone surrogate, a NaN in deviceProperties) costs that value, as
                # damage in an event costs the event; else "traceEvents" matched inside something else:
                # decode the whole document
                top = _salv.repair_head(head, _decode_top, dmg, salvage)
                if top is None:
                    state = "whole"
                    continue
            _merge_meta(meta, top)
            parsed += m.end() - 1
            off += m.end() - 1
            del buf[: m.end() - 1]  # buf[0] is now the array's "["
            state = "events"
            if stop_at is not None and off >= stop_at:
                raise _SplitFailed()  # the events do not start before the split point
        if state == "events" and stop_at is not None and off + len(buf) > stop_at:
            # first part of a split read: the last piece ends at the first boundary at/after stop_at
            fb = _first_boundary(buf, stop_at - off)
            if fb is None:
                if eof:
                    raise _SplitFailed()
                continue
            chunk = _decode_in_place(buf, fb[0], hint, view=True)  # (buf is not used after this)
            if chunk is None:
                raise _SplitFailed()  # not a boundary between whole events
            chunks.append(chunk)
            if dmg.any:
                raise _SplitFailed()  # the serial read counts the damage
            return _Scan(meta, chunks, off + fb[1], off + fb[1], False, split_at=off + fb[1])
        while state == "events" and len(buf) >= chunk_bytes and not eof:
            cut = _last_boundary(buf, 1)
            if cut is None:
                _bound_event(path, buf, off, chunk_bytes)
                break
            errs: list[Exception] = []
            chunk = _decode_in_place(buf, cut[0], hint, errs, view=True)
            if chunk is None:
                # the decode read a view of buf, which the error's frames may still hold: a copy is what
                # is mended and cut from here on (rare: damaged data, or a cut inside a string)
                buf = bytearray(buf)
                p = _salv.error_at(errs[0], bytes(buf[: cut[0]])) if errs else None
                if p is None or p >= cut[0]:
                    break  # the cut fell inside a string or nested value: read more, retry
                # a local error (an invalid byte, NaN, a flipped separator) in the middle of the data
                nxt = _read_past(path, buf, p, errs[0], hint, chunks, dmg, off, salvage, stop_at, start_at)
                if nxt is None:
                    break  # the damaged region runs past the data read so far
                if nxt:
                    parsed += nxt - 1
                    off += nxt - 1
                    del buf[: nxt - 1]
                    buf[0] = 91  # "["
                continue
            chunks.append(chunk)
            parsed += cut[1] - 1
            if parsed - released >= RELEASE_BYTES:
                pa.default_memory_pool().release_unused()
                released = parsed
            off += cut[1] - 1
            # the rest goes on in a new buffer: the decoded chunk's raw timestamps were views of the old one,
            # which must not be resized while anything holds them (_decode_in_place)
            buf = buf[cut[1] - 1 :]
            buf[0] = 91  # "["
            break
    if state == "seek" or (stop_at is not None and state != "events"):
        raise _SplitFailed()
    if state in ("head", "whole"):
        # No (usable) traceEvents key: decode what we have as one document for a precise error or result.
        if truncated and not salvage:
            raise BadTraceError(f"{path}: truncated gzip stream (file cut mid-write?)")
        rest = bytes(buf)
        if not rest.strip():
            raise BadTraceError(f"{path}: empty file")
        try:
            top = _decode_top(rest)
        except msgspec.DecodeError as err:
            raise BadTraceError(f"{path}: not a valid Kineto JSON trace ({err})") from None
        if top.traceEvents is None:
            raise BadTraceError(f"{path}: no traceEvents array (not a PyTorch profiler trace?)")
        _merge_meta(meta, top)
        if top.traceEvents:
            chunks.append(_columns(top.traceEvents))
        return _Scan(meta, chunks, total, total, False)
    # Last piece: the remaining events, the `]` closing the array and the top-level keys after it.
    last = _native_last(buf, meta)
    if last is not None:
        chunks.append(last)
        return _Scan(meta, chunks, total, total, False, damage=dmg)
    while True:
        tail = b"".join((b'{"traceEvents":', buf))  # (one copy)
        try:
            top = _decode_top(tail)
            break
        except msgspec.DecodeError as err:
            p = _salv.error_at(err, tail)
            p = None if p is None or p < 16 else p - 15  # index in buf
            if not _salv.is_cut(buf, p):
                assert p is not None
                nxt = _read_past(path, buf, p, err, hint, chunks, dmg, off, salvage, stop_at, start_at)
                if nxt == 0:
                    continue  # mended in place
                if nxt is not None:
                    parsed += nxt - 1
                    off += nxt - 1
                    del buf[: nxt - 1]
                    buf[0] = 91  # "["
                    continue
                # the damage is in the last event: drop it when the array is closed after it
                start = _salv.keep_before(buf, p, _keeper(chunks, hint))
                parsed += start - 1
                off += start - 1
                del buf[1:start]
                if _salv.drop_last_event(buf, 1, p - (start - 1), dmg, off):
                    continue
                p = len(buf)
            if not salvage:
                why = "truncated gzip stream" if truncated else f"not valid JSON ({err})"
                raise BadTraceError(f"{path}: {why}; the file may have been cut mid-write") from None
            evs = _salvage_tail(buf, len(buf) if p is None else p)
            if evs:
                chunks.append(_columns(evs[0]))
                parsed += evs[1]
            return _Scan(meta, chunks, total, parsed, True, damage=dmg)
    _merge_meta(meta, top)
    if top.traceEvents:
        chunks.append(_columns(top.traceEvents))
    if not chunks and not top.traceEvents:
        raise BadTraceError(f"{path}: traceEvents is empty (nothing was recorded)")
    return _Scan(meta, chunks, total, total, False, damage=dmg)


#: Bytes before the `traceEvents` key (metadata) beyond which a file is not taken for a Kineto trace, and
#: bytes one event may take (beyond a chunk): both bound what the reader holds whatever the input.
MAX_HEAD_BYTES = 256 * 1024**2
MAX_EVENT_BYTES = 256 * 1024**2
#: A run of whitespace at least this long at the end of the buffer is collapsed (JSON between tokens).
_WS_RUN = 64 * 1024


def _collapse_ws(buf: bytearray) -> int:
    """Collapse a long run of whitespace at the end of buf to one byte (whitespace between JSON tokens is
    insignificant; a trace padded with gigabytes of it, a 229:1 gzip, must not be held). Returns bytes
    removed."""
    n = len(buf)
    if n < _WS_RUN or buf[n - 1] not in _WS or bytes(buf[n - _WS_RUN :]).strip(_WS):
        return 0
    q = n - _WS_RUN  # buf[q:] is whitespace: find where the run starts, a slice at a time (C speed)
    while q > 0:
        lo = max(0, q - _WS_RUN)
        keep = len(bytes(buf[lo:q]).rstrip(_WS))
        q = lo + keep
        if keep:
            break
    removed = n - q - 1
    del buf[q + 1 :]
    return removed


def _bound_head(path: Path, buf: bytearray, off: int) -> None:
    """Before the `traceEvents` key: fail fast on bytes no JSON object starts with (a file of zeros, a
    binary), collapse whitespace padding, and give up past MAX_HEAD_BYTES of metadata."""
    first = bytes(buf[:4096]).lstrip(_WS)[:1]
    if first and first != b"{":
        raise BadTraceError(
            f"{path}: not a valid Kineto JSON trace (starts with {first!r}, not a JSON object)"
        )
    _collapse_ws(buf)
    if len(buf) > MAX_HEAD_BYTES:
        raise BadTraceError(
            f"{path}: no traceEvents key in the first {MAX_HEAD_BYTES >> 20} MiB (not a Kineto trace?)"
        )


def _bound_event(path: Path, buf: bytearray, off: int, chunk_bytes: int) -> None:
    """Between event boundaries: collapse whitespace padding; an event longer than MAX_EVENT_BYTES (or
    bytes that never reach a boundary) is not a trace we can hold."""
    _collapse_ws(buf)
    if len(buf) > chunk_bytes + MAX_EVENT_BYTES:
        raise BadTraceError(
            f"{path}: no event boundary in {MAX_EVENT_BYTES >> 20} MiB after byte {off} of the decompressed "
            "data (an event that large is not a Kineto trace)"
        )


def _keeper(chunks: list, hint: _Hint) -> Any:
    """salvage.keep_before's decode: the whole events of buf[:end] become a chunk."""

    def decode(buf: bytearray, end: int) -> bool:
        chunk = _decode_in_place(buf, end, hint)
        if chunk is None:
            return False
        chunks.append(chunk)
        return True

    return decode


def _read_past(
    path: Path,
    buf: bytearray,
    p: int,
    err: Exception,
    hint: _Hint,
    chunks: list,
    dmg: _salv.Damage,
    off: int,
    salvage: bool,
    stop_at: int | None,
    start_at: int | None,
) -> int | None:
    """A local decode error at buf[p] (buf[0] == "["), followed by more data. Mended in place (returns 0:
    decode again), or, with salvage, the whole events before the damaged one become chunks and the index of
    the `{` of the first whole event after it is returned (the caller drops buf up to there); None when no
    event boundary follows the error in buf (the caller reads more, or at the end of the data drops the
    last event). Without salvage a damaged event is a BadTraceError at once."""
    if _salv.mend(buf, p, err):
        if stop_at is not None or start_at is not None:
            raise _SplitFailed()  # the serial read counts the damage
        dmg.mended += 1
        dmg.note(off + p)
        return 0
    if not salvage:
        raise BadTraceError(
            f"{path}: invalid JSON at byte {off + p} of the decompressed data "
            f"({_salv._POS.sub('', str(err)).strip()}); "
            "salvage (the CLI's default) skips the damaged event"
        )
    if _salv.first_boundary(buf, p) is None:
        return None
    start = _salv.keep_before(buf, p, _keeper(chunks, hint))
    return _salv.skip_to_next(buf, start, p, dmg, off)


def _decode_in_place(
    buf: bytearray, end: int, hint: _Hint | None = None, errors: list | None = None, view: bool = False
) -> _Chunk | None:
    """Decode the events in buf[0:end] (buf[0] == "[") as a JSON array: the separator byte at buf[end] is
    overwritten with "]" for the decode and restored after it. None when buf[:end] is not whole events.

    Decoded raw timestamps reference the text they were decoded from, and something outside tracelens can
    hold them for a moment after the chunk is done (Dask's sampling profiler keeps the frames of a running
    task, with their locals): a buffer they are views of cannot be resized meanwhile ("memoryview has N
    exported buffers"). By default the decode reads a copy of the chunk (freed with the last reference to
    it). With `view` it reads buf itself, sparing that copy (~1 MiB a chunk, and its fresh pages): the
    caller then must not resize buf after this call, only drop it (the main loop goes on with a new buffer
    holding the rest, or a copy of buf after a failed decode)."""
    saved = buf[end]
    buf[end] = 93  # "]"
    try:
        part: bytes | memoryview = memoryview(buf)[: end + 1] if view else bytes(memoryview(buf)[: end + 1])
        if not view:
            buf[end] = saved
        got = _native_scan(part)  # the compiled decoder, when built: None leaves the chunk to msgspec
        if got is not None and got[1] == end + 1:
            return got[0]
        # a chunk naming a collective (one search, ~0.1 ms per MiB) needs the full args: decoded so at once
        lean_ok = (
            hint is None
            or not hint.lean
            or (buf.find(COLL_KEY, 0, end) < 0 and buf.find(PEER_KEY, 0, end) < 0)
        )
        try:
            evs = _decode_events(part, hint, lean_ok)
        except msgspec.DecodeError as err:
            if errors is not None:
                errors.append(err)
            return None
        try:
            return _columns(evs)
        except _NeedFullArgs:  # a collective: this chunk and the rest of the file with the full args
            assert hint is not None  # (only _decode_events with a hint decodes lean structs)
            hint.lean = False
            del evs
            return _columns(_decode_events(part, hint))
    finally:
        buf[end] = saved


def _salvage_tail(buf: bytearray, hi: int) -> tuple[list, int] | None:
    """Complete events at the start of a cut-off remainder (buf[0] == "[") before buf[hi] (where the data
    ends or turns bad): try event boundaries from the last one back (a bounded number of times: the
    remainder is at most about two chunks, so this costs a bounded time)."""
    for _ in range(64):
        cut = _last_boundary(buf, 1, hi)
        if cut is None:
            break
        try:
            return _decode_events(bytes(buf[: cut[0]]) + b"]"), cut[0]
        except msgspec.DecodeError:
            hi = cut[0] - 1
    # a single complete event before the cut?
    end = buf.rfind(b"}", 0, hi)
    for _ in range(64):
        if end <= 0:
            break
        try:
            return _decode_events(bytes(buf[: end + 1]) + b"]"), end + 1
        except msgspec.DecodeError:
            end = buf.rfind(b"}", 0, end)
    return None


def _native_last(buf: bytearray, meta: dict) -> _Chunk | None:
    """The last piece (buf[0] == "[": the remaining events, the array's `]`, the top-level keys after it)
    by the compiled decoder: its events' columns, the keys merged into `meta`; None when the decoder is off
    or leaves the events to msgspec, or when the text after the array is not a whole JSON object's end (the
    caller decodes the piece as before, with its salvage). An empty array is left to the caller too (it
    tells an empty trace apart)."""
    got = _native_scan(buf)
    if got is None:
        return None
    chunk, stop = got
    if stop < 64 and not bytes(buf[1 : stop - 1]).strip():
        return None
    try:
        top = _decode_top(b"".join((b'{"traceEvents":[', memoryview(buf)[stop - 1 :])))
    except msgspec.DecodeError:
        return None
    if top.traceEvents:  # a second `traceEvents` key after the array (msgspec keeps the last): as before
        return None
    _merge_meta(meta, top)
    return chunk


def _merge_meta(meta: dict, top: Any) -> None:
    for k in _META_KEYS:
        v = getattr(top, k)
        if v is not None:
            meta[k] = v
