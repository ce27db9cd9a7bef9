"""Ingest throughput and peak memory: tracelens vs orjson.loads, json.loads and HolisticTraceAnalysis 0.5.

Every measurement runs in a fresh Python process: it imports what it needs, records its RSS (the baseline:
interpreter + imports + library initialisation), runs the operation once, and reports the wall time, the CPU
time (user + system, all threads and waited-for child processes) and `ru_maxrss - baseline`. Throughput is MB (10**6 bytes) of
*decompressed* JSON per second. Medians of `--repeat` runs are reported; the runs are interleaved in rounds so
that a busy moment of a shared machine hits every row alike.

    .venv/bin/python benchmarks/ingest.py                      # df_index_resolver (53.7 MB raw)
    .venv/bin/python benchmarks/ingest.py TRACE.json.gz --repeat 5 --hta-python /path/to/hta-venv/bin/python

The tracelens `read` rows run with TRACELENS_SPLIT unset (the default, `auto`: two processes when a CPU is
idle, else one) and, as `_split`, with TRACELENS_SPLIT=1 (always two processes); `split runs` says how many runs of a row were split,
and for those the helper's peak RSS minus its RSS just after the fork (the memory it allocated or copied on
write) is reported separately and added in `x raw JSON with helper`.

`tracelens_load_cached` is a fresh process reading the warm Parquet cache (what a second CLI run costs, with
the Parquet reader's one-time start-up); `tracelens_load_cached_warm` is a second load in one process (what a
notebook's reload costs). `tracelens_load_run_first` / `_run_cached` do the same for a multi-rank run (`--run`,
default the 16-rank sample): the first load ingests the ranks in the worker pool sized to the machine and
writes the per-rank Parquet cache; the cached load reads it (their MB/s count that run's decompressed JSON). HTA runs in its own virtual environment (it is not a tracelens dependency); its
rows are skipped when `--hta-python` does not exist. HTA is timed on
`hta.common.trace_parser.parse_trace_dataframe` (the per-file parse inside `TraceAnalysis`, default JSON
backend) and on the whole `TraceAnalysis(trace_dir=...)` load.
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
DEFAULT_HTA_PYTHON = Path("/work/hta-venv/bin/python")
DEFAULT_RUN = REPO / "sample_traces" / "qwen35-27b-seq4k-tp4pp4"

_PRELUDE = r"""
import json, resource, sys, time
def rss_kb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (resource.getpagesize() // 1024)
def _cpu():  # this process (all threads) and its waited-for children (a split read's helper process)
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime
_CPU0 = [0.0]
def report(t0, base_kb, **extra):
    dt = time.perf_counter() - t0
    cpu = _cpu() - _CPU0[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # 0 when no child ran
    try:  # the helper's RSS just after fork (written by the hook below): its growth is its own memory
        with open(_FORK_RSS) as fh:
            child_start = int(fh.read())
        _os.remove(_FORK_RSS)
    except (OSError, ValueError):
        child_start = 0
    print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "peak_kb": peak, "base_kb": base_kb,
                      "child_peak_kb": child, "child_start_kb": child_start, **extra}))
import os as _os, tempfile as _tf
_FORK_RSS = _os.path.join(_tf.gettempdir(), f"tracelens-bench-fork-{_os.getpid()}")
def _at_fork():
    with open(_FORK_RSS, "w") as fh:
        fh.write(str(rss_kb()))
def spy_split(kineto):
    _os.register_at_fork(after_in_child=_at_fork)
    used = []
    from tracelens.ingest.kineto import reader
    orig = reader._scan_split
    def spy(*a, **kw):
        sc = orig(*a, **kw)
        used.append(sc is not None)
        return sc
    reader._scan_split = spy  # (reader._scan calls it)
    return used
