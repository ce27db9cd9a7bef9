"""Write the NCCL-side inputs of a simulated run: Flight Recorder dumps (JSON and pickle), NCCL
profiler-plugin traces and NCCL_DEBUG=INFO logs, all from the run's COLLECTIVES table, optionally with a
planted hang.

Why: these formats are what users have when a run hangs or a collective is slow; tests need them with
known truth. Each writer follows the real producer's layout (docs/nccl-inputs.md):
- `flight_recorder/json/nccl_trace_rank_<r>.json` and `flight_recorder/pickle/nccl_trace_rank_<r>`
  (version "2.10" keys; pickle of plain containers only, like `_dump_fr_trace`);
- `nccl_profiler/ncclprof_<commHash>_<localRank>.json` (one Chrome-trace array per communicator per rank,
  microseconds since a per-process plugin start, closed by `{}`);
- `nccl_logs/nccl.<host>.<pid>.log` (INIT `ncclCommInitRank ... Init COMPLETE` lines, COLL call lines).

Hang fault `hang=(rank, seq[, pg_name])`: `rank` never joins collective `seq` of the group (default: the
largest group holding the rank) and records nothing after it; every other rank has that collective
`started` and never completed, and nothing it enqueued after the point where the collective would have
ended. Truth is returned (and written to `nccl_truth.json`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa

from tracelens.errors import BadInputError
from tracelens.ingest.nccl_log import NCCL_DTYPES, OP_TO_NCCL, TORCH_TO_NCCL_DTYPE, api_count

FORMATS = ("fr_json", "fr_pickle", "plugin", "log")
_FR_OP = {
    "allreduce": "all_reduce",
    "allgather": "_allgather_base",
    "reducescatter": "_reduce_scatter_base",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "gather": "gather",
    "scatter": "scatter",
}
HOST_RANKS = 8  # ranks per simulated host (for log names and cudaDev)


def comm_hash(pg_name: str, ranks: Iterable[int] | None) -> int:
    """Deterministic 64-bit communicator hash of a process group (what the plugin prints as CommHash)."""
    key = f"{pg_name}|{','.join(map(str, ranks or []))}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def _frame(coll: pa.Table) -> pd.DataFrame:
    df = coll.to_pandas()
    for c in ("pg_name", "pg_desc", "op", "dtype", "state", "source"):
        df[c] = df[c].astype(object)
    df["pg_ranks"] = [list(map(int, x)) if x is not None else None for x in df["pg_ranks"]]
    df = df.sort_values(["rank", "enqueue_ns", "order"], kind="stable").reset_index(drop=True)
    return df


def _groups(df: pd.DataFrame) -> dict[str, dict]:
    """{pg_name: {"desc", "ranks"}}; ranks from pg_ranks, else from the ranks that called into the group."""
    out: dict[str, dict] = {}
    for name, g in df.groupby("pg_name", sort=True):
        ranks = next((r for r in g["pg_ranks"] if r), None) or sorted(int(r) for r in g["rank"].unique())
        desc = next((d for d in g["pg_desc"] if isinstance(d, str) and d), None)
        out[str(name)] = {
            "desc": desc or ("default_pg" if str(name) == "0" else "undefined"),
            "ranks": sorted(ranks),
        }
    return out


def _assign_seq(df: pd.DataFrame) -> pd.DataFrame:
    """FR sequence ids per (rank, pg): collective_seq_id counts collectives (from 1), p2p_seq_id p2p ops."""
    df = df.copy()
    p2p = df["is_p2p"].fillna(False).astype(bool) | df["op"].isin(["send", "recv"])
    df["x_p2p"] = p2p
    df["x_coll_seq"] = df["seq"].where(~p2p).astype("Float64")
    miss = df["x_coll_seq"].isna() & ~p2p
    if miss.any():
        counted = df[~p2p].groupby(["rank", "pg_name"]).cumcount().reindex(df.index) + 1
        df.loc[miss, "x_coll_seq"] = counted[miss]
    p2p_count = df[p2p].groupby(["rank", "pg_name"]).cumcount().reindex(df.index)
    df["x_p2p_seq"] = (p2p_count.fillna(-1) + 1).astype("int64")
    # p2p records carry the group's current collective seq (as ProcessGroupNCCL does)
    df["x_coll_seq"] = df.groupby(["rank", "pg_name"])["x_coll_seq"].ffill().fillna(0).astype("int64")
    return df


def apply_hang(df: pd.DataFrame, groups: dict, hang: tuple) -> tuple[pd.DataFrame, dict]:
    """Plant the hang on the frame (see module doc); returns the new frame (with `x_state`) and the truth."""
    rank, seq = int(hang[0]), int(hang[1])
    coll_rows = ~df["x_p2p"] & (df["x_coll_seq"] == seq)
    if len(hang) > 2 and hang[2] is not None:
        pg = str(hang[2])
        if pg not in groups:
            raise BadInputError(f"--hang: no process group {pg!r} in this run")
    else:
        # the largest group of that rank that has a collective #seq on it (ties: the lowest pg name)
        have = set(df.loc[coll_rows & (df["rank"] == rank), "pg_name"].astype(str))
        mine = [n for n, g in groups.items() if rank in g["ranks"] and n in have]
        if not mine:
            raise BadInputError(f"--hang: rank {rank} has no collective #{seq} in any process group")
        pg = min(mine, key=lambda n: (-len(groups[n]["ranks"]), len(n), n))
    hit = coll_rows & (df["pg_name"] == pg)
    if not (hit & (df["rank"] == rank)).any():
        raise BadInputError(f"--hang: rank {rank} has no collective #{seq} on pg {pg}")
    hung = df[hit]
    t_cut = int(hung["end_ns"].max())
    df = df.copy()
    df["x_state"] = "completed"
    t_rank = int(hung.loc[hung["rank"] == rank, "enqueue_ns"].iloc[0])
    keep = ~((df["rank"] == rank) & (df["enqueue_ns"] >= t_rank))
    keep &= (df["rank"] == rank) | (df["enqueue_ns"] < t_cut)
    others = hit & (df["rank"] != rank)
    df.loc[others, "x_state"] = "started"
    df.loc[others, "end_ns"] = pd.NA
    late = (df["end_ns"].fillna(t_cut + 1) > t_cut) & ~others & (df["rank"] != rank)
    df.loc[late & (df["start_ns"].fillna(t_cut + 1) < t_cut), "x_state"] = "started"
    df.loc[late & ~(df["start_ns"].fillna(t_cut + 1) < t_cut), "x_state"] = "scheduled"
    df.loc[late, "end_ns"] = pd.NA
    df.loc[late & (df["x_state"] == "scheduled"), "start_ns"] = pd.NA
    df = df[keep].reset_index(drop=True)
    op = str(hung["op"].iloc[0])
    waiting = len(groups[pg]["ranks"]) - 1
    truth = {
        "rank": rank,
        "seq": seq,
        "pg_name": pg,
        "pg_desc": groups[pg]["desc"],
        "op": op,
        "waiting_ranks": sorted(int(r) for r in hung["rank"].unique() if r != rank),
        "message": (
            f"rank {rank} never joined {op} #{seq} on pg {pg} ({groups[pg]['desc']}); "
            f"{waiting} rank{'s' if waiting != 1 else ''} waited"
        ),
    }
    return df, truth


def _fr_entries(d: pd.DataFrame, groups: dict, pg_ids: dict) -> list[dict]:
    entries = []
    op_ids: dict[str, int] = {}
    for i, r in enumerate(d.itertuples(index=False)):
        pg = str(r.pg_name)
        ranks = groups[pg]["ranks"]
        name = _FR_OP.get(r.op, str(r.op))
        if r.x_p2p:
            me = ranks.index(int(r.rank)) if int(r.rank) in ranks else int(r.rank)
            other = ranks.index(int(r.peer)) if (pd.notna(r.peer) and int(r.peer) in ranks) else -1
            name = f"send {me}->{other}" if r.op == "send" else f"recv {me}<-{other}"
        op_ids[pg] = op_ids.get(pg, 0) + 1
        n_in = int(r.in_nelems) if pd.notna(r.in_nelems) else 0
        n_out = int(r.out_nelems) if pd.notna(r.out_nelems) else 0
        dt = r.dtype if isinstance(r.dtype, str) else "Float"
        state = r.x_state
        start = int(r.start_ns) if (pd.notna(r.start_ns) and state != "scheduled") else None
        end = int(r.end_ns) if (pd.notna(r.end_ns) and state == "completed") else None
        entries.append(
            {
                "record_id": i,
                "pg_id": pg_ids[pg],
                "process_group": (pg, groups[pg]["desc"]),
                "thread_name": "pt_main_thread",
                "thread_id": "140000000000000",
                "collective_seq_id": int(r.x_coll_seq),
                "p2p_seq_id": int(r.x_p2p_seq),
                "op_id": op_ids[pg],
                "profiling_name": f"nccl:{name}",
                "time_created_ns": int(r.enqueue_ns),
                "duration_ms": (end - start) / 1e6 if (start is not None and end is not None) else None,
                "input_sizes": [[n_in]],
                "input_dtypes": [dt],
                "output_sizes": [[n_out]],
                "output_dtypes": [dt],
                "state": state,
                "time_discovered_started_ns": start,
                "time_discovered_completed_ns": end,
                "retired": state == "completed",
                "timeout_ms": 600000,
                "is_p2p": bool(r.x_p2p),
            }
        )
    return entries


def _fr_dump(rank: int, d: pd.DataFrame, groups: dict, pg_ids: dict, as_json: bool) -> dict:
    entries = _fr_entries(d, groups, pg_ids)
    mine = {n: g for n, g in groups.items() if rank in g["ranks"]}
    status = {}
    for n in mine:
        e = [x for x in entries if x["process_group"][0] == n and not x["is_p2p"]]
        enq = max((x["collective_seq_id"] for x in e), default=-1)
        sta = max((x["collective_seq_id"] for x in e if x["state"] in ("started", "completed")), default=-1)
        com = max((x["collective_seq_id"] for x in e if x["state"] == "completed"), default=-1)
        vals = {
            "last_enqueued_collective": enq,
            "last_started_collective": sta,
            "last_completed_collective": com,
        }
        status[str(pg_ids[n])] = {k: str(v) for k, v in vals.items()} if as_json else vals
    dump = {
        "version": "2.10",
        "comm_lib_version": "2.27.5",
        "pg_config": {n: {"name": n, "desc": g["desc"], "ranks": str(g["ranks"])} for n, g in mine.items()},
        "pg_status": status,
        "entries": entries,
    }
    if as_json:
        for entry in entries:
            entry["process_group"] = list(entry["process_group"])
            for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                entry[k] = entry[k] or 0
            if entry["duration_ms"] is None:
                del entry["duration_ms"]
        dump["nccl_comm_state"] = {}
    return dump


def _event(name: str, cat: str, ph: str, eid: int, pid: int, ts_us: float, args: dict | None = None) -> str:
    """One event line exactly as the plugin's print_event.cc writes it (ts with %f, `args` only on begins)."""
    line = f'{{"name": "{name}", "cat": "{cat}", "ph": "{ph}", "id": {eid}, "pid": {pid}, "tid": 1, '
    line += f'"ts": {ts_us:f}'
    if args is not None:
        line += ', "args": ' + json.dumps(args)
    return line + "},"


