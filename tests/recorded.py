"""Real multi-rank CPU runs recorded with scripts/record_cpu_run.py and scripts/record_cpu_layouts.py
(torch 2.13, gloo, 8 ranks).

`recorded_run(kind, **opts)` / `recorded_layout(kind)` return the path of a recorded run (truth.json inside).
Kinds name the planted fault; keyword options are the script's pipeline flags (`annotate="hf"`, ...).

The runs the tests use are stored in tests/data/recorded/<name>/ (recorded once by this module:
`python -m tests.recorded --store`, about 3 MB each): recording one takes 30-60 s of two cores, ten of them
would take most of CI's time, and a stored run gives the same verdicts on every machine (the ranks
time-share the cores, so live timings carry the host's scheduling noise). A kind or option set with no
stored run, or every run with TRACELENS_RECORD_LIVE=1, is recorded live, once per test session, into a
temporary folder (skipped when torch is not installed: the `record` extra pins it).
`python -m pytest -m recording` (with the `record` extra) records the faults run live and checks that it
gives the stored run's verdicts, so the recorder keeps working with the pinned torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "record_cpu_run.py"

#: kind -> record_cpu_run.py flags (all `--kind pipeline`: 8 ranks, pp=4 x dp=2, 1F1B, m=4)
KINDS: dict[str, list[str]] = {
    "clean": [],
    "heavy_stage": ["--heavy-stage", "2", "--heavy-layers", "6"],
    "faults": ["--fault-compute", "--slow-rank", "5", "--stall-rank", "1", "--stall-ms", "30"],
    "skipped_send": ["--skip-send", "2:3:1", "--timeout-s", "10"],
}
_CACHE: dict[tuple, Path] = {}
_ROOT: list[Path] = []
STORED = REPO / "tests" / "data" / "recorded"


def stored_name(kind: str, opts: dict | None = None) -> str:
    """Folder name of a stored run: the kind, then its options (`heavy_stage-annotate-hf`)."""
    return "-".join([kind, *(f"{k}-{v}" for k, v in sorted((opts or {}).items()))])


def _stored(name: str) -> Path | None:
    if os.environ.get("TRACELENS_RECORD_LIVE") == "1":
        return None
    p = STORED / name
    return p if (p / "truth.json").is_file() else None


def _flags(opts: dict) -> list[str]:
    out = []
    for k, v in sorted(opts.items()):
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def recorded_run(kind: str, **opts) -> Path:
    """Path of a recorded run of `kind` with extra script options: the stored one, else recorded once per
    session."""
    stored = _stored(stored_name(kind, opts))
    if stored is not None:
        return stored
    return record_run(kind, **opts)


def _record(key: tuple, name: str, out: Path | None, args: list[str], timeout: int) -> Path:
    """Run a recorder script (`args`, then `-o OUT`) into `out`, or once per session (by `key`) into a
    temporary folder as `name`; the output folder."""
    pytest.importorskip("torch", reason="torch==2.13.0 (the record extra) records the real runs")
    if out is None and key in _CACHE:
        return _CACHE[key]
    if out is None:
        if not _ROOT:
            _ROOT.append(Path(tempfile.mkdtemp(prefix="tracelens-recorded-")))
        out = _ROOT[0] / name
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, *args, "-o", str(out)], capture_output=True, text=True, env=env, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"recording {name} failed:\n{proc.stderr[-3000:]}")
    _CACHE[key] = out
    return out


def record_run(kind: str, out: Path | None = None, **opts) -> Path:
    """Record `kind` live (into `out`, or once per session into a temporary folder)."""
    args = [str(SCRIPT), "--kind", "pipeline", *KINDS[kind], *_flags(opts)]
    return _record((kind, tuple(sorted(opts.items()))), f"{kind}-{len(_CACHE)}", out, args, 600)


def truth(run: Path) -> dict:
    return json.loads((run / "truth.json").read_text())


# ----- layouts and schedules read from structure (issue 23): scripts/record_cpu_layouts.py -----------------

LAYOUT_SCRIPT = REPO / "scripts" / "record_cpu_layouts.py"
#: kind -> record_cpu_layouts.py flags (8 ranks each; see the script's docstring)
LAYOUT_KINDS: dict[str, list[str]] = {
    "tppdp_clean": ["--layout", "tppdp"],
    "tppdp_slow_tp": ["--layout", "tppdp", "--slow-rank", "5"],
    "ulysses": ["--layout", "ulysses"],
    "interleaved_bare": ["--layout", "interleaved", "--bare"],
}


def recorded_layout(kind: str) -> Path:
    """Path of a recorded run of LAYOUT_KINDS[kind] (truth.json inside): the stored one, else recorded once
    per session."""
    stored = _stored(stored_name("layout-" + kind))
    if stored is not None:
        return stored
    return record_layout(kind)


def record_layout(kind: str, out: Path | None = None) -> Path:
    """Record LAYOUT_KINDS[kind] live (into `out`, or once per session into a temporary folder)."""
    return _record(("layout", kind), f"layout-{kind}", out, [str(LAYOUT_SCRIPT), *LAYOUT_KINDS[kind]], 900)


#: the runs the tests read: (kind, options) of record_cpu_run.py and the layout kinds
STORED_RUNS: list[tuple[str, dict]] = [
    ("clean", {}),
    ("heavy_stage", {}),
    ("heavy_stage", {"annotate": "hf"}),
    ("heavy_stage", {"annotate": "class"}),
    ("faults", {}),
    ("skipped_send", {}),
]
STORED_LAYOUTS: list[str] = list(LAYOUT_KINDS)


def _store(only: list[str]) -> None:
    """Record every stored run again into tests/data/recorded/ (replacing what is there)."""
    import shutil

    jobs = [(stored_name(k, o), lambda out, k=k, o=o: record_run(k, out, **o)) for k, o in STORED_RUNS]
    jobs += [(stored_name("layout-" + k), lambda out, k=k: record_layout(k, out)) for k in STORED_LAYOUTS]
    for name, record in jobs:
        if only and name not in only:
            continue
        dest = STORED / name
        tmp = STORED / f".{name}.new"
        shutil.rmtree(tmp, ignore_errors=True)
        record(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        print(f"stored {dest.relative_to(REPO)}", flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="record the runs the tests read into tests/data/recorded/")
    ap.add_argument("--store", action="store_true", help="record them (all, or the names given)")
    ap.add_argument("names", nargs="*", help="stored names (default: all); --list shows them")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print(
            "\n".join(
                [stored_name(k, o) for k, o in STORED_RUNS]
                + [stored_name("layout-" + k) for k in STORED_LAYOUTS]
            )
        )
    elif a.store:
        _store(a.names)
