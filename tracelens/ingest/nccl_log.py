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
from dataclasses import dataclass, field
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


# The core of every NCCL debug line (debug.cc): `host:pid:tid [cudaDev] NCCL INFO `, an optional RCCL numeric
# timestamp after `[dev]`. Whatever precedes it is a prefix and is skipped: NCCL_DEBUG_TIMESTAMP_FORMAT's
# `[date time] `, a bare or RFC 3339 timestamp (Kubernetes), Ray's `(RayTrainWorker pid=.., ip=..) `,
# torchrun's `[rank3]:` / `[default0]:`, SLURM's `0: `. It is searched, not anchored, so a line holding two
# messages (interleaved writers) yields both: `_find_cores` finds each `NCCL INFO` marker and reads the
# `host:pid:tid [dev] ` before it backwards (`_CORE_REV`).
# Collective call message (enqueue.cc), after the core. Forks print `peer N` for `op N root N`, a decimal
# comm and `[nranks=N, localRanks=M]`; RCCL/MSCCL append `task N globalrank G`.
_CALL_BODY = (
    r"(?P<func>[A-Za-z]+): opCount (?P<opcount>(?:0x)?[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) "
    r"(?:op (?P<redop>\d+) root (?P<root>-?\d+)|peer (?P<peer>-?\d+)) "
    r"comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)|\d+) \[nranks=(?P<nranks>\d+)[^\]]*\]"
    r"(?:.*?\bglobalrank (?P<globalrank>\d+))?"
)
_CALL_RE = re.compile(_CALL_BODY)
_CALL_SEARCH = re.compile(r"(?<![A-Za-z])" + _CALL_BODY)
# NCCL >= 2.1x: `ncclCommInitRank comm .. rank .. nranks .. cudaDev .. nvmlDev .. busId .. commId ..
# - Init COMPLETE`;
# NCCL 2.4-era: `comm 0x.. rank 0 nranks 1 cudaDev 0 nvmlDev 0 - Init COMPLETE`; split communicators print
# `ncclCommSplit comm .. busId .. parent 0x.. color C key K commId 0x.. localSize ..` (commId after parent).
_INIT_RE = re.compile(
    r"(?:\[Rank \d+\]\s+)?(?:(?P<api>ncclCommInit\w*|ncclCommSplit\w*)\s+)?comm (?P<comm>0x[0-9a-fA-F]+) "
    r"rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudadev>\d+)(?: nvmlDev (?P<nvmldev>\d+))?"
    r"(?: busId (?P<busid>[0-9a-fA-F]+))?(?:.*? commId (?P<commid>0x[0-9a-fA-F]+))?.*Init COMPLETE"
)
_VERSION_RE = re.compile(r"NCCL version (\S+)")
_FUNC_NAMES = tuple(NCCL_OPS)


def _maybe_cut_call(body: str) -> bool:
    """Could `body` be the beginning of a call message that was cut short (`Broad`, `AllReduce: opCount 3 se`)?"""
    b = body.rstrip("\r\n")
    if "opCount" in b:
        return True
    name, colon, rest = b.partition(":")
    if not colon:
        return bool(name) and any(f.startswith(name) for f in _FUNC_NAMES)
    return name in NCCL_OPS and " opCount".startswith(rest)


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


#: Counters of `LogParse.stats` (docs/nccl-inputs.md): lines read; lines holding an NCCL core; calls
#: read; lines that held more than one message; calls rebuilt from a message cut across two lines; lines
#: that lost (part of) their prefix, given their process by the comm pointer or the known host; call
#: fragments without a process (`unattributed`) and call fragments that could not be rebuilt (`damaged`).
STAT_KEYS = (
    "lines",
    "nccl_lines",
    "calls",
    "multi_message_lines",
    "rejoined",
    "prefix_recovered",
    "unattributed",
    "damaged",
)


