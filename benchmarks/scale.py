"""End-to-end `tracelens analyze` at 8, 64, 256 and 1,024 simulated ranks: wall time, peak RSS, cost per event.

For each rank count the simulator writes a run (TINY_MODEL widened to ~1.8 MB of raw JSON per rank: seq 1024,
8 microbatches, 3 steps, TP2 x PP4 x DP(ranks/8)) into a temporary folder, then `tracelens analyze` runs
in a fresh process, first on a cold cache (ingest + per-rank stage + cross-rank analysis + report), then
again on the warm cache. Peak RSS is the largest SUM of the resident memory of the whole process tree
(the CLI and its worker processes), sampled every 20 ms from /proc, next to the largest single process.
Runs are deleted afterwards (`--keep` keeps them).

    .venv/bin/python benchmarks/scale.py [--ranks 8,64,256,1024] [--engine local|dask] [--no-report]
    .venv/bin/python benchmarks/scale.py --simulate-args "--tp 8 --pp 8 --dp 16 --steps 2 --microbatches 8"
    .venv/bin/python benchmarks/scale.py --run /path/to/sim1024 --workdir /tmp/scale   # an existing run
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def simulate_run(ranks: int, out: Path) -> None:
    """The benchmark's run of `ranks` ranks (TP2 x PP4 x DP ranks/8) written to `out`."""
    from tracelens.simulate import TINY_MODEL, SimConfig, simulate

    if ranks % 8:
        raise SystemExit(f"--ranks: {ranks} is not a multiple of 8 (TP2 x PP4 x DP)")
    cfg = SimConfig(
        model=TINY_MODEL,
        seq_len=1024,
        tp=2,
        pp=4,
        dp=ranks // 8,
        microbatches=8,
        steps=3,
        compress_level=1,
    )
    simulate(cfg, out)


def raw_bytes(run: Path) -> int:
    """Decompressed size of all traces of a run (streamed, nothing kept)."""
    total = 0
    for f in sorted(run.glob("*.json.gz")):
        with gzip.open(f, "rb") as g:
            while chunk := g.read(1 << 22):
                total += len(chunk)
    return total


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_rss(root: int) -> tuple[int, int]:
    """(sum of RSS over root and all its descendants, largest single RSS) in bytes."""
    kids = _children()
    todo, total, biggest = [root], 0, 0
    while todo:
        p = todo.pop()
        r = _rss(p)
        total += r
        biggest = max(biggest, r)
        todo.extend(kids.get(p, []))
    return total, biggest


