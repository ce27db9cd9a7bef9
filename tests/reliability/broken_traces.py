"""Builders of broken, odd and hostile inputs for the reliability tests (no real trace is copied into the repo).

Kineto traces are built as dicts and written as JSON text (optionally gzip); real traces are read from
`../shared/traces/hta` and the repo's `sample_traces/` and cut or mutated into tmp folders.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HTA = REPO.parent / "shared" / "traces" / "hta"
GLOO = REPO / "sample_traces" / "cpu-gloo-4rank"

#: Epoch-scale base (ns) so timestamps look like real Kineto ones.
BASE_NS = 1790857026000000000


def x(cat: str, name: str, ts: float | str, dur: float | str, pid=1, tid=1, **args) -> dict:
    """A complete (`ph: X`) event; ts/dur in µs relative to baseTimeNanoseconds."""
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def step_events(
    steps: int = 3, step_us: float = 1000.0, kernel_name: str = "gemm_kernel", first_step: int = 1
) -> list[dict]:
    """Per step: a ProfilerStep window, a cpu op, a launch and its kernel, an NCCL allreduce kernel."""
    out = []
    for i in range(steps):
        t0 = i * step_us
        c = 100 + 10 * i
        out += [
            x("user_annotation", f"ProfilerStep#{first_step + i}", t0, step_us * 0.95),
            x("cpu_op", "aten::mm", t0 + 10, 50),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 20, 5, correlation=c),
            x("kernel", kernel_name, t0 + 100, 400, pid=0, tid=7, device=0, stream=7, correlation=c),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 30, 5, correlation=c + 1),
            x(
                "kernel",
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                t0 + 500,
                200,
                pid=0,
                tid=13,
                device=0,
                stream=13,
                correlation=c + 1,
                **{"Collective name": "allreduce", "Process Group Name": "0", "Group size": 2},
            ),
        ]
    return out


def kineto_doc(rank: int | None = 0, world_size: int | None = 1, events: list | None = None, **top) -> dict:
    """A small valid Kineto trace (distributedInfo omitted when rank and world_size are None)."""
    d: dict = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS}
    if rank is not None or world_size is not None:
        di: dict = {"backend": "nccl"}
        if rank is not None:
            di["rank"] = rank
        if world_size is not None:
            di["world_size"] = world_size
        d["distributedInfo"] = di
    d["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    d.update(top)
    d["traceEvents"] = step_events() if events is None else events
    return d


def write(path: Path, doc: dict | bytes | str, gz: bool = False) -> Path:
    """Write a doc (dict -> JSON, str/bytes verbatim), gzipped when `gz`; parent folders are created."""
    if isinstance(doc, dict):
        data = json.dumps(doc, ensure_ascii=False).encode()
    elif isinstance(doc, str):
        data = doc.encode()
    else:
        data = doc
    if gz:
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run(folder: Path, world_size: int, ranks, **kw) -> Path:
    """A run folder of `ranks` traces (rank<r>.json) of a job of `world_size` ranks."""
    for r in ranks:
        write(folder / f"rank{r}.json", kineto_doc(r, world_size, **kw))
    return folder


def decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def cut(data: bytes, fraction: float) -> bytes:
    """The first `fraction` of the bytes (a profiler killed mid-write)."""
    return data[: int(len(data) * fraction)]


def whitespace_bomb(path: Path, pad_bytes: int, member_bytes: int = 4 << 20) -> Path:
    """A valid trace whose JSON carries `pad_bytes` of spaces, as a multi-member gzip built from one
    compressed member of spaces repeated (cheap to build, ~1000:1)."""
    head = json.dumps(kineto_doc(0, 1))[:-1].encode()  # without the closing "}"
    blank = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    member = blank.compress(b" " * member_bytes) + blank.flush()
    parts = [gzip.compress(head)] + [member] * max(1, pad_bytes // member_bytes) + [gzip.compress(b"}")]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(parts))
    return path


#: An NCCL profiler-plugin file as print_event.cc writes it (world of 4, this is rank 2).
PLUGIN_TEXT = """[
{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1500.25, "args": {"SeqNum": 0, "CommHash": 987654321, "Rank": 2, "Count": 1024, "Datatype": "ncclFloat32", "Algorithm": "Ring", "Protocol": "LL", "nChannels": 2}},
{"name": "ScheduleSend", "cat": "PROXY", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1501.0, "args": {"Channel": 0, "Peer": 3, "Steps": 6, "ChunkSize": 131072, "transSize": 6144}},
{"name": "ScheduleSend", "cat": "PROXY", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1502.0},
{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1550.75},
{"name": "Send", "cat": "P2P", "ph": "b", "id": 1, "pid": 4242, "tid": 1, "ts": 1600.0, "args": {"CommHash": 987654321, "Rank": 2, "Peer": 0, "Count": 100, "Datatype": "ncclFloat32", "nChannels": 1}},
{"name": "Send", "cat": "P2P", "ph": "e", "id": 1, "pid": 4242, "tid": 1, "ts": 1610.0},
{}]
"""  # noqa: E501

#: NCCL_DEBUG=INFO output of one rank (init lines and three collectives).
LOG_TEXT = """\
node07:31337:31337 [3] NCCL INFO NCCL version 2.27.5+cuda12.9
node07:31337:31400 [3] NCCL INFO ncclCommInitRank comm 0x55d0c0a1b2c0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4a000 commId 0x1a2b3c4d5e6f7081 - Init COMPLETE
some unrelated training output line
node07:31337:31337 [3] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f0000001000 recvbuff 0x7f0000001000 count 1048576 datatype 9 op 0 root 0 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO AllGather: opCount 1b sendbuff 0x7f0000001000 recvbuff 0x7f0000002000 count 4096 datatype 7 op 0 root 0 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO Recv: opCount 1 sendbuff (nil) recvbuff 0x7f0000001000 count 256 datatype 9 op 0 root 6 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
"""  # noqa: E501


def cli(*args, cwd=None, env=None, fresh=False):
    """`tracelens ARGS` through the CLI's entry point (its exit codes and one-line errors; tests/cli.py)."""
    from tests.cli import tracelens

    return tracelens(*args, cwd=cwd, env=env, fresh=fresh)


def text_with_offsets(doc: dict) -> tuple[bytes, list[int]]:
    """JSON text of a Kineto doc whose `traceEvents` come last, and the byte offset just after each event."""
    events = doc["traceEvents"]
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    head = json.dumps(top)[:-1] + (", " if top else "") + '"traceEvents": ['
    out = head.encode()
    ends = []
    for i, e in enumerate(events):
        out += (", " if i else "").encode() + json.dumps(e).encode()
        ends.append(len(out))
    return out + b"]}", ends


def cli_inproc(capsys, *args) -> tuple[int, str, str]:
    """The CLI in this process (fast): (exit code, stdout, stderr)."""
    from tracelens.cli import app

    capsys.readouterr()
    try:
        app(args=[str(a) for a in args], prog_name="tracelens")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err
