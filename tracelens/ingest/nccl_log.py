"""NCCL_DEBUG=INFO logs (NCCL_DEBUG_SUBSYS with COLL and INIT) -> COLLECTIVES and communicator membership.

Lines look like `host:pid:tid [cudaDev] NCCL INFO <message>` (debug.cc). Two messages matter:
- collective calls (enqueue.cc): `AllReduce: opCount 3 sendbuff 0x.. recvbuff 0x.. count 1048576 datatype 9
  op 0 root 0 comm 0x55.. [nranks=8] stream 0x..` (opCount hex; datatype/op are enum ints; root is the peer of
  a Send/Recv);
- communicator init (init.cc): `ncclCommInitRank comm 0x.. rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4a000
  commId 0x1a2b.. - Init COMPLETE`.
Ranks in both are communicator-local. A process's global rank is its rank in its largest communicator
(the world), and a comm is named by its commId, which all its members share. The log has no timestamps
for collective calls, so time columns are null. `count` follows NCCL's API: per-rank send count for
AllGather, per-rank receive count for ReduceScatter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from tracelens import schema
from tracelens.errors import BadTraceError

SOURCE = "nccl_log"

#: ncclDataType_t enum -> (NCCL name, PyTorch ScalarType name, bytes).
NCCL_DTYPES = {
    0: ("ncclInt8", "Char", 1),
    1: ("ncclUint8", "Byte", 1),
    2: ("ncclInt32", "Int", 4),
    3: ("ncclUint32", "UInt32", 4),
    4: ("ncclInt64", "Long", 8),
    5: ("ncclUint64", "UInt64", 8),
    6: ("ncclFloat16", "Half", 2),
    7: ("ncclFloat32", "Float", 4),
    8: ("ncclFloat64", "Double", 8),
    9: ("ncclBfloat16", "BFloat16", 2),
    10: ("ncclFloat8e4m3", "Float8_e4m3fn", 1),
    11: ("ncclFloat8e5m2", "Float8_e5m2", 1),
}
NCCL_DTYPE_BY_NAME = {v[0]: k for k, v in NCCL_DTYPES.items()}
NCCL_DTYPE_BY_NAME.update({"ncclChar": 0, "ncclInt": 2, "ncclHalf": 6, "ncclFloat": 7, "ncclDouble": 8})
TORCH_TO_NCCL_DTYPE = {v[1]: k for k, v in NCCL_DTYPES.items()}
TORCH_TO_NCCL_DTYPE["Bool"] = 1

#: NCCL function names (ncclFuncToString, enqueue.cc opName) -> normalised op.
NCCL_OPS = {
    "AllReduce": "allreduce",
    "AllGather": "allgather",
    "ReduceScatter": "reducescatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "Send": "send",
    "Recv": "recv",
    "AllToAll": "alltoall",
    "AlltoAll": "alltoall",
    "Gather": "gather",
    "Scatter": "scatter",
}
OP_TO_NCCL = {
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reducescatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "send": "Send",
    "recv": "Recv",
    "alltoall": "AllToAll",
    "gather": "Gather",
    "scatter": "Scatter",
}


def nelems(op: str, count: int, nranks: int | None) -> tuple[int | None, int | None]:
    """(in_nelems, out_nelems) of one NCCL call from its API `count` (None: needs nranks, unknown)."""
    if op == "allgather":
        return count, (count * nranks if nranks else None)
    if op == "reducescatter":
        return (count * nranks if nranks else None), count
    if op == "alltoall":
        return (count * nranks, count * nranks) if nranks else (None, None)
    return count, count


def api_count(op: str, in_nelems: int, out_nelems: int) -> int:
    """The NCCL API `count` of a call with these buffer sizes (inverse of `nelems`)."""
    if op == "allgather":
        return int(in_nelems)
    if op == "reducescatter":
        return int(out_nelems)
    if op == "recv":
        return int(out_nelems)
    return int(in_nelems)


# Optional `[date time] ` (NCCL_DEBUG_TIMESTAMP_FORMAT), then host:pid:tid [dev], an optional RCCL timestamp.
_PREFIX = (
    r"^(?:\[[^\]]*\]\s*)?(?P<host>[^\s:\[]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+(?:\d+\s+)?"
    r"NCCL INFO\s+"
)
_COLL_RE = re.compile(
    _PREFIX + r"(?P<func>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-Fx]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) \[nranks=(?P<nranks>\d+)\]"
    r"(?:.*?\bglobalrank (?P<globalrank>\d+))?"  # RCCL appends `task N globalrank G`
)
# NCCL >= 2.1x: `ncclCommInitRank comm .. rank .. nranks .. cudaDev .. nvmlDev .. busId .. commId ..
# - Init COMPLETE`;
# NCCL 2.4-era: `comm 0x.. rank 0 nranks 1 cudaDev 0 nvmlDev 0 - Init COMPLETE`.
_INIT_RE = re.compile(
    _PREFIX
    + r"(?:\[Rank \d+\]\s+)?(?:(?P<api>ncclCommInit\w*|ncclCommSplit\w*)\s+)?comm (?P<comm>0x[0-9a-fA-F]+) "
    r"rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudadev>\d+)(?: nvmlDev (?P<nvmldev>\d+))?"
    r"(?: busId (?P<busid>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-fA-F]+))?.*Init COMPLETE"
)
_VERSION_RE = re.compile(r"NCCL version (\S+)")

MEMBERSHIP = pa.schema(
    [
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("comm", pa.string()),
        ("comm_id", pa.string()),
        ("rank", pa.int32()),  # communicator-local
        ("nranks", pa.int32()),
        ("cuda_dev", pa.int32()),
        ("nvml_dev", pa.int32()),
        ("bus_id", pa.string()),
        ("global_rank", pa.int32()),  # rank of this process in its largest communicator
    ]
)


#: A log line longer than this is not an NCCL line: it is skipped (read in pieces, never held whole).
MAX_LINE_BYTES = 1 << 20


def _lines(path: Path) -> Iterable[str]:
    """The log's lines, streamed (plain or gzip): what is held is one line of at most MAX_LINE_BYTES, and
    a gzip stream is inflated as it is read under the Kineto bomb limits (ingest.sniff)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        if magic == b"\x1f\x8b":
            yield from _gz_lines(path)
            return
        with open(path, "rb") as fh:
            yield from _bounded_lines(fh, path)
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read NCCL log ({err})") from err


