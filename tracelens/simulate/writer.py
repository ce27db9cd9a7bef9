"""Streaming Kineto (PyTorch profiler Chrome-trace) writer: one rank's file at a time.

Only the numeric timing arrays of the run are in memory; each rank's JSON is produced step by step
and streamed through gzip (mtime 0, no file name) so outputs are byte-identical for a given config.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np

from tracelens.simulate import costs as C
from tracelens.simulate.engine import StageTiming
from tracelens.simulate.layout import Layout
from tracelens.simulate.program import ASYNC, COLL, COMPUTE, RECV, SEND, WAIT, WORLD, Program

FIRST_STEP = 2  # profiler schedule(wait=1, warmup=1, active=N) numbers the first recorded step 2
NCCL_VERSION = "2.21.5"
CBID_LAUNCH = 211
TRUNC = 30  # PyTorch truncates long rank lists in record_param_comms args
LAUNCH_NS = (3_412, 4_107, 3_655, 5_230, 3_871, 4_466, 3_309)  # cudaLaunchKernel durations (cycled)


def fmt(ns: int) -> str:
    """Kineto's µs with exactly 3 decimals (exact ns)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def ranks_str(ranks) -> str:
    r = [int(x) for x in ranks]
    if len(r) > TRUNC:
        return "[" + ", ".join(map(str, r[:TRUNC])) + ", ..., " + str(r[-1]) + "]"
    return "[" + ", ".join(map(str, r)) + "]"


def file_name(layout: Layout, rank: int, t_ns: int) -> str:
    """tensorboard_trace_handler naming: `<host>_<pid>.<time_ns>.pt.trace.json[.gz]` (no rank in it)."""
    return f"{layout.host_name(rank)}_{cpu_pid(rank)}.{t_ns}.pt.trace.json"


def cpu_pid(rank: int) -> int:
    return 3_100_000 + 4_099 * rank % 800_000


def _module_spans(prog: Program) -> list[tuple[int, int]]:
    """[lo, hi) op index ranges of each module (a module's ops are contiguous in its program)."""
    spans = [[-1, -1] for _ in prog.modules]
    for i, op in enumerate(prog.ops):
        if op.module >= 0:
            sp = spans[op.module]
            if sp[0] < 0:
                sp[0] = i
            sp[1] = i + 1
    return [(s[0], s[1]) for s in spans]


class StageStatic:
    """Per-stage, per-op strings and masks shared by every rank of the stage (built once)."""

    def __init__(self, prog: Program):
        self.prog = prog
        ops = prog.ops
        self.kinds = np.array([op.kind for op in ops], dtype=np.int8)
        self.has_kernel = self.kinds != WAIT
        self.spans = _module_spans(prog)
        self.module_first = {lo: m for m, (lo, hi) in enumerate(self.spans) if lo >= 0}
        self.names = [json.dumps(op.name) for op in ops]
        self.kargs = []
        for op in ops:
            gx, gy, gz = op.grid
            bx, by, bz = op.block
            warps = bx * by * bz // 32
            bps = round(gx * gy * gz / 132, 6)
            self.kargs.append(
                f'"registers per thread": {128 if op.kind == COMPUTE else 96}, "shared memory": '
                f'{166912 if op.kind == COMPUTE else 87568}, "blocks per SM": {bps}, "warps per SM": '
                f'{round(bps * warps, 6)}, "grid": [{gx}, {gy}, {gz}], "block": [{bx}, {by}, {bz}], '
                '"est. achieved occupancy %": '
                f"{min(100, int(bps * warps / 64 * 100)) if op.kind == COMPUTE else 0}"
            )


