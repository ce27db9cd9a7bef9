"""NCCL profiler-plugin traces (the example plugin of NCCL >= 2.23) -> COLLECTIVES.

One Chrome-trace JSON array per communicator per rank, `<prefix>_<commHash>_<rank>.json`, of async
`ph: b/e` pairs (matched by `cat` and `id`), closed by `{}`. `COLL` events carry SeqNum (per communicator
and per collective type), CommHash, Rank (communicator-local), Count (NCCL API count), Datatype
("ncclBfloat16"), Algorithm, Protocol, nChannels; `P2P` events carry CommHash, Rank, Peer, Count, Datatype,
nChannels; `PROXY` events carry Channel, Peer, Steps, ChunkSize, transSize. Older trees
(`ext-profiler/example/print_event.c`) write `nMaxChannels` and one `Send`/`Recv` PROXY op with nested
state timestamps; NCCL 2.28.x wrote some API-event values unquoted (`quote_bare_values`).
Timestamps are microseconds since the plugin started (steady clock), **not** epoch time: `read` returns them
as nanoseconds on that clock and `align` shifts them onto a reference (Kineto) clock by matching collective
end times. `enqueue_ns` is the COLL begin (the task enqueue), `end_ns` the COLL end; `start_ns` is null.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest.nccl_log import NCCL_DTYPE_BY_NAME, NCCL_DTYPES, NCCL_OPS, nelems

SOURCE = "nccl_plugin"
_NAME_RE = re.compile(r"_(\d+)_(\d+)\.json(?:\.gz)?$")

#: Per-event details beside the COLLECTIVES row (read_details).
DETAILS = pa.schema(
    [
        ("rank", pa.int32()),
        ("comm_hash", pa.string()),
        ("op", pa.string()),
        ("seq", pa.int64()),
        ("algorithm", pa.string()),
        ("protocol", pa.string()),
        ("n_channels", pa.int32()),
        ("proxy_steps", pa.int64()),  # sum of `Steps` over the PROXY ops that ran inside this event
        ("proxy_bytes", pa.int64()),  # sum of `transSize` over those PROXY ops
        ("pid", pa.int64()),
        ("enqueue_ns", pa.int64()),
        ("end_ns", pa.int64()),
    ]
)


def name_info(path: str | Path) -> tuple[str, int] | None:
    """(commHash, rank) from a `<prefix>_<commHash>_<rank>.json` name, else None."""
    m = _NAME_RE.search(Path(path).name)
    return (m.group(1), int(m.group(2))) if m else None


# NCCL 2.28.x's example plugin printed some values without quotes (`"Stream": 0x262ca50`, `"Stream": (nil)`,
# `"datatype": ncclFloat32`), and `%f` prints `nan`/`-nan`/`inf`: invalid JSON that current NCCL quotes.
_BARE_VALUE = re.compile(r"(:[ \t]*)(0x[0-9a-fA-F]+|\(nil\)|-?(?:nan|inf)\b|[A-Za-z_]\w*)(?=[ \t]*[,}\]])")


#: A plugin file (one process's JSON array) bigger than this, raw or gunzipped, is refused.
MAX_BYTES = 1 << 30


def quote_bare_values(text: str) -> str:
    """Quote the bare values (hex pointers, `(nil)`, enum names, nan/inf) of a plugin dump so it parses;
    `true`, `false` and `null` stay as they are."""

    def repl(m: re.Match) -> str:
        tok = m.group(2)
        return m.group(0) if tok in ("true", "false", "null") else f'{m.group(1)}"{tok}"'

    return _BARE_VALUE.sub(repl, text)


#: Plugin categories whose begin/end pairs become rows of the collectives table.
_COLL_CATS = ("COLL", "P2P")


def load_events(path: str | Path) -> list[dict]:
    """The JSON array of one plugin file; a file cut off before its closing `]` is salvaged, and the bare
    values of NCCL 2.28.x's example plugin (`"Stream": 0x..`, `"datatype": ncclFloat32`) are accepted."""
    return _load_events(path)[0]