def _bounded_lines(fh, path: Path, counter=None) -> Iterable[str]:
    while True:
        line = fh.readline(MAX_LINE_BYTES)
        if not line:
            return
        if counter is not None:
            counter(len(line))
        if len(line) >= MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # the rest of an overlong line: skipped
                line = fh.readline(MAX_LINE_BYTES)
                if counter is not None:
                    counter(len(line))
            continue
        yield line.decode("utf-8", errors="replace")


def _gz_lines(path: Path) -> Iterable[str]:
    """Lines of a gzip log, inflated as they are read; a stream cut mid-write yields the lines before the
    cut, corrupt data is a BadTraceError, more output than the bomb limits allow too."""
    import gzip
    import zlib

    from tracelens.ingest.kineto import MAX_RATIO, RATIO_MIN_BYTES, max_decompressed_bytes

    limit = max_decompressed_bytes()
    size = max(1, path.stat().st_size)
    total = [0]

    def count(n: int) -> None:
        total[0] += n
        if total[0] > limit or (total[0] > RATIO_MIN_BYTES and total[0] > MAX_RATIO * size):
            raise BadTraceError(
                f"{path}: decompresses to more than {min(limit, MAX_RATIO * size)} bytes (decompression bomb?); "
                "raise TRACELENS_MAX_DECOMPRESSED_BYTES if this file is genuine"
            )

    with gzip.open(path, "rb") as fh:
        try:
            yield from _bounded_lines(fh, path, count)
        except EOFError:  # cut mid-write: the lines before the cut
            return
        except (zlib.error, gzip.BadGzipFile) as err:
            raise BadTraceError(f"{path}: corrupt gzip data ({err})") from None


def parse(path: str | Path) -> tuple[list[dict], list[dict], str | None]:
    """(collective calls, init records, NCCL version) from one log file, communicator-local, in file order."""
    path = Path(path)
    calls, inits, version = [], [], None
    for line in _lines(path):
        if "NCCL INFO" not in line:
            continue
        m = _COLL_RE.match(line)
        if m:
            calls.append(m.groupdict())
            continue
        m = _INIT_RE.match(line)
        if m:
            inits.append(m.groupdict())
            continue
        if version is None:
            v = _VERSION_RE.search(line)
            if v:
                version = v.group(1)
    return calls, inits, version


def _membership_rows(inits: list[dict]) -> list[dict]:
    """Init records -> membership rows; global rank per process = its rank in its largest communicator."""
    best: dict[tuple, tuple[int, int]] = {}
    for i in inits:
        key = (i["host"], int(i["pid"]))
        n, r = int(i["nranks"]), int(i["rank"])
        if key not in best or n > best[key][0]:
            best[key] = (n, r)
    rows = []
    for i in inits:
        key = (i["host"], int(i["pid"]))
        rows.append(
            {
                "host": i["host"],
                "pid": int(i["pid"]),
                "comm": i["comm"].lower(),
                "comm_id": i["commid"].lower() if i.get("commid") else None,
                "rank": int(i["rank"]),
                "nranks": int(i["nranks"]),
                "cuda_dev": int(i["cudadev"]),
                "nvml_dev": int(i["nvmldev"]) if i.get("nvmldev") else None,
                "bus_id": i.get("busid"),
                "global_rank": best[key][1],
            }
        )
    return rows


def read_comms(path: str | Path) -> pa.Table:
    """Communicator membership from one log (schema MEMBERSHIP), one row per `Init COMPLETE` line."""
    _, inits, _ = parse(path)
    try:
        return pa.Table.from_pylist(_membership_rows(inits), schema=MEMBERSHIP)
    except (ValueError, OverflowError, pa.ArrowException) as err:  # a number beyond int64 in a line
        raise BadTraceError(f"{path}: malformed NCCL log line ({type(err).__name__}: {err})") from None


