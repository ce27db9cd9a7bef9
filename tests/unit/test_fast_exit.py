"""`tracelens._app.main`, the command's entry point: the command's exit code, output and `atexit` callbacks
kept, and the process ended with `os._exit` (no object-by-object teardown of the analysis), except when a
thread is still working or the exit code is not a number."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tracelens import _app

ROOT = Path(__file__).resolve().parents[2]
GLOO = ROOT / "sample_traces" / "cpu-gloo-4rank"


class _Exited(Exception):
    def __init__(self, code: int):
        self.code = code


@pytest.fixture
def exits(monkeypatch):
    """os._exit and the atexit run recorded instead of carried out."""
    seen: list[str] = []

    def fake_exit(code: int):
        seen.append("exit")
        raise _Exited(code)

    monkeypatch.setattr(_app.os, "_exit", fake_exit)
    monkeypatch.setattr(_app.atexit, "_run_exitfuncs", lambda: seen.append("atexit"))
    return seen


def _main(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["tracelens", *argv])
    with pytest.raises(_Exited) as got:
        _app.main()
    return got.value.code


def test_exit_codes_kept_and_atexit_run_first(monkeypatch, exits, capsys, tmp_path):
    import tracelens.cli  # noqa: F401 (the commands register on the app)

    assert _main(monkeypatch, "--version") == 0
    assert capsys.readouterr().out.startswith("tracelens ")
    assert exits == ["atexit", "exit"]
    assert _main(monkeypatch, "analyze", str(tmp_path / "nope")) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_working_thread_keeps_the_normal_exit(monkeypatch, exits):
    import tracelens.cli  # noqa: F401

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)  # (not a daemon: Python's exit would wait for it)
    t.start()
    try:
        monkeypatch.setattr(sys, "argv", ["tracelens", "--version"])
        with pytest.raises(SystemExit) as got:
            _app.main()
        assert got.value.code in (0, None) and exits == []
    finally:
        stop.set()
        t.join()


def test_a_text_exit_code_keeps_the_normal_exit(monkeypatch, exits):
    def text_exit():
        raise SystemExit("a message")

    monkeypatch.setattr(_app, "app", text_exit)
    with pytest.raises(SystemExit) as got:
        _app.main()
    assert got.value.code == "a message" and exits == []


def test_fresh_process_output_and_atexit_complete(tmp_path):
    """A real process: everything written is flushed before `os._exit`, and the analysis' files are there."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
        "sys.argv = ['tracelens', 'analyze', sys.argv[1], '-o', sys.argv[2], '--no-cache']\n"
        "from tracelens.cli import main\n"
        "main()\n"
    )
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-c", code, str(GLOO), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.rstrip().endswith("atexit ran")
    assert f"wrote {out / 'summary.json'} and {out / 'report.html'}" in r.stdout
    assert (out / "summary.json").stat().st_size > 0 and (out / "report.html").stat().st_size > 0
    bad = subprocess.run(
        [sys.executable, "-m", "tracelens", "analyze", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_a_profiler_keeps_the_normal_exit(tmp_path):
    """`python -m cProfile -o F -m tracelens ...` writes F after the command returns: no fast exit then."""
    prof = tmp_path / "out.prof"
    r = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "tracelens", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tracelens ") and prof.stat().st_size > 0
