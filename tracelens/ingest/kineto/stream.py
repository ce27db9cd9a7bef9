"""Decompressed stream of a trace file: gzip inflate (ISA-L when installed) with size and ratio
limits, block readers, event-boundary search in the raw JSON.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import types
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path

from tracelens.errors import BadTraceError
from tracelens.ingest import salvage as _salv

_inflate: types.ModuleType  # isal_zlib or zlib (the same API)
try:  # ISA-L's inflate (python-isal) is ~3x faster than zlib's and releases the GIL likewise; optional
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover (depends on the environment)
    _inflate = zlib
_INFLATE_ERRORS: tuple[type[Exception], ...] = tuple({zlib.error, _inflate.error})
#: What ISA-L's gzip reader raises on a cut or corrupt file (_reused_blocks).
_REUSED_ERRORS: tuple[type[Exception], ...] = (EOFError, OSError, *_INFLATE_ERRORS)
#: ISA-L's gzip reader, which inflates into a caller's buffer (no new object per block): split reads use it.
_GzipReader = getattr(_inflate, "_GzipReader", None)

#: Decompressed bytes above which a gzip trace is refused (override with TRACELENS_MAX_DECOMPRESSED_BYTES).
DEFAULT_MAX_DECOMPRESSED = 64 * 1024**3
#: A compression ratio above this, once past RATIO_MIN_BYTES of output, is treated as a decompression bomb.
MAX_RATIO = 1000
RATIO_MIN_BYTES = 1024**3
#: Inflated block size. Larger blocks are allocated by mmap and fault their pages in afresh each time
#: (1 MiB blocks cost ~3,000 page faults, ~5 ms, per 25 MB of JSON); 256 KiB ones are reused from the heap.
_READ_BYTES = 256 * 1024


# ------------------------------------------------------------------------------------------ reading
def max_decompressed_bytes() -> int:
    """Decompressed-size limit for gzip traces (env TRACELENS_MAX_DECOMPRESSED_BYTES, default 64 GiB)."""
    v = os.environ.get("TRACELENS_MAX_DECOMPRESSED_BYTES")
    if v:
        try:
            return int(float(v))
        except ValueError:
            pass
    return DEFAULT_MAX_DECOMPRESSED


class _Truncated(Exception):
    """The gzip stream ended before its end marker (a file cut mid-write)."""


def _utf16(path: Path) -> str | None:
    """The file's UTF-16 codec when its content is UTF-16 text (encoding.text_encoding), else None."""
    from tracelens.ingest.encoding import raw_head, text_encoding

    try:
        return text_encoding(raw_head(path, 4096))
    except OSError:
        return None


def _blocks(path: Path, out_bytes: int = _READ_BYTES) -> Generator[bytes, None, None]:
    """Decompressed content of `path` in blocks of at most ~`out_bytes` (gzip by magic bytes, multi-member
    aware, size-bounded against decompression bombs), as UTF-8 when the content is UTF-16 (transcoded as it
    streams). Raises _Truncated after the last block of a cut gzip."""
    enc = _utf16(path)
    if enc is None:
        yield from _raw_blocks(path, out_bytes)
        return
    import codecs

    dec = codecs.getincrementaldecoder(enc)(errors="replace")
    try:
        for b in _raw_blocks(path, out_bytes):
            text = dec.decode(b)
            if text:
                yield text.encode()
    except _Truncated:
        tail = dec.decode(b"", final=True)
        if tail:
            yield tail.encode()
        raise
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail.encode()


