"""A small pool of persistent worker interpreters running per-rank tasks (ingest + per-rank stage).

Used by the Parquet ingest of `tracelens.loader` and by the per-rank stage of the local engine.
Workers are fresh interpreters started by command line (`python -c ...`): nothing of the caller's `__main__` is re-imported (scripts without a main guard and
notebooks work) and no threads are forked. Tasks and answers are one JSON line each over pipes; a task
names a function of `TASKS` and its keyword arguments.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from tracelens import errors


def _process_rank(**kw) -> int:
    from tracelens.engine.local import process_rank

    return process_rank(**kw)


def _ingest_rank(**kw) -> int:
    from tracelens.loader import ingest_rank

    return ingest_rank(**kw)


#: Functions a worker may run, by name.
TASKS: dict[str, Callable[..., int]] = {"process_rank": _process_rank, "ingest_rank": _ingest_rank}


class WorkerPool:
    """n persistent workers; `run(i, task)` sends a task to worker i and waits for its answer."""

    def __init__(self, n: int):
        env = dict(os.environ)
        pkg_parent = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if env.get("TRACELENS_SPLIT", "auto").strip().lower() == "auto":
            env["TRACELENS_SPLIT"] = "0"  # the pool already keeps every core busy with one rank per worker
        self._errs = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 (closed in close())
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", "from tracelens.workers import worker_main; worker_main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
            )
            for err in self._errs
        ]

    def run(self, i: int, task: dict) -> dict:
        p = self.procs[i]
        assert p.stdin is not None and p.stdout is not None
        try:
            p.stdin.write(json.dumps(task).encode() + b"\n")
            p.stdin.flush()
            line = p.stdout.readline()
        except OSError:
            line = b""
        if not line:
            p.wait()
            self._errs[i].seek(0)
            tail = self._errs[i].read().decode(errors="replace").strip().splitlines()[-1:]
            return {
                "error": "RuntimeError",
                "message": f"worker died (exit {p.returncode}) " + " ".join(tail),
            }
        return json.loads(line)

    def close(self) -> None:
        for p in self.procs:
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self._errs:
            f.close()


def worker_main() -> None:
    """Worker loop: one JSON task per stdin line -> one JSON answer per stdout line."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed to stdout lands on stderr
    for line in sys.stdin.buffer:
        t = json.loads(line)
        try:
            ans = {"ok": TASKS[t["fn"]](**t["kw"])}
        except Exception as err:  # noqa: BLE001 (reported to the parent, which raises it there)
            ans = {"error": type(err).__name__, "message": str(err)}
        out.write(json.dumps(ans).encode() + b"\n")
        out.flush()


def raise_remote(ans: dict) -> None:
    """Raise a worker's error in the parent: TracelensError subclasses as themselves, others as RuntimeError."""
    cls = getattr(errors, ans.get("error", ""), None)
    if isinstance(cls, type) and issubclass(cls, errors.TracelensError):
        raise cls(ans["message"])
    raise RuntimeError(f"{ans.get('error')}: {ans.get('message')}")


def run_tasks(
    tasks: list[dict],
    n: int,
    progress: Callable[[int, int], None] | None = None,
    done: int = 0,
    total: int = 0,
) -> None:
    """Run tasks on n workers (n <= 1: in this process), calling progress(done, total) after each."""
    if n <= 1 or not sys.executable:
        for t in tasks:
            TASKS[t["fn"]](**t["kw"])
            done += 1
            if progress:
                progress(done, total)
        return
    pool = WorkerPool(n)
    q: queue.Queue = queue.Queue()
    for t in tasks:
        q.put(t)
    results: queue.Queue = queue.Queue()
    stop = threading.Event()

    def feed(i: int) -> None:
        while not stop.is_set():
            try:
                t = q.get_nowait()
            except queue.Empty:
                return
            results.put(pool.run(i, t))

    threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    try:
        for _ in range(len(tasks)):
            ans = results.get()
            if "error" in ans:
                raise_remote(ans)
            done += 1
            if progress:
                progress(done, total)
    finally:
        stop.set()
        if any(th.is_alive() for th in threads):
            for p in pool.procs:
                p.kill()
        for th in threads:
            th.join()
        pool.close()