def cut_note(path: str | Path) -> str | None:
    """For a plugin file cut mid-write (no closing `]`): what was read and what was lost, for the run's
    warnings; None for a whole file."""
    events, cut = _load_events(path)
    if not cut:
        return None
    ended = {(e.get("pid"), e.get("id")) for e in events if e.get("ph") == "e"}
    open_ = sum(
        1
        for e in events
        if e.get("ph") == "b" and e.get("cat") in _COLL_CATS and (e.get("pid"), e.get("id")) not in ended
    )
    return (
        f"{Path(path).name}: NCCL profiler-plugin file cut mid-write: read the {len(events):,} events before "
        f"the cut; {open_:,} collective{'' if open_ == 1 else 's'} whose end was lost have no row, and any "
        "after the cut are missing"
    )


def _load_events(path: str | Path) -> tuple[list[dict], bool]:
    """load_events, and whether the file was cut (its array not closed: the events before the cut)."""
    from tracelens.ingest.sniff import check_first_byte, gunzip_bounded

    path = Path(path)
    check_first_byte(path, b"[", "not an NCCL profiler-plugin trace (expected a JSON array)")  # fail fast
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as err:
        raise BadTraceError(f"{path}: cannot read ({err.strerror or err})") from err
    if len(raw) > MAX_BYTES:
        raise BadTraceError(f"{path}: larger than {MAX_BYTES >> 20} MiB, not an NCCL profiler-plugin trace")
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_bounded(raw, path, MAX_BYTES)  # bounded: stops as soon as the output passes MAX_BYTES
    text = raw.decode("utf-8", errors="replace").strip()
    if not text.startswith("["):
        raise BadTraceError(f"{path}: not an NCCL profiler-plugin trace (expected a JSON array)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise BadTraceError(
            f"{path}: invalid JSON in NCCL profiler-plugin trace (nested too deeply)"
        ) from None
    except ValueError:
        text = quote_bare_values(text)
        data = None
    if data is None:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    was_cut = False
    if data is None:
        cut = text.rfind("},")
        try:
            data = json.loads(text[: cut + 1] + "]") if cut > 0 else None
        except (ValueError, RecursionError):
            data = None
        if data is None:
            raise BadTraceError(f"{path}: invalid JSON in NCCL profiler-plugin trace") from None
        was_cut = True
    if not isinstance(data, list):
        raise BadTraceError(f"{path}: not an NCCL profiler-plugin trace (expected a JSON array)")
    return [e for e in data if isinstance(e, dict) and e], was_cut


def _pairs(events: list[dict]) -> pd.DataFrame:
    """Begin/end pairs as one frame: cat, name, id, begin ts (ns), end ts (ns), args (of the begin event)."""
    rows_b = [e for e in events if e.get("ph") == "b"]
    rows_e = [e for e in events if e.get("ph") == "e"]
    b = pd.DataFrame(
        {
            "cat": [e.get("cat") for e in rows_b],
            "name": [e.get("name") for e in rows_b],
            "id": [e.get("id") for e in rows_b],
            "pid": [e.get("pid") for e in rows_b],
            "ts": [e.get("ts") for e in rows_b],
            "args": [e.get("args") or {} for e in rows_b],
        }
    )
    e = pd.DataFrame(
        {
            "cat": [x.get("cat") for x in rows_e],
            "name": [x.get("name") for x in rows_e],
            "id": [x.get("id") for x in rows_e],
            "ts_end": [x.get("ts") for x in rows_e],
        }
    )
    if b.empty:
        return b.assign(ts_end=pd.Series(dtype=float))
    # The same (cat, name, id) can open several times (the plugin reuses ids for ScheduleX/ProgressX and
    # NET steps): pair the k-th begin with the k-th end of the same key.
    b["k"] = b.groupby(["cat", "name", "id"], dropna=False).cumcount()
    e["k"] = e.groupby(["cat", "name", "id"], dropna=False).cumcount()
    out = b.merge(e, on=["cat", "name", "id", "k"], how="left")
    out["begin_ns"] = _us_to_ns(out["ts"])
    out["end_ns"] = _us_to_ns(out["ts_end"])
    return out