"""

_READ = r"""
import os
import pyarrow as pa; pa.array([1]).sum()  # Arrow's one-time initialisation belongs to the baseline
from tracelens.ingest import kineto
used = spy_split(kineto)
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
tr = kineto.read(sys.argv[ARG])
report(t0, base, rows=tr.events.num_rows, split=bool(used and used[0]))
"""
#: TRACELENS_SPLIT per tracelens row: None the default (auto), "1" a split read (two processes).
SPLIT_ENV = {
    "tracelens_read_gz": None,
    "tracelens_read_gz_split": "1",
    "tracelens_read_json": None,
    "tracelens_read_json_split": "1",
}
CHILDREN = {
    "tracelens_read_gz": _READ.replace("ARG", "1"),
    "tracelens_read_gz_split": _READ.replace("ARG", "1"),
    "tracelens_read_json": _READ.replace("ARG", "2"),
    "tracelens_read_json_split": _READ.replace("ARG", "2"),
    # a fresh process as a notebook starts (pandas and pyarrow imported): the clock includes importing what
    # the call needs, as the first call pays it
    "tracelens_read_gz_fresh": r"""
import pandas, pyarrow as pa; pa.array([1]).sum()
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
from tracelens.ingest import kineto
tr = kineto.read(sys.argv[1])
report(t0, base, rows=tr.events.num_rows)
""",
    "tracelens_api_load_fresh": r"""
import pandas, pyarrow as pa; pa.array([1]).sum()
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
import tracelens
run = tracelens.load(sys.argv[3], no_cache=True)  # the first call of a notebook
report(t0, base, rows=run.analysis.run.events.num_rows)
""",
    "orjson_loads": r"""
import orjson
data = open(sys.argv[2], "rb").read()  # the input bytes are read before the baseline
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
doc = orjson.loads(data)
report(t0, base, rows=len(doc["traceEvents"]))
""",
    "json_loads": r"""
import json as js
data = open(sys.argv[2], "rb").read()
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
doc = js.loads(data)
report(t0, base, rows=len(doc["traceEvents"]))
""",
    "tracelens_load_first": r"""
import pyarrow as pa; pa.array([1]).sum()
from tracelens.run import load_tables
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
t = load_tables(sys.argv[3], workers=1)
report(t0, base, rows=t.events.num_rows)
""",
    "tracelens_load_cached": r"""
import pyarrow as pa; pa.array([1]).sum()
from tracelens.run import load_tables
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
t = load_tables(sys.argv[3], workers=1)
report(t0, base, rows=t.events.num_rows)
""",
    "tracelens_load_run_first": r"""
import pyarrow as pa; pa.array([1]).sum()
from tracelens.run import load_tables
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
t = load_tables(sys.argv[4])  # every rank, through the worker pool sized to the machine
report(t0, base, rows=t.events.num_rows)
""",
    "tracelens_load_run_cached": r"""
import pyarrow as pa; pa.array([1]).sum()
from tracelens.run import load_tables
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
t = load_tables(sys.argv[4])
report(t0, base, rows=t.events.num_rows)
""",
    "tracelens_api_load_no_cache": r"""
import pyarrow as pa; pa.array([1]).sum()
t_imp = time.perf_counter()
import tracelens, tracelens.run, tracelens.run_analysis  # the modules of tracelens.load (as other rows import theirs)
t_imp = time.perf_counter() - t_imp
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
run = tracelens.load(sys.argv[3], no_cache=True)  # what a notebook user types
report(t0, base, rows=run.analysis.run.events.num_rows, import_seconds=t_imp)
""",
    "tracelens_api_load_first": r"""
import pyarrow as pa; pa.array([1]).sum()
t_imp = time.perf_counter()
import tracelens, tracelens.run, tracelens.run_analysis  # the modules of tracelens.load (as other rows import theirs)
t_imp = time.perf_counter() - t_imp
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
run = tracelens.load(sys.argv[3])  # a cold cache: ingest, per-rank stage, cache written
report(t0, base, rows=run.analysis.run.events.num_rows, import_seconds=t_imp)
""",
    "tracelens_api_load_cached": r"""
