"""Hang and desync diagnosis from per-rank collective records (Flight Recorder first, any source works).

Entries are matched across ranks by (process group, collective sequence number), as `torchfrtrace`
(`build_collectives`) does; a process group is its name and its declared ranks (the dump's pg_config, else
the rank's trace `distributedInfo.pg_config`), never the ranks that happened to record it. A collective that
some members never joined, while no member completed it, is a hang (COLLECTIVE_HANG). Only a member whose
dump was read can be "missing": a member without a usable dump is no evidence either way, and one whose
Kineto trace shows it in the collective did not hang in it. A missing member that is itself waiting in
another hung collective is blocked, not the cause: the findings name the members that are missing and wait
in no collective (blocked in point-to-point or host code), or, where every missing member waits elsewhere,
the members missing from the wait that began first. Joined entries that disagree on op, element counts or
dtype are a desync (COLLECTIVE_MISMATCH). Point-to-point records are not matched here (their sequence
numbers are per pair). See docs/nccl-inputs.md ("Hangs").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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


#: PyTorch's default Flight Recorder ring buffer (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE: 2,000
#: entries). A dump holding at least this many entries may have overwritten its oldest ones, so a group it
#: holds no record of is not evidence that the rank never issued that group's collectives.
FR_DEFAULT_BUFFER = 2000
#: Flight Recorder (time_created_ns) and Kineto times are each host's wall clock; NTP keeps hosts within about
#: a millisecond of each other, so times on different ranks less than this apart are not ordered.
CLOCK_TOLERANCE_NS = 1_000_000
#: PyTorch's default process-group timeout (torch.distributed.constants.default_pg_timeout, 30 min): no
#: member waits longer in a collective, so a call that starts later than this after the others issued it
#: is another call.
PG_TIMEOUT_NS = 30 * 60 * 1_000_000_000

Gid = tuple[str, "tuple[int, ...] | None"]


@dataclass
class HangResult:
    """Findings (COLLECTIVE_HANG, COLLECTIVE_MISMATCH) and notes (what could not be judged, and why)."""

    findings: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _declared(
    name: str,
    desc: str | None,
    rank: int,
    row_ranks: Any,
    members: Mapping[tuple[int, str], Iterable[int]] | None,
    expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None,
) -> tuple[int, ...] | None:
    """The declared members of the group a rank's record names: the dump's pg_config, else the rank's
    trace pg_config (`members`), else `expected_ranks`; None when nothing declares them."""
    if isinstance(row_ranks, (list, tuple, np.ndarray)) and len(row_ranks):
        return tuple(sorted(int(r) for r in row_ranks))
    if members is not None:
        got = members.get((rank, name))
        if got is not None:
            return tuple(sorted(int(r) for r in got))
    if isinstance(expected_ranks, Mapping):
        given = expected_ranks.get(name, None if desc is None else expected_ranks.get(desc))
        return tuple(sorted(int(r) for r in given)) if given is not None else None
    if expected_ranks is not None and (desc == "default_pg" or name == "0"):
        return tuple(sorted(int(r) for r in expected_ranks))
    return None


def _identities(
    df: pd.DataFrame,
    members: Mapping[tuple[int, str], Iterable[int]] | None,
    expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None,
) -> tuple[pd.Series, list[Gid]]:
    """Each record's process group identity (a code into the returned list of (pg name, its declared ranks)), as torchfrtrace keys a group by
    its name and the hash of its ranks (split_group can give different groups one name). A record whose
    group nothing declares takes the one declared group of that name holding its rank, else (name, None)."""
    firsts = df.groupby(["rank", "pg_name"], sort=False).agg(
        desc=("pg_desc", "first"), ranks=("pg_ranks", "first")
    )
    known: dict[tuple[int, str], Gid] = {}
    unknown: list[tuple[int, str]] = []
    for (r, name), row in firsts.iterrows():
        desc = row["desc"] if isinstance(row["desc"], str) else None
        ranks = _declared(str(name), desc, int(r), row["ranks"], members, expected_ranks)
        if ranks is None:
            unknown.append((int(r), str(name)))
        else:
            known[(int(r), str(name))] = (str(name), ranks)
    by_name: dict[str, set[Gid]] = {}
    for gid in known.values():
        by_name.setdefault(gid[0], set()).add(gid)
    for r, name in unknown:
        fits = [g for g in by_name.get(name, ()) if g[1] is not None and r in g[1]]
        known[(r, name)] = fits[0] if len(fits) == 1 else (name, None)
    gids = sorted(set(known.values()), key=lambda g: (g[0], g[1] is None, g[1] or ()))
    code = {g: i for i, g in enumerate(gids)}
    keys = pd.DataFrame(
        [(r, n, code[g]) for (r, n), g in known.items()], columns=["rank", "pg_name", "_code"]
    ).astype({"rank": df["rank"].dtype})
    codes = df[["rank", "pg_name"]].merge(keys, on=["rank", "pg_name"], how="left")["_code"]
    return pd.Series(codes.to_numpy(dtype="int64"), index=df.index), gids


def _credible_completion(grp: pd.DataFrame, mem: set[int]) -> pd.Series:
    """Per seq of one group: did any member complete it, believably?

    A completed entry proves the collective completed, except where a member never issued it (its records
    end before that seq) and no entry has a completion time: gloo retires a timed-out collective (and counts
    it in `pg_status.last_completed_collective`) although peers never joined. A retired entry without all
    participants is not a completion."""
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


def _kineto_frame(kineto: pa.Table | None) -> pd.DataFrame | None:
    """The Kineto collective calls with both times, as plain columns (None when there are none)."""
    if kineto is None or kineto.num_rows == 0:
        return None
    want = ("rank", "op", "pg_name", "seq", "start_ns", "end_ns", "is_p2p")
    k = kineto.select([c for c in want if c in kineto.column_names]).to_pandas()
    for c in ("op", "pg_name"):
        k[c] = k[c].astype(object).where(k[c].notna(), None) if c in k else None
    if "seq" not in k:
        k["seq"] = np.nan
    if "is_p2p" in k:
        k = k[~k["is_p2p"].fillna(False).astype(bool)]
    k = k[k["end_ns"].notna() & k["start_ns"].notna() & k["rank"].notna()]
    return k if len(k) else None


def _seen_in_trace(
    kin: pd.DataFrame | None, rank: int, op: str, name: str, seq: int, rows: pd.DataFrame
) -> bool:
    """Whether `rank`'s Kineto trace shows it in this collective: a call of the same op (same group and seq
    where the trace names them) that ended after the last member that dumped it had issued it, and began
    before any of them issued its next record on the group (without one: within the process-group
    timeout of the first issue). A collective cannot end on one rank before every
    member joined it, and its members issue their next record only after it ends: such a call is that rank's
    part in it."""
    if kin is None:
        return False
    k = kin[(kin["rank"] == rank) & (kin["op"] == op)]
    named = k["pg_name"].notna()
    k = k[~named | ((k["pg_name"] == name) & (k["seq"].isna() | (k["seq"] == seq)))]
    issued = rows["enqueue_ns"].dropna()
    if k.empty or issued.empty:
        return False
    ok = k["end_ns"].astype("float64") >= float(issued.max()) - CLOCK_TOLERANCE_NS
    following = rows["_next_ns"].dropna()
    latest = float(following.min()) if not following.empty else float(issued.min()) + PG_TIMEOUT_NS
    ok &= k["start_ns"].astype("float64") <= latest + CLOCK_TOLERANCE_NS
    return bool(ok.any())


def trace_groups(metadata: pa.Table | None) -> tuple[dict[tuple[int, str], tuple[int, ...]], dict[str, str]]:
    """({(rank, pg_name): ranks}, {pg_name: description}) from each rank's `distributedInfo.pg_config`
    (metadata column `pg_config_json`: a list of groups or a dict keyed by name). A rank's record names a
    group by its name; the group that rank belongs to is the one of that name holding it (a trace may list
    groups it is not in, and split_group can give several groups one name). Unreadable entries are skipped."""
    members: dict[tuple[int, str], tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    if (
        metadata is None
        or "pg_config_json" not in metadata.column_names
        or "rank" not in metadata.column_names
    ):
        return members, descs
    parsed: dict[str, list[tuple[str, str | None, tuple[int, ...]]]] = {}
    for rank, text in zip(metadata.column("rank").to_pylist(), metadata.column("pg_config_json").to_pylist()):
        if rank is None or not text:
            continue
        if text not in parsed:
            parsed[text] = _pg_entries(text)
        for name, desc, ranks in parsed[text]:
            if int(rank) in ranks:
                members.setdefault((int(rank), name), ranks)
            if desc:
                descs.setdefault(name, desc)
    return members, descs


def _pg_entries(text: str) -> list[tuple[str, str | None, tuple[int, ...]]]:
    """(name, description, ranks) of every readable group in one pg_config JSON text."""
    import json

    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        return []
    items = cfg.items() if isinstance(cfg, dict) else enumerate(cfg) if isinstance(cfg, list) else []
    out = []
    for key, g in items:
        if not isinstance(g, dict):
            continue
        name = g.get("pg_name", g.get("name", key if isinstance(key, str) else None))
        ranks = g.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except (ValueError, RecursionError):
                ranks = None
        if not isinstance(name, (str, int)) or isinstance(name, bool) or str(name) == "":
            continue
        if (
            not isinstance(ranks, list)
            or not ranks
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
        ):
            continue
        desc = g.get("pg_desc", g.get("desc"))
        out.append(
            (
                str(name),
                desc if isinstance(desc, str) and desc and desc != "undefined" else None,
                tuple(sorted(ranks)),
            )
        )
    return out


def diagnose(
    coll: pa.Table,
    expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None = None,
    *,
    members: Mapping[tuple[int, str], Iterable[int]] | None = None,
    descs: Mapping[str, str] | None = None,
    dumps: Iterable[int] | None = None,
    kineto: pa.Table | None = None,
) -> list[dict[str, Any]]:
    """Findings (COLLECTIVE_HANG, COLLECTIVE_MISMATCH) of `diagnose_run` (same arguments; notes dropped)."""
    return diagnose_run(
        coll, expected_ranks, members=members, descs=descs, dumps=dumps, kineto=kineto
    ).findings


def diagnose_run(
    coll: pa.Table,
    expected_ranks: Iterable[int] | Mapping[str, Iterable[int]] | None = None,
    *,
    members: Mapping[tuple[int, str], Iterable[int]] | None = None,
    descs: Mapping[str, str] | None = None,
    dumps: Iterable[int] | None = None,
    kineto: pa.Table | None = None,
) -> HangResult:
    """Hangs and desyncs from a COLLECTIVES table of several ranks (Flight Recorder), with notes.

    `expected_ranks`: the world's ranks (members of the default group when nothing else declares them), or
    {pg_name or pg_desc: ranks}. `members`: {(rank, pg_name): ranks} from the ranks' traces
    (distributedInfo.pg_config), `descs` {pg_name: description} from the same. `dumps`: the ranks whose dump
    was read (default: the ranks in `coll`); a member without one is "no evidence", never "did not join".
    `kineto`: the run's Kineto collectives; a member seen in a collective there did not hang in it.
    Hangs come first (the cause's wait first), then mismatches, earliest enqueued first; each finding carries
    the numbers behind its message. Records without a rank (NCCL logs without INIT lines) are judged per
    process (`_unranked_findings`)."""
    coll, unranked = _split_unranked(coll)
    if unranked is not None:
        res = diagnose_run(coll, expected_ranks, members=members, descs=descs, dumps=dumps, kineto=kineto)
        res.findings += _unranked_findings(unranked)
        return res
    res = HangResult()
    rows_all = _frame(coll)
    entries = rows_all.groupby("rank").size()
    dumped = {int(r) for r in (dumps if dumps is not None else rows_all["rank"].unique())}
    df = rows_all[~rows_all["is_p2p"].fillna(False).astype(bool) & rows_all["seq"].notna()].copy()
    if df.empty:
        return res
    df["seq"] = df["seq"].astype("int64")
    # a record without a group name (a damaged dump) is judged in a group of its own, named "unknown"
    df["pg_name"] = df["pg_name"].where(df["pg_name"].notna(), "unknown").astype(str)
    df["_gid"], gids = _identities(df, members, expected_ranks)
    prog = progress(coll)
    kin = _kineto_frame(kineto)
    groups = _known_groups(gids, members, descs)
    hangs: list[dict[str, Any]] = []
    mismatches: list[tuple[float, dict[str, Any]]] = []

    for code, grp in df.groupby("_gid", sort=False):
        gid = gids[int(code)]
        name, declared = gid
        d = grp["pg_desc"].dropna()
        desc = str(d.mode().iloc[0]) if len(d) else (descs or {}).get(name)
        recorders = {int(r) for r in grp["rank"].unique()}
        mem = set(declared) if declared is not None else recorders
        grp = grp[grp["rank"].isin(mem)].sort_values(["rank", "seq"])
        if grp.empty:
            continue
        # evidence: members whose dump was read, less one holding no record of this group whose ring buffer
        # may have wrapped (it forgot them rather than never issuing them)
        forgot = {r for r in mem - recorders if r in dumped and entries.get(r, 0) >= FR_DEFAULT_BUFFER}
        no_dump = mem - dumped
        evidence = mem - no_dump - forgot
        # A ring buffer forgets old records: judge only seqs every member that recorded anything still holds.
        lo = grp.groupby("rank")["seq"].min().max()
        grp = grp[grp["seq"] >= lo].copy()
        grp["_next_ns"] = grp.groupby("rank")["enqueue_ns"].shift(-1)
        pg = _pg_text(str(name), desc)
        if declared is None:  # nothing declares its ranks: never presented as a group of the recorders
            pg += f" (members unknown: judged among the {len(recorders)} ranks whose dumps hold it)"
        hang = _first_hang(grp, evidence, kin, str(name))
        if hang is not None:
            hang.update(name=str(name), desc=desc, pg=pg, members=mem, no_evidence=sorted(no_dump | forgot))
            hangs.append(hang)
        elif no_dump:
            last = grp[grp["seq"] == grp["seq"].max()]
            if not last["state"].eq("completed").any():
                waiting = sorted({int(r) for r in last["rank"]})
                res.notes.append(
                    f"{_ranks_text(waiting)} {'was' if len(waiting) == 1 else 'were'} still in "
                    f"{last['op'].mode().iloc[0]} #{int(last['seq'].iloc[0])} on {pg} when dumped; "
                    f"{_ranks_text(sorted(no_dump))} left no usable Flight Recorder dump, so whether "
                    f"{'it' if len(no_dump) == 1 else 'they'} joined is unknown: no hang is reported without evidence"
                )
        mismatches += _mismatches(grp, str(name), desc, pg)

    res.findings = _hang_findings(hangs, prog, groups, lambda r: _departed(df, r)) + [
        f for _, f in sorted(mismatches, key=lambda t: t[0])
    ]
    return res


def _first_hang(
    grp: pd.DataFrame, evidence: set[int], kin: pd.DataFrame | None, name: str
) -> dict[str, Any] | None:
    """The first collective of one group that a member with evidence never joined and no member believably
    completed (members seen in it in their traces are not missing); None when there is none."""
    n_joined = grp.groupby("seq")["rank"].nunique()
    done = _credible_completion(grp, evidence).reindex(n_joined.index, fill_value=False)
    for seq in n_joined.index[(n_joined < len(evidence)) & ~done]:
        rows = grp[grp["seq"] == seq]
        joined = {int(r) for r in rows["rank"].unique()}
        op = str(rows["op"].mode().iloc[0])
        absent = sorted(evidence - joined)
        seen = [m for m in absent if _seen_in_trace(kin, m, op, name, int(seq), rows)]
        missing = [m for m in absent if m not in seen]
        if not missing:
            continue
        first = rows["enqueue_ns"].min()
        return {
            "seq": int(seq),
            "op": op,
            "missing": missing,
            "joined": sorted(joined),
            "in_flight": {int(r) for r in rows.loc[~rows["state"].eq("completed"), "rank"]},
            "seen_in_trace": seen,
            "t": float(first) if pd.notna(first) else float("inf"),
        }
    return None


def _departed(df: pd.DataFrame, rank: int) -> bool | None:
    """Whether the rank's last collective follows the one before it as it never did before in its records
    (by group, op and size: a step's calls repeat, so a call that skipped one makes a new pair). None when
    its records are too few to tell (fewer than a pair before the last one)."""
    mine = df[df["rank"] == rank]
    if len(mine) < 3:
        return None
    keys = list(zip(mine["_gid"], mine["op"], mine["in_nelems"].fillna(-1)))
    return (keys[-2], keys[-1]) not in set(zip(keys[:-2], keys[1:-1]))


def _known_groups(
    gids: list[Gid], members: Mapping[tuple[int, str], Iterable[int]] | None, descs: Mapping[str, str] | None
) -> dict[tuple[int, ...], str]:
    """{ranks: "pg NAME (desc)"} of every group some source declares (dumps and traces)."""
    out: dict[tuple[int, ...], str] = {}
    for name, declared in gids:
        if declared is not None:
            out.setdefault(declared, _pg_text(name, (descs or {}).get(name)))
    for (_, name), ranks in (members or {}).items():
        out.setdefault(tuple(sorted(int(r) for r in ranks)), _pg_text(name, (descs or {}).get(name)))
    return out


def _hang_findings(
    hangs: list[dict[str, Any]],
    prog: pd.DataFrame,
    groups: dict[tuple[int, ...], str],
    departed: Callable[[int], bool | None],
) -> list[dict[str, Any]]:
    """The COLLECTIVE_HANG finding (one: a hung job hangs once): the ranks every wait comes down to, the
    ranks blocked behind them, and the collectives each waits in.

    A missing member that waits (in flight) in another hung collective is blocked there. The members missing
    and waiting nowhere are the ones to look at; when every missing member waits elsewhere (a cycle: the
    culprit skipped a collective and went on to the next, where the others never arrive), the collective
    whose wait began first is where it started: the one whose missing rank `departed` from its routine,
    else the one whose wait began first by the hosts' clocks. The root collectives that name new ranks are
    listed in `hangs`; the later ones (their missing ranks named already, or blocked) in `caused`."""
    if not hangs:
        return []
    hangs = sorted(hangs, key=lambda h: h["t"])
    waits_in: dict[int, dict[str, Any]] = {}
    for h in hangs:
        for r in h["in_flight"]:
            waits_in.setdefault(r, h)
    for h in hangs:
        h["blocked"] = [m for m in h["missing"] if m in waits_in and waits_in[m] is not h]
        h["free"] = [m for m in h["missing"] if m not in h["blocked"]]
    roots = [h for h in hangs if h["free"]]
    if not roots:  # a cycle: each missing rank waits in another hung collective
        # the rank that departed from its own routine (its last call follows its previous one as it never did
        # before) skipped a collective and went on; the others only stopped where it left them
        gone = {r for r in {m for h in hangs for m in h["missing"]} if departed(r)}
        roots = [h for h in hangs if set(h["missing"]) & gone]
        for h in roots:
            h["free"] = sorted(set(h["missing"]) & gone)
        if not roots:  # no such evidence: the wait that began first (by the hosts' clocks) is the cause
            t0 = hangs[0]["t"]
            roots = [h for h in hangs if h["t"] <= t0 + CLOCK_TOLERANCE_NS]
            for h in roots:
                h["free"] = list(h["missing"])
    kept: list[dict[str, Any]] = []
    named: set[int] = set()
    for h in roots:
        if set(h["free"]) - named:
            kept.append(h)
            named |= set(h["free"])
    later = [h for h in hangs if h not in kept]
    # one hang, one finding: the ranks every wait comes down to, each root collective listed
    free = sorted(named)
    first = kept[0]
    waited = sorted({r for h in kept for r in h["joined"]})
    if len(kept) == 1:
        msg = f"{_ranks_text(free)} never joined {first['op']} #{first['seq']} on {first['pg']}"
    else:
        parts = [f"{h['op']} #{h['seq']} on {h['pg']} ({_ranks_text(h['free'])})" for h in kept[:4]]
        more = f" and {len(kept) - 4} more" if len(kept) > 4 else ""
        msg = f"{_ranks_text(free)} never joined their collectives: " + ", ".join(parts) + more
    msg += f"; {len(waited)} rank waited" if len(waited) == 1 else f"; {len(waited)} ranks waited"
    if len(free) > 1 and not any(m in waits_in for m in free):
        grp = groups.get(tuple(free))
        if grp is not None and all(set(free) != h["members"] for h in kept):
            msg += (
                f"; {_ranks_text(free)} are all of {grp} and wait in no collective: blocked inside that group "
                "(point-to-point, which gloo's Flight Recorder does not record) or in host code"
            )
        else:
            msg += f"; {_ranks_text(free)} wait in no collective (blocked in point-to-point or host code)"
    blocked = sorted({b for h in kept for b in h["blocked"]})
    for b in blocked:
        w = waits_in[b]
        if b in named:
            msg += f"; rank {b} went on to {w['op']} #{w['seq']} on {w['pg']}, where it waits"
        else:
            msg += f"; rank {b}, missing too, waits in {w['op']} #{w['seq']} on {w['pg']}"
    seen = sorted({r for h in kept for r in h["seen_in_trace"]})
    if seen:
        msg += f"; {_ranks_text(seen)} completed it in {'its' if len(seen) == 1 else 'their'} trace"
    no_evidence = sorted({r for h in kept for r in h["no_evidence"]})
    if no_evidence:
        msg += f"; no usable Flight Recorder dump from {_ranks_text(no_evidence)}: not judged"
    # hangs of other ranks behind this one (the culprit's own further absences add nothing to the text)
    behind = [c for c in later if set(c["missing"]) - named]
    for c in behind[:3]:
        others = sorted(set(c["missing"]) - named)
        msg += f"; behind it, {_ranks_text(others)} never reach {c['op']} #{c['seq']} on {c['pg']}"
    if len(behind) > 3:
        msg += f" (and {len(behind) - 3} more collectives)"

    def brief(h: dict[str, Any]) -> dict[str, Any]:
        return {"pg_name": h["name"], "pg_desc": h["desc"], "seq": h["seq"], "op": h["op"],
                "missing_ranks": h["missing"], "waiting_ranks": h["joined"]}  # fmt: skip

    p = prog[(prog["pg_name"] == first["name"]) & prog["rank"].isin(first["members"])]
    per_rank = [
        {
            "rank": int(r.rank),
            "last_enqueued": None if pd.isna(r.last_enqueued) else int(r.last_enqueued),
            "last_started": None if pd.isna(r.last_started) else int(r.last_started),
            "last_completed": None if pd.isna(r.last_completed) else int(r.last_completed),
        }
        for r in p.itertuples()
    ]
    extra: dict[str, Any] = {"root_rank": free[0]} if len(free) == 1 else {}
    return [
        finding(
            "COLLECTIVE_HANG",
            "error",
            msg,
            ranks=free,
            pg_name=first["name"],
            pg_desc=first["desc"],
            seq=first["seq"],
            op=first["op"],
            missing_ranks=first["missing"],
            waiting_ranks=waited,
            blocked_ranks=blocked,
            no_evidence_ranks=no_evidence,
            seen_in_trace_ranks=seen,
            progress=per_rank,
            hangs=[brief(h) for h in kept],
            caused=[brief(c) for c in later],
            **extra,
        )
    ]


def _mismatches(
    grp: pd.DataFrame, name: str, desc: str | None, pg: str
) -> list[tuple[float, dict[str, Any]]]:
    """The first collective of one group whose joined entries disagree on op, element counts or dtype."""
    sized = ~grp["op"].isin(_SIZE_FREE_OPS)
    sig = grp.assign(
        _in=grp["in_nelems"].where(sized, -1).fillna(-2),
        _out=grp["out_nelems"].where(sized, -1).fillna(-2),
        _dt=grp["dtype"].fillna(""),
    )
    nsig = sig.groupby("seq")[["op", "_in", "_out", "_dt"]].nunique()
    bad = nsig[(nsig > 1).any(axis=1)]
    if not len(bad):
        return []
    seq = int(bad.index.min())
    rows = sig[sig["seq"] == seq]
    what = [c for c in ("op", "_in", "_out", "_dt") if nsig.loc[seq, c] > 1]
    kind = "op" if "op" in what else ("size" if any(c in what for c in ("_in", "_out")) else "dtype")
    combo = rows[["op", "_in", "_out", "_dt"]].astype(str).agg("|".join, axis=1)
    majority = combo.value_counts().index[0]
    odd = sorted(int(r) for r in rows.loc[combo != majority, "rank"].unique())
    maj = rows[combo == majority].iloc[0]
    oddrow = rows[combo != majority].iloc[0]

    def describe(r: pd.Series) -> str:
        if kind == "op":
            return str(r["op"])
        if kind == "size":
            return f"in {int(r['_in'])} / out {int(r['_out'])} elements"
        return str(r["_dt"] or "unknown dtype")

    msg = (
        f"{kind} mismatch in {maj['op']} #{seq} on {pg}: "
        f"{_ranks_text(odd)} called {describe(oddrow)} "
        f"where {int((combo == majority).sum())} ranks called {describe(maj)}"
    )
    first_enq = rows["enqueue_ns"].min()
    return [
        (
            float(first_enq) if pd.notna(first_enq) else float("inf"),
            finding(
                "COLLECTIVE_MISMATCH", "error", msg, ranks=odd, pg_name=name, pg_desc=desc, seq=seq,
                op=str(maj["op"]), mismatch=kind,
            ),
        )
    ]  # fmt: skip


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


def _split_unranked(coll: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """(rows with a rank, rows without one or None): a null rank is unknown, never rank NaN or 0."""
    ranks = coll.column("rank")
    if ranks.null_count == 0:
        return coll, None
    known = pa.compute.is_valid(ranks)
    return coll.filter(known), coll.filter(pa.compute.invert(known))


def _unranked_findings(coll: pa.Table) -> list[dict[str, Any]]:
    """Hang / desync findings of rows without ranks, matched per process (analyze.comm.nccl_sources)."""
    from tracelens.analyze.comm.nccl_sources import diagnose_processes

    return diagnose_processes(coll)


__all__ = [
    "CLOCK_TOLERANCE_NS",
    "FR_DEFAULT_BUFFER",
    "PG_TIMEOUT_NS",
    "HangResult",
    "diagnose",
    "diagnose_run",
    "progress",
    "trace_groups",
]
