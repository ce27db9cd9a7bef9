"""PyTorch Flight Recorder dumps (pickle: `_dump_fr_trace`, JSON: `_dump_fr_trace_json`) -> COLLECTIVES.

A dump holds one rank's ring buffer of collective records. The file name carries the rank
(`<prefix><rank>`, e.g. `nccl_trace_rank_5`, optionally with a suffix such as `.json`); the content does not.
Versions differ in which keys exist, so every field is read by key presence, never by the version string.
Pickles are untrusted input: they are loaded with an unpickler that refuses every global, so only plain
containers and scalars can come out of one and no code can run while loading.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracelens import schema
from tracelens.errors import BadTraceError, RankError

SOURCE = "flight_recorder"
MAX_BYTES = 256 << 20  # a dump bigger than 256 MiB is not a Flight Recorder dump (2,000 entries: ~1-5 MB)
#: Entries beyond this are not a Flight Recorder ring buffer (the default holds 2,000; TORCH_NCCL_TRACE_
#: BUFFER_SIZE is set to tens of thousands at most in practice).
MAX_ENTRIES = 1_000_000

#: profiling_name operation (after the "nccl:"/"gloo:" prefix) -> normalised op of schema.COLLECTIVES.
OP_NAMES = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "_all_gather_base": "allgather",
    "all_gather_base": "allgather",
    "all_gather_single": "allgather",
    "all_gather_v": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather",
    "reduce_scatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_base": "reducescatter",
    "reduce_scatter_single": "reducescatter",
    "reduce_scatter_v": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall",
    "all_to_all_v_single": "alltoall",
    "alltoall": "alltoall",
    "alltoall_base": "alltoall",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "gather": "gather",
    "scatter": "scatter",
    "coalesced": "coalesced",
}

#: PyTorch ScalarType names (as FR and record_param_comms write them) -> element size in bytes.
DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "ComplexHalf": 4,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
}

#: Order matters: "reducescatter" before "reduce", "allgather" before "gather".
_SQUASHED = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
)
_RANK_RE = re.compile(r"(\d+)(?:\.[A-Za-z][A-Za-z0-9]*)*$")
_P2P_RE = re.compile(r"^(send|recv)\s+(-?\d+)\s*(->|<-)\s*(-?\d+)")


class _PlainUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global: only dicts, lists, tuples, sets, str, bytes, numbers, None."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id")


def _raw_bytes(path: Path) -> bytes:
    from tracelens.ingest.sniff import check_first_byte

    check_first_byte(path, b"{\x80", "neither a JSON nor a pickle Flight Recorder dump")  # before reading it
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from err
    if len(raw) > MAX_BYTES:
        raise BadTraceError(f"{path}: larger than 256 MiB, not a Flight Recorder dump")
    if raw[:2] == b"\x1f\x8b":
        from tracelens.ingest.sniff import gunzip_bounded

        # bounded: stops as soon as the output passes MAX_BYTES (a bomb is a BadTraceError, never inflated)
        raw = gunzip_bounded(raw, path, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise BadTraceError(f"{path}: decompresses to more than 256 MiB, not a Flight Recorder dump")
    return raw


#: Bytes with which a pickle opcode creates a container (EMPTY_DICT/LIST/TUPLE, MARK for DICT/LIST/TUPLE/
#: FROZENSET, TUPLE1-3, EMPTY_SET): their count bounds the containers an unpickling creates, at most one each.
_CONTAINER_OPS = (b"}", b"]", b")", b"(", b"\x85", b"\x86", b"\x87", b"\x8f")
#: A pickle that could create more containers than this is refused before unpickling: 1 byte creates an
#: empty record of 64 bytes (an 8 MB pickle of 4M empty records took 316 MB before its entries were counted).
#: A dump of 40,000 entries with 50-frame stacks makes ~2M; 10M empty records take ~0.8 GB.
MAX_PICKLE_CONTAINERS = 10_000_000


def loads_pickle(data: bytes, name: str = "<bytes>") -> Any:
    """Decode pickle bytes with the restricted unpickler; anything that needs a global is a BadTraceError."""
    n = sum(data.count(op) for op in _CONTAINER_OPS)
    if n > MAX_PICKLE_CONTAINERS:
        raise BadTraceError(
            f"{name}: pickle could create up to {n:,} containers, more than {MAX_PICKLE_CONTAINERS:,} (not a "
            "Flight Recorder dump; a pickle bomb?)"
        )
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as err:
        raise BadTraceError(f"{name}: unsafe or invalid pickle ({err}); only plain data is accepted") from err
    except Exception as err:  # noqa: BLE001 (any failure to decode bytes as plain-data pickle: OverflowError, ...)
        raise BadTraceError(f"{name}: invalid pickle ({type(err).__name__}: {err})") from err


def load_dump(path: str | Path) -> dict:
    """The dump as a plain dict (JSON or pickle, maybe gzipped), checked to be a Flight Recorder dump."""
    path = Path(path)
    raw = _raw_bytes(path)
    head = raw.lstrip()[:1]
    if head == b"{":
        try:
            dump = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise BadTraceError(f"{path}: invalid JSON ({err})") from err
        except RecursionError:
            raise BadTraceError(f"{path}: invalid JSON (nested too deeply)") from None
    elif raw[:1] == b"\x80":
        dump = loads_pickle(raw, str(path))
    else:
        raise BadTraceError(f"{path}: neither a JSON nor a pickle Flight Recorder dump")
    if not isinstance(dump, dict) or not ({"entries", "pg_config", "pg_status", "version"} & set(dump)):
        raise BadTraceError(
            f"{path}: not a Flight Recorder dump (no entries, pg_config, pg_status or version)"
        )
    entries = dump.get("entries", [])
    if entries is None:
        entries = []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadTraceError(f"{path}: Flight Recorder 'entries' is not a list of records")
    if len(entries) > MAX_ENTRIES:
        raise BadTraceError(
            f"{path}: {len(entries):,} Flight Recorder entries, more than {MAX_ENTRIES:,} (a ring buffer "
            "that large is not a Flight Recorder dump)"
        )
    if len({id(e) for e in entries}) != len(entries):
        # a pickle can reference one record many times (its memo): 10 MB expand to millions of rows
        raise BadTraceError(f"{path}: Flight Recorder entries repeat one record (a pickle memo bomb?)")
    dump["entries"] = entries
    return dump


def rank_from_path(path: str | Path) -> int | None:
    """The rank at the end of the file name (`nccl_trace_rank_5`, `fr_5.json`, `dump5.pkl`), else None."""
    m = _RANK_RE.search(Path(path).name)
    return int(m.group(1)) if m else None


def name_pattern(path: str | Path) -> str:
    """The file name with its rank replaced by "#" (`fr_trace_rank_#.json`): dumps of one run share it."""
    name = Path(path).name
    m = _RANK_RE.search(name)
    return name[: m.start(1)] + "#" + name[m.end(1) :] if m else name


def _parse_ranks(value: Any) -> list[int] | None:
    """pg_config ranks: a list, or its string form "[0, 1]" (parsed as JSON, never evaluated)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return [int(v) for v in value] or None
    return None