def _us_to_ns(col: pd.Series) -> pd.Series:
    """µs values (numbers or numeric strings) to nullable int64 ns; non-numbers, NaN, infinities and
    values beyond int64 become null."""
    v = pd.to_numeric(col, errors="coerce").astype("float64") * 1000.0
    v = v.where(np.isfinite(v) & (v.abs() < 9.0e18))
    return np.round(v).astype("Int64")


#: What a damaged plugin file (values of unexpected types) makes the parsing below raise.
_MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, pa.ArrowException)


def _collect(path: Path, rank: int | None, comm_ranks: dict[str, list[int]] | None):
    events = load_events(path)
    try:
        return _collect_events(path, events, rank, comm_ranks)
    except _MALFORMED as err:
        raise BadTraceError(
            f"{path}: malformed NCCL profiler-plugin event ({type(err).__name__}: {err})"
        ) from None


def _collect_events(
    path: Path, events: list[dict], rank: int | None, comm_ranks: dict[str, list[int]] | None
):
    p = _pairs(events)
    info = name_info(path)
    rows: list[dict] = []
    details: list[dict] = []
    if p.empty:
        return rows, details
    p = p[p["cat"].isin(["COLL", "P2P", "PROXY"])]
    ops = p[p["cat"].isin(["COLL", "P2P"])].sort_values("begin_ns", kind="stable")
    proxies = p[p["cat"] == "PROXY"]
    prox_b = proxies["begin_ns"].astype("float64").to_numpy()
    prox_steps = np.array([a.get("Steps", 0) or 0 for a in proxies["args"]], dtype=np.int64)
    prox_bytes = np.array([a.get("transSize", 0) or 0 for a in proxies["args"]], dtype=np.int64)
    # ProgressSend/ProgressRecv (current example plugin); older trees print one `Send` / `Recv` PROXY op
    names = proxies["name"].astype(str)
    prox_progress = (names.str.startswith("Progress") | names.isin(["Send", "Recv"])).to_numpy()
    order_ctr: dict[tuple, int] = {}
    for r in ops.itertuples(index=False):
        a = r.args
        comm_hash = str(a.get("CommHash", info[0] if info else ""))
        local = a.get("Rank", info[1] if info else None)
        members = (comm_ranks or {}).get(comm_hash)
        glob_rank = rank
        if glob_rank is None:
            glob_rank = members[local] if (members and local is not None and local < len(members)) else local
        op = NCCL_OPS.get(str(r.name), str(r.name).lower())
        is_p2p = r.cat == "P2P" or op in ("send", "recv")
        dt_code = NCCL_DTYPE_BY_NAME.get(str(a.get("Datatype")))
        dt = NCCL_DTYPES.get(dt_code) if dt_code is not None else None
        count = int(a.get("Count", 0) or 0)
        nranks = len(members) if members else None
        in_n, out_n = nelems(op, count, nranks)
        big = max((n for n in (in_n, out_n) if n is not None), default=None)
        peer = a.get("Peer") if is_p2p else None
        if peer is not None and members and 0 <= int(peer) < len(members):
            peer = members[int(peer)]
        seq = a.get("SeqNum")
        begin = None if pd.isna(r.begin_ns) else int(r.begin_ns)
        end = None if pd.isna(r.end_ns) else int(r.end_ns)
        okey = (comm_hash, op)
        rows.append(
            {
                "rank": glob_rank,
                "source": SOURCE,
                "pg_name": comm_hash,
                "pg_desc": None,
                "pg_ranks": members,
                "group_size": nranks,
                "op": op,
                "dtype": dt[1] if dt else (str(a.get("Datatype")) if a.get("Datatype") else None),
                "in_nelems": in_n,
                "out_nelems": out_n,
                "bytes": big * dt[2] if (big is not None and dt) else None,
                "seq": int(seq) if seq is not None else None,
                "order": order_ctr.get(okey, 0),
                "is_p2p": is_p2p,
                "peer": int(peer) if peer is not None else None,
                "state": "completed" if end is not None else "started",
                "enqueue_ns": begin,
                "start_ns": None,
                "end_ns": end,
                "step": None,
                "process": f"pid {int(r.pid)}" if _is_int(r.pid) else None,
            }
        )
        order_ctr[okey] = order_ctr.get(okey, 0) + 1
        inside = (prox_b >= (begin or 0)) & (prox_b <= (end if end is not None else np.inf)) & prox_progress
        details.append(
            {
                "rank": glob_rank,
                "comm_hash": comm_hash,
                "op": op,
                "seq": int(seq) if seq is not None else None,
                "algorithm": a.get("Algorithm"),
                "protocol": a.get("Protocol"),
                "n_channels": a.get("nChannels", a.get("nMaxChannels")),  # older trees: nMaxChannels
                "proxy_steps": int(prox_steps[inside].sum()) if len(prox_b) else None,
                "proxy_bytes": int(prox_bytes[inside].sum()) if len(prox_b) else None,
                "pid": int(r.pid) if _is_int(r.pid) else None,
                "enqueue_ns": begin,
                "end_ns": end,
            }
        )
    return rows, details


