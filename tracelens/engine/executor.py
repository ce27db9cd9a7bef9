"""The executor seam: per-rank tasks are plain functions submitted to a `concurrent.futures.Executor`.

- `InlineExecutor`: runs each call at once in this process (one task, one CPU, or an embedded Python).
- `LocalPool`: n persistent worker interpreters on this machine. They are fresh interpreters started by
  command line (`python -c ...`), so nothing of the caller's `__main__` is re-imported (scripts without a
  main guard and notebooks work) and no threads are forked. A call travels as a pickle (a module-level
  function, its arguments) over the worker's stdin; its result or exception comes back the same way.
- Dask: `distributed.Client.get_executor()` (see `tracelens.engine.dask_engine`).

`run_all` submits one call per argument tuple to any of them and waits, reporting progress.
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, as_completed
from pathlib import Path
from typing import IO, Any

Progress = Callable[[int, int], None]
_LEN = struct.Struct("<Q")


class InlineExecutor(Executor):
    """Runs every submitted call immediately in this process."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 (handed to the caller through the future)
            fut.set_exception(err)
        return fut


def _send(fh: IO[bytes], obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(_LEN.pack(len(data)) + data)
    fh.flush()


class _Unpickler(pickle.Unpickler):
    """Only what the pool's own messages hold: tracelens' functions, data classes and errors, paths and
    builtin exceptions. Anything else (it would be neither the parent nor its worker talking) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "tracelens" or module.startswith("tracelens.") or module in ("pathlib", "collections"):
            return super().find_class(module, name)
        if module == "builtins":
            obj = getattr(__import__("builtins"), name, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                return obj
        raise pickle.UnpicklingError(f"worker message: refused global {module}.{name}")


def _recv(fh: IO[bytes]) -> Any:
    head = fh.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = fh.read(n)
    if len(data) < n:
        raise EOFError
    return _Unpickler(io.BytesIO(data)).load()


def worker_main() -> None:
    """Worker loop: one pickled (fn, args, kwargs) per message on stdin -> one ("ok"|"err", value) on stdout."""
    from tracelens.store.pages import worker_allocator

    worker_allocator()  # (a worker reads rank after rank: freed heap reused, not handed back and faulted in)
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed to stdout lands on stderr
    inp = sys.stdin.buffer
    while True:
        try:
            fn, args, kwargs = _recv(inp)
        except EOFError:
            return
        try:
            ans: tuple[str, object] = ("ok", fn(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 (reported to the parent, which raises it there)
            ans = ("err", err)
        try:
            _send(out, ans)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(out, ("err", RuntimeError(f"{type(ans[1]).__name__}: {ans[1]}")))


class LocalPool(Executor):
    """n persistent worker interpreters; calls are queued and run by the first free worker."""

    def __init__(self, n: int):
        env = dict(os.environ)
        pkg_parent = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if env.get("TRACELENS_SPLIT", "auto").strip().lower() == "auto":
            env["TRACELENS_SPLIT"] = "0"  # the pool already keeps every core busy with one rank per worker
        self._errs = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 (closed in shutdown())
        self._procs = [
            subprocess.Popen(
                [sys.executable, "-c", "from tracelens.engine.executor import worker_main; worker_main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
            for err in self._errs
        ]
        self._queue: queue.Queue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None
        ]
        self._queue = queue.Queue()
        self._closed = False
        self._threads = [threading.Thread(target=self._feed, args=(i,), daemon=True) for i in range(n)]
        for th in self._threads:
            th.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        fut: Future[Any] = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _feed(self, i: int) -> None:
        p = self._procs[i]
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            assert p.stdin is not None and p.stdout is not None
            try:
                _send(p.stdin, (fn, args, kwargs))
                status, value = _recv(p.stdout)
            except (OSError, EOFError):
                fut.set_exception(RuntimeError(self._death(i)))
                self._drain()
                return
            if status == "ok":
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def _death(self, i: int) -> str:
        p = self._procs[i]
        p.wait()
        self._errs[i].seek(0)
        tail = self._errs[i].read().decode(errors="replace").strip().splitlines()[-1:]
        return f"worker died (exit {p.returncode}) " + " ".join(tail)

    def _drain(self) -> None:
        """After a worker died: fail what is still queued rather than leave it waiting forever."""
        if any(p.poll() is None for p in self._procs):
            return
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[0].set_running_or_notify_cancel():
                item[0].set_exception(RuntimeError("every worker died"))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for p in self._procs:  # calls in flight are abandoned: stop their workers
                p.kill()
        for _ in self._threads:
            self._queue.put(None)
        for p in self._procs:
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
        for p in self._procs:
            try:
                p.wait(timeout=None if wait else 10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for th in self._threads:
            th.join()
        for f in self._errs:
            f.close()


#: Below this much trace JSON (estimated: gzip files count SMALL_RUN_GZIP_FACTOR times their size) the
#: per-rank tasks run in this process by default: starting a worker interpreter (importing pyarrow and
#: pandas, ~1 s) costs more than the parallel read saves. `workers` given explicitly always gets the pool.
SMALL_RUN_BYTES = 48 * 1024 * 1024
SMALL_RUN_GZIP_FACTOR = 8


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under `taskset`), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_executor(n_tasks: int, workers: int | None = None, input_bytes: int | None = None) -> Executor:
    """The default executor for `n_tasks` calls: min(usable CPUs or `workers`, tasks) worker interpreters,
    or `InlineExecutor` when that is one, when the input is small (`input_bytes` below SMALL_RUN_BYTES and
    `workers` not given) or when Python is embedded without an executable."""
    n = max(1, min(workers or available_cpus(), n_tasks))
    small = workers is None and input_bytes is not None and input_bytes < SMALL_RUN_BYTES
    if n <= 1 or small or not sys.executable:
        return InlineExecutor()
    return LocalPool(n)


def run_all(
    executor: Executor,
    fn: Callable[..., Any],
    calls: Sequence[Iterable[Any]],
    progress: Progress | None = None,
    done: int = 0,
    total: int = 0,
) -> list[Any]:
    """`fn(*args)` for each args of `calls` on `executor`; results in call order. The first failure is
    raised after the calls not yet started are cancelled."""
    futures = [executor.submit(fn, *args) for args in calls]
    try:
        for fut in as_completed(futures):
            fut.result()
            done += 1
            if progress:
                progress(done, total)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return [f.result() for f in futures]


__all__ = [
    "SMALL_RUN_BYTES",
    "SMALL_RUN_GZIP_FACTOR",
    "InlineExecutor",
    "LocalPool",
    "Progress",
    "available_cpus",
    "local_executor",
    "run_all",
    "worker_main",
]