def _table(rows: list[dict]) -> pa.Table:
    return schema.table_from_rows(rows, schema.COLLECTIVES)


def _rows(calls: list[dict], inits: list[dict], world: dict | None = None) -> list[dict]:
    """Calls -> COLLECTIVES rows. `world`: (comm_id, local rank) -> global rank, from several logs."""
    members = _membership_rows(inits)
    by_comm = {(m["host"], m["pid"], m["comm"]): m for m in members}
    largest: dict[tuple, int] = {}
    for m in members:
        largest[(m["host"], m["pid"])] = max(largest.get((m["host"], m["pid"]), 0), m["nranks"])
    rows: list[dict] = []
    order: dict[tuple, int] = {}
    for c in calls:
        key = (c["host"], int(c["pid"]), c["comm"].lower())
        m = by_comm.get(key)
        op = NCCL_OPS.get(c["func"], c["func"].lower())
        nranks = int(c["nranks"])
        count = int(c["count"])
        dt = NCCL_DTYPES.get(int(c["dtype"]))
        in_n, out_n = nelems(op, count, nranks)
        big = max((n for n in (in_n, out_n) if n is not None), default=None)
        comm_name = m["comm_id"] if m and m["comm_id"] else c["comm"].lower()
        rank = int(c["globalrank"]) if c.get("globalrank") else (m["global_rank"] if m else None)
        is_p2p = op in ("send", "recv")
        peer = None
        pg_ranks = None
        if m and world is not None and m["comm_id"]:
            ranks = [world.get((m["comm_id"], i)) for i in range(nranks)]
            if all(r is not None for r in ranks):
                pg_ranks = ranks
        if is_p2p:
            local_peer = int(c["root"])
            if pg_ranks is not None and 0 <= local_peer < len(pg_ranks):
                peer = pg_ranks[local_peer]
            elif m and m["nranks"] == largest[(m["host"], m["pid"])]:
                peer = local_peer  # the process's world communicator: local rank = global rank
        okey = (rank, comm_name, op)
        rows.append(
            {
                "rank": rank,
                "source": SOURCE,
                "pg_name": comm_name,
                "pg_desc": None,
                "pg_ranks": pg_ranks,
                "group_size": nranks,
                "op": op,
                "dtype": dt[1] if dt else None,
                "in_nelems": in_n,
                "out_nelems": out_n,
                "bytes": big * dt[2] if (big is not None and dt) else None,
                "seq": int(c["opcount"], 16),
                "order": order.get(okey, 0),
                "is_p2p": is_p2p,
                "peer": peer,
                "state": "completed",
                "enqueue_ns": None,
                "start_ns": None,
                "end_ns": None,
                "step": None,
            }
        )
        order[okey] = order.get(okey, 0) + 1
    return rows


def read(path: str | Path) -> pa.Table:
    """One NCCL_DEBUG=INFO log -> COLLECTIVES (source "nccl_log"); rank = rank in the largest comm.

    Rows whose communicator has no `Init COMPLETE` line in the file have a null rank. A log without any
    NCCL INFO collective line gives an empty table; a file without any NCCL INFO line is a BadTraceError.
    """
    path = Path(path)
    calls, inits, version = parse(path)
    if not calls and not inits and version is None:
        raise BadTraceError(f"{path}: no NCCL INFO lines (set NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL)")
    try:
        return _table(_rows(calls, inits))
    except (ValueError, OverflowError, pa.ArrowException) as err:  # a number beyond int64 in a line
        raise BadTraceError(f"{path}: malformed NCCL log line ({type(err).__name__}: {err})") from None


def read_many(paths: Iterable[str | Path]) -> pa.Table:
    """Several logs (one per process or one merged) -> COLLECTIVES with global pg_ranks and peers resolved."""
    paths = [Path(p) for p in paths]
    parsed = [parse(p) for p in paths]
    try:
        world: dict[tuple[str, int], int] = {}
        for _, inits, _ in parsed:
            for m in _membership_rows(inits):
                if m["comm_id"]:
                    world[(m["comm_id"], m["rank"])] = m["global_rank"]
        rows: list[dict] = []
        for calls, inits, _ in parsed:
            rows.extend(_rows(calls, inits, world))
        return _table(rows)
    except (ValueError, OverflowError, pa.ArrowException) as err:  # a number beyond int64 in a line
        names = ", ".join(str(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
        raise BadTraceError(f"{names}: malformed NCCL log line ({type(err).__name__}: {err})") from None


def version(path: str | Path) -> str | None:
    """The `NCCL version X` string of the log, if any."""
    return parse(path)[2]


__all__ = [
    "MEMBERSHIP",
    "NCCL_DTYPES",
    "NCCL_DTYPE_BY_NAME",
    "NCCL_OPS",
    "OP_TO_NCCL",
    "TORCH_TO_NCCL_DTYPE",
    "api_count",
    "nelems",
    "parse",
    "read",
    "read_comms",
    "read_many",
    "version",
]