def _is_int(v) -> bool:
    """A pid as the plugin prints it (an integer; pandas may hand it over as numpy int or float)."""
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, int | np.integer):
        return True
    return isinstance(v, float | np.floating) and np.isfinite(v) and float(v).is_integer()


def _table(rows: list[dict]) -> pa.Table:
    return schema.table_from_rows(rows, schema.COLLECTIVES)


def read(
    path: str | Path, rank: int | None = None, comm_ranks: dict[str, list[int]] | None = None
) -> pa.Table:
    """One plugin file -> COLLECTIVES (source "nccl_plugin"), times on the plugin's own clock.

    `rank`: the global rank to write (default: the communicator-local `Rank`, which is global for the
    world communicator). `comm_ranks`: {commHash: global ranks in local-rank order}, which gives global
    peers, pg_ranks, group_size and the AllGather/ReduceScatter totals (`read_many` builds it).
    """
    rows, _ = _collect(Path(path), rank, comm_ranks)
    try:
        return _table(rows)
    except _MALFORMED as err:
        raise BadTraceError(
            f"{path}: malformed NCCL profiler-plugin event ({type(err).__name__}: {err})"
        ) from None


def read_details(path: str | Path, rank: int | None = None, comm_ranks: dict | None = None) -> pa.Table:
    """Per COLL/P2P event: algorithm, protocol, channels and proxy steps/bytes (schema DETAILS)."""
    _, details = _collect(Path(path), rank, comm_ranks)
    try:
        return pa.Table.from_pylist(details, schema=DETAILS)
    except _MALFORMED as err:
        raise BadTraceError(
            f"{path}: malformed NCCL profiler-plugin event ({type(err).__name__}: {err})"
        ) from None


def _file_meta(path: Path) -> tuple[int | str | None, str | None, int | None]:
    """(pid, commHash, local rank) of a plugin file, from its first COLL/P2P event (or its name)."""
    info = name_info(path)
    for e in load_events(path):
        if e.get("cat") in ("COLL", "P2P") and e.get("ph") == "b":
            args = e.get("args")
            a = args if isinstance(args, dict) else {}
            pid, r = e.get("pid"), a.get("Rank")
            pid = pid if isinstance(pid, int | str) and not isinstance(pid, bool) else None
            r = r if type(r) is int and 0 <= r < 2**31 else None
            return pid, str(a.get("CommHash", info[0] if info else "")), r
    return None, (info[0] if info else None), (info[1] if info else None)