def write_rank(
    path: Path,
    rank: int,
    stage: int,
    col: int,
    layout: Layout,
    static: StageStatic,
    timings: list[StageTiming],
    header: dict,
    base_ns: int,
    offset_ns: int,
    use_gzip: bool,
    level: int = 9,
) -> None:
    """Write one rank's trace (all steps) to `path`."""
    prog = static.prog
    ops = prog.ops
    pid = cpu_pid(rank)
    tids = (pid, pid + 7)  # main thread, autograd thread
    dev = layout.local_device(rank)
    shift = offset_ns - base_ns
    # groups and collective args (static for this rank)
    coll_args: dict[int, str] = {}
    seq: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.kind in (COLL, ASYNC, SEND, RECV, WORLD):
            g = layout.group_of(rank, op.axis)
            coll_args[i] = _coll_args(op, g, layout, rank, stage, col)
    corr = 1_000 + rank % 7
    ext = 10
    alloc = int(prog.static_bytes)
    peak = alloc
    addr = 0x7F3A00000000 + rank * 0x1000000

    f = _open(path, use_gzip, level)
    try:
        f.write(_header_text(header))
        first = True
        for step, tim in enumerate(timings):
            lau = tim.launch[:, col]
            sta = tim.start[:, col]
            end = tim.end[:, col]
            ws, we = int(tim.step_start[col]), int(tim.step_end[col])
            ev: list[str] = []
            ext += 1
            ev.append(
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{FIRST_STEP + step}", '
                f'"pid": {pid}, '
                f'"tid": {pid}, "ts": {fmt(ws + shift)}, "dur": {fmt(we - ws)}, "args": {{"External id": '
                f"{ext}, "
                f'"Record function id": 0}}}}'
            )
            mod_ext: dict[int, int] = {}
            for i, op in enumerate(ops):
                m = static.module_first.get(i)
                if m is not None:
                    ext += 1
                    mod_ext[m] = ext
                    lo, hi = static.spans[m]
                    mask = static.has_kernel[lo:hi]
                    L = lau[lo:hi][mask]
                    S = sta[lo:hi][mask]
                    E = end[lo:hi][mask]
                    c0 = int(L.min()) - 2_000
                    c1 = int(L.max()) + 8_000
                    g0 = int(S.min())
                    g1 = int(E.max())
                    mod = prog.modules[m]
                    tid = tids[mod.thread]
                    ev.append(
                        f'{{"ph": "X", "cat": "user_annotation", "name": "{mod.name}", "pid": {pid}, '
                        f'"tid": {tid}, '
                        f'"ts": {fmt(c0 + shift)}, "dur": {fmt(c1 - c0)}, "args": {{"External id": {ext}, '
                        f'"Record function id": 0}}}}'
                    )
                    ev.append(
                        f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "{mod.name}", "pid": {dev}, '
                        '"tid": 7, '
                        f'"ts": {fmt(g0 - 1 + shift)}, "dur": {fmt(g1 - g0 + 2)}, "args": {{"External '
                        f'id": {ext}}}}}'
                    )
                if op.kind == WAIT:
                    continue
                L, S, E = int(lau[i]), int(sta[i]), int(end[i])
                tid = tids[op.thread]
                corr += 1
                ld = LAUNCH_NS[i % len(LAUNCH_NS)]
                if op.kind == COMPUTE:
                    k_ext = mod_ext.get(op.module, ext)
                    cargs = ""
                else:
                    ext += 1
                    k_ext = ext
                    a = coll_args[i]
                    if op.kind not in (SEND, RECV):
                        axis = op.axis
                        seq[axis] = seq.get(axis, 0) + 1
                        a = a + f', "Seq": {seq[axis]}'
                    cargs = ", " + a
                    ev.append(
                        f'{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": {pid}, '
                        f'"tid": {tid}, '
                        f'"ts": {fmt(L - 6_000 + shift)}, "dur": {fmt(ld + 14_000)}, "args": {{"External '
                        f'id": {ext}, '
                        f'"Record function id": 0{cargs}, "Is asynchronized op": '
                        f"{1 if op.kind == ASYNC else 0}}}}}"
                    )
                if op.mem:
                    alloc += op.mem
                    peak = max(peak, alloc)
                    reserved = (peak // (2 << 20) + 1) * (2 << 20) + (1 << 30)
                    ev.append(
                        f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": '
                        f"{pid}, "
                        f'"tid": {tid}, "ts": {fmt(L + shift)}, "args": {{"Total Reserved": {reserved}, '
                        f'"Total Allocated": {alloc}, "Bytes": {op.mem}, "Device Id": {dev}, "Device '
                        'Type": 1, '
                        f'"Addr": {addr + (i % 512) * 0x200000}}}}}'
                    )
                ev.append(
                    f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                    f'"tid": {tid}, '
                    f'"ts": {fmt(L + shift)}, "dur": {fmt(ld)}, "args": {{"External id": {k_ext}, "cbid": '
                    f'{CBID_LAUNCH}, "correlation": {corr}}}}}'
                )
                ev.append(
                    f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {fmt(L + shift)}, '
                    f'"cat": "ac2g", "name": "ac2g"}}'
                )
                ev.append(
                    f'{{"ph": "X", "cat": "kernel", "name": {static.names[i]}, "pid": {dev}, "tid": '
                    f"{op.stream}, "
                    f'"ts": {fmt(S + shift)}, "dur": {fmt(E - S)}, "args": {{"External id": {k_ext}, '
                    '"queued": 0, '
                    f'"device": {dev}, "context": 1, "stream": {op.stream}, "correlation": {corr}, '
                    f"{static.kargs[i]}{cargs}}}}}"
                )
                ev.append(
                    f'{{"ph": "f", "id": {corr}, "pid": {dev}, "tid": {op.stream}, "ts": {fmt(S + shift)}, '
                    f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}'
                )
            chunk = ",\n  ".join(ev)
            f.write(("  " if first else ",\n  ") + chunk)
            first = False
        t_first = int(timings[0].step_start[col]) - 50_000
        t_last = int(timings[-1].step_end[col]) + 50_000
        f.write(",\n  " + _trailer(pid, tids, dev, t_first + shift, t_last - t_first, prog))
        f.write('\n],\n  "traceName": ' + json.dumps(header["_trace_name"]) + "\n}\n")
    finally:
        f.close()


def _open(path: Path, use_gzip: bool, level: int = 9):
    raw = open(path, "wb")  # noqa: SIM115 (closed by _TextSink.close)
    if use_gzip:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=level)
        return _TextSink(gz, raw)
    return _TextSink(raw, None)


