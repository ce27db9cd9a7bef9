"""`read(path)`: one Kineto trace file -> KinetoTrace (events, memory, metadata row).

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest import iterations as _it
from tracelens.ingest import salvage as _salv
from tracelens.ingest.kineto.columns import (
    _COLL_FIELDS,
    _IS_GPU,
    _IS_LAUNCH,
    _KIND_INDEX,
    _coerce_int,
    _dict_from_values,
    _int_array,
    _merge_chunks,
    _pg_ranks_array,
    _rank_int,
    _scatter,
    _scatter_index,
    null_array,
)
from tracelens.ingest.kineto.native import AVAILABLE as _NATIVE
from tracelens.ingest.kineto.p2p_local import peer_local_column
from tracelens.ingest.kineto.peek import rank_from_name
from tracelens.ingest.kineto.scan import _Scan, _scan_blocks
from tracelens.ingest.kineto.split import _reap, _scan_split
from tracelens.ingest.kineto.steps import assign_steps, drop_incomplete_steps, has_step_markers
from tracelens.ingest.kineto.stream import (
    _READ_BYTES,
    _blocks,
    _is_gzip,
    _prefetch,
    _reused_blocks,
    _SplitFailed,
    _utf8_replaced,
)
from tracelens.schema import NAME_MAX_CHARS
from tracelens.store.pages import trim_heap

#: Target size (bytes of JSON) of one decoded chunk of `traceEvents`: 4 MiB with the compiled decoder, which
#: makes no Python object per event, so a chunk's memory is its text and columns, and what a chunk costs
#: besides (the wrapper's NumPy and Arrow calls, the merge, the names interned again) is paid a quarter as
#: often as with 1 MiB (~12% of the read of a 4.4 MB rank); 1 MiB with msgspec's structs alone, which hold a
#: Python object per event while the chunk is decoded.
CHUNK_BYTES = (4 if _NATIVE else 1) * 1024 * 1024


@dataclass
class KinetoTrace:
    """One rank's trace: `events` (schema.EVENTS), `memory` (schema.MEMORY), `metadata` (a schema.METADATA
    row as a dict)."""

    events: pa.Table
    memory: pa.Table
    metadata: dict = field(default_factory=dict)


def _scan(path: Path, salvage: bool, chunk_bytes: int, utf8_replace: bool = False) -> _Scan:
    """Stream the file: metadata from the keys around `traceEvents`, events decoded chunk by chunk.
    `utf8_replace` reads a file with invalid UTF-8 (a corrupt name) with those bytes replaced."""
    if not utf8_replace:
        # the fast paths (split read, inline inflate into a reused buffer) read a whole, well-formed file; with
        # `salvage` a file they cannot read whole (cut mid-write, a damaged stream) is read again below
        sc = _scan_split(path, chunk_bytes)
        if sc is not None:
            return sc
        blocks = _reused_blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
        try:
            return _scan_blocks(path, blocks, False, chunk_bytes)
        except _SplitFailed:  # a cut or corrupt gzip stream: read again below, for the precise error
            pass
        except BadTraceError:
            if not salvage:
                raise
        finally:
            blocks.close()
    blocks = _blocks(path, max(16, min(_READ_BYTES, chunk_bytes)))
    if _is_gzip(path):
        blocks = _prefetch(blocks)
    if utf8_replace:
        blocks = _utf8_replaced(blocks)
    try:
        return _scan_blocks(path, blocks, salvage, chunk_bytes)
    finally:
        blocks.close()  # stops the decompression thread at once when decoding failed


def bounded_names(names: pa.Array) -> pa.Array:
    """The name column with every dictionary value longer than NAME_MAX_CHARS cut to its first
    NAME_MAX_CHARS characters plus `…[N chars, blake2b:<digest>]` (N the whole name's length, the digest
    of its UTF-8 bytes: distinct long names stay distinct, equal ones equal). One length test per distinct
    name; the column is unchanged (the same object) when no name is that long."""
    d = names.dictionary
    if len(d) == 0 or pc.max(pc.binary_length(d)).as_py() <= NAME_MAX_CHARS:
        return names  # (bytes >= characters: no name can be too long)
    values = d.to_pylist()
    cut = [_bounded(v) for v in values]
    return pa.DictionaryArray.from_arrays(names.indices, pa.array(cut, type=d.type))


def _bounded(v: str | None) -> str | None:
    if v is None or len(v) <= NAME_MAX_CHARS:
        return v
    digest = hashlib.blake2b(v.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{v[:NAME_MAX_CHARS]}…[{len(v):,} chars, blake2b:{digest}]"


#: Events from which a read hands the freed chunk memory back to the OS once they are merged (~70 bytes an
#: event: ~70 MB). Smaller reads (a rank of a large run: ~20,000 events) keep it for the next rank: trimming
#: costs page faults when the memory is needed again.
TRIM_EVENTS = 1_000_000


def _assemble(sc: _Scan, rank: int) -> tuple[pa.Table, pa.Table, list[dict] | None]:
    base = _coerce_int(sc.meta.get("baseTimeNanoseconds")) or 0
    c = _merge_chunks(sc.chunks)
    sc.chunks = []  # their columns are in `c` now: freed (a split read's child columns unmap with them)
    if c.n >= TRIM_EVENTS:  # the chunks' many small arrays, freed: handed back before the full-length columns
        trim_heap()
    ts, ts_valid, dur, dur_valid, kind, names = c.ts, c.ts_valid, c.dur, c.dur_valid, c.kind, c.name
    n, corr, rows = c.n, c.correlation, c.coll_rows
    coll = {f: c.coll.get(f, []) for f in _COLL_FIELDS}
    has_steps = has_step_markers(kind, names)
    found = _iterations(kind, names, ts, np.where(dur_valid, dur, 0), ts_valid, c.tid, has_steps)
    synth = None if has_steps or found is None else found
    windows = None
    if synth is not None:
        windows = (synth.start, synth.end, np.arange(len(synth.start), dtype=np.int64))
    step = assign_steps(kind, names, ts, dur, corr, windows)
    is_gpu = _IS_GPU[kind]
    device, stream, pid, tid = c.device, c.stream, c.pid, c.tid
    gpu_mask = pa.array(is_gpu)
    # device events: device/stream from args, else Kineto's convention pid = device, tid = stream
    device = pc.if_else(
        gpu_mask, pc.coalesce(device, pc.cast(pid, pa.int32(), safe=False)), pa.scalar(None, pa.int32())
    )
    # cpu ops keep an `args.stream` of their own (Triton launches; analyze.rank.hta_compat); other rows: null
    cpu_op = pa.array(kind == _KIND_INDEX["cpu_op"])
    stream = pc.if_else(
        gpu_mask,
        pc.coalesce(stream, pc.cast(tid, pa.int32(), safe=False)),
        pc.if_else(cpu_op, stream, pa.scalar(None, pa.int32())),
    )
    # an absolute time (base + ts) or an end (+ dur) beyond int64 would wrap around: such an event is
    # dropped like one without a timestamp (and counted in the metadata)
    wraps = _wraps(ts, dur, dur_valid, base)
    if wraps is not None:
        ts_valid = ts_valid & ~wraps
        ts = np.where(wraps, 0, ts)
    sc.dropped = int(n - np.count_nonzero(ts_valid))
    if ts.flags.writeable:  # (the merged copy: adding the base in place spares a full-length array)
        ts_ns = ts
        ts_ns += base
    else:
        ts_ns = ts + base
    kinds = pa.DictionaryArray.from_arrays(
        pa.array(kind.astype(np.int32)), pa.array(list(schema.KINDS), type=pa.string())
    )
    at = _scatter_index(n, rows)  # where the collective rows go (one index for their 11 columns)
    cols = {
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "kind": kinds,
        "name": bounded_names(names),
        "pid": pid,
        "tid": tid,
        "device": device,
        "stream": stream,
        "ts_ns": pa.array(ts_ns, mask=None if ts_valid.all() else ~ts_valid),
        # a missing or non-numeric dur: 0 (an instant)
        "dur_ns": pa.array(dur if dur_valid.all() else np.where(dur_valid, dur, 0)),
        "correlation": corr,
        "external_id": c.external_id,
        "sequence_nr": c.sequence_nr,
        "step": pa.array(step.astype(np.int32), mask=step < 0),
        "collective": _dict_from_values(coll["collective"], n, rows, at),
        "pg_name": _dict_from_values(coll["pg_name"], n, rows, at),
        "pg_desc": _dict_from_values(coll["pg_desc"], n, rows, at),
        "pg_ranks": _scatter(_pg_ranks_array(coll["pg_ranks"]), n, rows, at),
        "group_size": _scatter(_int_array(coll["group_size"], pa.int32()), n, rows, at),
        "seq": _scatter(_int_array(coll["seq"], pa.int64()), n, rows, at),
        "in_nelems": _scatter(_int_array(coll["in_nelems"], pa.int64()), n, rows, at),
        "out_nelems": _scatter(_int_array(coll["out_nelems"], pa.int64()), n, rows, at),
        "dtype": _dict_from_values(coll["dtype"], n, rows, at),
        "src_rank": _scatter(_int_array(coll["src_rank"], pa.int32()), n, rows, at),
        "dst_rank": _scatter(_int_array(coll["dst_rank"], pa.int32()), n, rows, at),
        "peer_local": null_array(pa.int32(), n),  # (filled by `_read` once the events are known)
    }
    events = pa.Table.from_arrays([cols[f.name] for f in schema.EVENTS], schema=schema.EVENTS)
    if not ts_valid.all():
        events = events.filter(pa.array(ts_valid))
    iterations = None
    if found is not None:
        if synth is not None:  # a step per iteration: a ProfilerStep#<i> marker over each
            events = _with_markers(events, synth, rank, base)
            steps_of: list[int | None] = list(range(len(synth.start)))
        else:  # the trace's own steps: each iteration in the step its annotation falls in
            steps_of = [int(step[r]) if r >= 0 and step[r] >= 0 else None for r in found.rows.tolist()]
        iterations = _it.records(list(zip(steps_of, found.iterations)))
    m = c.mem
    if m is not None:
        mts, mvalid = m["ts"], m["valid"]
        memory = pa.Table.from_arrays(
            [
                pa.array(np.full(len(mts), rank, dtype=np.int32)),
                pa.array(mts + base, mask=~mvalid),
                m["device"],
                m["bytes"],
                m["total_allocated"],
                m["total_reserved"],
            ],
            schema=schema.MEMORY,
        )
        if not mvalid.all():
            memory = memory.filter(pa.array(mvalid))
    else:
        memory = schema.MEMORY.empty_table()
    pa.default_memory_pool().release_unused()
    return events, memory, iterations


_CPU_KINDS = np.zeros(256, dtype=bool)
_CPU_KINDS[[_KIND_INDEX["cpu_op"], _KIND_INDEX["user_annotation"]]] = True


def _iterations(
    kind: np.ndarray,
    names: pa.DictionaryArray,
    ts: np.ndarray,
    dur: np.ndarray,
    ts_valid: np.ndarray,
    tid: pa.Array,
    has_steps: bool,
) -> _it.Windows | None:
    """The inference iterations of one rank's events (tracelens.ingest.iterations): the engines'
    annotations; in an engine trace without them or ProfilerStep, the repeats of its work."""
    cpu = _CPU_KINDS[kind.astype(np.uint8)] & ts_valid
    tids = (
        tid.fill_null(-1).to_numpy(zero_copy_only=False)
        if tid.null_count
        else tid.to_numpy(zero_copy_only=False)
    )
    found = _it.annotated_windows(kind, names, ts, dur, tids, cpu)
    if found is not None or has_steps or not _it.is_engine_trace(names):
        return found
    return _it.repeating_windows(names, ts, dur, tids, cpu, _IS_LAUNCH[kind] & ts_valid)


def _with_markers(events: pa.Table, w: _it.Windows, rank: int, base: int) -> pa.Table:
    """`events` plus a `ProfilerStep#<i>` user_annotation over each iteration window (on its thread), so that
    every analyzer sees the iterations as steps."""
    k = len(w.start)
    kinds = pa.DictionaryArray.from_arrays(
        pa.array(np.full(k, _KIND_INDEX["user_annotation"], dtype=np.int32)),
        pa.array(list(schema.KINDS), type=pa.string()),
    )
    cols: dict[str, pa.Array] = {
        "rank": pa.array(np.full(k, rank, dtype=np.int32)),
        "kind": kinds,
        "name": pa.array([f"ProfilerStep#{i}" for i in range(k)], pa.string()).dictionary_encode(),
        "tid": pa.array([None if t is None or t < 0 else int(t) for t in w.tid], pa.int64()),
        "ts_ns": pa.array(w.start + base, pa.int64()),
        "dur_ns": pa.array(w.end - w.start, pa.int64()),
        "step": pa.array(np.arange(k, dtype=np.int32)),
    }
    pid_of: dict[int, int | None] = {}
    for t in {t for t in w.tid if t is not None and t >= 0}:  # the pid of the thread's events
        at = pc.index(pc.equal(events.column("tid"), pa.scalar(int(t), pa.int64())), True).as_py()
        pid_of[int(t)] = None if at is None or at < 0 else events.column("pid")[at].as_py()
    pids = [pid_of.get(int(t)) if t is not None else None for t in w.tid]
    cols["pid"] = pa.array(pids, pa.int64())
    extra = pa.Table.from_arrays(
        [cols[f.name] if f.name in cols else pa.nulls(k, f.type) for f in schema.EVENTS], schema=schema.EVENTS
    )
    return pa.concat_tables([events, extra]).unify_dictionaries().combine_chunks()


_I64 = np.iinfo(np.int64)


def _wraps(ts: np.ndarray, dur: np.ndarray, dur_valid: np.ndarray, base: int) -> np.ndarray | None:
    """Events whose absolute start (base + ts) or end (+ dur) does not fit in int64 ns, or None."""
    if not len(ts):
        return None
    hi = _I64.max - max(base, 0)
    lo = _I64.min - min(base, 0)
    if int(ts.min()) >= lo and int(ts.max()) + max(int(dur.max()), 0) <= hi:  # (Python ints: no overflow)
        return None  # (the usual trace: decided by three reductions, no full-length temporaries)
    d = np.where(dur_valid, np.maximum(dur, 0), 0)
    # ts + d overflows only when ts > hi - d (both sides computed without overflow: 0 <= d, hi >= 0)
    bad = (ts > hi - d) | (ts < lo)
    return bad if bad.any() else None


def _json_text(v: Any) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), default=str)


def _metadata(path: Path, rank: int, meta: dict, n_events: int, sc: _Scan) -> dict:
    di = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else None
    dp = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else None
    gpu_name = None
    if dp and isinstance(dp[0], dict) and dp[0].get("name") is not None:
        gpu_name = str(dp[0]["name"])
    ws = _rank_int(di.get("world_size"), 1) if di else None
    return {
        "rank": rank,
        "path": str(path),
        "world_size": ws,
        "backend": None if not di or di.get("backend") is None else str(di.get("backend")),
        "host_name": None if meta.get("host_name") is None else str(meta["host_name"]),
        "trace_id": None if meta.get("trace_id") is None else str(meta["trace_id"]),
        "base_time_ns": _coerce_int(meta.get("baseTimeNanoseconds")),
        "gpu_name": gpu_name,
        "num_devices": len(dp) if dp is not None else None,
        "pg_config_json": _json_text(di.get("pg_config")) if di else None,
        "distributed_info_json": _json_text(di),
        "device_properties_json": _json_text(dp),
        "events": n_events,
        "salvaged": sc.salvaged,
        "salvaged_fraction": min(1.0, sc.bytes_parsed / sc.bytes_total if sc.bytes_total else 0.0)
        if sc.salvaged
        else None,
        "damaged_events": sc.damage.skipped,
        "dropped_events": sc.dropped,
        "mended_strings": sc.damage.mended,
        "header_repairs": sc.damage.header,
    }


def gpu_expected(meta: dict, memory: pa.Table | None = None) -> bool:
    """Whether a trace may have had device activity, for a cut that fell among the CPU ops (which Kineto
    writes first): unless its header says it is CPU-only (`deviceProperties: []`, no NCCL / RCCL backend,
    no `[memory]` event on a device), it is taken to have had some, lost at the cut."""
    dp = meta.get("deviceProperties")
    di = meta.get("distributedInfo")
    backend = str(di.get("backend") or "").lower() if isinstance(di, dict) else ""
    on_device = (
        memory is not None and memory.num_rows and (pc.max(memory.column("device")).as_py() or -1) >= 0
    )
    return not (isinstance(dp, list) and not dp) or "nccl" in backend or bool(on_device)


def metadata_table(rows: list[dict]) -> pa.Table:
    """Metadata row dicts -> a schema.METADATA table."""
    return pa.Table.from_pylist(rows, schema=schema.METADATA)


def read(
    path: str | Path, rank: int | None = None, *, salvage: bool = False, chunk_bytes: int = CHUNK_BYTES
) -> KinetoTrace:
    """Read one Kineto trace (`.json` or gzip) into events, memory and a metadata row.

    `rank` overrides the trace's own (`distributedInfo.rank`, else a `rank<N>` file name, else 0).
    `salvage=True` keeps the complete events of a file cut mid-write instead of raising BadTraceError.

    Python's cyclic garbage collector is paused while reading (and re-enabled after, when it was on): the
    decode allocates and frees millions of objects without cycles, and a full collection triggered by them
    would scan every object of the process (~25 ms with pyarrow and pandas loaded) for nothing.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _read(Path(path), rank, salvage, chunk_bytes)
    finally:
        if paused:
            gc.enable()


