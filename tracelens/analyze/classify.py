"""Classify events into compute, communication, memory or none (excluded), per rank.

GPU path (the rank has device events): communication = kernels of a communication family
(ingest.comm_families.FAMILIES: NCCL, RCCL, symmetric memory, custom all-reduce, DeepEP, NVSHMEM, MSCCL++),
kernels carrying collective args, and kernels whose launch sits directly inside a communication cpu op
(comm_families.COMM_CPU_OP, the innermost op around the launch: analyze.launch_link); memory = memcpy/memset
kinds and kernels of a memory family (memcpy-like names, MTIA `dma_request`); compute = all other kernels.
GPU annotations, sync events and CPU events are excluded.

CPU-only path (no device events on the rank, e.g. gloo): communication = `c10d::*` and
`record_param_comms` cpu ops and `gloo:*` / `nccl:*` annotations on any thread; compute = the other cpu ops
of the main thread (the thread holding `ProfilerStep#N`, else the busiest cpu_op thread).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from tracelens.analyze.dictcol import dict_lookup
from tracelens.ingest import comm_families

# Other analyzers import the lookup from here: an assignment, so that it is exported (no_implicit_reexport).
_dict_lookup = dict_lookup

NONE, COMPUTE, COMM, MEMORY = 0, 1, 2, 3
CLASS_NAMES = {NONE: "none", COMPUTE: "compute", COMM: "communication", MEMORY: "memory"}

#: NCCL-named kernels (the family whose names tell the collective); every family: comm_families.FAMILIES
COMM_KERNEL = comm_families.FAMILIES[0].kernel
MEMORY_KERNEL = comm_families.MEMORY_FAMILIES[0].kernel
CPU_COMM = comm_families.COMM_CPU_OP
STEP = re.compile(r"^ProfilerStep#([0-9]{1,9})$")  # ASCII digits, fits the int32 step column

DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def _kind_codes(events: pa.Table) -> dict[str, np.ndarray]:
    kinds = events.column("kind")
    return {
        k: _dict_lookup(kinds, lambda v, k=k: int(v == k)).astype(bool)
        for k in ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation")
    }


def main_threads(events: pa.Table) -> dict[int, int]:
    """rank -> tid of its main (step-driving) thread."""
    name = events.column("name")
    is_step = _dict_lookup(name, lambda v: int(bool(STEP.match(v)))).astype(bool)
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    tid = events.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
    dur = events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False)
    kinds = _kind_codes(events)
    out: dict[int, int] = {}
    for r in np.unique(rank):
        m = rank == r
        sm = m & is_step
        if sm.any():
            vals, counts = np.unique(tid[sm], return_counts=True)
            out[int(r)] = int(vals[np.argmax(counts)])
            continue
        cm = m & kinds["cpu_op"]
        if cm.any():
            vals, inv = np.unique(tid[cm], return_inverse=True)
            out[int(r)] = int(vals[np.argmax(np.bincount(inv, weights=dur[cm]))])
    return out


def gpu_ranks(events: pa.Table) -> set[int]:
    """Ranks with any device (kernel / memcpy / memset) event."""
    kinds = _kind_codes(events)
    dev = kinds["kernel"] | kinds["gpu_memcpy"] | kinds["gpu_memset"]
    rank = events.column("rank").to_numpy(zero_copy_only=False)
    return {int(r) for r in np.unique(rank[dev])}


def classify(events: pa.Table) -> np.ndarray:
    """Class code (NONE / COMPUTE / COMM / MEMORY) for every row of an events table."""
    n = events.num_rows
    out = np.zeros(n, dtype=np.int8)
    if n == 0:
        return out
    kinds = _kind_codes(events)
    name = events.column("name")
    comm_name = _dict_lookup(name, lambda v: int(comm_families.family_of_kernel(v) is not None)).astype(bool)
    mem_name = _dict_lookup(name, lambda v: int(comm_families.is_memory_kernel(v))).astype(bool)
    cpu_comm = _dict_lookup(name, lambda v: int(bool(CPU_COMM.match(v)))).astype(bool)
    has_coll = events.column("collective").is_valid().to_numpy(zero_copy_only=False)
    rank = events.column("rank").to_numpy(zero_copy_only=False)

    kernel = kinds["kernel"]
    memory_kind = kinds["gpu_memcpy"] | kinds["gpu_memset"]
    gpu = np.isin(rank, np.fromiter(gpu_ranks(events), dtype=rank.dtype))

    g_comm = kernel & (comm_name | has_coll | comm_launched(events))
    g_mem = memory_kind | (kernel & mem_name & ~g_comm)
    g_comp = kernel & ~g_comm & ~g_mem
    out[gpu & g_comp] = COMPUTE
    out[gpu & g_comm] = COMM
    out[gpu & g_mem] = MEMORY

    cpu = ~gpu
    if cpu.any():
        tid = events.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
        mains = main_threads(events)
        lut = np.full(int(rank.max()) + 1, -2, dtype=np.int64)
        for r, t in mains.items():
            lut[r] = t
        main_tid = lut[rank]
        on_main = tid == main_tid
        c_comm = (kinds["cpu_op"] | kinds["user_annotation"]) & cpu_comm
        c_comp = kinds["cpu_op"] & ~cpu_comm & on_main
        out[cpu & c_comp] = COMPUTE
        out[cpu & c_comm] = COMM
    return out


def comm_launched(events: pa.Table) -> np.ndarray:
    """Device rows whose launch sits directly inside a communication cpu op (the innermost op around the
    launch is one: a copy kernel of an `aten::copy_` nested in `c10d::allgather_` is not)."""
    from tracelens.analyze.launch_link import link_launches

    ln = link_launches(events)
    out = np.zeros(events.num_rows, dtype=bool)
    has = ln.parent >= 0
    out[has] = ln.parent[has] == ln.comm_parent[has]
    return out