class _TextSink:
    """Minimal text writer over a binary stream (closes the gzip member, then the file)."""

    def __init__(self, inner, raw):
        self.inner, self.raw = inner, raw

    def write(self, text: str) -> None:
        self.inner.write(text.encode("utf-8"))

    def close(self) -> None:
        self.inner.close()
        if self.raw is not None:
            self.raw.close()


def _coll_args(op, g, layout: Layout, rank: int, stage: int, col: int) -> str:
    """record_param_comms args (and the copy Kineto puts on the NCCL kernel)."""
    if op.axis == "pp":
        peer = int(layout.grid[stage + op.peer].reshape(-1)[col])
        g = layout.group_of(rank, "pp")
        src: int | None
        dst: int | None
        src, dst = (rank, peer) if op.kind == SEND else (peer, rank)
        members = g.ranks if g else (rank, peer)
        pg_name, pg_desc, size = (
            (g.name, g.desc, len(g.ranks)) if g else ("0", "default_pg", layout.world_size)
        )
    else:
        members = g.ranks
        pg_name, pg_desc, size = g.name, g.desc, len(g.ranks)
        src = dst = None
    stride = members[1] - members[0] if len(members) > 1 else 1
    if any(b - a != stride for a, b in zip(members, members[1:])):
        stride = -1
    a = (
        f'"Collective name": "{C.COLL_RECORD_NAME[op.coll]}", "dtype": "{op.dtype}", "In msg nelems": '
        f"{op.in_nelems}, "
        f'"Out msg nelems": {op.out_nelems}, "In split size": "[]", "Out split size": "[]", '
        f'"Global rank start": {members[0]}, "Global rank stride": {stride}, "Group size": {size}, '
        f'"Process Group Name": "{pg_name}", "Process Group Description": "{pg_desc}", '
        f'"Process Group Ranks": "{ranks_str(members)}", "Rank": {rank}'
    )
    if src is not None:
        a += f', "Src Rank": {src}, "Dst Rank": {dst}'
    return a


def _header_text(h: dict) -> str:
    keys = [
        "schemaVersion",
        "deviceProperties",
        "trace_id",
        "profile_memory",
        "record_shapes",
        "distributedInfo",
        "host_name",
        "displayTimeUnit",
        "baseTimeNanoseconds",
    ]
    lines = ["{"]
    for k in keys:
        lines.append(f"  {json.dumps(k)}: {json.dumps(h[k])},")
    lines.append('  "traceEvents": [\n')
    return "\n".join(lines)


def _trailer(pid: int, tids: tuple[int, int], dev: int, ts: int, dur: int, prog: Program) -> str:
    streams = sorted({op.stream for op in prog.ops if op.kind != WAIT})
    meta = [
        f'{{"name": "process_name", "ph": "M", "ts": {fmt(ts)}, "pid": {pid}, "tid": 0, "args": '
        f'{{"name": "python3"}}}}',
        f'{{"name": "process_labels", "ph": "M", "ts": {fmt(ts)}, "pid": {pid}, "tid": 0, "args": '
        f'{{"labels": "CPU"}}}}',
        f'{{"name": "process_sort_index", "ph": "M", "ts": {fmt(ts)}, "pid": {pid}, "tid": 0, '
        f'"args": {{"sort_index": {pid}}}}}',
        f'{{"name": "process_name", "ph": "M", "ts": {fmt(ts)}, "pid": {dev}, "tid": 0, "args": '
        f'{{"name": "python3"}}}}',
        f'{{"name": "process_labels", "ph": "M", "ts": {fmt(ts)}, "pid": {dev}, "tid": 0, '
        f'"args": {{"labels": "GPU {dev}"}}}}',
        f'{{"name": "process_sort_index", "ph": "M", "ts": {fmt(ts)}, "pid": {dev}, "tid": 0, '
        f'"args": {{"sort_index": {dev + 16777216}}}}}',
        f'{{"name": "thread_name", "ph": "M", "ts": {fmt(ts)}, "pid": {pid}, "tid": {tids[0]}, '
        f'"args": {{"name": "thread {tids[0]} (python3)"}}}}',
        f'{{"name": "thread_name", "ph": "M", "ts": {fmt(ts)}, "pid": {pid}, "tid": {tids[1]}, '
        f'"args": {{"name": "thread {tids[1]} (pt_autograd_{dev})"}}}}',
    ]
    for s in streams:
        meta.append(
            f'{{"name": "thread_name", "ph": "M", "ts": {fmt(ts)}, "pid": {dev}, "tid": {s}, '
            f'"args": {{"name": "stream {s}"}}}}'
        )
    meta.append(
        f'{{"ph": "X", "cat": "Trace", "ts": {fmt(ts)}, "dur": {fmt(dur)}, "pid": "Spans", '
        f'"tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {{"Op count": 0}}}}'
    )
    meta.append(
        f'{{"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", '
        f'"tid": "Trace PyTorch Profiler", "ts": {fmt(ts)}}}'
    )
    return ",\n  ".join(meta)


def trace_id(seed: int, rank: int) -> str:
    return hashlib.sha1(f"tracelens-sim-{seed}-{rank}".encode()).hexdigest()[:32].upper()
