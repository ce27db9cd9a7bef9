"""Regenerate the HTA golden files in tests/golden/ by running HolisticTraceAnalysis itself.

The golden numbers are independent ground truth for `tracelens.analyze.rank.hta_compat`: they come from
HTA's own `TraceAnalysis.get_temporal_breakdown` and `get_comm_comp_overlap`, never from tracelens.
Run it with the separate HTA virtual environment (HTA is NOT a tracelens dependency):

    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install 'HolisticTraceAnalysis==0.5.*'
    /work/hta-venv/bin/python scripts/hta_golden.py                   # all folders, default traces path
    /work/hta-venv/bin/python scripts/hta_golden.py --traces ../shared/traces/hta trace_filter

Each trace folder runs in its own subprocess (HTA may crash or hang on odd traces); a folder HTA cannot
analyse is recorded with its error instead of numbers. One file per folder: tests/golden/hta_<name>.json,
where <name> is the folder path with "/" replaced by "__".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "hta"
GOLDEN_DIR = REPO / "tests" / "golden"

#: Folders analysed by default (each holds .json/.json.gz Kineto traces that HTA can be pointed at).
DEFAULT_FOLDERS = (
    "trace_filter",
    "ns_resolution_trace",
    "negative_queue_length_values_check",
    "nccl_parser_config",
    "trace_diff/control",
    "trace_diff/test",
    "trace_compare/base",
    "trace_compare/test",
    "critical_path/alexnet",
    "critical_path/simple_add",
    "critical_path/cuda_event_sync",
    "critical_path/cuda_event_sync_multi_stream",
    "cupti_profiler",
    "amd_trace",
    "triton_example",
    "mtia_inference_trace",
    "mtia_trace_single_rank",
    "df_index_resolver",
    "distributed_info_unavailable",
    "rank_non_gpu",
    "cpu_only",
)

_CHILD = r"""
import json, math, sys, logging
logging.disable(logging.CRITICAL)
import hta, importlib.metadata as md
from hta.trace_analysis import TraceAnalysis

folder = sys.argv[1]
out = {"hta_version": md.version("HolisticTraceAnalysis")}
try:
    a = TraceAnalysis(trace_dir=folder)
    out["files"] = {str(k): v.split("/")[-1] for k, v in a.t.trace_files.items()}
    tb = a.get_temporal_breakdown(visualize=False)
    ov = a.get_comm_comp_overlap(visualize=False)
    ranks = {}
    for row in tb.to_dict("records"):
        ranks[str(int(row["rank"]))] = {
            "idle_time_us": float(row["idle_time(us)"]),
            "compute_time_us": float(row["compute_time(us)"]),
            "non_compute_time_us": float(row["non_compute_time(us)"]),
            "kernel_time_us": float(row["kernel_time(us)"]),
            "idle_time_pctg": float(row["idle_time_pctg"]),
            "compute_time_pctg": float(row["compute_time_pctg"]),
            "non_compute_time_pctg": float(row["non_compute_time_pctg"]),
        }
    for row in ov.to_dict("records"):
        v = float(row["comp_comm_overlap_pctg"])
        ranks[str(int(row["rank"]))]["comp_comm_overlap_pctg"] = None if math.isnan(v) else v
    out["ranks"] = ranks
except Exception as exc:  # recorded, not hidden: the golden says HTA cannot analyse this folder
    out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
print("@@GOLDEN@@" + json.dumps(out))
"""


def run_folder(traces: Path, folder: str, timeout_s: float) -> dict:
    """Run HTA on one folder in a fresh interpreter; return its numbers or its error."""
    path = traces / folder
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)],
            capture_output=True,
            check=False,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("@@GOLDEN@@"):
            return json.loads(line[len("@@GOLDEN@@") :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"HTA process exited {proc.returncode}: {tail}"}


def golden_name(folder: str) -> str:
    return "hta_" + folder.strip("/").replace("/", "__") + ".json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", default=list(DEFAULT_FOLDERS))
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for folder in args.folders:
        res = run_folder(args.traces, folder, args.timeout)
        doc = {
            "source": "HolisticTraceAnalysis TraceAnalysis(trace_dir).get_temporal_breakdown / "
            "get_comm_comp_overlap, include_last_profiler_step=False",
            "folder": folder,
            "regenerate": f"/work/hta-venv/bin/python scripts/hta_golden.py {folder}",
            **res,
        }
        target = args.out / golden_name(folder)
        target.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        status = "error: " + res["error"] if "error" in res else f"{len(res['ranks'])} rank(s)"
        print(f"{folder}: {status} -> {target.relative_to(REPO) if target.is_relative_to(REPO) else target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
