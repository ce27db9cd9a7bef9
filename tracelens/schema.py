"""Arrow schemas shared by every ingester and analyzer. Column names carry their unit.

One table per kind of record, all ranks together, with a `rank` column. Strings that repeat
(kind, name, collective, process group) are dictionary-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

DICT_STR = pa.dictionary(pa.int32(), pa.string())

#: Values of the `kind` column (Kineto `cat`, normalised). Anything else is `other`.
KINDS = (
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_runtime",
    "cuda_driver",
    "python_function",
    "other",
)

#: One row per complete (`ph: X`) event of every rank.
EVENTS = pa.schema(
    [
        ("rank", pa.int32()),
        ("kind", DICT_STR),
        ("name", DICT_STR),
        ("pid", pa.int64()),  # null when the trace used a string pid
        ("tid", pa.int64()),  # null when the trace used a string tid
        ("device", pa.int32()),  # GPU/accelerator index for device events, else null
        (
            "stream",
            pa.int32(),
        ),  # stream for device events; a cpu op's own `args.stream` (Triton launch); else null
        ("ts_ns", pa.int64()),  # absolute: baseTimeNanoseconds + ts (µs, 3 decimals) * 1000
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("sequence_nr", pa.int64()),  # autograd `Sequence number` of cpu ops (forward op <-> backward node)
        ("step", pa.int32()),  # ProfilerStep#N enclosing the event (GPU: the step of its CPU launch)
        # Collective fields (NCCL kernels and record_param_comms cpu ops); null elsewhere.
        ("collective", DICT_STR),
        ("pg_name", DICT_STR),
        ("pg_desc", DICT_STR),
        ("pg_ranks", pa.list_(pa.int32())),
        ("group_size", pa.int32()),
        ("seq", pa.int64()),
        ("in_nelems", pa.int64()),
        ("out_nelems", pa.int64()),
        ("dtype", DICT_STR),
        ("src_rank", pa.int32()),
        ("dst_rank", pa.int32()),
        # The peer of a point-to-point cpu op as the trace records it when it records no global peer: the
        # rank *within the op's process group* (gloo `c10d::send` / `c10d::recv_` `Concrete Inputs`; the
        # group itself is not recorded). `analyze.layout.p2p.resolve_peers` maps it to src_rank / dst_rank.
        ("peer_local", pa.int32()),
    ]
)

#: `[memory]` instant events.
MEMORY = pa.schema(
    [
        ("rank", pa.int32()),
        ("ts_ns", pa.int64()),
        ("device", pa.int32()),  # -1 = CPU
        ("bytes", pa.int64()),  # allocation (+) or free (-)
        ("total_allocated", pa.int64()),
        ("total_reserved", pa.int64()),
    ]
)

#: One row per rank: what the trace says about itself.
METADATA = pa.schema(
    [
        ("rank", pa.int32()),
        ("path", pa.string()),
        ("world_size", pa.int32()),
        ("backend", pa.string()),
        ("host_name", pa.string()),
        ("trace_id", pa.string()),
        ("base_time_ns", pa.int64()),
        ("gpu_name", pa.string()),  # first entry of deviceProperties, else null
        ("num_devices", pa.int32()),
        ("pg_config_json", pa.string()),  # distributedInfo.pg_config, JSON text
        ("distributed_info_json", pa.string()),
        ("device_properties_json", pa.string()),
        ("events", pa.int64()),
        ("salvaged", pa.bool_()),  # true when the file was truncated and partially recovered
        ("salvaged_fraction", pa.float64()),  # bytes parsed / bytes in file, when salvaged
        ("damaged_events", pa.int64()),  # events skipped for a local error (ingest/salvage.py)
        ("mended_strings", pa.int64()),
        ("dropped_events", pa.int64()),
        (
            "device_events_lost",
            pa.bool_(),
        ),
        # inference iterations (tracelens.ingest.iterations): JSON list of {"step", "name", "engine", "kind",
        # "phase", "tokens", ...}; null when the trace has no engine iterations
        (
            "iterations_json",
            pa.string(),
        ),  # salvaged: launches kept, every device event lost at the cut  # events without a usable ts (absent, invalid, beyond int64 ns)  # invalid UTF-8 sequences / lone surrogates replaced by U+FFFD
        ("header_repairs", pa.int64()),  # damaged values before traceEvents read as null (NaN, control bytes)
    ]
)

#: One row per (rank, collective instance), from any source (Kineto, Flight Recorder, NCCL plugin, NCCL log).
COLLECTIVES = pa.schema(
    [
        ("rank", pa.int32()),
        ("source", DICT_STR),  # kineto | flight_recorder | nccl_plugin | nccl_log
        ("pg_name", DICT_STR),
        ("pg_desc", DICT_STR),
        ("pg_ranks", pa.list_(pa.int32())),
        ("group_size", pa.int32()),
        ("op", DICT_STR),  # normalised: allreduce, allgather, reducescatter, alltoall, broadcast, reduce,
        #                    barrier, send, recv
        ("dtype", DICT_STR),
        ("in_nelems", pa.int64()),
        ("out_nelems", pa.int64()),
        ("bytes", pa.int64()),  # message size used for bandwidth (nccl-tests convention: the larger buffer)
        ("seq", pa.int64()),  # collective sequence number in its process group, if known
        ("order", pa.int64()),  # 0-based position of this op among same-pg (same-op) calls on this rank
        ("is_p2p", pa.bool_()),
        ("peer", pa.int32()),  # global rank of the other side of a send/recv
        ("state", DICT_STR),  # completed | started | scheduled (Flight Recorder); completed otherwise
        ("enqueue_ns", pa.int64()),  # CPU enqueue (record_param_comms start / FR time_created)
        ("start_ns", pa.int64()),  # kernel start on this rank (null when unknown)
        ("end_ns", pa.int64()),
        ("step", pa.int32()),
        ("process", DICT_STR),  # "host:pid" of the writing process (NCCL logs; plugin: "pid N"), else null
    ]
)


def table_from_rows(rows: list[dict[str, Any]], sch: pa.Schema) -> pa.Table:
    """Row dicts (missing keys -> null) to a table with exactly schema `sch`, dictionary columns encoded."""
    cols = {}
    for field in sch:
        vals = [row.get(field.name) for row in rows]
        if pa.types.is_dictionary(field.type):
            cols[field.name] = pa.array(vals, pa.string()).dictionary_encode().cast(field.type)
        else:
            cols[field.name] = pa.array(vals, field.type)
    return pa.table(cols, schema=sch)


KERNEL_NAME_COMM = r"^(nccl(Dev)?Kernel_|rccl|ncclDevKernel|ncclKernel)"


#: Longest event name kept whole, in characters. Real names stay far below it (C++ template kernel names of a
#: few KB: 5,160 characters at most in the shared traces); a longer one (a generated name, a damaged file)
#: is cut to this many characters and the digest of the whole name (`bounded_names`), so that every
#: analysis (name rules, grouping, the report) works on a bounded string and equal names still group.
NAME_MAX_CHARS = 16_384


# Tables the per-rank stage computes and the cache keeps (store/stages.py, store/runs.py).

#: One row per step of each rank: where its time went (analyze.rank.breakdown).
BREAKDOWN = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("window_start_ns", pa.int64()),
        ("window_end_ns", pa.int64()),
        ("step_time_ns", pa.int64()),
        ("compute_ns", pa.int64()),
        ("comm_ns", pa.int64()),
        ("overlapped_comm_ns", pa.int64()),
        ("exposed_comm_ns", pa.int64()),
        ("memcpy_ns", pa.int64()),
        ("idle_ns", pa.int64()),
        ("path", pa.string()),  # "gpu" or "cpu": which timeline the rank was analysed on
    ]
)

#: SPANS: one row per module-annotation span of each rank (analyze.pipeline.composition.module_spans).
SPANS = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("layer", pa.int32()),
        ("module", pa.string()),
        ("backward", pa.bool_()),
        ("gpu_start_ns", pa.int64()),
        ("gpu_end_ns", pa.int64()),
        ("compute_ns", pa.int64()),  # compute-kernel time inside the span
    ]
)

#: The critical path's device nodes (analyze.critical.critical_nodes.rank_nodes).
NODES = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int32()),
        ("stream", pa.int32()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("launch_ns", pa.int64()),  # CPU launch (cuda_runtime with the same correlation) or null
        ("launch_tid", pa.int64()),  # thread of that CPU launch, or null
        ("is_comm", pa.bool_()),
        ("label", pa.string()),  # layer type of the enclosing module annotation, else null
    ]
)

#: CPU runtime calls of a sync type (SYNC_NAME, or COPY_NAME whose own copy ended inside the call), per rank;
#: whether each blocked on the GPU is decided against the device work (`build_graph`).
SYNCS = pa.schema(
    [
        ("rank", pa.int32()),
        ("tid", pa.int64()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("name", pa.string()),
    ]
)

#: Causes of GPU idle time, in the order `analyze.rank.idle.idle_breakdown` reports them.
IDLE_CAUSES = ("host_bound", "synchronization", "launch_overhead", "other_stream", "other")
#: Top CPU ops of a gap cause: name -> ns, in the order `idle_breakdown` ranks them.
OPS_MAP = pa.map_(pa.string(), pa.int64())
#: `idle_breakdown`'s table in Arrow (the per-rank stage file; `idle_frame` gives the DataFrame back).
IDLE = pa.schema(
    [
        ("rank", pa.int64()),
        ("step", pa.int64()),  # null: the whole-trace window of a run without ProfilerStep
        ("step_time_ns", pa.int64()),
        ("idle_ns", pa.int64()),
        *((c + "_ns", pa.int64()) for c in IDLE_CAUSES),
        ("host_ops", OPS_MAP),
        ("sync_ops", OPS_MAP),
    ]
)


#: What the grid inference reads of the event rows with a rank list (`pg_rows`: one row per distinct
#: combination of these columns, in order of first appearance, with its number of event rows in `rows`).
PG_COLUMNS = ("rank", "kind", "pg_name", "pg_desc", "pg_ranks", "group_size", "collective")


PG_ROWS = pa.schema([EVENTS.field(c) for c in PG_COLUMNS] + [pa.field("rows", pa.int64())])


#: A set of half-open int64 intervals [start, end): (starts, ends), sorted and disjoint (analyze.core.intervals).
Intervals = tuple[np.ndarray, np.ndarray]


@dataclass
class RankSets:
    """Canonical interval sets of one rank's classes over its whole trace."""

    rank: int
    path: str
    compute: Intervals
    comm: Intervals
    memory: Intervals