def pg_config(dump: dict) -> dict[str, dict]:
    """{pg_name: {"desc": str | None, "ranks": [int] | None}} from the dump's pg_config (gloo: empty)."""
    out: dict[str, dict] = {}
    cfg = dump.get("pg_config")
    if not isinstance(cfg, dict):
        return out
    for key, val in cfg.items():
        if not isinstance(val, dict):
            continue
        name = str(val.get("name", key) if val.get("name", "") != "" else key)
        if name == "":
            continue  # gloo: {"": {"name": "", "desc": "", "ranks": "[]"}}
        out[name] = {"desc": val.get("desc") or None, "ranks": _parse_ranks(val.get("ranks"))}
    return out


def _int_or_none(v: Any) -> int | None:
    """Times and ids: None, 0 (JSON's 'unknown') and non-numbers become None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        try:
            return int(v) if v else None
        except (OverflowError, ValueError):  # inf, nan
            return None
    if isinstance(v, str):
        try:
            n = int(v)
        except ValueError:
            return None
        return n or None
    return None


def _numel(sizes: Any) -> int | None:
    """Total elements of a list of shapes ([[4, 8], [16]] -> 48); None when absent or malformed."""
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
            return None
        total += math.prod(shape)
    return total


def normalise_op(profiling_name: str) -> tuple[str, int | None, int | None]:
    """ "nccl:send 1->2" -> ("send", src_local, dst_local); "gloo:all_reduce" -> ("allreduce", None, None)."""
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    name = name.strip()
    m = _P2P_RE.match(name)
    if m:
        kind, a, arrow, b = m.groups()
        if arrow == "->":
            src, dst = int(a), int(b)
        else:
            dst, src = int(a), int(b)
        return kind, src, dst
    base = name.split(" ", 1)[0].lower()
    if base in OP_NAMES:
        return OP_NAMES[base], None, None
    squashed = base.replace("_", "")
    for key in _SQUASHED:
        if key in squashed:
            return key, None, None
    return base, None, None


def _status_marks(dump: dict) -> dict[str, tuple[int, int]]:
    """{pg_id: (last started, last completed collective seq)} from pg_status (-1 when none)."""
    out = {}
    raw = dump.get("pg_status")
    if isinstance(raw, dict):
        for pg_id, st in raw.items():
            if isinstance(st, dict):
                vals = []
                for key in ("last_started_collective", "last_completed_collective"):
                    try:
                        vals.append(int(st.get(key, -1)))
                    except (TypeError, ValueError, OverflowError):
                        vals.append(-1)
                out[str(pg_id)] = (vals[0], vals[1])
    return out


def _rows(dump: dict, rank: int) -> list[dict]:
    cfg = pg_config(dump)
    marks = _status_marks(dump)
    rows: list[dict] = []
    for e in dump["entries"]:
        pg = e.get("process_group")
        pg_name: str | None
        if isinstance(pg, (list, tuple)) and len(pg) >= 2:
            pg_name, pg_desc = str(pg[0]), (str(pg[1]) if pg[1] not in (None, "", "undefined") else None)
        else:
            pg_name, pg_desc = (str(e["pg_id"]) if "pg_id" in e else None), None
        conf = cfg.get(pg_name or "", {})
        pg_desc = pg_desc or conf.get("desc")
        ranks = conf.get("ranks")
        op, src, dst = normalise_op(str(e.get("profiling_name", "")))
        is_p2p = bool(e.get("is_p2p", op in ("send", "recv"))) or op in ("send", "recv")
        peer = None
        if op in ("send", "recv"):
            local = dst if op == "send" else src
            if ranks is not None and local is not None and 0 <= local < len(ranks):
                peer = sorted(ranks)[local]
            elif pg_desc == "default_pg" and local is not None:
                peer = local
        in_dt = e.get("input_dtypes") or []
        out_dt = e.get("output_dtypes") or []
        dtype = (in_dt[0] if in_dt else (out_dt[0] if out_dt else None)) if isinstance(in_dt, list) else None
        dtype = str(dtype) if dtype is not None else None
        in_n, out_n = _numel(e.get("input_sizes")), _numel(e.get("output_sizes"))
        elem = DTYPE_BYTES.get(dtype or "")
        big = max((n for n in (in_n, out_n) if n is not None), default=None)
        nbytes = big * elem if big is not None and elem is not None else None
        seq = e.get("p2p_seq_id" if is_p2p else "collective_seq_id", e.get("seq_id"))
        state = e.get("state")
        started, completed = (
            _int_or_none(e.get("time_discovered_started_ns")),
            _int_or_none(e.get("time_discovered_completed_ns")),
        )
        if state not in ("scheduled", "started", "completed"):
            state = "completed" if completed else ("started" if started else "scheduled")
        gloo = str(e.get("profiling_name", "")).startswith("gloo:")
        retired = e.get("retired")
        if gloo and state == "scheduled" and isinstance(retired, bool):
            # gloo never updates an entry's state (all stay "scheduled") but retires it when its work ends
            # (done, or failed: a timeout retires it too): an entry not retired was still in flight
            state = "completed" if retired else "started"
        elif state != "completed" and not is_p2p:
            # without `retired`, pg_status says how far each group got: entries at or below the last
            # started/completed mark take that state. gloo's marks count the backend's work sequence numbers
            # (`op_id`: point-to-point included), NCCL's the collective sequence.
            last_started, last_completed = marks.get(str(e.get("pg_id")), (-1, -1))
            mark = e.get("op_id" if gloo else "collective_seq_id")
            if isinstance(mark, int) and not isinstance(mark, bool):
                if mark <= last_completed:
                    state = "completed"
                elif state == "scheduled" and mark <= last_started:
                    state = "started"
        rows.append(
            {
                "rank": rank,
                "source": SOURCE,
                "pg_name": pg_name,
                "pg_desc": pg_desc,
                "pg_ranks": ranks,
                "group_size": len(ranks) if ranks else None,
                "op": op,
                "dtype": dtype,
                "in_nelems": in_n,
                "out_nelems": out_n,
                "bytes": nbytes,
                "seq": int(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None,
                "is_p2p": is_p2p,
                "peer": peer,
                "state": state,
                "enqueue_ns": _int_or_none(e.get("time_created_ns")),
                "start_ns": started,
                "end_ns": completed,
                "_record": e.get("record_id", len(rows)),
            }
        )
    return rows


def _table(rows: list[dict]) -> pa.Table:
    """Rows -> COLLECTIVES, with `order` = position among same (rank, pg, op) records in record order."""
    rows.sort(key=lambda r: (r["rank"], r["_record"] if isinstance(r["_record"], int) else 0))
    counters: dict[tuple, int] = {}
    for r in rows:
        key = (r["rank"], r["pg_name"], r["op"])
        r["order"] = counters.get(key, 0)
        counters[key] = r["order"] + 1
    return schema.table_from_rows(rows, schema.COLLECTIVES)


def read(path: str | Path, rank: int | None = None) -> pa.Table:
    """One dump -> a COLLECTIVES table (source "flight_recorder"), one row per record, in record order.

    `rank` defaults to the number at the end of the file name. Times: `enqueue_ns` = time_created_ns,
    `start_ns`/`end_ns` = time the watchdog discovered the start / completion (null when unknown, as in gloo).
    `state` is the entry's; gloo leaves every entry "scheduled", so there an entry it retired (its work
    ended: done or failed) is "completed" and one it had not retired "started" (the rank was in it when it
    dumped); dumps without `retired` are raised to "started"/"completed" where pg_status says the group got
    that far.
    """
    path = Path(path)
    if rank is None:
        rank = rank_from_path(path)
        if rank is None:
            raise RankError(
                f"{path}: cannot tell the rank of this Flight Recorder dump (name must end in the rank)"
            )
    dump = load_dump(path)
    try:
        return _table(_rows(dump, int(rank)))
    except (
        TypeError,
        ValueError,
        AttributeError,
        KeyError,
        IndexError,
        OverflowError,
        pa.ArrowException,
    ) as err:
        raise BadTraceError(f"{path}: malformed Flight Recorder entry ({type(err).__name__}: {err})") from err


def read_many(paths: Iterable[str | Path]) -> pa.Table:
    """Several dumps (one per rank) -> one COLLECTIVES table."""
    tables = [read(p) for p in paths]
    if not tables:
        return _table([])
    return pa.concat_tables(tables).combine_chunks().unify_dictionaries()


def read_status(path: str | Path) -> dict:
    """Dump-level facts: version, comm library version, pg_config and per-pg progress from `pg_status`.

    Returns {"version", "comm_lib_version", "pg_config": {name: {desc, ranks}}, "pg_status": {pg_id:
    {"pg_name", "pg_desc", "last_enqueued_collective", "last_started_collective",
    "last_completed_collective"}}}
    with -1 / missing values as None (gloo never reports a started collective).
    """
    path = Path(path)
    dump = load_dump(path)
    names: dict[str, tuple[str | None, str | None]] = {}
    for e in dump["entries"]:
        pg = e.get("process_group")
        if "pg_id" in e and isinstance(pg, (list, tuple)) and len(pg) >= 2:
            names[str(e["pg_id"])] = (str(pg[0]), str(pg[1]))
    status = {}
    raw = dump.get("pg_status")
    if isinstance(raw, dict):
        for pg_id, st in raw.items():
            if not isinstance(st, dict):
                continue
            item = {}
            for key in ("last_enqueued_collective", "last_started_collective", "last_completed_collective"):
                v = st.get(key)
                try:
                    n = int(v) if v is not None and not isinstance(v, bool) else None
                except (TypeError, ValueError, OverflowError):  # a string, nan, inf
                    n = None
                item[key] = n if n is not None and n >= 0 else None
            name, desc = names.get(str(pg_id), (None, None))
            status[str(pg_id)] = {"pg_name": name, "pg_desc": desc, **item}
    return {
        "version": str(dump["version"]) if "version" in dump else None,
        "comm_lib_version": dump.get("comm_lib_version", dump.get("nccl_version")) or None,
        "pg_config": pg_config(dump),
        "pg_status": status,
    }


__all__ = [
    "DTYPE_BYTES",
    "OP_NAMES",
    "load_dump",
    "loads_pickle",
    "name_pattern",
    "normalise_op",
    "pg_config",
    "rank_from_path",
    "read",
    "read_many",
    "read_status",
]
