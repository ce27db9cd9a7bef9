"""Hangs through point-to-point: the rank that never issued a send, and the ranks blocked behind it.

A step that hangs is far longer than the run's other steps on every rank (a blocked `recv` waits for the
whole timeout). Each rank's sequence of communication calls in that step (`c10d::send`, `c10d::recv_`,
collectives, `nccl:send`/`nccl:recv`, in issue order on its main thread) is compared with its sequence in
a healthy step (its own earlier step, else a stage peer's in the same step):

* a rank that was merely blocked issued a *prefix* of the healthy sequence and stopped in its last call;
* the root issued something else: at the first position where its sequence departs from the healthy one,
  the healthy step issued a call (`send` #k) that it never issued, and it went on without it.

Finding P2P_HANG (error): the root rank and the call it never issued, the chain of ranks blocked behind it
(their last call and when it began, earliest first) and per-rank progress (last call enqueued, started,
completed). The hung steps are returned so the run's performance findings can leave them out.
See docs/pipeline.md ("Hangs through point-to-point").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.analyze.rank.classify import _dict_lookup, main_threads
from tracelens.findings import finding

#: communication calls as the host issues them -> short op name
CALLS = re.compile(
    r"^(?:c10d::(?P<c10d>send|recv_|recv_any_source_|allreduce_|allgather_|_allgather_base_|reduce_scatter_|"
    r"_reduce_scatter_base_|broadcast_|barrier|alltoall_base_|alltoall_|gather_|scatter_)"
    r"|nccl:(?P<nccl>send|recv|all_reduce|all_gather|reduce_scatter|broadcast|all_to_all))$"
)
HUNG_FACTOR = 5.0  # a hung step is at least this many times the median of the other steps, on every rank


@dataclass
class P2PHangResult:
    hung_steps: list[int] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: per rank: last enqueued / started / completed call
    progress: list[dict[str, Any]] = field(default_factory=list)


def _short(name: str) -> str | None:
    m = CALLS.match(name)
    if not m:
        return None
    op = m.group("c10d") or m.group("nccl")
    return {
        "recv_": "recv",
        "recv_any_source_": "recv",
        "allreduce_": "allreduce",
        "all_reduce": "allreduce",
    }.get(op, op.strip("_"))


def hung_steps(breakdown: pa.Table, factor: float = HUNG_FACTOR) -> list[int]:
    """Steps whose duration is >= factor x the median of the other steps on every rank that has them.

    Each row's reference (the median of its rank's other steps) is read off the rank's sorted durations
    with the row left out, for all rows at once: O(rows log rows), whatever the number of steps."""
    b = breakdown.select(["rank", "step", "step_time_ns"]).filter(pc.is_valid(breakdown.column("step")))
    step = b.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    if np.unique(step).size < 2:
        return []
    rank = b.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    dur_col = b.column("step_time_ns")
    key = np.unique(np.stack([rank, step]), axis=1)
    if dur_col.null_count or key.shape[1] != step.size:  # (a null or a repeated (rank, step): pandas' rules)
        return _hung_steps_frame(b, factor)
    dur = dur_col.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((dur, rank))
    r, v = rank[order], dur[order]
    first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    size = np.diff(np.r_[first, r.size])
    start = np.repeat(first, size)  # each sorted row's rank's first position
    n = np.repeat(size, size)
    p = np.arange(r.size) - start  # the row's position among its rank's sorted durations
    m = n - 1  # the other steps of the row's rank

    def others(k: np.ndarray) -> np.ndarray:
        """The k-th smallest of the rank's other durations (the row itself left out)."""
        out: np.ndarray = v[np.minimum(start + k + (k >= p), r.size - 1)].astype(np.float64)
        return out

    lo_k = np.maximum((m - 1) // 2, 0)
    ref = np.where(m % 2 == 1, others(lo_k), (others(np.maximum(m // 2 - 1, 0)) + others(m // 2)) / 2)
    has_ref = m > 0
    hung = v.astype(np.float64) >= factor * ref
    s = step[order][has_ref]
    seen = np.unique(s)
    bad = np.unique(s[~hung[has_ref]])
    return [int(x) for x in seen[~np.isin(seen, bad)]]


def _hung_steps_frame(b: pa.Table, factor: float) -> list[int]:
    """`hung_steps` as pandas computes it, for a breakdown with a null duration or a repeated (rank, step)."""
    f = b.to_pandas()
    out = []
    for s in sorted(f["step"].unique()):
        cur = f[f["step"] == s].set_index("rank")["step_time_ns"]
        ref = f[f["step"] != s].groupby("rank")["step_time_ns"].median()
        common = cur.index.intersection(ref.index)
        if len(common) and bool((cur[common] >= factor * ref[common]).all()):
            out.append(int(s))
    return out


def call_sequences(events: pa.Table) -> pd.DataFrame:
    """Communication calls per rank on its main thread, in issue order: rank, step, op, ts_ns, end_ns."""
    cols = ["rank", "step", "op", "ts_ns", "end_ns"]
    if events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    names = events.column("name")
    is_call = _dict_lookup(names, lambda v: int(_short(v) is not None)).astype(bool)
    kind = events.column("kind")
    is_op = _dict_lookup(kind, lambda v: int(v in ("cpu_op", "user_annotation"))).astype(bool)
    idx = np.flatnonzero(is_call & is_op)
    if idx.size == 0:
        return pd.DataFrame(columns=cols)
    t = events.take(pa.array(idx)).select(["rank", "name", "tid", "ts_ns", "dur_ns", "step"]).to_pandas()
    mains = main_threads(events)
    t = t[t["tid"] == t["rank"].map(mains)]
    t["op"] = t["name"].astype(str).map(_short)
    t["end_ns"] = t["ts_ns"] + t["dur_ns"].fillna(0)
    t["step"] = t["step"].astype("Int64")
    return t.sort_values(["rank", "ts_ns"])[cols].reset_index(drop=True)


def _departure(seq: list[str], ref: list[str]) -> int | None:
    """First index where `seq` is not a prefix of `ref` (None: it is a prefix)."""
    for i, op in enumerate(seq):
        if i >= len(ref) or ref[i] != op:
            return i
    return None


def diagnose_p2p(
    events: pa.Table, breakdown: pa.Table, stage_of: dict[int, int] | None = None
) -> P2PHangResult:
    """Root rank, missing call and blocked chain of a hang through point-to-point (see the module doc)."""
    res = P2PHangResult(hung_steps=hung_steps(breakdown))
    if not res.hung_steps:
        return res
    calls = call_sequences(events)
    if calls.empty:
        return res
    step = res.hung_steps[0]
    w = breakdown.select(["rank", "step", "window_end_ns"]).to_pylist()
    win_end = {(int(x["rank"]), int(x["step"])): int(x["window_end_ns"]) for x in w if x["step"] is not None}
    seqs = {int(r): g for r, g in calls.groupby("rank")}
    healthy: dict[int, list[str]] = {}
    for r, g in seqs.items():
        prev = g[(g["step"].notna()) & (g["step"] != step) & (g["step"] < step)]
        if len(prev):
            last = prev["step"].max()
            healthy[r] = prev[prev["step"] == last]["op"].tolist()
    roots: list[dict[str, Any]] = []
    blocked: list[dict[str, Any]] = []
    for r, g in sorted(seqs.items()):
        cur = g[g["step"] == step]
        if cur.empty:
            continue
        ref = healthy.get(r)
        if ref is None and stage_of:  # no earlier step: a stage peer's sequence in this step
            peers = [p for p, s in stage_of.items() if s == stage_of.get(r) and p != r and p in seqs]
            for p in peers:
                pc_ = seqs[p][seqs[p]["step"] == step]["op"].tolist()
                if len(pc_) > len(cur):
                    ref = pc_
                    break
        ops = cur["op"].tolist()
        last = cur.iloc[-1]
        op, since = str(last["op"]), int(last["ts_ns"])
        end = win_end.get((r, step), int(last["end_ns"]))
        if op != "recv":  # async sends return at once: the wait is in a collective still pending at the end
            coll = cur[~cur["op"].isin(("send", "recv"))]
            if len(coll):
                op, since = str(coll.iloc[0]["op"]), int(coll.iloc[0]["ts_ns"])
        blocked.append(
            {
                "rank": r,
                "op": op,
                "index": len(ops),
                "since_ns": since,
                "blocked_ms": round((end - since) / 1e6, 1),
            }
        )
        if ref is None:
            continue
        k = _departure(ops, ref)
        if k is not None:
            missing = ref[k]
            nth = sum(1 for o in ref[: k + 1] if o == missing)
            roots.append({"rank": r, "op": missing, "nth": nth, "position": k + 1, "issued_instead": ops[k]})
        res.progress.append(
            {"rank": r, "step": step, "last_enqueued": f"{ops[-1]} #{len(ops)}",
             "last_started": f"{ops[-1]} #{len(ops)}",
             "last_completed": f"{ops[-2]} #{len(ops) - 1}" if len(ops) > 1 else None,
             "healthy_calls": len(ref)}
        )  # fmt: skip
    if not roots:
        return res
    root = roots[0]
    chain = sorted(blocked, key=lambda b: b["since_ns"])
    t0 = chain[0]["since_ns"] if chain else 0
    chain_txt = ", ".join(
        f"rank {b['rank']} in {b['op']} (+{(b['since_ns'] - t0) / 1e6:.0f} ms, {b['blocked_ms'] / 1e3:.1f} s)"
        for b in chain[:8]
    )
    where = f" (stage {stage_of[root['rank']]})" if stage_of and root["rank"] in stage_of else ""
    res.findings.append(
        finding(
            "P2P_HANG",
            "error",
            f"step {step} hung: rank {root['rank']}{where} never issued {root['op']} #{root['nth']} of the step "
            f"(call {root['position']} of its healthy sequence; it issued {root['issued_instead']} there); "
            f"blocked behind it: {chain_txt}. Step {step} is left out of the performance analysis",
            ranks=[root["rank"]],
            stages=[stage_of[root["rank"]]] if stage_of and root["rank"] in stage_of else [],
            step=step,
            root_rank=root["rank"],
            missing_op=root["op"],
            missing_nth=root["nth"],
            blocked_chain=[{k: v for k, v in b.items() if k != "since_ns"} for b in chain],
            other_departures=[x["rank"] for x in roots[1:]],
            progress=res.progress,
        )
    )
    return res
