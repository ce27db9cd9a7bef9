"""Hang and desync diagnosis from per-rank collective records (Flight Recorder first, any source works).

Entries are matched across ranks by (process group, collective sequence number), as `torchfrtrace`
(`build_collectives`) does. A collective that some members of its group never joined, while no member
completed it, is a hang (COLLECTIVE_HANG): the members that are absent are the ranks to look at, the
others are waiting for them. Joined entries that disagree on op, element counts or dtype are a desync
(COLLECTIVE_MISMATCH). Point-to-point records are not matched here (their sequence numbers are per pair).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from tracelens.findings import finding

_SIZE_FREE_OPS = {"alltoall", "gather", "scatter", "coalesced"}


def _ranks_text(ranks: Iterable[int]) -> str:
    rs = sorted(int(r) for r in ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    if len(rs) > 8:
        return "ranks " + ", ".join(map(str, rs[:8])) + f", ... ({len(rs)} ranks)"
    return "ranks " + ", ".join(map(str, rs))


def _pg_text(name: str, desc: str | None) -> str:
    return f"pg {name} ({desc})" if desc else f"pg {name}"


def _frame(coll: pa.Table) -> pd.DataFrame:
    cols = [
        "rank",
        "pg_name",
        "pg_desc",
        "pg_ranks",
        "op",
        "dtype",
        "in_nelems",
        "out_nelems",
        "seq",
        "is_p2p",
        "state",
        "enqueue_ns",
        "start_ns",
        "end_ns",
    ]
    df = coll.select(cols).to_pandas()
    for c in ("pg_name", "pg_desc", "op", "dtype", "state"):
        df[c] = df[c].astype(object)
    df["pg_desc"] = df["pg_desc"].where(df["pg_desc"].notna(), None)
    return df


def _members(
    df: pd.DataFrame, expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None
) -> dict[tuple[Any, Any], set[int]]:
    """Members of each (pg_name, pg_desc): pg_ranks, else `expected_ranks`, else the ranks seen in it."""
    out: dict[tuple[Any, Any], set[int]] = {}
    for key, grp in df.groupby(["pg_name", "pg_desc"], dropna=False, sort=False):
        name, desc = key
        desc = None if (desc is None or (isinstance(desc, float) and np.isnan(desc))) else desc
        ranks: set[int] = set()
        for lst in grp["pg_ranks"]:
            if lst is not None and len(lst):
                ranks.update(int(r) for r in lst)
        if not ranks and expected_ranks is not None:
            if isinstance(expected_ranks, Mapping):
                given = expected_ranks.get(name, None if desc is None else expected_ranks.get(desc))
                if given is not None:
                    ranks = {int(r) for r in given}
            elif desc == "default_pg" or name == "0":
                ranks = {int(r) for r in expected_ranks}
        if not ranks:
            ranks = {int(r) for r in grp["rank"].unique()}
        out[(name, desc)] = ranks
    return out


def _credible_completion(grp: pd.DataFrame, mem: set[int]) -> pd.Series:
    """Per seq of one group: did any member complete it, believably?

    A completed entry proves the collective completed, except where a member never issued it (its records
    end before that seq) and no entry has a completion time: gloo marks a timed-out collective retired and
    counts it in `pg_status.last_completed_collective` (which is where such states come from), although peers
    never joined. A retired entry without all participants is not a completion."""
    done = grp["state"].eq("completed").groupby(grp["seq"]).any()
    if done.empty:
        return done
    last_seq = grp.groupby("rank")["seq"].max()
    absent_last = min((int(last_seq.get(r, -1)) for r in mem), default=-1)  # a member's last record
    timed = grp["end_ns"].notna() & (grp["end_ns"].fillna(0) > 0)
    has_time = timed.groupby(grp["seq"]).any()
    n = grp.groupby("seq")["rank"].nunique()
    never_joined = (n < len(mem)) & (n.index.to_series(index=n.index) > absent_last)
    return done & ~(never_joined & ~has_time.reindex(done.index, fill_value=False))


def progress(coll: pa.Table) -> pd.DataFrame:
    """Per (rank, pg): last enqueued, started and completed collective seq (NaN when none), like pg_status."""
    df = _frame(_split_unranked(coll)[0])
    df = df[~df["is_p2p"].fillna(False).astype(bool) & df["seq"].notna()]
    if df.empty:
        return pd.DataFrame(
            columns=["rank", "pg_name", "pg_desc", "last_enqueued", "last_started", "last_completed"]
        )
    seq = df["seq"].astype("int64")
    started = df["state"].isin(["started", "completed"])
    completed = df["state"].eq("completed")
    df = df.assign(
        _enq=seq,
        _sta=seq.where(started),
        _com=seq.where(completed),
        pg_desc=df["pg_desc"].fillna(""),
    )
    g = df.groupby(["rank", "pg_name", "pg_desc"], sort=True)
    out = g.agg(last_enqueued=("_enq", "max"), last_started=("_sta", "max"), last_completed=("_com", "max"))
    out = out.reset_index()
    out["pg_desc"] = out["pg_desc"].replace("", None)
    return out


def diagnose(
    coll: pa.Table, expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None = None
) -> list[dict[str, Any]]:
    """Findings (COLLECTIVE_HANG, COLLECTIVE_MISMATCH) from a COLLECTIVES table of several ranks.

    `expected_ranks`: the world's ranks (used for the default group when the records carry no membership),
    or {pg_name or pg_desc: ranks} per group. Hangs come first, earliest enqueued first; each finding
    carries the numbers behind its message (pg, seq, op, missing/waiting ranks, per-rank progress).
    Records without a rank (NCCL logs without INIT lines) are judged per process (`_unranked_findings`).
    """
    coll, unranked = _split_unranked(coll)
    if unranked is not None:
        return diagnose(coll, expected_ranks) + _unranked_findings(unranked)
    df = _frame(coll)
    df = df[~df["is_p2p"].fillna(False).astype(bool) & df["seq"].notna()].copy()
    if df.empty:
        return []
    df["seq"] = df["seq"].astype("int64")
    members = _members(df, expected_ranks)
    prog = progress(coll)
    hangs: list[tuple[float, dict[str, Any]]] = []
    mismatches: list[tuple[float, dict[str, Any]]] = []

    for (name, desc), grp in df.groupby(["pg_name", "pg_desc"], dropna=False, sort=False):
        desc = None if (desc is None or (isinstance(desc, float) and np.isnan(desc))) else desc
        mem = members[(name, desc)]
        grp = grp[grp["rank"].isin(mem)]
        if grp.empty:
            continue
        # A ring buffer forgets old records: judge only seqs every member that recorded anything still holds.
        lo = grp.groupby("rank")["seq"].min().max()
        grp = grp[grp["seq"] >= lo]
        per_seq = grp.groupby("seq")
        n_joined = per_seq["rank"].nunique()
        any_done = _credible_completion(grp, mem)
        incomplete = n_joined[(n_joined < len(mem)) & ~any_done]
        if len(incomplete):
            seq = int(incomplete.index.min())
            rows = grp[grp["seq"] == seq]
            joined = {int(r) for r in rows["rank"].unique()}
            missing = sorted(mem - joined)
            op = rows["op"].mode().iloc[0]
            pg = _pg_text(str(name), desc)
            msg = f"{_ranks_text(missing)} never joined {op} #{seq} on {pg}; {len(joined)} ranks waited"
            if len(joined) == 1:
                msg = msg.replace("1 ranks waited", "1 rank waited")
            p = prog[(prog["pg_name"] == name) & prog["rank"].isin(mem)]
            per_rank = [
                {
                    "rank": int(r.rank),
                    "last_enqueued": None if pd.isna(r.last_enqueued) else int(r.last_enqueued),
                    "last_started": None if pd.isna(r.last_started) else int(r.last_started),
                    "last_completed": None if pd.isna(r.last_completed) else int(r.last_completed),
                }
                for r in p.itertuples()
            ]
            first_enq = rows["enqueue_ns"].min()
            hangs.append(
                (
                    float(first_enq) if pd.notna(first_enq) else float("inf"),
                    finding(
                        "COLLECTIVE_HANG",
                        "error",
                        msg,
                        ranks=missing,
                        pg_name=str(name),
                        pg_desc=desc,
                        seq=seq,
                        op=op,
                        missing_ranks=missing,
                        waiting_ranks=sorted(joined),
                        progress=per_rank,
                    ),
                )
            )
        # Desync: joined entries of one (pg, seq) that disagree.
        sized = ~grp["op"].isin(_SIZE_FREE_OPS)
        sig = grp.assign(
            _in=grp["in_nelems"].where(sized, -1).fillna(-2),
            _out=grp["out_nelems"].where(sized, -1).fillna(-2),
            _dt=grp["dtype"].fillna(""),
        )
        nsig = sig.groupby("seq")[["op", "_in", "_out", "_dt"]].nunique()
        bad = nsig[(nsig > 1).any(axis=1)]
        if len(bad):
            seq = int(bad.index.min())
            rows = sig[sig["seq"] == seq]
            what = [
                c
                for c, label in (("op", "op"), ("_in", "size"), ("_out", "size"), ("_dt", "dtype"))
                if nsig.loc[seq, c] > 1
            ]
            kind = "op" if "op" in what else ("size" if any(c in what for c in ("_in", "_out")) else "dtype")
            combo = rows[["op", "_in", "_out", "_dt"]].astype(str).agg("|".join, axis=1)
            counts = combo.value_counts()
            majority = counts.index[0]
            odd = sorted(int(r) for r in rows.loc[combo != majority, "rank"].unique())
            maj = rows[combo == majority].iloc[0]
            oddrow = rows[combo != majority].iloc[0]

            def describe(r: pd.Series, kind: str = kind) -> str:
                if kind == "op":
                    return str(r["op"])
                if kind == "size":
                    return f"in {int(r['_in'])} / out {int(r['_out'])} elements"
                return str(r["_dt"] or "unknown dtype")

            pg = _pg_text(str(name), desc)
            msg = (
                f"{kind} mismatch in {maj['op']} #{seq} on {pg}: "
                f"{_ranks_text(odd)} called {describe(oddrow)} "
                f"where {int((combo == majority).sum())} ranks called {describe(maj)}"
            )
            first_enq = rows["enqueue_ns"].min()
            mismatches.append(
                (
                    float(first_enq) if pd.notna(first_enq) else float("inf"),
                    finding(
                        "COLLECTIVE_MISMATCH",
                        "error",
                        msg,
                        ranks=odd,
                        pg_name=str(name),
                        pg_desc=desc,
                        seq=seq,
                        op=str(maj["op"]),
                        mismatch=kind,
                    ),
                )
            )
    hangs.sort(key=lambda t: t[0])
    mismatches.sort(key=lambda t: t[0])
    return [f for _, f in hangs] + [f for _, f in mismatches]


def _split_unranked(coll: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """(rows with a rank, rows without one or None): a null rank is unknown, never rank NaN or 0."""
    ranks = coll.column("rank")
    if ranks.null_count == 0:
        return coll, None
    known = pa.compute.is_valid(ranks)
    return coll.filter(known), coll.filter(pa.compute.invert(known))


def _unranked_findings(coll: pa.Table) -> list[dict[str, Any]]:
    """Hang / desync findings of rows without ranks, matched per process (analyze.nccl_sources)."""
    from tracelens.analyze.nccl_sources import diagnose_processes

    return diagnose_processes(coll)


__all__ = ["diagnose", "progress"]