import pyarrow as pa; pa.array([1]).sum()
t_imp = time.perf_counter()
import tracelens, tracelens.run, tracelens.run_analysis  # the modules of tracelens.load (as other rows import theirs)
t_imp = time.perf_counter() - t_imp
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
run = tracelens.load(sys.argv[3])  # the cache tracelens_api_load_first left (a second notebook session)
report(t0, base, rows=run.analysis.run.events.num_rows, import_seconds=t_imp)
""",
    "tracelens_analyze_no_cache": r"""
import pyarrow as pa; pa.array([1]).sum()
import contextlib, io, tempfile
from tracelens.cli import app
out = tempfile.mkdtemp()
sys.argv = ["tracelens", "analyze", sys.argv[3], "-o", out, "--no-cache", "--no-report"]
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    try:
        app()  # the whole command: load, every analyzer, summary.json
    except SystemExit as e:
        if e.code:
            raise
report(t0, base, rows=0)
""",
    "tracelens_load_cached_warm": r"""
import pyarrow as pa; pa.array([1]).sum()
from tracelens.run import load_tables
load_tables(sys.argv[3], workers=1)  # first use of the Parquet reader in this process (one-time costs)
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
t = load_tables(sys.argv[3], workers=1)
report(t0, base, rows=t.events.num_rows)
""",
}

#: Where the tracelens_load_* children keep their cache (removed for every cold load).
BENCH_CACHE = Path(tempfile.gettempdir()) / "tracelens-bench-cache"

HTA_CHILDREN = {
    "hta_parse_trace_dataframe": r"""
import logging; logging.disable(logging.CRITICAL)
from hta.common.trace_parser import parse_trace_dataframe
from hta.configs.parser_config import ParserConfig
import pandas as pd
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
meta, df, sym = parse_trace_dataframe(sys.argv[1], ParserConfig())
report(t0, base, rows=len(df))
""",
    "hta_trace_analysis_load": r"""