@dataclass
class LogParse:
    """What one log file holds: calls and init records (dicts of the regex groups plus host/pid/tid/dev),
    the NCCL version, calls whose `host:pid:tid` prefix was cut off (`orphans`: attributed later through
    their comm pointer) and counts of what was recovered or lost (`stats`)."""

    path: Path
    calls: list[dict] = field(default_factory=list)
    inits: list[dict] = field(default_factory=list)
    version: str | None = None
    orphans: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=lambda: dict.fromkeys(STAT_KEYS, 0))


#: Characters that may precede a `host:pid:tid` core that is not glued to the text before it.
_BOUNDARY = frozenset(" \t[]():|>,;\"'=")


# The same core read backwards from its `NCCL INFO` / `NCCL WARN` marker: matching a reversed window at its
# start costs the length of the core, where searching the whole line forwards costs far more.
_CORE_REV = re.compile(
    r"\s+(?:(?:\d+\.)?\d+\s+)?\](?P<dev>\d+)\[\s+(?P<tid>\d+):(?P<pid>\d+):(?P<host>[\w.\-]*[A-Za-z0-9_])"
)
_MARKERS = ("NCCL INFO", "NCCL WARN")


def _find_cores(text: str) -> list[tuple[int, int, dict]]:
    """(start, end, groups) of every `host:pid:tid [dev] NCCL INFO|WARN ` core on a line, left to right."""
    out: list[tuple[int, int, dict]] = []
    prev = 0
    j = text.find("NCCL ")
    while j >= 0:
        level = text[j + 5 : j + 9]
        if level in ("INFO", "WARN") and (j + 9 == len(text) or not text[j + 9].isalnum()):
            m = _CORE_REV.match(text[prev:j][::-1])
            if m:
                end = j + 9 + (1 if text[j + 9 : j + 10] == " " else 0)
                g = {k: v[::-1] for k, v in m.groupdict().items()}
                g["level"] = level
                out.append((j - m.end(), end, g))
                prev = end
        j = text.find("NCCL ", j + 5)
    return out


def _clean_hosts(path: Path) -> set[tuple[str, str]]:
    """(host, pid) of cores that stand at a word boundary (the first core of a line, not glued to other
    text), less those whose host is the cut end of a longer host of the same pid."""
    pairs: set[tuple[str, str]] = set()
    for line in _lines(path):
        if "NCCL " not in line:
            continue
        j = line.find("NCCL INFO")
        m = _CORE_REV.match(line[:j][::-1]) if j > 0 else None
        if m and (m.end() == j or line[j - m.end() - 1] in _BOUNDARY):
            pairs.add((m.group("host")[::-1], m.group("pid")[::-1]))
        if _GLUED_LINE.search(line):  # a host glued behind a stream pointer or globalrank is known too
            for start, _, g in _find_cores(line):
                after_call = line[:start].endswith(("stream ", "globalrank "))
                glued = _GLUED_RE.match(g["host"]) if after_call else None
                if glued:
                    pairs.add((g["host"][glued.end() :], g["pid"]))
    by_pid: dict[str, list[str]] = {}
    for h, pid in pairs:
        by_pid.setdefault(pid, []).append(h)
    return {(h, pid) for h, pid in pairs if not any(o != h and o.endswith(h) for o in by_pid[pid])}


# A host token glued to the end of the previous message, when no known host ends it: the stream pointer
# (`0x55d0c0000b00nodeB`) or RCCL's globalrank (`5nodeB`) before a host that starts with a non-hex letter.
_GLUED_RE = re.compile(r"^(?:0x[0-9a-fA-F]+|\d+)(?=[g-zG-Z_])")
_GLUED_LINE = re.compile(r"(?:stream 0x[0-9a-fA-F]+|globalrank \d+)[g-zG-Z_]")