def _plugin_files(run_dir: Path, df: pd.DataFrame, groups: dict) -> list[Path]:
    out_dir = run_dir / "nccl_profiler"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    done = df[df["end_ns"].notna() & (df["x_state"] == "completed")]
    for rank, d in done.groupby("rank", sort=True):
        rank = int(rank)
        pid = 40000 + rank
        t0 = int(df.loc[df["rank"] == rank, "enqueue_ns"].min()) - 5_000_000 - 1_337_000 * rank  # plugin init
        for pg, g in d.groupby("pg_name", sort=True):
            ranks = groups[str(pg)]["ranks"]
            local = ranks.index(rank)
            h = comm_hash(str(pg), ranks)
            lines = []
            seqnum: dict[str, int] = {}
            for k, r in enumerate(g.itertuples(index=False)):
                func = OP_TO_NCCL.get(r.op, "AllReduce")
                dt = NCCL_DTYPES[
                    TORCH_TO_NCCL_DTYPE.get(r.dtype if isinstance(r.dtype, str) else "Float", 7)
                ][0]
                count = api_count(r.op, int(r.in_nelems or 0), int(r.out_nelems or 0))
                b = (int(r.enqueue_ns) - t0) / 1000.0
                e = (int(r.end_ns) - t0) / 1000.0
                if r.x_p2p:
                    peer = ranks.index(int(r.peer)) if (pd.notna(r.peer) and int(r.peer) in ranks) else -1
                    cat = "P2P"
                    args = {
                        "CommHash": h,
                        "Rank": local,
                        "Peer": peer,
                        "Count": count,
                        "Datatype": dt,
                        "nChannels": 2,
                    }
                else:
                    cat = "COLL"
                    s = seqnum.get(func, 0)
                    seqnum[func] = s + 1
                    args = {"SeqNum": s, "CommHash": h, "Rank": local, "Count": count, "Datatype": dt,
                            "Algorithm": "Ring", "Protocol": "Simple", "nChannels": 4}  # fmt: skip
                lines.append(_event(func, cat, "b", k, pid, b, args))
                if pd.notna(r.start_ns):
                    ps = (int(r.start_ns) - t0) / 1000.0
                    nbytes = int(r.bytes or 0)
                    steps = max(1, -(-nbytes // (4 << 20)))
                    proxy = {"Channel": 0, "Peer": (local + 1) % len(ranks), "Steps": steps,
                             "ChunkSize": 524288, "transSize": nbytes}  # fmt: skip
                    lines.append(_event("ProgressSend", "PROXY", "b", k, pid, ps, proxy))
                    lines.append(_event("ProgressSend", "PROXY", "e", k, pid, e))
                lines.append(_event(func, cat, "e", k, pid, e))
            path = out_dir / f"ncclprof_{h}_{local}.json"
            path.write_text("[\n" + "\n".join(lines) + "\n{}]\n")
            written.append(path)
    return written


def _log_files(run_dir: Path, df: pd.DataFrame, groups: dict) -> list[Path]:
    out_dir = run_dir / "nccl_logs"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in sorted(int(r) for r in df["rank"].unique()):
        d = df[df["rank"] == rank]
        host = f"node{rank // HOST_RANKS:03d}"
        pid, tid, dev = 40000 + rank, 50000 + rank, rank % HOST_RANKS
        pre = f"{host}:{pid}:{tid} [{dev}] NCCL INFO "
        lines = [pre + "NCCL version 2.27.5+cuda12.9"]
        comm_ptr = {}
        for j, pg in enumerate(
            sorted({str(p) for p in d["pg_name"]} | {n for n, g in groups.items() if rank in g["ranks"]})
        ):
            ranks = groups[pg]["ranks"]
            comm_ptr[pg] = f"0x55{rank:04x}{j:04x}a0"
            lines.append(
                pre + f"ncclCommInitRank comm {comm_ptr[pg]} rank {ranks.index(rank)} nranks {len(ranks)} "
                f"cudaDev {dev} nvmlDev {dev} busId {0x18000 + dev * 0x11000:x} "
                f"commId {comm_hash(pg, ranks):#x} - Init COMPLETE"
            )
        op_count: dict[str, int] = {}
        for r in d.itertuples(index=False):
            pg = str(r.pg_name)
            ranks = groups[pg]["ranks"]
            func = OP_TO_NCCL.get(r.op, "AllReduce")
            dt = TORCH_TO_NCCL_DTYPE.get(r.dtype if isinstance(r.dtype, str) else "Float", 7)
            count = api_count(r.op, int(r.in_nelems or 0), int(r.out_nelems or 0))
            root = ranks.index(int(r.peer)) if (r.x_p2p and pd.notna(r.peer) and int(r.peer) in ranks) else 0
            oc = op_count.get(pg, 0)
            op_count[pg] = oc + 1
            lines.append(
                pre
                + f"{func}: opCount {oc:x} sendbuff 0x7f{rank:02x}00001000 recvbuff 0x7f{rank:02x}00002000 "
                f"count {count} datatype {dt} op 0 root {root} comm {comm_ptr[pg]} [nranks={len(ranks)}] "
                f"stream 0x55{rank:04x}0000b0"
            )
        path = out_dir / f"nccl.{host}.{pid}.log"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def write_nccl_outputs(
    run_dir: str | Path,
    coll: pa.Table,
    hang: tuple | None = None,
    formats: Iterable[str] = FORMATS,
) -> dict:
    """Write the chosen NCCL-side formats for the run whose collectives are `coll` (schema.COLLECTIVES).

    `coll` rows need rank, pg_name, op, dtype, in/out nelems, enqueue/start/end ns (and peer for p2p);
    `seq` is used as the collective seq when present.
    Returns {"files": {format: [paths]}, "hang": truth or None}.
    """
    run_dir = Path(run_dir)
    formats = tuple(formats)
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise BadInputError(f"unknown NCCL output formats {sorted(unknown)}; choose from {FORMATS}")
    df = _assign_seq(_frame(coll))
    groups = _groups(df)
    pg_ids = {n: i for i, n in enumerate(sorted(groups, key=lambda n: (len(n), n)))}
    truth = None
    if hang is not None:
        df, truth = apply_hang(df, groups, hang)
    else:
        df = df.assign(x_state="completed")
    files: dict[str, list[str]] = {}
    for fmt in ("fr_json", "fr_pickle"):
        if fmt not in formats:
            continue
        sub = run_dir / "flight_recorder" / ("json" if fmt == "fr_json" else "pickle")
        sub.mkdir(parents=True, exist_ok=True)
        files[fmt] = []
        for rank in sorted(int(r) for r in df["rank"].unique()):
            dump = _fr_dump(rank, df[df["rank"] == rank], groups, pg_ids, as_json=fmt == "fr_json")
            if fmt == "fr_json":
                path = sub / f"nccl_trace_rank_{rank}.json"
                path.write_text(json.dumps(dump, indent=1))
            else:
                path = sub / f"nccl_trace_rank_{rank}"
                path.write_bytes(pickle.dumps(dump, protocol=4))
            files[fmt].append(str(path))
    if "plugin" in formats:
        files["plugin"] = [str(p) for p in _plugin_files(run_dir, df, groups)]
    if "log" in formats:
        files["log"] = [str(p) for p in _log_files(run_dir, df, groups)]
    if truth is not None:
        (run_dir / "nccl_truth.json").write_text(json.dumps({"hang": truth}, indent=2) + "\n")
    return {"files": files, "hang": truth}


def write_for_run(run_dir: str | Path, hang: tuple | None = None, formats: Iterable[str] = FORMATS) -> dict:
    """NCCL outputs for a simulated run folder: read its Kineto traces, build the collectives table, write.

    This is what `tracelens simulate ... --hang RANK:SEQ` needs after the Kineto traces are written.
    """
    from tracelens.analyze.comm.collectives import collectives_from_events
    from tracelens.ingest import kineto
    from tracelens.ingest.sniff import KINETO, detect_format

    run_dir = Path(run_dir)
    files = sorted(p for p in run_dir.iterdir() if p.is_file() and detect_format(p) == KINETO)
    if not files:
        raise BadInputError(f"{run_dir}: no Kineto traces to derive NCCL outputs from")
    events = pa.concat_tables([kineto.read(f).events for f in files], promote_options="permissive")
    return write_nccl_outputs(run_dir, collectives_from_events(events), hang=hang, formats=formats)


def parse_hang(spec: str) -> tuple[int, int] | tuple[int, int, str]:
    """`RANK:SEQ` or `RANK:SEQ:PG` (the CLI's --hang) -> tuple for `write_nccl_outputs`."""
    parts = spec.split(":")
    try:
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
        if len(parts) == 3:
            return int(parts[0]), int(parts[1]), parts[2]
    except ValueError:
        pass
    raise BadInputError(f"--hang takes RANK:SEQ or RANK:SEQ:PG, got {spec!r}")


__all__ = ["FORMATS", "apply_hang", "comm_hash", "parse_hang", "write_for_run", "write_nccl_outputs"]
