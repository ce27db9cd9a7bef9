"""One Chrome trace (Perfetto / chrome://tracing JSON) with every rank, clock-aligned, findings as markers.

Each rank is one process (pid = rank, named "rank N (stage S)"); CPU threads keep their thread ids and GPU
streams become threads `GPU_TID_BASE + device * 1000 + stream` named "GPU d stream s". Timestamps are
aligned with the clock offsets of the cross-rank analysis (aligned = raw - offset) and shifted so the run
starts at 0. Findings become instant events: one global marker each at the start, plus a marker on every
rank a finding names, so Perfetto shows them on the right tracks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens._version import __version__
from tracelens.store.atomic import write_bytes

SCHEMA = "tracelens.chrome-trace/1"
GPU_TID_BASE = 1_000_000_000
#: Collective columns copied into args when not null.
COLL_ARGS = ("collective", "pg_desc", "group_size", "seq", "in_nelems", "out_nelems", "dtype")
GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


def _col(t: pa.Table, name: str, fill) -> np.ndarray:
    c = t.column(name)
    if pa.types.is_dictionary(c.type):
        c = c.cast(pa.string())
    return c.fill_null(fill).to_numpy(zero_copy_only=False)


def trace_events(
    events: pa.Table,
    stage_of: Mapping[int, int | None] | None = None,
    offsets_ns: Mapping[int, int] | None = None,
    findings: list[dict] | None = None,
) -> list[dict]:
    """Chrome trace events of all ranks: metadata (process/thread names), complete events, finding markers."""
    stage_of = stage_of or {}
    offsets_ns = offsets_ns or {}
    if events.num_rows == 0:
        return []
    rank = _col(events, "rank", -1).astype(np.int64)
    ranks = np.unique(rank)
    lut = {int(r): int(offsets_ns.get(int(r), 0)) for r in ranks}
    off = np.array([lut[int(r)] for r in rank], dtype=np.int64) if lut else np.zeros(rank.size, np.int64)
    ts = _col(events, "ts_ns", 0).astype(np.int64) - off
    t0 = int(ts.min())
    ts_us = np.round((ts - t0) / 1000.0, 3)
    dur_us = np.round(_col(events, "dur_ns", 0).astype(np.int64) / 1000.0, 3)
    kind = _col(events, "kind", "other")
    name = _col(events, "name", "")
    on_gpu = np.isin(kind, GPU_KINDS)
    device = _col(events, "device", 0).astype(np.int64)
    stream = _col(events, "stream", 0).astype(np.int64)
    tid = np.where(on_gpu, GPU_TID_BASE + device * 1000 + stream, _col(events, "tid", 0).astype(np.int64))
    step = _col(events, "step", -1).astype(np.int64)
    extra = {c: events.column(c) for c in COLL_ARGS if c in events.column_names}
    has_coll = (
        ~np.asarray(pc.is_null(events.column("collective")).to_numpy(zero_copy_only=False), bool)
        if "collective" in extra
        else np.zeros(rank.size, bool)
    )
    coll_rows = {c: (v.cast(pa.string()) if pa.types.is_dictionary(v.type) else v) for c, v in extra.items()}
    coll_idx = np.flatnonzero(has_coll)
    coll_args = {}
    if coll_idx.size:
        sub = {c: v.take(pa.array(coll_idx)).to_pylist() for c, v in coll_rows.items()}
        for j, i in enumerate(coll_idx.tolist()):
            coll_args[i] = {c: sub[c][j] for c in sub if sub[c][j] is not None}

    out: list[dict] = []
    for r in ranks.tolist():
        s = stage_of.get(int(r))
        out.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": int(r),
                "tid": 0,
                "args": {"name": f"rank {r}" + (f" (stage {s})" if s is not None else "")},
            }
        )
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": int(r), "tid": 0, "args": {"sort_index": int(r)}}
        )
    pairs = (
        np.unique(np.stack([rank[on_gpu], tid[on_gpu]]), axis=1)
        if on_gpu.any()
        else np.empty((2, 0), np.int64)
    )
    for r, t in pairs.T.tolist():
        d, st = divmod(t - GPU_TID_BASE, 1000)
        out.append(
            {"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": f"GPU {d} stream {st}"}}
        )
    for i, (r, t, n, k, a, b, sp) in enumerate(
        zip(
            rank.tolist(),
            tid.tolist(),
            name.tolist(),
            kind.tolist(),
            ts_us.tolist(),
            dur_us.tolist(),
            step.tolist(),
        )
    ):
        ev = {"ph": "X", "name": n, "cat": k, "pid": r, "tid": t, "ts": a, "dur": b}
        args = coll_args.get(i)
        if sp >= 0:
            args = {**(args or {}), "step": sp}
        if args:
            ev["args"] = args
        out.append(ev)
    first = {int(r): float(ts_us[rank == r].min()) for r in ranks}
    for f in findings or []:
        label = f"{f.get('code')}: {f.get('message')}"
        args = {
            "code": f.get("code"),
            "severity": f.get("severity"),
            "message": f.get("message"),
            "ranks": f.get("ranks") or [],
            "stages": f.get("stages") or [],
        }
        out.append(
            {
                "ph": "i",
                "s": "g",
                "name": label,
                "cat": "tracelens.finding",
                "pid": int(ranks[0]),
                "tid": 0,
                "ts": 0.0,
                "args": args,
            }
        )
        for r in f.get("ranks") or []:
            if int(r) in first:
                out.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "name": label,
                        "cat": "tracelens.finding",
                        "pid": int(r),
                        "tid": 0,
                        "ts": first[int(r)],
                        "args": args,
                    }
                )
    return out


def export_trace(
    events: pa.Table,
    path: Path,
    stage_of: Mapping[int, int | None] | None = None,
    offsets_ns: Mapping[int, int] | None = None,
    findings: list[dict] | None = None,
    run_name: str | None = None,
    compress: bool | None = None,
) -> int:
    """Write the merged Chrome trace JSON atomically, gzip-compressed when `compress` (default: when `path`
    ends in `.gz`, which Perfetto UI opens as it is); returns the number of trace events written."""
    evs = trace_events(events, stage_of, offsets_ns, findings)
    other = {
        "schema": SCHEMA,
        "generator": f"tracelens {__version__}",
        "run": run_name or "",
        "clock_aligned": bool(offsets_ns),
        "offsets_ns": {str(k): int(v) for k, v in (offsets_ns or {}).items()},
    }
    # Only keys Perfetto's JSON importer knows (it stops reading at an unknown top-level key); otherData
    # first, written with json's ": " so tracelens.outputs finds the schema mark and a rerun may overwrite.
    head = '{"otherData": ' + json.dumps(other) + ', "displayTimeUnit": "ms", "traceEvents": '
    data = head.encode() + msgspec.json.encode(evs) + b"}\n"
    if compress if compress is not None else Path(path).name.endswith(".gz"):
        import gzip

        data = gzip.compress(data, compresslevel=6, mtime=0)
    write_bytes(path, data)
    return len(evs)