def _cores(text: str, hosts: set[str], pairs: set[tuple[str, str]]) -> list[tuple[int, int, dict]]:
    """(start, end, core info) of each core on a line. A core glued to the text before it (`..stream
    0x7f1anode03:41:41 [0] NCCL INFO`) takes the longest known host that ends its host token; the rest of
    the token goes back to the message before it. A host whose start was cut off takes the one known host
    that ends with it."""
    out = []
    for start, end, g in _find_cores(text):
        host, cut = g["host"], False
        if host not in hosts and start > 0:
            cands = [h for h in hosts if host.endswith(h)]
            after_call = text[:start].endswith(("stream ", "globalrank "))
            glued = _GLUED_RE.match(host) if after_call else None
            h = max(cands, key=len) if cands else (host[glued.end() :] if glued else host)
            start += len(host) - len(h)
            host = h
        if (host, g["pid"]) not in pairs:  # the start of the host was cut off (`de03:41:41 [0] ..`)
            longer = [h for h, pid in pairs if pid == g["pid"] and h != host and h.endswith(host)]
            if len(longer) == 1:
                host, cut = longer[0], True
        info = {"host": host, "pid": g["pid"], "tid": g["tid"], "dev": g["dev"], "level": g["level"]}
        if cut:
            info["cut"] = True
        out.append((start, end, info))
    return out


def parse_file(path: str | Path) -> LogParse:
    """Parse one log. Every `host:pid:tid [dev] NCCL INFO` core on a line starts a message (prefixes are
    skipped, two messages on a line are both read); a call cut at a line end is joined with the start of the
    next line; a call without its prefix becomes an orphan; what cannot be rebuilt is counted as damaged."""
    out = LogParse(Path(path))
    st = out.stats
    pairs = _clean_hosts(out.path)
    hosts = {h for h, _ in pairs}
    pending: list[tuple[dict, str]] = []  # (core info, cut call body) from the previous line
    for line in _lines(out.path):
        st["lines"] += 1
        text = line.rstrip("\r\n")
        cores = _cores(text, hosts, pairs) if "NCCL " in text else []
        lead = text[: cores[0][0]] if cores else text
        if pending and lead.strip():
            for i in range(len(pending) - 1, -1, -1):
                info, body = pending[i]
                m = _CALL_RE.match(body + lead) or _CALL_RE.match(body + " " + lead.lstrip())
                if m:
                    out.calls.append({**m.groupdict(), **info})
                    st["rejoined"] += 1
                    pending.pop(i)
                    lead = ""
                    break
        st["damaged"] += len(pending)
        pending = []
        if lead and "opCount" in lead:
            m = _CALL_SEARCH.search(lead)
            if m:
                out.orphans.append(m.groupdict())
            else:
                st["damaged"] += 1
        if not cores:
            continue
        st["nccl_lines"] += 1
        if len(cores) > 1:
            st["multi_message_lines"] += 1
        for j, (_, end, info) in enumerate(cores):
            if info.pop("cut", False):
                st["prefix_recovered"] += 1
            if info.pop("level") != "INFO":
                continue
            stop = cores[j + 1][0] if j + 1 < len(cores) else len(text)
            body = text[end:stop]
            m = _CALL_RE.match(body)
            if m:
                out.calls.append({**m.groupdict(), **info})
                continue
            m = _INIT_RE.match(body)
            if m:
                out.inits.append({**m.groupdict(), **info})
                continue
            if out.version is None:
                v = _VERSION_RE.search(body)
                if v:
                    out.version = v.group(1)
                    continue
            if _maybe_cut_call(body):
                if j + 1 == len(cores):
                    pending.append((info, body))  # its rest may open the next line
                else:
                    st["damaged"] += 1
    st["damaged"] += len(pending)
    return out