import logging; logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
base = rss_kb(); _CPU0[0] = _cpu(); t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[3])
report(t0, base, rows=sum(len(d) for d in ta.t.traces.values()))
""",
}


def _run(python: str, code: str, args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run(
        [python, "-c", _PRELUDE + code, *args], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(
            out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    import msgspec
    import pyarrow

    try:
        import orjson

        orjson_version = orjson.__version__
    except ImportError:  # (an optional comparison: its row fails on its own)
        orjson_version = None

    try:
        import isal

        inflate = f"isal {isal.__version__}"
    except ImportError:
        inflate = "zlib (isal not installed)"

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "msgspec": msgspec.__version__,
        "orjson": orjson_version,
        "inflate": inflate,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-python", default=str(DEFAULT_HTA_PYTHON))
    ap.add_argument("--json", help="also write the results as JSON here")
    ap.add_argument(
        "--run",
        default=str(DEFAULT_RUN),
        help="a multi-rank run for the first-load vs cached-reload rows (default: the 16-rank sample)",
    )
    ap.add_argument("--only", help="comma-separated rows to measure (default: all)")
    a = ap.parse_args(argv)
    # Measure tracelens as an installed package runs: with its bytecode compiled (an installer compiles it;
    # an editable checkout under PYTHONDONTWRITEBYTECODE would otherwise compile the lazily imported
    # modules inside every measurement).
    compileall.compile_dir(str(REPO / "tracelens"), quiet=1)

    trace = Path(a.trace).resolve()
    load_before = os.getloadavg()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="tracelens-bench-") as tmp:
        raw = Path(tmp) / "trace.json"
        opener = gzip.open if trace.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(trace, "rb") as src, open(raw, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        raw_bytes = raw.stat().st_size
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        shutil.copy(trace, run_dir / trace.name)
        multi = Path(tmp) / "multi"
        multi.mkdir()
        for f in sorted(Path(a.run).iterdir()):  # the traces only (no cache, no reports)
            if f.is_file() and ".pt.trace.json" in f.name:
                shutil.copy(f, multi / f.name)
        multi_raw = 0
        for f in multi.iterdir():
            with (gzip.open if f.name.endswith(".gz") else open)(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    multi_raw += len(chunk)
        args = [str(trace), str(raw), str(run_dir), str(multi)]

        results: dict[str, dict] = {}

        only = set(a.only.split(",")) if a.only else None
        jobs = [(name, sys.executable, code) for name, code in CHILDREN.items() if not only or name in only]
        if only is not None and not only & set(HTA_CHILDREN):
            pass
        elif Path(a.hta_python).exists():
            jobs += [(name, a.hta_python, code) for name, code in HTA_CHILDREN.items()]
        else:
            results["hta_parse_trace_dataframe"] = {"error": f"{a.hta_python} not found"}
        # Rounds interleave all measurements, so that a busy moment of a shared machine hits every row alike.
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in jobs}
        for _ in range(a.repeat):
            for name, python, code in jobs:  # tracelens_load_first leaves the cache that _cached reads
                if name in results:
                    continue
                # the benchmark's own caches (one for the single trace, one for the multi-rank run)
                # (tracelens.load salvages by default, load_tables not: their cache entries differ)
                cache = BENCH_CACHE / ("multi" if "_run_" in name else "api" if "_api_" in name else "single")
                if name in ("tracelens_load_first", "tracelens_load_run_first", "tracelens_api_load_first"):
                    shutil.rmtree(cache, ignore_errors=True)
                job_env = dict(env)
                job_env["TRACELENS_CACHE_DIR"] = str(cache)
                job_env.pop("TRACELENS_SPLIT", None)
                if SPLIT_ENV.get(name) is not None:
                    job_env["TRACELENS_SPLIT"] = SPLIT_ENV[name]
                try:
                    runs[name].append(_run(python, code, args, job_env))
                except RuntimeError as err:
                    results[name] = {"error": str(err)}
        for name, rs in runs.items():
            if name in results or not rs:
                continue
            secs = statistics.median(r["seconds"] for r in rs)
            above = statistics.median((r["peak_kb"] - r["base_kb"]) / 1024 for r in rs)
            # a split read's helper process: its peak RSS minus its RSS just after fork (what it allocated
            # or copied on write; the pages it still shares with this process are not counted twice)
            child = statistics.median(
                max(0, r.get("child_peak_kb", 0) - r.get("child_start_kb", 0)) / 1024
                if r.get("split")
                else 0.0
                for r in rs
            )
            results[name] = {
                "seconds": secs,
                "cpu_seconds": statistics.median(r["cpu_seconds"] for r in rs),
                "mb_per_s": (multi_raw if name.startswith("tracelens_load_run") else raw_bytes) / 1e6 / secs,
                "peak_rss_mb": statistics.median(r["peak_kb"] / 1024 for r in rs),
                "baseline_rss_mb": statistics.median(r["base_kb"] / 1024 for r in rs),
                "rss_above_baseline_mb": above,
                "rss_over_raw": above
                * 2**20
                / (multi_raw if name.startswith("tracelens_load_run") else raw_bytes),
                "helper_rss_above_baseline_mb": child,
                "rss_with_helper_over_raw": (above + child) * 2**20 / raw_bytes,
                "split_runs": sum(bool(r.get("split")) for r in rs),
                "seconds_each_run": [round(r["seconds"], 4) for r in rs],
                "rows": rs[0].get("rows"),
                "runs": len(rs),
            }

    machine = _machine()
    machine["load_average_before_after"] = [round(load_before[0], 1), round(os.getloadavg()[0], 1)]
    out = {"trace": str(trace), "raw_json_bytes": raw_bytes, "machine": machine, "results": results}
    ratios = {}
    for mine in ("tracelens_read_gz", "tracelens_read_gz_split"):
        tl = results.get(mine, {})
        for other in ("orjson_loads", "json_loads", "hta_parse_trace_dataframe", "hta_trace_analysis_load"):
            if "seconds" in results.get(other, {}) and "seconds" in tl:
                ratios[f"{mine}_vs_{other}"] = results[other]["seconds"] / tl["seconds"]
                ratios[f"{mine}_vs_{other}_cpu"] = results[other]["cpu_seconds"] / tl["cpu_seconds"]
    if "seconds" in results.get("tracelens_load_run_first", {}) and "seconds" in results.get(
        "tracelens_load_run_cached", {}
    ):
        ratios["tracelens_load_run_cached_speedup_vs_first"] = (
            results["tracelens_load_run_first"]["seconds"] / results["tracelens_load_run_cached"]["seconds"]
        )
    for cached in ("tracelens_load_cached", "tracelens_load_cached_warm"):
        if "seconds" in results.get("tracelens_load_first", {}) and "seconds" in results.get(cached, {}):
            ratios[f"{cached}_speedup_vs_first"] = (
                results["tracelens_load_first"]["seconds"] / results[cached]["seconds"]
            )
    # the user paths against the parser they wrap (issue 15's target: within 1.5x of read())
    for user in ("tracelens_load_first", "tracelens_api_load_no_cache", "tracelens_api_load_first",
                 "tracelens_api_load_cached", "tracelens_analyze_no_cache", "tracelens_api_load_fresh"):  # fmt: skip
        if "seconds" in results.get(user, {}) and "seconds" in results.get("tracelens_read_gz", {}):
            ratios[f"{user}_over_read_gz"] = (
                results[user]["seconds"] / results["tracelens_read_gz"]["seconds"]
            )
    fresh, parser = results.get("tracelens_api_load_fresh", {}), results.get("tracelens_read_gz_fresh", {})
    if "seconds" in fresh and "seconds" in parser:
        ratios["tracelens_api_load_fresh_over_read_gz_fresh"] = fresh["seconds"] / parser["seconds"]
    hta = results.get("hta_trace_analysis_load", {})
    if "seconds" in fresh and "seconds" in hta:
        ratios["hta_trace_analysis_load_over_tracelens_api_load_fresh"] = hta["seconds"] / fresh["seconds"]
    out["ratios"] = ratios
    _print(out)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


def _print(out: dict) -> None:
    m = out["machine"]
    print(f"trace: {out['trace']} ({out['raw_json_bytes'] / 1e6:.1f} MB decompressed JSON)")
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {m['python']}; "
        f"1-min load average before/after: {m['load_average_before_after']}"
    )
    print()
    print(
        "| what | seconds | CPU s | MB/s (raw JSON) | peak RSS MB | baseline MB | above baseline MB | x raw JSON "
        "| helper own MB | x raw JSON with helper | split runs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in out["results"].items():
        if "error" in r:
            print(f"| {name} | error: {r['error']} | | | | | | | | | |")
            continue
        print(
            f"| {name} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | {r['mb_per_s']:.0f} | {r['peak_rss_mb']:.0f} | "
            f"{r['baseline_rss_mb']:.0f} | {r['rss_above_baseline_mb']:.0f} | {r['rss_over_raw']:.2f} | "
            f"{r['helper_rss_above_baseline_mb']:.0f} | {r['rss_with_helper_over_raw']:.2f} | "
            f"{r['split_runs']}/{r['runs']} |"
        )
    print()
    print("seconds of each run (in round order; the table gives their median):")
    for name, r in out["results"].items():
        if "seconds_each_run" in r:
            print(f"  {name}: {', '.join(f'{x:.3f}' for x in r['seconds_each_run'])}")
    print()
    for k, v in out["ratios"].items():
        print(f"{k}: {v:.1f}x")


if __name__ == "__main__":
    main()