def _read(path: Path, rank: int | None, salvage: bool, chunk_bytes: int) -> KinetoTrace:
    try:
        try:
            sc = _scan(path, salvage, chunk_bytes)
        except BadTraceError as err:
            if "UTF-8" not in str(err):
                raise
            sc = _scan(path, salvage, chunk_bytes, utf8_replace=True)  # invalid bytes in a name: replace
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from None
    except RecursionError:
        raise BadTraceError(f"{path}: not a valid Kineto JSON trace (nested too deeply)") from None
    if rank is None:
        di = sc.meta.get("distributedInfo")
        rank = _rank_int(di.get("rank")) if isinstance(di, dict) else None
        if rank is None:
            rank = rank_from_name(path)
        if rank is None:
            rank = 0
    try:
        events, memory, iterations = _assemble(sc, int(rank))
    finally:
        _reap(sc.helper)
    device_lost = False
    if sc.salvaged:
        gpu = gpu_expected(sc.meta, memory)
        device_lost = _salv.uncovered_steps(events, gpu)[1]
        events = drop_incomplete_steps(events, gpu)
    events = events.set_column(
        events.schema.get_field_index("peer_local"), "peer_local", peer_local_column(events, path)
    )
    meta = _metadata(path, int(rank), sc.meta, events.num_rows, sc)
    meta["device_events_lost"] = device_lost
    meta["iterations_json"] = None if iterations is None else json.dumps(iterations, separators=(",", ":"))
    return KinetoTrace(events=events, memory=memory, metadata=meta)