def comm_membership(paths: Iterable[str | Path]) -> dict[str, list[int]]:
    """{commHash: global ranks by local rank} from a set of plugin files of one run.

    Each process (pid) writes one file per communicator; its global rank is its local rank in the largest
    communicator it belongs to (the world). Communicators whose members are not all present are left out.
    """
    metas = [_file_meta(Path(p)) for p in paths]
    size: dict[str, int] = {}
    for _, h, _ in metas:
        if h is not None:
            size[h] = size.get(h, 0) + 1
    world_of_pid: dict[int | str, tuple[int, int]] = {}
    for pid, h, r in metas:
        if pid is None or h is None or r is None:
            continue
        if pid not in world_of_pid or size[h] > world_of_pid[pid][0]:
            world_of_pid[pid] = (size[h], int(r))
    comms: dict[str, dict[int, int]] = {}
    for pid, h, r in metas:
        if pid is None or h is None or r is None:
            continue
        comms.setdefault(h, {})[int(r)] = world_of_pid[pid][1]
    out = {}
    for h, m in comms.items():
        if sorted(m) == list(range(len(m))):
            out[h] = [m[i] for i in range(len(m))]
    return out


def read_many(paths: Iterable[str | Path]) -> pa.Table:
    """All plugin files of a run -> one COLLECTIVES table with global ranks, peers and group sizes."""
    paths = [Path(p) for p in paths]
    members = comm_membership(paths)
    tables = [read(p, comm_ranks=members) for p in paths]
    if not tables:
        return _table([])
    return pa.concat_tables(tables).combine_chunks().unify_dictionaries()


def align(coll_plugin: pa.Table, coll_reference: pa.Table, tolerance_ns: int | None = None) -> pa.Table:
    """Shift each rank's plugin times onto the reference clock (e.g. Kineto's) by matching collective ends.

    For every rank, candidate offsets pair a plugin collective with each reference collective of the same op
    and byte count; the offset under which most plugin collective ends land within `tolerance_ns` of a
    reference end wins (median of the matched differences). Ranks without a match keep their times; their
    rows are unchanged. Returns the plugin table with enqueue/start/end shifted.
    """
    pl = coll_plugin.to_pandas()
    ref = coll_reference.to_pandas()
    shifts = np.zeros(len(pl), dtype=np.int64)
    for rank, grp in pl.groupby("rank", sort=False):
        rr = ref[(ref["rank"] == rank) & ref["end_ns"].notna()]
        g = grp[grp["end_ns"].notna()]
        if rr.empty or g.empty:
            continue
        ref_end = np.sort(rr["end_ns"].to_numpy(np.int64))
        pl_end = g["end_ns"].to_numpy(np.int64)
        tol = tolerance_ns
        if tol is None:
            span = np.diff(ref_end)
            tol = int(max(1000, np.median(span[span > 0]) / 4)) if (span > 0).any() else 1_000_000
        # candidate offsets: the first few plugin collectives against every reference one of the same kind
        sig_ref = rr["op"].astype(str) + "|" + rr["bytes"].astype(str)
        sig_pl = g["op"].astype(str) + "|" + g["bytes"].astype(str)
        cands = []
        for i in range(min(4, len(g))):
            same = rr["end_ns"].to_numpy(np.int64)[(sig_ref == sig_pl.iloc[i]).to_numpy()]
            cands.append(same - pl_end[i])
        cand = np.unique(np.concatenate(cands)) if cands else np.array([], dtype=np.int64)
        if cand.size == 0:
            continue
        best, best_score = cand[0], -1  # the first candidate always replaces it (its score is >= 0)
        for off in cand:
            x = pl_end + off
            idx = (
                np.clip(np.searchsorted(ref_end, x), 1, len(ref_end) - 1)
                if len(ref_end) > 1
                else np.zeros(len(x), dtype=np.int64)
            )
            near = (
                np.minimum(np.abs(ref_end[idx] - x), np.abs(ref_end[idx - 1] - x))
                if len(ref_end) > 1
                else (np.abs(ref_end[0] - x))
            )
            score = int((near <= tol).sum())
            if score > best_score:
                best, best_score = off, score
        x = pl_end + best
        if len(ref_end) > 1:
            idx = np.clip(np.searchsorted(ref_end, x), 1, len(ref_end) - 1)
            nearest = np.where(
                np.abs(ref_end[idx] - x) < np.abs(ref_end[idx - 1] - x), ref_end[idx], ref_end[idx - 1]
            )
        else:
            nearest = np.full(len(x), ref_end[0])
        ok = np.abs(nearest - x) <= tol
        off = int(best + np.median(nearest[ok] - x[ok])) if ok.any() else int(best)
        pos = pl.index.get_indexer(grp.index)
        shifts[pos] = off
    out = coll_plugin
    for col in ("enqueue_ns", "start_ns", "end_ns"):
        arr = out.column(col)
        shifted = pc.add(arr, pa.array(shifts, pa.int64()))
        out = out.set_column(out.schema.get_field_index(col), col, shifted)
    return out


