"""The one atomic writer: every file tracelens writes goes to a temporary name beside it, then is renamed.

A reader (another analysis, a browser, a CI job) never sees half a file, and a failed write leaves the
previous file in place. The temporary name is unique per process and call, so concurrent writers of the
same file do not trample each other's temporary files.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc


def write_atomic(dest: str | Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` to fill a temporary file beside `dest`, then rename it onto `dest`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(dest: str | Path, data: bytes) -> None:
    """Write bytes atomically."""
    write_atomic(dest, lambda tmp: tmp.write_bytes(data))


def write_text(dest: str | Path, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes(dest, text.encode("utf-8"))


def write_ipc(dest: str | Path, table: pa.Table, compression: str | None = None) -> None:
    """Write an Arrow IPC file atomically: for the many small per-rank files read back on every run (stage
    files), whose cost is opening them, ~20x less than a Parquet file's footer and metadata; `compression`
    ("lz4", "zstd") compresses its buffers (on this thread: the callers are already one per core)."""
    opts = pa.ipc.IpcWriteOptions(compression=compression, use_threads=False)

    def write(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=opts) as w:
            w.write_table(table)

    write_atomic(dest, write)


def write_later(name: str, write: Callable[[], object]) -> Future[None]:
    """Call `write()` in a thread of its own (named `name`), started here: the future is done when it
    returns. An OSError (a cache that cannot take the files) is no error: the future's result is None, as
    for a write that succeeded. Any other exception is the future's."""
    done: Future[None] = Future()

    def run() -> None:
        try:
            write()
        except OSError:
            pass
        except BaseException as err:  # noqa: BLE001 (handed to the caller through the future)
            done.set_exception(err)
            return
        done.set_result(None)

    threading.Thread(target=run, name=name).start()
    return done


__all__ = ["write_atomic", "write_bytes", "write_ipc", "write_later", "write_text"]
