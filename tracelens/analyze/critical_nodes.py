"""Events -> the critical path's inputs: device work with its step, CPU launch and layer label (`device_nodes`,
schema NODES), and the CPU runtime calls that may have blocked on the GPU (`sync_calls`, schema SYNCS).

`tracelens.analyze.critical_path` builds the graph from these two tables (see its docstring).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.classify import COMM_KERNEL, DEVICE_KINDS, _dict_lookup

#: A sync-type runtime call blocked on the GPU when device work of its rank ended inside the call and the call
#: returned at most this long after the latest such end (the runtime's return and, for a device-to-host copy
#: into pageable memory, the staging copy: 9-17 µs on hta/trace_filter).
SYNC_TOL_NS = 50_000
#: Runtime (and driver) calls that wait for the GPU: synchronize calls of the device, a stream, an event or the
#: context (CUDA, HIP, driver API; `_ptsz` per-thread-default-stream variants).
SYNC_NAME = re.compile(r"^(?:cuda|hip|cu)(?:Device|Stream|Event|Ctx)Synchronize(?:_v\d+|_ptsz|_spt)?$")
#: Copies that can block the CPU (`.item()`, `.cpu()`, `.tolist()`): they count only when their own device copy
#: (same correlation) ended inside the call, i.e. the call waited for it (a device-to-host copy into pageable
#: memory, a synchronous cudaMemcpy / hipMemcpy / hipMemcpyWithStream).
COPY_NAME = re.compile(
    r"^(?:(?:cuda|hip)Memcpy(?:2D|3D|Peer|WithStream|DtoH|FromSymbol)?|cuMemcpy(?:DtoH|2D|3D)?)"
    r"(?:Async)?(?:_v\d+|_ptsz|_ptds|_spt)?$"
)

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


def device_nodes(events: pa.Table, spans: pa.Table | None = None) -> pa.Table:
    """Device work with its step and CPU launch time (schema NODES), from one or more ranks' events."""
    if events.num_rows == 0:
        return NODES.empty_table()
    kind = events.column("kind")
    dev = np.zeros(events.num_rows, dtype=bool)
    for k in DEVICE_KINDS:
        dev |= _dict_lookup(kind, lambda v, k=k: int(v == k)).astype(bool)
    step = events.column("step")
    has_step = step.is_valid().to_numpy(zero_copy_only=False)
    if (dev & has_step).any():
        dev &= has_step
    else:  # no ProfilerStep annotations: the whole trace is one window (step 0), as the breakdown does
        events = events.set_column(
            events.column_names.index("step"), "step", pa.array(np.zeros(events.num_rows, np.int32))
        )
    rt = _dict_lookup(kind, lambda v: int(v == "cuda_runtime")).astype(bool)
    comm_name = _dict_lookup(events.column("name"), lambda v: int(bool(COMM_KERNEL.match(v)))).astype(bool)
    has_coll = events.column("collective").is_valid().to_numpy(zero_copy_only=False)
    if not dev.any():
        return NODES.empty_table()

    def col(name: str, mask: np.ndarray, fill: int = -1) -> np.ndarray:
        return _col(events, name, mask, fill)

    d = pd.DataFrame(
        {
            "rank": col("rank", dev),
            "step": col("step", dev),
            "stream": col("stream", dev),
            "start_ns": col("ts_ns", dev),
            "dur": col("dur_ns", dev, 0),
            "corr": col("correlation", dev),
            "is_comm": (comm_name | has_coll)[dev],
        }
    )
    d["end_ns"] = d["start_ns"] + np.maximum(d["dur"], 0)
    launch = pd.DataFrame(
        {
            "rank": col("rank", rt),
            "corr": col("correlation", rt),
            "launch_ns": col("ts_ns", rt),
            "launch_tid": events.column("tid").filter(pa.array(rt)).to_pandas().astype("float64").to_numpy(),
        }
    )
    launch = launch[launch["corr"] >= 0].drop_duplicates(["rank", "corr"])
    d = d.merge(launch, on=["rank", "corr"], how="left")
    d.loc[d["corr"] < 0, ["launch_ns", "launch_tid"]] = np.nan
    label = _labels(d, spans)
    return pa.table(
        {
            "rank": pa.array(d["rank"].to_numpy(), pa.int32()),
            "step": pa.array(d["step"].to_numpy(), pa.int32()),
            "stream": pa.array(d["stream"].to_numpy(), pa.int32()),
            "start_ns": pa.array(d["start_ns"].to_numpy(), pa.int64()),
            "end_ns": pa.array(d["end_ns"].to_numpy(), pa.int64()),
            "launch_ns": pa.array(d["launch_ns"].to_numpy(), pa.float64(), from_pandas=True).cast(pa.int64()),
            "launch_tid": pa.array(d["launch_tid"].to_numpy(), pa.float64(), from_pandas=True).cast(
                pa.int64()
            ),
            "is_comm": pa.array(d["is_comm"].to_numpy(), pa.bool_()),
            "label": pa.array(label, pa.string()),
        },
        schema=NODES,
    )


def _col(events: pa.Table, name: str, mask: np.ndarray, fill: int = -1) -> np.ndarray:
    out: np.ndarray = (
        events.column(name).filter(pa.array(mask)).fill_null(fill).to_numpy(zero_copy_only=False)
    )
    return out


