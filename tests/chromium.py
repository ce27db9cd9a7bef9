"""One headless Chromium for many pages, driven over the DevTools protocol on a pipe (no extra Python
package): `--remote-debugging-pipe` reads JSON commands, each ended by a NUL byte, from file descriptor 3
and writes replies and events to file descriptor 4.

`Browser` opens a page at a given viewport width, waits for its load event, evaluates JavaScript in it
(`evaluate`) and takes a screenshot of the whole page (`screenshot`, PNG bytes). One launch serves every
page of a test module: a launch costs about a second of CPU, a page load a fraction of that.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
SKIP_REASON = "no chromium binary (.ci/run installs Debian's chromium: apt-get install -y chromium)"


_MOVE_FDS = """
import fcntl, os, sys
a, b = (fcntl.fcntl(int(x), fcntl.F_DUPFD, 10) for x in sys.argv[1:3])
os.dup2(a, 3)
os.dup2(b, 4)
for fd in {a, b, int(sys.argv[1]), int(sys.argv[2])} - {3, 4}:
    os.close(fd)
os.execv(sys.argv[3], sys.argv[3:])
"""


class BrowserError(RuntimeError):
    """A DevTools command failed, the browser exited, or a wait timed out."""


class Browser:
    """A headless Chromium with one tab (a flat DevTools session), reused for every page."""

    def __init__(self, profile_dir: Path, timeout: float = 60.0) -> None:
        if CHROMIUM is None:
            raise BrowserError(SKIP_REASON)
        self.timeout = timeout
        profile_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(profile_dir / "chromium.log", "wb")  # noqa: SIM115 (closed in close())
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        args = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--mute-audio",
            f"--user-data-dir={profile_dir}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        # the pipe ends become descriptors 3 (commands in) and 4 (replies out) of Chromium: a small Python
        # program between the fork and Chromium moves them there (above 9 first, so that neither move
        # overwrites the other's source) and execs Chromium; no code runs in the forked child itself
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MOVE_FDS, str(to_chrome_r), str(from_chrome_w), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            pass_fds=(to_chrome_r, from_chrome_w),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self._events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    # ---- protocol ----------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("Chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (rc={self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: bool = False, **params: Any) -> dict:
        """Send one command; return its result (events that arrive meanwhile are kept for `wait_event`)."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str) -> dict:
        """The first not yet seen event named `method` (waiting for it)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for i, ev in enumerate(self._events):
                if ev["method"] == method:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    # ---- pages -------------------------------------------------------------------------------------
    def open(self, url: str, width: int, height: int = 900) -> None:
        """Load `url` in a viewport `width` CSS pixels wide; return after its load event."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited; JSON-serialisable)."""
        r = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in r:
            raise BrowserError(f"script failed: {r['exceptionDetails'].get('text')}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def console_errors(self) -> list[str]:
        """Uncaught exceptions and console.error messages since the last call."""
        out = []
        keep = []
        for ev in self._events:
            if ev["method"] == "Runtime.exceptionThrown":
                d = ev["params"]["exceptionDetails"]
                out.append(str((d.get("exception") or {}).get("description") or d.get("text")))
            elif ev["method"] == "Runtime.consoleAPICalled" and ev["params"]["type"] == "error":
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in ev["params"]["args"]))
            else:
                keep.append(ev)
        self._events = keep
        return out

    def screenshot(self) -> bytes:
        """PNG of the whole page (beyond the viewport's height)."""
        r = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)
        return base64.b64decode(r["data"])

    def close(self) -> None:
        with contextlib.suppress(BrowserError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