def _raw_blocks(path: Path, out_bytes: int = _READ_BYTES) -> Generator[bytes, None, None]:
    """_blocks without the UTF-16 transcoding."""
    limit = max_decompressed_bytes()
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic != b"\x1f\x8b":
            while True:
                b = fh.read(out_bytes)
                if not b:
                    return
                yield b
        d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
        total_in = total_out = 0
        pending = b""
        exhausted = False
        while True:
            if not pending and not exhausted:
                pending = fh.read(max(out_bytes // 8, 16))
                exhausted = not pending
                total_in += len(pending)
            cut = False
            try:
                out = d.decompress(pending, out_bytes)
                if exhausted and not out and not d.eof:
                    # input used up before the end marker; ISA-L may still hold decoded bytes: take them
                    out = d.flush()
                    cut = True
            except _INFLATE_ERRORS as err:
                raise BadTraceError(f"{path}: corrupt gzip data ({err})") from None
            pending = d.unconsumed_tail
            total_out += len(out)
            if total_out > limit:
                raise BadTraceError(
                    f"{path}: decompresses to more than {limit} bytes; "
                    "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                )
            if total_out > RATIO_MIN_BYTES and total_out > MAX_RATIO * total_in:
                raise BadTraceError(
                    f"{path}: compression ratio above {MAX_RATIO}:1 (decompression bomb?); "
                    "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
                )
            if out:
                yield out
            if cut:
                raise _Truncated()
            if d.eof:
                rest = d.unused_data
                if rest.lstrip(b"\x00")[:2] == b"\x1f\x8b":  # another gzip member follows
                    d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
                    pending = rest.lstrip(b"\x00")
                elif rest.lstrip(b"\x00") or exhausted:
                    return  # the end, or trailing bytes that are not a gzip member (the trace before is whole)
                else:
                    pending = b""


def _reused_blocks(path: Path, out_bytes: int) -> Generator[memoryview | bytes, None, None]:
    """Decompressed content of `path` for the fast paths (split reads, serial reads without salvage): like
    _blocks (same limits), but inflated inline by ISA-L's gzip reader into one reused buffer, so no block is
    allocated (fresh pages fault in: ~5 ms per 25 MB in a forked child) and no thread hands blocks over (the
    decoder holds the GIL for a chunk at a time, so a background inflater mostly waits for it). A block is
    valid only until the next one is requested (_scan_blocks copies it). Any error, a cut file included,
    raises _SplitFailed: the careful path (_blocks) then reads the file and reports it precisely. Falls back
    to _blocks without python-isal."""
    if _GzipReader is None or not _is_gzip(path) or _utf16(path) is not None:
        yield from _blocks(path, out_bytes)
        return
    limit = max_decompressed_bytes()
    buf = memoryview(bytearray(out_bytes))
    total = 0
    try:
        with open(path, "rb") as fh:
            reader = _GzipReader(fh, out_bytes)
            while True:
                n = reader.readinto(buf)
                if not n:
                    return
                total += n
                if total > limit or (total > RATIO_MIN_BYTES and total > MAX_RATIO * fh.tell()):
                    raise _SplitFailed()
                yield buf[:n]
    except _REUSED_ERRORS:
        raise _SplitFailed() from None


def _prefetch(it: Iterator[bytes], depth: int = 4) -> Generator[bytes, None, None]:
    """Run a block iterator in a background thread (zlib and file reads release the GIL, so decompression
    overlaps decoding); at most `depth` blocks wait in the queue. Exceptions are re-raised in the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for b in it:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as err:  # noqa: BLE001 (handed to the consumer)
            q.put(err)

    th = threading.Thread(target=work, name="tracelens-gunzip", daemon=True)
    th.start()
    try:
        while True:
            b = q.get()
            if b is done:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()
        while th.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                th.join(0.05)


_TE_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"


def _last_boundary(buf: bytes | bytearray, lo: int, hi: int | None = None) -> tuple[int, int] | None:
    """Last `}` , `{` separator in buf[lo:hi]: (index just after `}`, index of `{`), or None (salvage's)."""
    return _salv.last_boundary(buf, lo, len(buf) if hi is None else hi)


# the first `}` , `{` event separator at or after an offset (depends only on the bytes, so both parts of a
# split read agree; None when the separator may continue in the next block): one implementation, salvage's
_first_boundary = _salv.first_boundary


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _utf8_replaced(blocks: Iterator[bytes]) -> Generator[bytes, None, None]:
    """The blocks with invalid UTF-8 sequences replaced by U+FFFD (a sequence split across blocks is kept)."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        for b in blocks:
            yield dec.decode(b).encode()
        yield dec.decode(b"", final=True).encode()
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


class _SplitFailed(Exception):
    """A split read cannot be used (no boundary near the middle, odd layout, an error in either part):
    the file is read serially instead, which also gives the precise error."""
