"""Classify events into compute, communication, memory or none (excluded), per rank.

GPU path (the rank has device events): communication = kernels of a communication family
(ingest.comm_families.FAMILIES: NCCL, RCCL, symmetric memory, custom all-reduce, DeepEP, NVSHMEM, MSCCL++),
kernels carrying collective args, and kernels whose launch sits directly inside a communication cpu op
(comm_families.COMM_CPU_OP, the innermost op around the launch: analyze.rank.launch_link); memory = memcpy/memset
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

from tracelens.analyze.core.dictcol import columns, dict_lookup, per_object
from tracelens.analyze.core.intset import distinct
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


def is_step_name(v: str) -> bool:
    """`ProfilerStep#N` (STEP); a module-level predicate, so that `Columns.flag` shares its lookup."""
    return STEP.match(v) is not None


def _is_comm_kernel_name(v: str) -> bool:
    return comm_families.family_of_kernel(v) is not None


def _is_cpu_comm_name(v: str) -> bool:
    return CPU_COMM.match(v) is not None


def main_threads(events: pa.Table) -> dict[int, int]:
    """rank -> tid of its main (step-driving) thread."""
    cols = columns(events)
    is_step = cols.flag("name", is_step_name)
    rank = cols.int64("rank")
    tid = cols.int64("tid", -1)
    dur = cols.int64("dur_ns", 0)
    cpu_op = cols.kinds("cpu_op")
    out: dict[int, int] = {}
    for r in distinct(rank):
        m = rank == r
        sm = m & is_step
        if sm.any():
            vals, counts = np.unique(tid[sm], return_counts=True)
            out[int(r)] = int(vals[np.argmax(counts)])
            continue
        cm = m & cpu_op
        if cm.any():
            vals, inv = np.unique(tid[cm], return_inverse=True)
            out[int(r)] = int(vals[np.argmax(np.bincount(inv, weights=dur[cm]))])
    return out


def gpu_ranks(events: pa.Table) -> set[int]:
    """Ranks with any device (kernel / memcpy / memset) event."""
    cols = columns(events)
    dev = cols.kinds(*DEVICE_KINDS)
    rank = cols.int64("rank")
    return {int(r) for r in distinct(rank[dev])}


def rank_mask(rank: np.ndarray, ranks: set[int] | np.ndarray) -> np.ndarray:
    """np.isin(rank, ranks) for integer ranks: one lookup table indexed by rank (np.isin sorts or hashes the
    rows: ~30 ms for 2.85 M rows of 1,024 ranks, the table ~5 ms)."""
    want = np.fromiter(ranks, np.int64) if isinstance(ranks, set) else np.asarray(ranks, np.int64)
    if rank.size == 0 or want.size == 0:
        return np.zeros(rank.shape, bool)
    lo, hi = int(rank.min()), int(rank.max())
    if lo < 0 or hi > 4 * rank.size + (1 << 20):
        return np.isin(rank, want)
    lut = np.zeros(hi + 1, bool)
    lut[want[(want >= 0) & (want <= hi)]] = True
    out: np.ndarray = lut[rank]
    return out


def classify(events: pa.Table) -> np.ndarray:
    """Class code (NONE / COMPUTE / COMM / MEMORY) for every row of an events table."""
    n = events.num_rows
    out = np.zeros(n, dtype=np.int8)
    if n == 0:
        return out
    cols = columns(events)
    comm_name = cols.flag("name", _is_comm_kernel_name)
    mem_name = cols.flag("name", comm_families.is_memory_kernel)
    cpu_comm = cols.flag("name", _is_cpu_comm_name)
    has_coll = cols.valid("collective")
    rank = cols.int64("rank")

    kernel = cols.kinds("kernel")
    memory_kind = cols.kinds("gpu_memcpy", "gpu_memset")
    gpu = rank_mask(rank, gpu_ranks(events))

    g_comm = kernel & (comm_name | has_coll | comm_launched(events))
    g_mem = memory_kind | (kernel & mem_name & ~g_comm)
    g_comp = kernel & ~g_comm & ~g_mem
    out[gpu & g_comp] = COMPUTE
    out[gpu & g_comm] = COMM
    out[gpu & g_mem] = MEMORY

    cpu = ~gpu
    if cpu.any():
        tid = cols.int64("tid", -1)
        mains = main_threads(events)
        lut = np.full(int(rank.max()) + 1, -2, dtype=np.int64)
        for r, t in mains.items():
            lut[r] = t
        main_tid = lut[rank]
        on_main = tid == main_tid
        cpu_op = cols.kinds("cpu_op")
        c_comm = cols.kinds("cpu_op", "user_annotation") & cpu_comm
        c_comp = cpu_op & ~cpu_comm & on_main
        out[cpu & c_comp] = COMPUTE
        out[cpu & c_comm] = COMM
    return out


def comm_launched(events: pa.Table) -> np.ndarray:
    """Device rows whose launch sits directly inside a communication cpu op (the innermost op around the
    launch is one: a copy kernel of an `aten::copy_` nested in `c10d::allgather_` is not). Computed once
    per table (launch_link's memo; the array is shared: read only)."""
    from tracelens.analyze.rank.launch_link import launch_parents

    memo = per_object(events)
    got = memo.get("comm_launched")
    if got is None:
        # the innermost op around the launch is a communication op (then it is also the innermost of those:
        # link_launches' `parent == comm_parent`, without looking the communication ops up on their own)
        parent = launch_parents(events, keep=False)  # (asked for once: these flags are what is kept)
        out = np.zeros(events.num_rows, dtype=bool)
        has = parent >= 0
        out[has] = columns(events).flag("name", comm_families.is_comm_cpu_op)[parent[has]]
        out.flags.writeable = False
        got = memo["comm_launched"] = out
    return got  # type: ignore[return-value]


def keep_comm_launched(events: pa.Table, flags: np.ndarray) -> None:
    """Make `flags` what `comm_launched(events)` gives from now on: the flags computed before over these very
    rows (the run memo keeps those of its cross-rank events). ValueError when they are not one bool a row."""
    if flags.dtype != np.bool_ or flags.shape != (events.num_rows,):
        raise ValueError(f"{flags.shape} {flags.dtype} flags for a table of {events.num_rows} rows")
    flags.flags.writeable = False
    per_object(events)["comm_launched"] = flags
