"""Event names far longer than any real one (a generated 200,000-character kernel name): cut at ingest to a
bounded text that keeps the digest of the whole name, so that equal names still group, different ones stay
apart, and neither the analysis nor the report handles (or prints) the whole name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from broken_traces import kineto_doc, step_events, write

from tracelens.ingest import kineto
from tracelens.schema import NAME_MAX_CHARS

LONG = "void f<" + "T, " * 66_666 + "T>()"  # ~200,000 characters
OTHER = LONG[:-4] + "U>()"  # the same first 199,996 characters


def _trace(d: Path) -> Path:
    evs = step_events(steps=3, kernel_name=LONG)
    for e in evs:
        if e["name"] == LONG and e["ts"] > 1000:  # the second and third steps' kernel: another long name
            e["name"] = OTHER
            break
    return write(d / "rank0.json", kineto_doc(0, 1, evs))


def test_long_names_are_cut_with_their_digest(tmp_path):
    path = _trace(tmp_path / "run")
    names = kineto.read(path).events.column("name").to_pylist()
    assert max(len(n) for n in names if n) < NAME_MAX_CHARS + 60
    long_ones = [n for n in names if n and len(n) > NAME_MAX_CHARS]
    assert len(long_ones) == 3
    assert all(
        n.startswith(LONG[:NAME_MAX_CHARS]) and f"[{len(LONG):,} chars, blake2b:" in n for n in long_ones
    )
    assert len(set(long_ones)) == 2  # (equal names equal, the other one apart)
    assert sum(n == long_ones[0] for n in long_ones) in (1, 2)
    short = [n for n in names if n and len(n) <= NAME_MAX_CHARS]
    assert "aten::mm" in short and "cudaLaunchKernel" in short  # (other names untouched)


def test_the_report_never_holds_the_whole_name(tmp_path):
    run = _trace(tmp_path / "run").parent
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tracelens", "analyze", str(run), "-o", str(out)]
    cmd += ["--cache-dir", str(tmp_path / "cache")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert LONG not in html and OTHER not in html
    assert LONG[:NAME_MAX_CHARS] not in html or html.count(LONG[:NAME_MAX_CHARS]) < 20
    summary = (out / "summary.json").read_text()
    assert LONG not in summary and OTHER not in summary

    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    assert max(len(s) for s in strings(json.loads(summary))) < NAME_MAX_CHARS + 200