def attribute_orphans(parses: list[LogParse]) -> None:
    """Give each orphan call (prefix cut off) the process that owns its comm pointer, when exactly one does
    in these files; the others are counted as `unattributed`. Clears `orphans`."""
    owner: dict[str, set[tuple]] = {}
    for lp in parses:
        for rec in lp.calls + lp.inits:
            owner.setdefault(rec["comm"].lower(), set()).add(
                (rec["host"], rec["pid"], rec["tid"], rec["dev"])
            )
    for lp in parses:
        for o in lp.orphans:
            procs = owner.get(o["comm"].lower(), set())
            if len({(h, p) for h, p, _, _ in procs}) == 1:
                host, pid, tid, dev = sorted(procs)[0]
                lp.calls.append({**o, "host": host, "pid": pid, "tid": tid, "dev": dev})
                lp.stats["prefix_recovered"] += 1
            else:
                lp.stats["unattributed"] += 1
        lp.orphans = []
        lp.stats["calls"] = len(lp.calls)


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

    from tracelens.ingest.kineto.stream import MAX_RATIO, RATIO_MIN_BYTES, max_decompressed_bytes

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
    lp = parse_file(path)
    attribute_orphans([lp])
    return lp.calls, lp.inits, lp.version


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
    """Calls -> COLLECTIVES rows. `world`: (comm_id, local rank) -> global rank, from several logs.

    Without an init line for its communicator a row keeps a null rank (the device index is not a rank) and
    its comm pointer as pg_name, marked `_ptr` for `infer_communicators`."""
    members = _membership_rows(inits)
    by_comm = {(m["host"], m["pid"], m["comm"]): m for m in members}
    largest: dict[tuple, int] = {}
    for mb in members:
        largest[(mb["host"], mb["pid"])] = max(largest.get((mb["host"], mb["pid"]), 0), mb["nranks"])
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
            local_peer = int(c["root"] if c.get("root") is not None else c["peer"])
            if pg_ranks is not None and 0 <= local_peer < len(pg_ranks):
                peer = pg_ranks[local_peer]
            elif m and m["nranks"] == largest[(m["host"], m["pid"])]:
                peer = local_peer  # the process's world communicator: local rank = global rank
        process = f"{c['host']}:{int(c['pid'])}"
        okey = (process, comm_name, op)
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
                "process": process,
                "_ptr": not (m and m["comm_id"]),
                "_count": count,
            }
        )
        order[okey] = order.get(okey, 0) + 1
    return rows


def _compatible(a: dict, b: dict) -> bool:
    """Two op sequences ({(opCount, k): (op, count, dtype)}) of one communicator's members: they agree on
    at least half of their common calls, or on the op of 80 % of them (a size or dtype desync)."""
    common = a.keys() & b.keys()
    if not common:
        return False
    same = sum(a[k] == b[k] for k in common)
    same_op = sum(a[k][0] == b[k][0] for k in common)
    return same >= 0.5 * len(common) or same_op >= 0.8 * len(common)


def infer_communicators(rows: list[dict]) -> None:
    """Name, across processes, the communicators that no init line identified (rows marked `_ptr`).

    A comm pointer is local to its process. Streams (process, pointer) of the same nranks whose sequences of
    (opCount, op, count, dtype) are identical form one class; a class of k x nranks streams is complete (k
    communicators that did the same thing, indistinguishable from the log); incomplete classes whose
    sequences are compatible (one stopped early, or they disagree on a few calls) are merged: that is one
    communicator whose members desynced or hung. Each group gets the pg_name `n<nranks>#<i>`."""
    streams: dict[tuple, dict] = {}
    for r in rows:
        if not r.get("_ptr"):
            continue
        key = (r["process"], r["pg_name"])
        st = streams.setdefault(key, {"n": r["group_size"], "sig": {}, "rows": [], "first": len(streams)})
        st["rows"].append(r)
    if not streams:
        return
    for st in streams.values():
        k_of: dict[int, int] = {}
        for r in st["rows"]:
            if r["is_p2p"]:
                continue
            k = k_of.get(r["seq"], 0)
            k_of[r["seq"]] = k + 1
            st["sig"][(r["seq"], k)] = (r["op"], r["_count"], r["dtype"])
    by_n: dict[int, list[tuple]] = {}
    for key, st in streams.items():
        by_n.setdefault(st["n"], []).append(key)
    for n, keys in sorted(by_n.items()):
        classes: dict[tuple, list[tuple]] = {}
        for key in keys:
            classes.setdefault(tuple(sorted(streams[key]["sig"].items())), []).append(key)
        groups = [c for c in classes.values() if len(c) % max(n, 1) == 0]
        rest = sorted((c for c in classes.values() if len(c) % max(n, 1) != 0), key=len, reverse=True)
        merged: list[list[tuple]] = []  # greedy: each class joins the first group it is compatible with
        for c in rest:
            sig = streams[c[0]]["sig"]
            home = next((g for g in merged if _compatible(streams[g[0]]["sig"], sig)), None)
            if home is None:
                merged.append(list(c))
            else:
                home.extend(c)
        groups += merged
        groups.sort(key=lambda g: min(streams[k]["first"] for k in g))
        for i, g in enumerate(groups):
            for key in g:
                for r in streams[key]["rows"]:
                    r["pg_name"] = f"n{n}#{i}"


