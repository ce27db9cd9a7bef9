"""Every folder of ../shared/traces/hta loads or gives its specific error; selected files field by field
against an independent reference reader (json + Decimal, exact)."""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tracelens import schema
from tracelens.errors import RankError
from tracelens.ingest import kineto
from tracelens.run import load_tables

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found at {TRACES}")

#: folders that mix traces of different runs: the specific error each one must give
EXPECTED_ERRORS = {
    "critical_path": (RankError, "rank 0 appears twice"),
    "trace_compare": (RankError, "rank 1 appears twice"),
    "trace_diff": (RankError, "world sizes disagree"),
}
#: folder -> (ranks, world size from distributedInfo or None)
EXPECTED_RANKS = {
    "trace_filter": ([0, 1], 128),
    "df_index_resolver": ([1], 2),
    "cpu_only": ([34], 300),
    "mtia_trace_single_rank": ([0], 1),
    "negative_queue_length_values_check": ([0], 16),
    "rank_unavailable": ([0], None),  # distributedInfo without rank; a single trace is rank 0
    "distributed_info_unavailable": ([0], None),
    "mtia_inference_trace": ([0], None),  # rank from the file name
    "trace_file_list": ([1], None),  # distributedInfo after traceEvents
}

FOLDERS = sorted(p.name for p in TRACES.iterdir() if p.is_dir()) if TRACES.is_dir() else []


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_folder_loads_or_gives_its_error(folder):
    path = TRACES / folder
    if folder in EXPECTED_ERRORS:
        cls, msg = EXPECTED_ERRORS[folder]
        with pytest.raises(cls, match=msg):
            load_tables(path, no_cache=True, workers=1)
        return
    t = load_tables(path, no_cache=True, workers=1)
    assert t.events.schema.equals(schema.EVENTS)
    assert t.memory.schema.equals(schema.MEMORY)
    assert t.metadata.schema.equals(schema.METADATA)
    assert t.events.num_rows > 0
    assert t.events.column("ts_ns").null_count == 0
    ranks = t.events.column("rank").to_numpy()
    assert t.metadata.column("events").to_pylist() == [
        int((ranks == r).sum()) for r in t.metadata.column("rank").to_pylist()
    ]
    if folder in EXPECTED_RANKS:
        ranks, ws = EXPECTED_RANKS[folder]
        assert t.metadata.column("rank").to_pylist() == ranks
        assert set(t.metadata.column("world_size").to_pylist()) == {ws}
    assert not (path / ".tracelens").exists()  # no_cache writes nothing next to the traces


def _ns(v) -> int | None:
    if v is None:
        return None
    return int((Decimal(str(v)) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def _ref_ranks(v):
    if not isinstance(v, str) or "..." in v:
        return None
    return [int(x) for x in v.strip("[]").split(",") if x.strip()]


_COMM_OP = ("nccl:", "c10d::", "record_param_comms", "gloo:")


def _ref_in_nelems(e: dict):
    """`In msg nelems`, else (communication cpu ops, docs/ingest.md) the input tensor of `Input Dims`:
    the second tensor of c10d `*_base_` / `alltoall_base_` ops (output, input), the first elsewhere."""
    a = e.get("args") or {}
    if "In msg nelems" in a or "Out msg nelems" in a or not str(e.get("name")).startswith(_COMM_OP):
        return a.get("In msg nelems")
    tensors = []
    for d in a.get("Input Dims") or []:
        if isinstance(d, list) and d and all(type(x) is int and x >= 0 for x in d):
            n = 1
            for x in d:
                n *= x
            tensors.append(n)
    if not tensors:
        return None
    name = e["name"]
    if name.startswith("c10d::") and ("_base_" in name or "into_tensor" in name) and len(tensors) >= 2:
        return tensors[1]
    return tensors[0]


@pytest.mark.parametrize(
    "rel",
    [
        "trace_filter/sampled_rank-1.json.gz",  # integer µs timestamps, float durations
        "nccl_parser_config/nccl_data.json.gz",  # baseTimeNanoseconds + 3-decimal relative ts, NCCL args
        "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # epoch-scale 3-decimal ts
        "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm: hex stream strings
    ],
)
def test_field_by_field_against_reference(rel):
    path = TRACES / rel
    with gzip.open(path, "rb") as fh:
        doc = json.loads(fh.read(), parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    got = kineto.read(path).events
    assert got.num_rows == len(xs)
    cols = {c: got.column(c).to_pylist() for c in got.column_names}
    want = {
        "ts_ns": [base + _ns(e["ts"]) for e in xs],
        "dur_ns": [_ns(e.get("dur")) for e in xs],
        "name": [e.get("name") for e in xs],
        "correlation": [(e.get("args") or {}).get("correlation") for e in xs],
        "external_id": [(e.get("args") or {}).get("External id") for e in xs],
        "pid": [e["pid"] if isinstance(e.get("pid"), int) else None for e in xs],
        "collective": [(e.get("args") or {}).get("Collective name") for e in xs],
        "in_nelems": [_ref_in_nelems(e) for e in xs],
        "pg_ranks": [_ref_ranks((e.get("args") or {}).get("Process Group Ranks")) for e in xs],
    }
    for c, w in want.items():
        assert cols[c] == w, c
    gpu = [i for i, e in enumerate(xs) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for i in gpu[:500]:
        s = (xs[i].get("args") or {}).get("stream")
        assert cols["stream"][i] == (int(s, 16) if isinstance(s, str) else s)


def test_steps_of_gpu_kernels_follow_their_launch():
    t = kineto.read(TRACES / "trace_filter" / "sampled_rank-0.json.gz").events.to_pandas()
    steps = sorted(t["step"].dropna().unique().tolist())
    assert steps  # ProfilerStep#N windows exist in this trace
    launches = t[t["kind"] == "cuda_runtime"].dropna(subset=["correlation"]).set_index("correlation")["step"]
    kernels = t[(t["kind"] == "kernel") & t["correlation"].isin(launches.index)]
    assert len(kernels) > 100
    assert (
        kernels["step"].fillna(-1).to_numpy() == launches.loc[kernels["correlation"]].fillna(-1).to_numpy()
    ).all()
