"""Hand-written Kineto traces for ingest tests: numbers are written as exact JSON text, like Kineto does."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path


class Num(str):
    """A JSON number written verbatim (e.g. "1712195495519689.047"), beyond what a float can hold."""


def _default(o):
    raise TypeError(o)


def dumps(doc: dict, indent: int | None = 2) -> str:
    """JSON text of `doc`; Num values are emitted as bare numbers with their exact digits."""

    def mark(o):
        if isinstance(o, Num):
            return f"@@NUM{o}@@"
        if isinstance(o, dict):
            return {k: mark(v) for k, v in o.items()}
        if isinstance(o, list):
            return [mark(v) for v in o]
        return o

    text = json.dumps(mark(doc), indent=indent, default=_default)
    return re.sub(r'"@@NUM([^@]*)@@"', r"\1", text)


def write(path: Path, doc: dict, gz: bool | None = None, indent: int | None = 2) -> Path:
    text = dumps(doc, indent).encode()
    if gz if gz is not None else str(path).endswith(".gz"):
        text = gzip.compress(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    return path


def x(cat: str, name: str, ts: str, dur: str, pid=1, tid=1, **args) -> dict:
    """A complete (`ph: X`) event; ts/dur are µs texts."""
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": Num(ts), "dur": Num(dur)}
    if args:
        e["args"] = args
    return e


BASE = 1790857026000000000

#: One rank of a 2-rank NCCL job: a profiler step with a cpu op, a launch, its kernel, a collective
#: (record_param_comms + NCCL kernel), a memcpy, a memory event, metadata/flow events with string pids.
RANK1_EVENTS = [
    {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "spans"}},
    x(
        "user_annotation",
        "ProfilerStep#7",
        "5111733288000.000",
        "1000.000",
        pid=100,
        tid=100,
        **{"External id": 1},
    ),
    x("cpu_op", "aten::mm", "5111733288010.123", "20.456", pid=100, tid=100, **{"External id": 2}),
    x(
        "cuda_runtime",
        "cudaLaunchKernel",
        "5111733288012.001",
        "5.002",
        pid=100,
        tid=100,
        correlation=501,
        **{"External id": 2},
    ),
    # the kernel runs after the CPU step window ended: its step still comes from its launch
    x(
        "kernel",
        "ampere_sgemm_128x64_tn",
        "5111733289100.500",
        "300.250",
        pid=0,
        tid=7,
        device=0,
        stream=7,
        correlation=501,
        **{"External id": 2},
    ),
    x(
        "cpu_op",
        "record_param_comms",
        "5111733288100.000",
        "30.000",
        pid=100,
        tid=100,
        **{
            "External id": 3,
            "Collective name": "allreduce",
            "dtype": "BFloat16",
            "In msg nelems": 1048576,
            "Out msg nelems": 1048576,
            "Group size": 2,
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": "[0, 1]",
            "Seq": 12,
        },
    ),
    x("cuda_runtime", "cudaLaunchKernel", "5111733288110.000", "4.000", pid=100, tid=100, correlation=502),
    x(
        "kernel",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "5111733288200.000",
        "150.999",
        pid=0,
        tid=20,
        device=0,
        stream=20,
        correlation=502,
        **{
            "External id": 3,
            "Collective name": "allreduce",
            "dtype": "BFloat16",
            "In msg nelems": 1048576,
            "Out msg nelems": 1048576,
            "Group size": 2,
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": "[0, 1]",
            "Seq": 12,
        },
    ),
    x(
        "gpu_memcpy",
        "Memcpy HtoD (Pageable -> Device)",
        "5111733288400.000",
        "2.000",
        pid=0,
        tid=7,
        device=0,
        stream=7,
        correlation=503,
    ),
    {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 100,
        "tid": 100,
        "ts": Num("5111733288020.500"),
        "args": {
            "Total Reserved": 2097152,
            "Total Allocated": 1048576,
            "Bytes": 524288,
            "Device Id": 0,
            "Device Type": 1,
            "Addr": 1234,
        },
    },
    {
        "ph": "s",
        "id": 501,
        "pid": 100,
        "tid": 100,
        "ts": Num("5111733288012.001"),
        "cat": "ac2g",
        "name": "ac2g",
    },
    {
        "ph": "X",
        "cat": "Trace",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": Num("5111733288000.000"),
        "dur": Num("2000.000"),
    },
    x("cpu_op", "aten::add", "5111733289500.000", "1.000", pid=100, tid=100),  # after the step: no step
]

RANK1_DOC = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85000000000}],
    "distributedInfo": {
        "backend": "nccl",
        "rank": 1,
        "world_size": 2,
        "pg_count": 1,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}],
    },
    "trace_id": "ABC123",
    "host_name": "node7",
    "displayTimeUnit": "ms",
    "baseTimeNanoseconds": Num(str(BASE)),
    "traceEvents": RANK1_EVENTS,
    "traceName": "rank1.pt.trace.json",
}


def doc(rank: int | None = None, world_size: int | None = None, events: list | None = None, **top) -> dict:
    """A small valid trace; `rank`/`world_size` go to distributedInfo (omitted when both are None)."""
    d: dict = {"schemaVersion": 1}
    if rank is not None or world_size is not None:
        di = {"backend": "nccl"}
        if rank is not None:
            di["rank"] = rank
        if world_size is not None:
            di["world_size"] = world_size
        d["distributedInfo"] = di
    d.update(top)
    d["traceEvents"] = events if events is not None else [x("cpu_op", "aten::mm", "10.000", "5.000")]
    return d