def _build(parses: list[LogParse]) -> pa.Table:
    """Parsed logs -> one COLLECTIVES table: orphans attributed, global ranks resolved, communicators named."""
    attribute_orphans(parses)
    world: dict[tuple[str, int], int] = {}
    for lp in parses:
        for m in _membership_rows(lp.inits):
            if m["comm_id"]:
                world[(m["comm_id"], m["rank"])] = m["global_rank"]
    # membership is per process: a merged log (all processes in one file) and per-process files alike
    inits = [i for lp in parses for i in lp.inits]
    rows = _rows([c for lp in parses for c in lp.calls], inits, world)
    infer_communicators(rows)
    return _table(rows)


def _malformed(paths: list[Path], err: Exception) -> BadTraceError:
    names = ", ".join(str(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    return BadTraceError(f"{names}: malformed NCCL log line ({type(err).__name__}: {err})")


def read(path: str | Path) -> pa.Table:
    """One NCCL_DEBUG=INFO log -> COLLECTIVES (source "nccl_log"); rank = rank in the largest comm.

    Rows whose communicator has no `Init COMPLETE` line have a null rank and an inferred pg_name
    (`infer_communicators`). A log without any NCCL INFO collective line gives an empty table; a file
    without any NCCL INFO line is a BadTraceError.
    """
    path = Path(path)
    lp = parse_file(path)
    if not lp.calls and not lp.inits and lp.version is None and not lp.orphans:
        raise BadTraceError(f"{path}: no NCCL INFO lines (set NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL)")
    try:
        return _build([lp])
    except (ValueError, OverflowError, pa.ArrowException) as err:  # a number beyond int64 in a line
        raise _malformed([path], err) from None


def read_many_stats(paths: Iterable[str | Path]) -> tuple[pa.Table, dict]:
    """`read_many` plus the parse counters summed over the files (STAT_KEYS, and `files`)."""
    files = [Path(p) for p in paths]
    parses = [parse_file(p) for p in files]
    try:
        table = _build(parses)
    except (ValueError, OverflowError, pa.ArrowException) as err:  # a number beyond int64 in a line
        raise _malformed(files, err) from None
    stats = {k: sum(lp.stats[k] for lp in parses) for k in STAT_KEYS}
    stats["files"] = len(parses)
    return table, stats


def read_many(paths: Iterable[str | Path]) -> pa.Table:
    """Several logs (one per process or one merged) -> COLLECTIVES with global pg_ranks and peers resolved."""
    return read_many_stats(paths)[0]


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
    "LogParse",
    "STAT_KEYS",
    "attribute_orphans",
    "infer_communicators",
    "parse",
    "parse_file",
    "read",
    "read_comms",
    "read_many",
    "read_many_stats",
    "version",
]