def run_measured(cmd: list[str], interval: float = 0.02) -> dict:
    """Run cmd; wall time, peak tree RSS and peak single-process RSS (sampled), CPU time of the tree."""
    t0 = time.perf_counter()
    r0 = os.times()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            tot, big = tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], tot), max(peak[1], big)
            time.sleep(interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    th.join()
    wall = time.perf_counter() - t0
    r1 = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return {"wall_s": wall, "cpu_s": cpu, "peak_tree_rss": peak[0], "peak_proc_rss": peak[1]}


def events_of(cache: Path) -> int:
    """Complete events of all ranks, from the metadata in the run's cache folder."""
    sys.path.insert(0, str(REPO))
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 0
    for p in cache.rglob("rank*.meta.*"):  # (Arrow IPC; Parquet in caches of older versions)
        if p.suffix == ".arrow":
            with pa.OSFile(str(p)) as f:
                t = pa.ipc.open_file(f).read_all().select(["events"])
        elif p.suffix == ".parquet":
            t = pq.read_table(p, columns=["events"])
        else:
            continue
        n += sum(v or 0 for v in t.column("events").to_pylist())
    return n


def _world(sim_args: str) -> int:
    """Ranks of a `tracelens simulate` command line (the product of its --tp --pp --dp --cp)."""
    words, n = sim_args.split(), 1
    for flag in ("--tp", "--pp", "--dp", "--cp"):
        if flag in words:
            n *= int(words[words.index(flag) + 1])
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--engine", default="local", choices=["local", "dask"])
    ap.add_argument("--no-report", action="store_true", help="skip report.html (default: write it)")
    ap.add_argument("--workdir", default=None, help="where runs are written (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the simulated runs")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument(
        "--simulate-args",
        default=None,
        help="simulate one run with `tracelens simulate ARGS` instead of the --ranks runs, e.g. issue 15's "
        "'--tp 8 --pp 8 --dp 16 --steps 2 --microbatches 8' (1,024 ranks of the default model, 4.5 GB of JSON)",
    )
    ap.add_argument(
        "--run",
        default=None,
        help="measure this existing run folder (never deleted) instead of simulating one, e.g. a run kept "
        "by an earlier --keep; its cache and output go to --workdir",
    )
    args = ap.parse_args()
    # Measure tracelens as an installed package runs: with its bytecode compiled (an installer compiles it;
    # an editable checkout under PYTHONDONTWRITEBYTECODE would otherwise compile every module it imports,
    # ~0.45 s, inside each measured run), as benchmarks/ingest.py does.
    compileall.compile_dir(str(REPO / "tracelens"), quiet=1)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tracelens-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "tracelens", "analyze"]
    rows = []
    try:
        given = Path(args.run).resolve() if args.run else None
        if given is not None:
            sizes = [sum(1 for f in given.iterdir() if f.name.endswith((".trace.json", ".trace.json.gz")))]
        elif args.simulate_args:
            sizes = [_world(args.simulate_args)]
        else:
            sizes = [int(v) for v in args.ranks.split(",")]
        for n in sizes:
            run = given or work / (f"r{n}" if not args.simulate_args else f"sim{n}")
            if given is None and not run.exists():
                t = time.perf_counter()
                if args.simulate_args:
                    cmd = [
                        sys.executable,
                        "-m",
                        "tracelens",
                        "simulate",
                        *args.simulate_args.split(),
                        "-o",
                        str(run),
                    ]
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                else:
                    simulate_run(n, run)
                print(f"simulated {n} ranks in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            cache = work / f"cache{n}"  # a cache of this run's own (cold first, then warm)
            shutil.rmtree(cache, ignore_errors=True)
            raw = raw_bytes(run)
            out = work / f"out{n}"
            cmd = exe + [
                str(run),
                "-o",
                str(out),
                "--force",
                "--engine",
                args.engine,
                "--cache-dir",
                str(cache),
            ]
            if args.no_report:
                cmd.append("--no-report")
            cold = run_measured(cmd)
            warm = run_measured(cmd)
            ev = events_of(cache)
            row = {"ranks": n, "raw_json_bytes": raw, "events": ev, "cold": cold, "warm": warm}
            rows.append(row)
            print(
                f"{n:5d} ranks {raw / 1e9:6.2f} GB raw {ev:>10,} events | cold {cold['wall_s']:7.1f} s "
                f"{cold['peak_tree_rss'] / 2**20:7.0f} MiB tree ({cold['peak_proc_rss'] / 2**20:6.0f} max proc) "
                f"{1e6 * cold['wall_s'] / max(ev, 1):6.2f} us/event | warm {warm['wall_s']:6.1f} s "
                f"{warm['peak_tree_rss'] / 2**20:6.0f} MiB {1e6 * warm['wall_s'] / max(ev, 1):6.2f} us/event",
                flush=True,
            )
            if not args.keep:
                if given is None:
                    shutil.rmtree(run, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg": os.getloadavg(),
    }
    base = {r["ranks"]: r for r in rows}.get(64)
    if base:
        for r in rows:
            for k in ("cold", "warm"):
                per = r[k]["wall_s"] / max(r["events"], 1)
                r[k]["per_event_vs_64"] = per / (base[k]["wall_s"] / max(base["events"], 1))
        print("per-event cost relative to 64 ranks (cold, warm):")
        for r in rows:
            print(
                f"  {r['ranks']:5d}: {r['cold']['per_event_vs_64']:.2f}x  {r['warm']['per_event_vs_64']:.2f}x"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine, "engine": args.engine, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