def sync_calls(events: pa.Table) -> pa.Table:
    """CPU runtime/driver calls that can block on the GPU (schema SYNCS), from one or more ranks' events.

    Synchronize calls (SYNC_NAME) all; copies (COPY_NAME) only when their own device copy (same rank and
    correlation) ended inside the call. Whether a call really waited is decided in `build_graph` against the
    device work of its rank (SYNC_TOL_NS).
    """
    if events.num_rows == 0 or "tid" not in events.column_names:
        return SYNCS.empty_table()
    kind = events.column("kind")
    rt = _dict_lookup(kind, lambda v: int(v in ("cuda_runtime", "cuda_driver"))).astype(bool)
    name = events.column("name")
    is_sync = rt & _dict_lookup(name, lambda v: int(bool(SYNC_NAME.match(v)))).astype(bool)
    is_copy = rt & _dict_lookup(name, lambda v: int(bool(COPY_NAME.match(v)))).astype(bool)
    tid_ok = events.column("tid").is_valid().to_numpy(zero_copy_only=False)
    cand = (is_sync | is_copy) & tid_ok
    if not cand.any():
        return SYNCS.empty_table()
    c = pd.DataFrame(
        {
            "rank": _col(events, "rank", cand),
            "tid": _col(events, "tid", cand),
            "start_ns": _col(events, "ts_ns", cand),
            "dur": _col(events, "dur_ns", cand, 0),
            "corr": _col(events, "correlation", cand),
            "copy": is_copy[cand] & ~is_sync[cand],
            "name": events.column("name").filter(pa.array(cand)).cast(pa.string()).to_pylist(),
        }
    )
    c["end_ns"] = c["start_ns"] + np.maximum(c["dur"], 0)
    if c["copy"].any():
        dev = np.zeros(events.num_rows, dtype=bool)
        for k in DEVICE_KINDS:
            dev |= _dict_lookup(kind, lambda v, k=k: int(v == k)).astype(bool)
        own = pd.DataFrame(
            {
                "rank": _col(events, "rank", dev),
                "corr": _col(events, "correlation", dev),
                "own_end": _col(events, "ts_ns", dev) + np.maximum(_col(events, "dur_ns", dev, 0), 0),
            }
        )
        own = own[own["corr"] >= 0].drop_duplicates(["rank", "corr"])
        c = c.merge(own, on=["rank", "corr"], how="left")
        inside = (c["own_end"] > c["start_ns"]) & (c["own_end"] <= c["end_ns"]) & (c["corr"] >= 0)
        c = c[~c["copy"] | inside.fillna(False).to_numpy(dtype=bool)]
    return pa.table(
        {
            "rank": pa.array(c["rank"].to_numpy(), pa.int32()),
            "tid": pa.array(c["tid"].to_numpy(), pa.int64()),
            "start_ns": pa.array(c["start_ns"].to_numpy(), pa.int64()),
            "end_ns": pa.array(c["end_ns"].to_numpy(), pa.int64()),
            "name": pa.array(c["name"].tolist(), pa.string()),
        },
        schema=SYNCS,
    )


def _labels(d: pd.DataFrame, spans: pa.Table | None) -> list[str | None]:
    """Layer type (`layers.N.<type>` annotation) around each kernel's start, when module spans are known: the
    span of the kernel's rank with the latest GPU start at or before the kernel's start (the last listed of
    spans starting together), if it has not ended before it. One sorted search over all ranks at once."""
    out: list[str | None] = [None] * len(d)
    need = {"rank", "gpu_start_ns", "gpu_end_ns", "module"}
    if spans is None or spans.num_rows == 0 or not need <= set(spans.column_names) or not len(d):
        return out
    rank = d["rank"].to_numpy().astype(np.int64)
    start = d["start_ns"].to_numpy().astype(np.int64)
    sp = spans.select(["rank", "gpu_start_ns", "gpu_end_ns", "module"])
    sp = sp.filter(sp.column("gpu_start_ns").is_valid())
    s_rank = sp.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    keep = np.isin(s_rank, np.unique(rank))
    if not keep.any():
        return out
    sp = sp.filter(pa.array(keep))
    s_rank = s_rank[keep]
    s_start = sp.column("gpu_start_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    s_end = sp.column("gpu_end_ns").fill_null(np.iinfo(np.int64).min).to_numpy(zero_copy_only=False)
    s_mod = np.asarray(sp.column("module").to_pylist(), dtype=object)
    order = np.lexsort((s_start, s_rank))  # stable: spans starting together keep their listed order
    s_rank, s_start, s_end, s_mod = s_rank[order], s_start[order], s_end[order], s_mod[order]
    # (rank, time) as one sortable int64: the rank's position above 40 bits of time since its earliest instant
    ranks = np.unique(np.concatenate([s_rank, rank]))
    ri_s, ri_d = np.searchsorted(ranks, s_rank), np.searchsorted(ranks, rank)
    base = np.full(ranks.size, np.iinfo(np.int64).max)
    np.minimum.at(base, ri_s, s_start)
    np.minimum.at(base, ri_d, start)
    rel_s, rel_d = s_start - base[ri_s], start - base[ri_d]
    if max(int(rel_s.max()), int(rel_d.max())) < 2**40 and ranks.size < 2**22:
        idx = np.searchsorted((ri_s << 40) + rel_s, (ri_d << 40) + rel_d, side="right") - 1
    else:  # a trace longer than ~18 minutes: one search per rank
        idx = np.full(start.size, -1, dtype=np.int64)
        lo = np.searchsorted(s_rank, ranks, side="left")
        hi = np.searchsorted(s_rank, ranks, side="right")
        for k in range(ranks.size):
            m = ri_d == k
            if lo[k] < hi[k] and m.any():
                idx[m] = lo[k] + np.searchsorted(s_start[lo[k] : hi[k]], start[m], side="right") - 1
    jj = np.maximum(idx, 0)
    hit = (idx >= 0) & (s_rank[jj] == rank) & (s_end[jj] >= start)
    res = np.full(start.size, None, dtype=object)
    res[hit] = s_mod[jj[hit]]
    labels: list[str | None] = res.tolist()
    return labels
