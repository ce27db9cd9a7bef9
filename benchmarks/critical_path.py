"""Where the critical path and what-if spend their time on one run, in one process, on a warm cache.

    .venv/bin/python benchmarks/critical_path.py RUN --cache-dir DIR

Run it after `tracelens analyze RUN --cache-dir DIR` (benchmarks/scale.py --keep --workdir W leaves both:
W/rN and W/cacheN). Prints wall and CPU seconds of: opening the analysis (cache reads), the cross-rank
analysis (collective matching, which the graph needs), the graph with its observed replay and path, the rest
of summary.json, and the what-if replays once more on their own; the graph's size; the process' peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from tracelens.run_analysis import Options, analyze_run

    marks: list[tuple[str, float, float, float]] = []

    def mark(name: str) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB, the process' peak so far
        marks.append((name, time.perf_counter(), time.process_time(), peak))

    mark("start")
    an = analyze_run(Path(a.run), Options(cache_dir=a.cache_dir))
    mark("open (cached per-rank results)")
    _ = an.cross
    mark("cross-rank analysis (matching)")
    crit = an.critical
    mark("critical path (events -> nodes, graph, replay, path)")
    summary = an.summary()
    mark("the rest of summary.json (other analyzers, what-if once)")
    wi = an.what_if([dict(f) for f in summary["findings"]])
    mark("what-if replays (again, alone)")
    rows = []
    for (_, w0, c0, _), (name, w1, c1, peak) in zip(marks, marks[1:]):
        rows.append(
            {"stage": name, "wall_s": round(w1 - w0, 3), "cpu_s": round(c1 - c0, 3), "peak_mib": round(peak)}
        )
        print(f"{name:58s} {w1 - w0:7.2f} s wall {c1 - c0:7.2f} s CPU, peak RSS so far {peak:6.0f} MiB")
    g = crit.graph if crit is not None else None
    info = {
        "ranks": len(an.ranks),
        "device_kernels": int(g.k_rank.size) if g is not None else 0,
        "graph_nodes": int(g.n_nodes) if g is not None else 0,
        "levels": len(g.levels) if g is not None else 0,
        "what_if_entries": len(wi),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(info))
    if a.json:
        Path(a.json).write_text(json.dumps({"stages": rows, **info}, indent=1) + "\n")


if __name__ == "__main__":
    main()