def align_ranks(coll_plugin: pa.Table, reference_rank: int | None = None) -> pa.Table:
    """Without a Kineto reference: shift every rank's plugin clock onto one rank's (default the lowest).

    The same collective (same communicator, op and SeqNum) ends at the same moment on all its members, so
    the offset between two ranks is the median difference of their end times over the collectives they
    share; ranks that share nothing with the reference are reached through ranks that do.
    """
    df = coll_plugin.select(["rank", "pg_name", "op", "seq", "is_p2p", "end_ns"]).to_pandas()
    df = df[~df["is_p2p"].fillna(False).astype(bool) & df["end_ns"].notna() & df["seq"].notna()]
    df = df.assign(pg_name=df["pg_name"].astype(str), op=df["op"].astype(str))
    ranks = sorted(
        int(r) for r in pd.unique(coll_plugin.column("rank").drop_null().to_numpy(zero_copy_only=False))
    )
    df = df[df["rank"].notna()]  # a rank the file did not say: left on its own clock
    if not ranks:
        return coll_plugin
    ref = ranks[0] if reference_rank is None else int(reference_rank)
    offsets: dict[int, int] = {ref: 0}
    key = ["pg_name", "op", "seq"]
    frontier = [ref]
    while frontier:
        a = frontier.pop()
        mine = df[df["rank"] == a][key + ["end_ns"]]
        pairs = mine.merge(df[~df["rank"].isin(list(offsets))], on=key, suffixes=("_a", ""))
        if pairs.empty:
            continue
        diff = (
            (pairs["end_ns_a"].astype("int64") - pairs["end_ns"].astype("int64"))
            .groupby(pairs["rank"])
            .median()
        )
        for r, d in diff.items():
            offsets[int(r)] = offsets[a] + int(round(d))
            frontier.append(int(r))
    rank_col = pd.Series(coll_plugin.column("rank").to_numpy(zero_copy_only=False))
    lookup = rank_col.map(offsets).fillna(0).to_numpy(np.int64)
    out = coll_plugin
    for col in ("enqueue_ns", "start_ns", "end_ns"):
        idx = out.schema.get_field_index(col)
        out = out.set_column(idx, col, pc.add(out.column(col), pa.array(lookup, pa.int64())))
    return out


__all__ = [
    "DETAILS",
    "align",
    "align_ranks",
    "comm_membership",
    "load_events",
    "name_info",
    "quote_bare_values",
    "read",
    "read_details",
    "read_many",
]
