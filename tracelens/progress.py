"""Plain progress lines for logs (CI): Rich's bar draws only on a terminal, so a CI log would show
nothing for minutes on a large run. When stderr is not a TTY, `PlainProgress` prints one line every
`interval` seconds (default 10), starting only after the work has taken `delay` seconds (default 10):
short runs print nothing. `TRACELENS_PROGRESS_SECONDS` sets both (0 prints on every update; tests)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO


class PlainProgress:
    """Heartbeat lines `tracelens: <phase>: <done>/<total> files, <elapsed> s` on `stream`."""

    def __init__(
        self,
        stream: TextIO | None = None,
        interval: float | None = None,
        delay: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ.get("TRACELENS_PROGRESS_SECONDS")
        seconds = float(env) if env not in (None, "") else None
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval if interval is not None else (seconds if seconds is not None else 10.0)
        self.delay = delay if delay is not None else (seconds if seconds is not None else 10.0)
        self.clock = clock
        self.start = clock()
        self.last: float | None = None
        self.phase = "reading traces"
        self.done: int | None = None
        self.total: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def wanted(stream: TextIO | None = None) -> bool:
        """True when `stream` (stderr) is not a terminal: the Rich bar would not show there."""
        s = stream if stream is not None else sys.stderr
        try:
            return not s.isatty()
        except (AttributeError, ValueError):
            return True

    def line(self) -> str:
        elapsed = self.clock() - self.start
        count = ""
        if self.done is not None:
            count = f": {self.done:,}/{self.total:,} files" if self.total else f": {self.done:,} files"
        return f"tracelens: {self.phase}{count}, {elapsed:.0f} s"

    def maybe_print(self) -> bool:
        """Print a line when the work has run `delay` s and the last line is `interval` s old."""
        with self._lock:
            now = self.clock()
            if now - self.start < self.delay:
                return False
            if self.last is not None and now - self.last < self.interval:
                return False
            self.last = now
            print(self.line(), file=self.stream, flush=True)
            return True

    def update(self, done: int, total: int | None = None) -> None:
        self.done, self.total = done, total
        self.maybe_print()

    def set_phase(self, phase: str) -> None:
        self.phase, self.done, self.total = phase, None, None
        self.maybe_print()

    def __enter__(self) -> PlainProgress:
        """Also print from a background thread, so that a long phase without updates still shows."""
        tick = max(0.05, min(self.interval, 1.0))

        def beat() -> None:
            while not self._stop.wait(tick):
                self.maybe_print()

        self._thread = threading.Thread(target=beat, name="tracelens-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
