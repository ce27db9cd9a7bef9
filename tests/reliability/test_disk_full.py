"""Issue 42, item 5: a full disk. A full cache is "analyzed without cache" and leaves nothing half-written;
a full output folder is a one-line error (exit 2) that replaces no output. The disk is not filled: the one
atomic writer (store/atomic.write_atomic) is made to fail with ENOSPC after a number of files, as a full disk
fails the write that finds no room (a part of the temporary file written)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from broken_traces import GLOO, cli_inproc

import tracelens.store.atomic as atomic
from tracelens.run_analysis import Options, analyze_run


def _fill_after(monkeypatch, under: Path, room: int) -> dict[str, int]:
    """Writes of files under `under` fail with ENOSPC once `room` of them were written."""
    real = atomic.write_atomic
    seen = {"writes": 0, "refused": 0}

    def write_atomic(dest, write):
        if Path(dest).resolve().is_relative_to(under.resolve()):
            seen["writes"] += 1
            if seen["writes"] > room:
                seen["refused"] += 1

                def partial(tmp: Path) -> None:
                    Path(tmp).write_bytes(b"\0" * 100)
                    raise OSError(errno.ENOSPC, "No space left on device")

                return real(dest, partial)
        return real(dest, write)

    monkeypatch.setattr(atomic, "write_atomic", write_atomic)
    return seen


def _plain(summary: dict) -> dict:
    s = dict(summary)
    s.pop("tracelens_version", None)
    s["run"] = {k: v for k, v in s["run"].items() if k != "warnings"}
    return s


@pytest.fixture(scope="module")
def reference() -> dict:
    return _plain(analyze_run(GLOO / "traces", Options(no_cache=True)).summary())


def _half_written(root: Path) -> list[Path]:
    """Temporary files, and cache entries without their metadata file (written last: the entry's mark)."""
    tmp = [p for p in root.rglob("*") if p.name.endswith((".tmp", ".part"))]
    entries = root / "entries"
    bad = (
        [d for d in entries.glob("*") if d.is_dir() and not list(d.glob("rank*.meta*"))]
        if entries.exists()
        else []
    )
    return tmp + bad


@pytest.mark.parametrize("room", [0, 2, 5, 12, 30])
def test_a_full_cache_is_analyzed_without_cache(tmp_path, monkeypatch, reference, room):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(cache))
    seen = _fill_after(monkeypatch, cache, room)
    s = analyze_run(GLOO / "traces", Options()).summary()
    assert seen["refused"] > 0, "the cache was written to"
    assert _plain(s) == reference
    full = [w for w in s["run"]["warnings"] if "is full" in w]
    if room < 8:  # (4 ranks, 2 files each: the entries themselves did not fit)
        assert full == [f"cache folder {cache} is full (No space left on device): analyzed without cache"]
    assert _half_written(cache) == []
    # room again: the next run uses the cache and gives the same result
    monkeypatch.undo()
    monkeypatch.setenv("TRACELENS_CACHE_DIR", str(cache))
    again = analyze_run(GLOO / "traces", Options()).summary()
    assert _plain(again) == reference and not [w for w in again["run"]["warnings"] if "cache" in w]


def test_a_full_output_folder_is_one_line_and_replaces_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    old = b'{"schema": "tracelens.summary/1", "an": "earlier summary"}\n'
    (out / "summary.json").write_bytes(old)
    _fill_after(monkeypatch, out, 1)  # summary.json fits, report.html does not
    code, _, err = cli_inproc(capsys, "analyze", GLOO / "traces", "-o", out, "--no-cache")
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("tracelens: error: cannot write ") and line.endswith("No space left on device")
    assert (out / "summary.json").read_bytes() == old  # not replaced without its report
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    for args in (("report", "export-trace", GLOO / "traces", "-o", out / "m.json"),):
        code, _, err = cli_inproc(capsys, *args)
        assert code == 2 and "No space left on device" in err and not (out / "m.json").exists()
    json.loads((out / "summary.json").read_text())
