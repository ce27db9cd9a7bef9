"""Where one `tracelens analyze` run spends its time and memory, phase by phase.

Runs `tracelens analyze ARGS` in a fresh process with a few of its functions timed from inside (the per-rank
phase, the metadata, the reduction into the run memo, the cross-rank analysis, the critical path's graph build,
its write, the critical path, the what-if, the summary, the report) and samples the resident memory of the
whole process tree every 20 ms from outside (as `scale.py` does). Prints one line per timed call (start, end,
duration, peak tree RSS while it ran), then the whole run's wall time and peak.

    .venv/bin/python benchmarks/phases.py analyze RUN -o OUT --cache-dir CACHE       # cold, then:
    .venv/bin/python benchmarks/phases.py analyze RUN -o OUT --cache-dir CACHE       # warm

Start it from a folder outside the checkout you mean to measure, with PYTHONPATH at that checkout:
`python -m tracelens` puts the current folder first on sys.path (docs/performance.md).
"""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import tree_rss  # noqa: E402

#: (module, attribute) of the calls timed in the child, as "module:attr" or "module:Class.method".
TIMED = (
    "tracelens.run:run_all",
    "tracelens.run:_read_metadata",
    "tracelens.run:_reduce",
    "tracelens.run:write_memo",
    "tracelens.analyze.comm.stragglers:analyze_cross_rank",
    "tracelens.run_analysis:Analysis._build_graph",
    "tracelens.store.runs:_write_graph_state",
    "tracelens.run_analysis:Analysis._critical",
    "tracelens.analyze.critical.whatif:what_if",
    "tracelens.summary:build_summary",
    "tracelens.report.html:write_report",
)

#: The child: wraps TIMED, then runs the CLI as `python -m tracelens` does. The marks go to the file named by
#: TRACELENS_PHASES_OUT from an atexit callback (the command ends with os._exit after running those).
CHILD = r"""
import atexit, importlib, json, os, runpy, sys, time
T0 = time.time()
marks = []
def timed(owner, name, label):
    f = getattr(owner, name)
    def g(*a, **k):
        t = time.time()
        try:
            return f(*a, **k)
        finally:
            marks.append((label, t - T0, time.time() - T0))
    setattr(owner, name, g)
for spec in json.loads(os.environ["TRACELENS_PHASES_TIMED"]):
    mod, attr = spec.split(":")
    try:
        owner = importlib.import_module(mod)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        timed(owner, name, attr)
    except (ImportError, AttributeError):
        pass  # (another version of tracelens: not there)
def dump():
    with open(os.environ["TRACELENS_PHASES_OUT"], "w") as fh:
        json.dump({"t0": T0, "marks": marks}, fh)
atexit.register(dump)
sys.argv = ["tracelens"] + sys.argv[1:]
runpy.run_module("tracelens", run_name="__main__")
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    # Measure tracelens as an installed package runs, with its bytecode compiled (as scale.py does: under
    # PYTHONDONTWRITEBYTECODE a checkout would compile every module it imports, ~0.45 s, in the measured process
    # and in each pool worker): the package the child will import, wherever PYTHONPATH puts it.
    where = subprocess.run(
        [sys.executable, "-c", "import os, tracelens; print(os.path.dirname(tracelens.__file__))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if where:
        compileall.compile_dir(where, quiet=1)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tracelens-phases-{os.getpid()}.json"
    env = {**os.environ, "TRACELENS_PHASES_OUT": str(out), "TRACELENS_PHASES_TIMED": json.dumps(TIMED)}
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], env=env, stdout=subprocess.DEVNULL)
    samples: list[tuple[float, int]] = []

    def sample() -> None:
        while proc.poll() is None:
            samples.append((time.time(), tree_rss(proc.pid)[0]))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = proc.wait()
    th.join()
    wall = time.time() - start
    try:
        got = json.loads(out.read_text())
        out.unlink()
    except (OSError, ValueError):
        print(f"no phase marks (exit code {rc})", file=sys.stderr)
        return 1
    t0 = got["t0"]

    def peak(a: float, b: float) -> float:
        inside = [r for t, r in samples if t0 + a <= t <= t0 + b]
        return max(inside, default=0) / 2**20

    print(f"{'call':38s} {'start':>7s} {'end':>7s} {'took':>6s} {'peak MiB':>9s}")
    for label, a, b in sorted(got["marks"], key=lambda m: m[1]):
        print(f"{label:38s} {a:7.2f} {b:7.2f} {b - a:6.2f} {peak(a, b):9.0f}")
    top = max(samples, key=lambda s: s[1], default=(start, 0))
    print(
        f"exit code {rc}; wall {wall:.2f} s (child's clock from its start: {got['t0'] - start:+.2f} s); "
        f"peak tree RSS {top[1] / 2**20:.0f} MiB at {top[0] - t0:.2f} s"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
