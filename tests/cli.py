"""Run the `tracelens` command line the way a user does: through its real entry point (`tracelens.cli.app`,
whose `_App.__call__` turns errors into one-line messages and exit codes), in this process.

A fresh interpreter per call costs ~1.5 s of CPU (imports) before the command starts; most tests only need
the entry point, its exit code and its output, so they run it here, with stdout, stderr, the environment,
the working directory and `sys.argv` captured and restored around the call. `fresh=True` (or
`TRACELENS_TEST_FRESH_CLI=1` for the whole suite) runs `python -m tracelens` in a subprocess instead: the
tests of what only a new process shows (a traceback on stderr, nothing printed at import) keep using it.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracelens(
    *args: object,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """`tracelens ARGS` -> CompletedProcess(returncode, stdout, stderr). `env`: variables set for the call
    (on top of this process' environment). `timeout` bounds a fresh interpreter only (pytest's own limits
    apply to a call in this process)."""
    argv = [str(a) for a in args]
    if fresh or os.environ.get("TRACELENS_TEST_FRESH_CLI") == "1":
        e = {**os.environ, **(env or {})}
        e["PYTHONPATH"] = str(REPO) + (
            os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""
        )
        return subprocess.run(
            [sys.executable, "-m", "tracelens", *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=e,
            timeout=timeout,
            check=False,
        )
    from tracelens.cli import app

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv[:], os.getcwd()
    code = 0
    try:
        os.environ.pop("TRACELENS_DEBUG", None)
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["tracelens", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app()
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["tracelens", *argv], code, out.getvalue(), err.getvalue())
