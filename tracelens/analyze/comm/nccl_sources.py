"""Collective analysis of the NCCL-side sources on their own (NCCL_DEBUG logs, profiler-plugin dumps).

Pasted logs and plugin dumps often come without Kineto traces, and logs without INIT lines carry no rank:
then the unit of analysis is the *process* (`process` column: "host:pid" for logs, "pid N" for the plugin),
and a rank that no source states stays unknown. Per source this module gives:
- `by_op`: calls, instances, bytes and, where the source has times (the plugin), the median bus bandwidth;
- `processes`: one row per process (rank when known, calls, bytes, communicators, ops);
- `communicators`: one row per communicator (how it was identified, nranks, processes seen, calls);
- `diagnose_processes`: COLLECTIVE_MISMATCH / COLLECTIVE_HANG from the op sequence of each communicator,
  matched across its processes (log: opCount, several calls of one group share it; plugin: position in the
  communicator's sequence, since its SeqNum counts per collective type);
- `cross_check`: per op, calls and sizes of a source against the Kineto collectives of the same run.
Pure functions: tables in, plain dicts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.comm.collectives import busbw_factor
from tracelens.findings import finding

_SIZE_FREE_OPS = {"alltoall", "gather", "scatter", "coalesced"}
_COLS = [
    "rank", "source", "pg_name", "group_size", "op", "dtype", "in_nelems", "out_nelems", "bytes", "seq",
    "is_p2p", "state", "enqueue_ns", "start_ns", "end_ns", "process",
]  # fmt: skip


def frame(coll: pa.Table) -> pd.DataFrame:
    """COLLECTIVES -> DataFrame with plain values and `who`: the process, else `rank N` (never NaN)."""
    cols = [c for c in _COLS if c in coll.column_names]
    df = coll.select(cols).to_pandas()
    for c in ("source", "pg_name", "op", "dtype", "state", "process"):
        if c in df:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
        else:
            df[c] = None
    df["rank"] = df["rank"].astype("Int64")
    df["is_p2p"] = df["is_p2p"].fillna(False).astype(bool)
    who = df["process"].copy()
    no_proc = who.isna()
    who[no_proc] = ["rank " + str(r) if pd.notna(r) else "unknown" for r in df.loc[no_proc, "rank"]]
    df["who"] = who.astype(str)
    return df


def _label(who: str, rank: Any) -> str:  # rank: a pandas cell (int, NA or None)
    if pd.isna(rank) or who.startswith("rank "):
        return who if who.startswith("rank ") else f"process {who}"
    return f"rank {int(rank)} ({who})"


def _names(parts: list[str], rank_of: dict[str, object]) -> str:
    shown = [_label(p, rank_of.get(p)) for p in sorted(parts)]
    if len(shown) > 6:
        return ", ".join(shown[:6]) + f", ... ({len(shown)} processes)"
    return ", ".join(shown)


def _key_positions(df: pd.DataFrame) -> pd.Series:
    """A sortable position of each collective row in its communicator's sequence, equal across members.

    Logs: opCount (the calls of one group share it, so the k-th call of an opCount counts too);
    plugin: SeqNum counts per collective type, so the position is the row's index in the communicator's
    enqueue order on that process. Other sources: their seq."""
    out = pd.Series(np.nan, index=df.index)
    log = df["source"].eq("nccl_log") & df["seq"].notna()
    if log.any():
        d = df[log]
        k = d.groupby(["who", "pg_name", "seq"], sort=False).cumcount()
        out[log] = d["seq"].astype("int64") * 4096 + k
    plug = df["source"].eq("nccl_plugin")
    if plug.any():
        d = df[plug].copy()
        d["_t"] = d["enqueue_ns"].astype("Float64")
        d = d.sort_values(["who", "pg_name", "_t"], kind="stable", na_position="last")
        out[d.index] = d.groupby(["who", "pg_name"], sort=False).cumcount()
    rest = ~(log | plug) & df["seq"].notna()
    out[rest] = df.loc[rest, "seq"].astype("int64")
    return out


def _seq_text(source: str, pos: int, seq: Any) -> str:  # seq: a pandas cell
    if source == "nccl_log":
        return f"opCount 0x{int(pos) // 4096:x}"
    if source == "nccl_plugin":
        return f"call #{int(pos)}" + (f" (SeqNum {int(seq)})" if pd.notna(seq) else "")
    return f"#{int(seq)}"


def diagnose_processes(coll: pa.Table) -> list[dict[str, Any]]:
    """COLLECTIVE_MISMATCH / COLLECTIVE_HANG per communicator, matching the calls of its processes.

    A process that never made the call the others made at one position, and made nothing after it on
    that communicator, hung there or is the one the others wait for (COLLECTIVE_HANG; from a log, whose
    calls carry no completion, only a warning when it is the last call logged and most members lack it:
    the logs may just end there). Calls at one position that disagree on op, element counts or dtype are a desync
    (COLLECTIVE_MISMATCH), naming the minority processes. Never raises on unknown ranks."""
    if coll.num_rows == 0:
        return []
    df = frame(coll)
    df = df[~df["is_p2p"] & df["pg_name"].notna()].copy()
    if df.empty:
        return []
    df["_pos"] = _key_positions(df)
    df = df[df["_pos"].notna()]
    df["_pos"] = df["_pos"].astype("int64")
    rank_of = df.groupby("who")["rank"].first().to_dict()
    hangs, mismatches = [], []
    for (source, pg), grp in df.groupby(["source", "pg_name"], sort=False):
        members = sorted(grp["who"].unique())
        if len(members) < 2:
            continue
        nranks = grp["group_size"].dropna()
        nranks = int(nranks.mode().iloc[0]) if len(nranks) else None
        comm = f"communicator {pg}" + (f" ({nranks} ranks)" if nranks else "")
        if (
            nranks and len(members) > nranks
        ):  # identical communicators a log without INIT lines cannot tell apart
            comm = f"communicators {pg} ({len(members)} processes in groups of {nranks} that made the same calls)"
        lo = grp.groupby("who")["_pos"].min().max()  # an excerpt may start at different points per process
        grp = grp[grp["_pos"] >= lo]
        last = grp.groupby("who")["_pos"].max()
        # hang: the first position some members never reached (and they made nothing after it): for each
        # member, the first position after its last call that another member reached
        positions = np.unique(grp["_pos"].to_numpy())
        after = np.searchsorted(positions, last.to_numpy(), side="right")
        stops = np.unique(positions[after[after < positions.size]])
        for pos in stops:
            joined = set(grp.loc[grp["_pos"] == pos, "who"])
            missing = sorted(m for m in members if m not in joined and last.get(m, -1) < pos)
            if not missing:
                continue
            rows = grp[grp["_pos"] == pos]
            if rows["end_ns"].notna().any() and source != "nccl_log":
                continue  # someone completed it: the absent record is lost, not a hang
            op = str(rows["op"].mode().iloc[0])
            where = _seq_text(source, pos, rows["seq"].iloc[0])
            beyond = (grp["_pos"] > pos).any()
            n = len(joined)
            # A log has no completions: the last logged call missing on a majority may be where it was cut.
            sure = source != "nccl_log" or beyond or len(missing) < n
            tail = (
                ""
                if beyond or source != "nccl_log"
                else " (the last call logged on it: unless the logs were cut here)"
            )
            msg = (
                f"{_names(missing, rank_of)} never called {op} {where} on {comm}; "
                f"{n} process{'es' if n != 1 else ''} did{tail}"
            )
            known = sorted(int(rank_of[m]) for m in missing if pd.notna(rank_of.get(m)))
            hangs.append(
                finding(
                    "COLLECTIVE_HANG",
                    "error" if sure else "warning",
                    msg,
                    ranks=known,
                    source=source,
                    pg_name=str(pg),
                    seq=int(rows["seq"].iloc[0]) if pd.notna(rows["seq"].iloc[0]) else None,
                    op=op,
                    missing_processes=missing,
                    waiting_processes=sorted(joined),
                )
            )
            break
        # desync: the first position whose calls disagree
        sized = ~grp["op"].isin(_SIZE_FREE_OPS)
        sig = grp.assign(
            _in=grp["in_nelems"].where(sized, -1).fillna(-2).astype("int64"),
            _out=grp["out_nelems"].where(sized, -1).fillna(-2).astype("int64"),
            _dt=grp["dtype"].fillna(""),
        )
        combo = sig["op"].astype(str) + "|" + sig["_in"].astype(str) + "|" + sig["_out"].astype(str) + "|"
        combo = combo + sig["_dt"].astype(str)
        nsig = combo.groupby(sig["_pos"]).nunique()
        bad = nsig[nsig > 1]
        if len(bad):
            pos = int(bad.index.min())
            at = sig["_pos"] == pos
            rows, c = sig[at], combo[at]
            counts = c.value_counts()
            majority = counts.index[0]
            maj, odd_rows = rows[c == majority], rows[c != majority]
            odd = sorted(odd_rows["who"].unique())
            m0, o0 = maj.iloc[0], odd_rows.iloc[0]
            kind = (
                "op"
                if m0["op"] != o0["op"]
                else ("size" if (m0["_in"], m0["_out"]) != (o0["_in"], o0["_out"]) else "dtype")
            )

            def describe(r: pd.Series, kind: str = kind) -> str:
                if kind == "op":
                    return str(r["op"])
                if kind == "size":
                    return f"{r['op']} of in {int(r['_in'])} / out {int(r['_out'])} elements"
                return f"{r['op']} in {r['_dt'] or 'unknown dtype'}"

            where = _seq_text(source, pos, m0["seq"])
            nmaj = maj["who"].nunique()
            msg = (
                f"{kind} mismatch at {where} on {comm}: {_names(odd, rank_of)} called {describe(o0)} "
                f"where {nmaj} process{'es' if nmaj != 1 else ''} called {describe(m0)}"
            )
            known = sorted(int(rank_of[m]) for m in odd if pd.notna(rank_of.get(m)))
            mismatches.append(
                finding(
                    "COLLECTIVE_MISMATCH",
                    "error",
                    msg,
                    ranks=known,
                    source=source,
                    pg_name=str(pg),
                    seq=int(m0["seq"]) if pd.notna(m0["seq"]) else None,
                    op=str(m0["op"]),
                    mismatch=kind,
                    processes=odd,
                    majority_processes=sorted(maj["who"].unique()),
                )
            )
    return hangs + mismatches + _likely_mismatches(df, rank_of)


_INFERRED = (
    r"^n\d+#\d+$"  # pg_name of a communicator inferred from op sequences (nccl_log.infer_communicators)
)


def _likely_mismatches(df: pd.DataFrame, rank_of: dict[str, object]) -> list[dict[str, Any]]:
    """COLLECTIVE_MISMATCH (warning, "likely") between inferred log communicators that are probably one.

    Without INIT lines a communicator is inferred from its calls; comm pointers differ per process (they are
    addresses), so processes of one communicator whose calls disagree on every common opCount stay apart, each
    an incomplete communicator (fewer processes than its nranks). Two such communicators are taken for one
    when they have the same nranks, disjoint processes that together are at most nranks, share opCounts
    (opCount counts one communicator's calls), and each is the other's only such candidate with every one of
    their processes logging no other incomplete communicator of that nranks (so no pairing is a guess between
    several). Their first shared opCount whose calls disagree is then a likely desync; it stays a warning, as
    the log cannot prove the two are one communicator."""
    d = df[df["source"].eq("nccl_log") & df["pg_name"].astype(str).str.match(_INFERRED)]
    if d.empty:
        return []
    comms: dict[str, dict[str, Any]] = {}
    for pg, g in d.groupby("pg_name", sort=True):
        n = g["group_size"].dropna()
        if not len(n):
            continue
        nranks, procs = int(n.mode().iloc[0]), set(g["who"])
        if len(procs) < nranks:
            comms[str(pg)] = {
                "n": nranks,
                "procs": procs,
                "seqs": set(g["seq"].dropna().astype("int64")),
                "rows": g,
            }
    per_proc: dict[tuple[str, int], int] = {}
    for c in comms.values():
        for p in c["procs"]:
            per_proc[(p, c["n"])] = per_proc.get((p, c["n"]), 0) + 1
    cands: dict[str, list[str]] = {a: [] for a in comms}
    names = sorted(comms)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ca, cb = comms[a], comms[b]
            if (
                ca["n"] == cb["n"]
                and not ca["procs"] & cb["procs"]
                and len(ca["procs"] | cb["procs"]) <= ca["n"]
                and ca["seqs"] & cb["seqs"]
            ):
                cands[a].append(b)
                cands[b].append(a)
    out = []
    for a in names:
        if len(cands[a]) != 1 or a > cands[a][0]:
            continue
        b = cands[a][0]
        ca, cb = comms[a], comms[b]
        if len(cands[b]) != 1 or any(per_proc[(p, ca["n"])] > 1 for p in ca["procs"] | cb["procs"]):
            continue
        f = _likely_pair(ca, cb, rank_of)
        if f is not None:
            out.append(f)
    return out


def _call_text(r: pd.Series, kind: str) -> str:
    if kind == "op":
        return str(r["op"])
    if kind == "size":
        return f"{r['op']} of in {r['in_nelems']} / out {r['out_nelems']} elements"
    return f"{r['op']} in {r['dtype'] or 'unknown dtype'}"


def _likely_pair(ca: dict[str, Any], cb: dict[str, Any], rank_of: dict[str, Any]) -> dict[str, Any] | None:
    """The likely mismatch finding of two inferred communicators taken for one (None when they agree)."""
    shared = sorted(ca["seqs"] & cb["seqs"])
    for seq in shared:
        ra = ca["rows"][ca["rows"]["seq"] == seq].iloc[0]
        rb = cb["rows"][cb["rows"]["seq"] == seq].iloc[0]
        sig = [
            (r["op"], None if pd.isna(r["in_nelems"]) else int(r["in_nelems"]), r["dtype"]) for r in (ra, rb)
        ]
        if sig[0] == sig[1]:
            continue
        kind = "op" if sig[0][0] != sig[1][0] else ("size" if sig[0][1] != sig[1][1] else "dtype")
        n = ca["n"]
        span = f"0x{shared[0]:x}" + (f"-0x{shared[-1]:x}" if len(shared) > 1 else "")
        msg = (
            f"likely {kind} mismatch at opCount 0x{seq:x} on a {n}-rank communicator: "
            f"{_names(sorted(cb['procs']), rank_of)} called {_call_text(rb, kind)} where "
            f"{_names(sorted(ca['procs']), rank_of)} called {_call_text(ra, kind)}. Likely one communicator "
            f"(the log has no INIT lines and comm pointers differ per process): each of these processes logged "
            f"one {n}-rank communicator, they make at most {n} processes together, and their calls cover the "
            f"same opCounts {span}"
        )
        procs = sorted(ca["procs"] | cb["procs"])
        known = sorted(int(rank_of[p]) for p in procs if pd.notna(rank_of.get(p)))
        return finding(
            "COLLECTIVE_MISMATCH",
            "warning",
            msg,
            ranks=known,
            source="nccl_log",
            likely=True,
            seq=int(seq),
            op=str(ra["op"]),
            mismatch=kind,
            processes=procs,
            calls={
                **{p: _call_text(ra, "size") for p in sorted(ca["procs"])},
                **{p: _call_text(rb, "size") for p in sorted(cb["procs"])},
            },
            pg_names=[str(ra["pg_name"]), str(rb["pg_name"])],
        )
    return None


def _instances(df: pd.DataFrame) -> pd.Series:
    """One id per call instance (the same call on every member of its communicator)."""
    pos = _key_positions(df)
    key = df["source"].astype(str) + "|" + df["pg_name"].astype(str) + "|" + df["op"].astype(str) + "|"
    key = key + pos.astype("Int64").astype(str)
    p2p = df["is_p2p"]
    key[p2p] = key[p2p] + "|" + df.loc[p2p, "who"]  # p2p: one call per process, not matched here
    return pd.Series(pd.factorize(key)[0], index=df.index)


def busbw(df: pd.DataFrame) -> pd.Series:
    """Bus bandwidth (GB/s) per row where times exist: bytes / (end - latest enqueue of the instance) x the
    nccl-tests factor. From the plugin, whose COLL begin is the enqueue, this is a lower bound when the call
    queued behind other work."""
    out = pd.Series(np.nan, index=df.index)
    timed = df["end_ns"].notna() & df["enqueue_ns"].notna() & df["bytes"].notna() & ~df["is_p2p"]
    if not timed.any():
        return out
    d = df[timed]
    inst = _instances(df)[timed]
    latest = d["enqueue_ns"].astype("int64").groupby(inst).transform("max")
    n = d["who"].groupby(inst).transform("nunique")
    size = d["group_size"].astype("Float64").fillna(n.astype("Float64")).to_numpy(dtype=float)
    xfer = d["end_ns"].astype("int64") - latest
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where(xfer > 0, d["bytes"].astype("float64") / xfer.where(xfer > 0, 1), np.nan)
    fac = np.array([busbw_factor(o, k) for o, k in zip(d["op"], size)])
    out[timed] = alg * fac
    return out


def by_op(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (source, op): calls (rows, one per process and call), instances, bytes, median busbw."""
    if df.empty:
        return []
    df = df.assign(_inst=_instances(df), _bw=busbw(df))
    out = []
    for (source, op), g in df.groupby(["source", "op"], sort=True):
        bw = g["_bw"].dropna()
        out.append(
            {
                "source": str(source),
                "op": str(op),
                "calls": int(len(g)),
                "instances": int(g["_inst"].nunique()),
                "bytes": int(g["bytes"].fillna(0).sum()),
                "busbw_gbps_median": float(bw.median()) if len(bw) else None,
                "skew_ms_median": None,
            }
        )
    return out


def processes(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per (source, process): rank (null when unknown), calls, bytes, communicators, calls per op."""
    out = []
    for (source, who), g in df.groupby(["source", "who"], sort=True):
        ranks = g["rank"].dropna().unique()
        host, _, pid = str(who).rpartition(":") if g["process"].notna().any() else ("", "", "")
        if str(who).startswith("pid "):
            host, pid = "", str(who)[4:]
        out.append(
            {
                "source": str(source),
                "process": str(who),
                "host": host or None,
                "pid": int(pid) if pid.isdigit() else None,
                "rank": int(ranks[0]) if len(ranks) == 1 else None,
                "calls": int(len(g)),
                "p2p_calls": int(g["is_p2p"].sum()),
                "bytes": int(g["bytes"].fillna(0).sum()),
                "communicators": int(g["pg_name"].nunique()),
                "ops": {str(k): int(v) for k, v in g["op"].value_counts().sort_index().items()},
            }
        )
    return out


def communicators(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per (source, communicator): how it is named, nranks, processes that recorded it, calls."""
    out = []
    for (source, pg), g in df.groupby(["source", "pg_name"], sort=True):
        n = g["group_size"].dropna()
        name = str(pg)
        if source == "nccl_log":
            how = "inferred from op sequences" if name.startswith("n") and "#" in name else "commId"
        elif source == "nccl_plugin":
            how = "CommHash"
        else:
            how = "process group"
        out.append(
            {
                "source": str(source),
                "pg_name": name,
                "identified_by": how,
                "nranks": int(n.mode().iloc[0]) if len(n) else None,
                "processes": int(g["who"].nunique()),
                "calls": int(len(g)),
                "ops": sorted(str(o) for o in g["op"].dropna().unique()),
            }
        )
    return out


def cross_check(source_coll: pa.Table, kineto_coll: pa.Table) -> dict[str, Any]:
    """Per op: calls and distinct sizes of an NCCL source against the Kineto collectives of the same run.

    Kineto traces usually cover a few profiled steps while logs cover the whole run, so call counts may
    differ; what must hold is that every (op, bytes) the traces saw appears in the source."""
    src = frame(source_coll)
    kin = frame(kineto_coll)
    source = str(src["source"].dropna().iloc[0]) if src["source"].notna().any() else "nccl"
    rows, missing = [], []
    for op in sorted(set(src["op"].dropna()) | set(kin["op"].dropna())):
        s, k = src[src["op"] == op], kin[kin["op"] == op]
        s_sizes = set(s["bytes"].dropna().astype("int64"))
        k_sizes = set(k["bytes"].dropna().astype("int64"))
        only_k = sorted(k_sizes - s_sizes)
        missing += [(op, b) for b in only_k]
        rows.append(
            {
                "op": str(op),
                "kineto_calls": int(len(k)),
                "source_calls": int(len(s)),
                "kineto_sizes": len(k_sizes),
                "sizes_missing_in_source": only_k[:10],
            }
        )
    s_ranks = {int(r) for r in src["rank"].dropna()}
    k_ranks = {int(r) for r in kin["rank"].dropna()}
    agree = not missing and {r["op"] for r in rows if r["kineto_calls"]} <= set(src["op"].dropna())
    out = {
        "source": source,
        "by_op": rows,
        "ranks_only_in_kineto": sorted(k_ranks - s_ranks) if s_ranks else [],
        "ranks_only_in_source": sorted(s_ranks - k_ranks) if k_ranks else [],
        "agree": bool(agree),
        "note": None,
    }
    if missing:
        shown = ", ".join(f"{op} of {b:,} B" for op, b in missing[:3])
        out["note"] = (
            f"{source} and the Kineto traces disagree: {shown} in the traces never appear in {source}"
        )
    elif not agree:
        out["note"] = f"{source} lacks ops the Kineto traces hold"
    return out


@dataclass
class NcclSourcesResult:
    by_op: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    communicators: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    cross_check: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def analyze_sources(
    nccl: dict[str, pa.Table], kineto: pa.Table | None = None, log_stats: dict[str, int] | None = None
) -> NcclSourcesResult:
    """The collective analysis of every NCCL-side source (logs and plugin; Flight Recorder has its own
    `hang.diagnose`), plus a cross-check against `kineto` (the run's Kineto collectives) when given."""
    res = NcclSourcesResult()
    for name in ("nccl_log", "nccl_plugin"):
        t = nccl.get(name)
        if t is None:
            continue
        if t.num_rows == 0:
            what = "NCCL_DEBUG_SUBSYS=COLL" if name == "nccl_log" else "NCCL_PROFILE_EVENT_MASK with Coll (2)"
            res.notes.append(f"{name}: read, but it holds no collective calls (set {what})")
            continue
        df = frame(t)
        res.by_op += by_op(df)
        res.processes += processes(df)
        res.communicators += communicators(df)
        res.findings += diagnose_processes(t)
        if kineto is not None and kineto.num_rows:
            cc = cross_check(t, kineto)
            res.cross_check.append(cc)
            if cc["note"]:
                res.notes.append(cc["note"])
        unknown = int(df["rank"].isna().sum())
        if unknown:
            res.notes.append(
                f"{name}: {unknown:,} of {len(df):,} calls have no rank (no INIT line names their "
                "communicator): analyzed per process (host:pid)"
            )
    if log_stats:
        lost = log_stats.get("damaged", 0) + log_stats.get("unattributed", 0)
        fixed = (
            log_stats.get("rejoined", 0)
            + log_stats.get("prefix_recovered", 0)
            + log_stats.get("multi_message_lines", 0)
        )
        if lost or fixed:
            res.notes.append(
                f"NCCL logs: {log_stats.get('calls', 0):,} calls read; recovered "
                f"{log_stats.get('multi_message_lines', 0)} lines holding several messages, "
                f"{log_stats.get('rejoined', 0)} calls cut across lines, {log_stats.get('prefix_recovered', 0)} "
                f"calls without their prefix; {lost} call fragments could not be read "
                f"({log_stats.get('unattributed', 0)} without a process)"
            )
    return res


__all__ = [
    "NcclSourcesResult",
    "analyze_sources",
    "busbw",
    "by_op",
    "communicators",
    "cross_check",
    "diagnose_processes",
    "frame",
    "processes",
]
