"""Regenerate tests/golden/amd_tracelens_gpu_timeline.json: AMD TraceLens's GPU-timeline breakdown of every
real trace under ../shared/traces, for tests/conformance/test_amd_tracelens_golden.py.

AMD TraceLens (github.com/AMD-AGI/TraceLens) is not installable here (no package index entry; not a tracelens
dependency), so this script is an independent re-implementation of its definition, written from its source
(`TraceLens/TreePerf/gpu_event_analyser.py`, `GPUEventAnalyser.get_gpu_event_lists` + `compute_metrics_dict`,
AMD-AGI/TraceLens commit 0346a17a08abccecf9f89a9b08a0596f19195bf9). It reads the raw JSON with `json` and
float µs exactly as that code does and shares no code with tracelens:

- GPU events: `cat` in {kernel, gpu_memcpy, gpu_memset}, all of them (every kernel, linked to a CPU op or
  not: the `include_unlinked_kernels` view); t_end = ts + dur.
- communication: kernels / memsets whose name contains "nccl"; memcpy: gpu_memcpy; computation: the rest.
- total = last end - first start of the union of all GPU events; busy = |union|; idle = total - busy;
  computation = |union of computation|; percentages of total.

    /work/venv/bin/python scripts/amd_tracelens_golden.py [--traces ../shared/traces]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
GOLDEN = REPO / "tests" / "golden" / "amd_tracelens_gpu_timeline.json"
TRACE = re.compile(r"\.json(\.gz)?$")
#: Kernel names whose class tracelens and AMD TraceLens define differently (tracelens: memory or
#: communication families outside the "nccl" substring): the computation share is comparable only without them.
DIFFERENT = re.compile(
    r"^(Memcpy|Memset|\[?memcpy|\[?memset|hipMemcpy|hipMemset|dma_request$)|multimem_|one_shot_all_reduce|"
    r"two_shot_all_reduce|symm_mem|cross_device_reduce|custom_all_?reduce|deep_ep::|dpsk::ep::|nvshmem|mscclpp|"
    r"^rccl",
    re.IGNORECASE,
)


def merge(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if not iv:
        return []
    iv = sorted(iv, key=lambda x: x[0])
    out = [iv[0]]
    for s, e in iv[1:]:
        ls, le = out[-1]
        if s <= le:
            out[-1] = (ls, max(le, e))
        else:
            out.append((s, e))
    return out


def metrics(events: list) -> dict | None:
    gpu, comp, comm = [], [], []
    comparable = True
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or not isinstance(e.get("dur"), (int, float)):
            continue
        t = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        gpu.append(t)
        name = str(e.get("name"))
        if cat == "gpu_memcpy":
            continue
        if "nccl" in name:
            comm.append(t)
        else:
            comp.append(t)
            if cat == "gpu_memset" or DIFFERENT.search(name):
                comparable = False
    if not gpu:
        return None
    allu = merge(gpu)
    total = allu[-1][1] - allu[0][0]
    busy = sum(e - s for s, e in allu)
    c = sum(e - s for s, e in merge(comp))
    return {
        "total_time_us": round(total, 3),
        "busy_time_us": round(busy, 3),
        "idle_time_us": round(total - busy, 3),
        "computation_time_us": round(c, 3),
        "idle_pct": round(100 * (total - busy) / total, 4) if total else None,
        "computation_pct": round(100 * c / total, 4) if total else None,
        "computation_comparable": comparable,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = ap.parse_args()
    out = {}
    for f in sorted(args.traces.rglob("*")):
        if not f.is_file() or not TRACE.search(f.name):
            continue
        raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        events = doc.get("traceEvents") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            continue
        m = metrics([e for e in events if isinstance(e, dict)])
        if m is not None:
            out[str(f.relative_to(args.traces))] = m
    GOLDEN.write_text(
        json.dumps(
            {
                "source": "independent re-implementation of AMD TraceLens GPUEventAnalyser.compute_metrics "
                "(TraceLens/TreePerf/gpu_event_analyser.py, AMD-AGI/TraceLens@0346a17a08abccecf9f89a9b08a0596f19195bf9),"
                " all GPU events (include_unlinked_kernels); AMD TraceLens itself could not be installed here",
                "regenerate": "/work/venv/bin/python scripts/amd_tracelens_golden.py",
                "files": out,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"{len(out)} traces -> {GOLDEN}")


if __name__ == "__main__":
    main()
