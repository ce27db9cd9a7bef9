"""Evidence for CPU-timeline ranks (gloo) that does not depend on how the OS shared the cores.

When several ranks share one host's CPUs, every op's wall duration includes the time its process was
descheduled: a rank that does 40% more work can show the same summed op time as its peers (they wait
while it runs), and a rank that merely lost its core looks slow. Two measures hold regardless:

* `ops`: compute-class cpu ops per (rank, step) on the main thread, a count of work done. A rank that
  runs more ops than its stage peers does more work (the +40% rank's 64 extra `aten::mm` per step); a
  stage whose ranks run more ops holds more layers.
* `host_ns`: time inside cpu-op frames with no op running under them (a `time.sleep`, Python, a comm
  hook inside `autograd::engine::evaluate_function: AccumulateGrad`): on the main thread, the union of
  the non-leaf compute frames minus the union of the leaf ops. That is host time, not compute.

Ranks `shared_host_ranks` returns are judged on these (tracelens.analyze.comm.stragglers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.rank.classify import COMM, COMPUTE, _dict_lookup, classify, main_threads
from tracelens.thresholds import DEFAULT

if TYPE_CHECKING:
    from tracelens.schema import RankSets


def shared_host_ranks(metadata: pa.Table | None, sets: dict[int, RankSets]) -> set[int]:
    """CPU-timeline ranks that share a host name with another CPU-timeline rank (time-shared cores)."""
    if metadata is None or metadata.num_rows == 0:
        return set()
    cpu = {r for r, s in sets.items() if getattr(s, "path", None) == "cpu"}
    hosts: dict[str, list[int]] = {}
    for row in metadata.select(["rank", "host_name"]).to_pylist():
        if row["rank"] in cpu and row["host_name"]:
            hosts.setdefault(str(row["host_name"]), []).append(int(row["rank"]))
    return {r for rs in hosts.values() if len(rs) > 1 for r in rs}


def _self_times(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Self time, direct parent) of properly nested intervals sorted by (start, -end): duration minus direct
    children, and the index of each interval's direct parent (-1 for none)."""
    child = np.zeros(len(s), np.int64)
    parent = np.full(len(s), -1, np.int64)
    stack: list[int] = []
    for i in range(len(s)):
        si = s[i]
        while stack and e[stack[-1]] <= si:
            stack.pop()
        if stack:
            child[stack[-1]] += min(e[i], e[stack[-1]]) - si
            parent[i] = stack[-1]
        stack.append(i)
    out: np.ndarray = (e - s) - child
    return out, parent


def _waited(
    s: np.ndarray, e: np.ndarray, parent: np.ndarray, which: np.ndarray, cs: np.ndarray, ce: np.ndarray
) -> np.ndarray:
    """For the intervals `which` (indices into s, e): the part of their self time (outside their direct
    children) covered by communication spans [cs, ce) (sorted by start) that start and end inside them: a
    collective the frame launched and returned from only once it completed, i.e. time spent waiting for peers
    (FSDP's all-gather inside an autograd node), not host work."""
    out = np.zeros(len(which), np.int64)
    if cs.size == 0:
        return out
    kids = np.argsort(parent, kind="stable")
    kp = parent[kids]
    for j, i in enumerate(which):
        lo, hi = int(s[i]), int(e[i])
        a, b = np.searchsorted(cs, lo, "left"), np.searchsorted(cs, hi, "left")
        inside = ce[a:b] <= hi
        if not inside.any():
            continue
        comm = iv.union(cs[a:b][inside], ce[a:b][inside])
        c0, c1 = np.searchsorted(kp, i, "left"), np.searchsorted(kp, i, "right")
        mine = kids[c0:c1]
        own = iv.subtract(comm, iv.union(s[mine], np.minimum(e[mine], hi))) if mine.size else comm
        out[j] = int(np.sum(own[1] - own[0]))
    return out


def frame_gaps(events: pa.Table, ranks: set[int] | None = None, per_call: bool = False) -> pd.DataFrame:
    """Per (rank, step, frame name): self time of main-thread cpu-op frames that are not `aten::` /
    `c10d::` ops nor communication (autograd nodes, `AccumulateGrad`, custom ops): time the host spent in
    them with no op under it. An `aten::` op's self time is its work, and a communication op's
    (`_c10d_functional::wait_tensor`, DTensor's wait for a collective) is waiting for its peers, so neither
    is host time here; nor is the time a frame spends in a collective it launched and waited for (`_waited`:
    FSDP's all-gather inside an autograd node). A collective already in flight when the frame began, or
    still in flight when it ended, was not what it waited for (a sleep in a DDP comm hook while an earlier
    bucket's all-reduce runs stays host time)."""
    cols = ["rank", "step", "name", "gap_ns", "calls"]
    if events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    kind = events.column("kind")
    is_op = _dict_lookup(kind, lambda v: int(v == "cpu_op")).astype(bool)
    rank = events.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    tid = events.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
    ts = events.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False), 0)
    step = events.column("step").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    names = events.column("name").combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = names.dictionary_encode()
    values = names.dictionary.to_pylist()
    code = names.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int64)
    framey = np.array(
        [not (v or "").startswith(("aten::", "c10d::", "ProfilerStep")) for v in values] + [False]
    )
    comm = classify(events) == COMM
    mains = main_threads(events)
    parts = []
    for r in np.unique(rank):
        r = int(r)
        if ranks is not None and r not in ranks:
            continue
        idx = np.flatnonzero((rank == r) & is_op & (tid == mains.get(r, -2)))
        if idx.size == 0:
            continue
        order = idx[np.lexsort((-end[idx], ts[idx]))]
        s_o, e_o = ts[order], end[order]
        self_t, parent = _self_times(s_o, e_o)
        cand = np.flatnonzero(framey[code[order]] & ~comm[order] & (self_t >= STALL_MIN_NS))
        flight = np.flatnonzero((rank == r) & comm)
        if cand.size and flight.size:
            fo = flight[np.argsort(ts[flight], kind="stable")]
            self_t[cand] -= _waited(s_o, e_o, parent, cand, ts[fo], end[fo])
        f = framey[code[order]] & ~comm[order] & (step[order] >= 0)
        if not f.any():
            continue
        parts.append(
            pd.DataFrame(
                {"rank": r, "step": step[order][f], "name": np.array(values + [""], object)[code[order][f]],
                 "gap_ns": self_t[f]}
            )
        )  # fmt: skip
    if not parts:
        return pd.DataFrame(columns=cols)
    d = pd.concat(parts, ignore_index=True)
    if per_call:
        return d
    return d.groupby(["rank", "step", "name"], as_index=False).agg(
        gap_ns=("gap_ns", "sum"), calls=("gap_ns", "size")
    )


#: a stall call: self time >= this (ns) and >= half the frame's largest; sizes within STALL_SPREAD of each other
#: (tracelens.thresholds: stall_min_ms, stall_spread)
STALL_MIN_NS = int(DEFAULT.stall_min_ms * 1e6)
STALL_SPREAD = DEFAULT.stall_spread


def stall_frames(
    events: pa.Table,
    ranks: set[int],
    group_of: dict[int, int],
    min_ns: int = STALL_MIN_NS,
    spread: float = STALL_SPREAD,
) -> pd.DataFrame:
    """Per (rank, step): a regular host stall in one kind of frame, {rank, step, host_frame, host_ns, calls}.

    On time-shared cores descheduling also leaves long self times, but irregularly; a stall the program
    makes (a sleep in a comm hook before each bucket) is regular: the same number of long calls of one
    frame in every step, of about the same length (within STALL_SPREAD), with no call of
    that frame between half that length and it, which its peers do not show.
    host_ns is the long calls' time minus the peers' median time in those calls of that frame."""
    cols = ["rank", "step", "host_frame", "host_ns", "calls"]
    d = frame_gaps(events, ranks, per_call=True)
    if d.empty:
        return pd.DataFrame(columns=cols)
    steps = d.groupby("rank")["step"].unique().map(lambda v: sorted(int(x) for x in v))
    best: dict[int, tuple[str, pd.Series, int, float]] = {}
    for (r, name), g in d.groupby(["rank", "name"]):
        top = float(g["gap_ns"].max())
        if top < min_ns:
            continue
        big = g[g["gap_ns"] >= max(min_ns, 0.5 * top)]
        counts = big.groupby("step").size().reindex(steps[r], fill_value=0)
        if (counts == 0).any() or counts.nunique() != 1:
            continue
        lo = float(big["gap_ns"].min())
        if float(big["gap_ns"].max()) > spread * lo:
            continue
        # separated: no call of that frame between half the stall and the stall (descheduling has a tail)
        if ((g["gap_ns"] >= lo / 2) & (g["gap_ns"] < lo)).any():
            continue
        per_step = big.groupby("step")["gap_ns"].sum()
        if r not in best or per_step.min() > best[r][1].min():
            best[r] = (name, per_step, int(counts.iloc[0]), float(big["gap_ns"].min()))
    rows = []
    for r, (name, per_step, n, floor) in best.items():
        peers = [p for p, grp in group_of.items() if grp == group_of.get(r) and p != r]
        pg = d[d["rank"].isin(peers) & (d["name"] == name) & (d["gap_ns"] >= floor / spread)]
        for st, v in per_step.items():
            ref = pg[pg["step"] == st].groupby("rank")["gap_ns"].sum().reindex(peers, fill_value=0)
            excess = float(v) - (float(np.median(ref)) if len(ref) else 0.0)
            if excess > 0:
                rows.append((int(r), int(st), name, excess, n))
    return pd.DataFrame(rows, columns=cols)


def _timeline(
    events: pa.Table,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[int, int]]:
    """rank, tid, start, end, step (-1 for none) per event as NumPy arrays, and each rank's main thread."""
    rank = events.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    tid = events.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
    ts = events.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False), 0)
    step = events.column("step").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return rank, tid, ts, end, step, main_threads(events)


def per_rank_step(events: pa.Table, ranks: set[int] | None = None) -> pd.DataFrame:
    """Per (rank, step) of CPU-timeline ranks: `ops` (compute cpu ops on the main thread) and `host_ns`
    (time in compute frames with no op under them)."""
    cols = ["rank", "step", "ops", "host_ns"]
    if events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    classes = classify(events)
    kind = events.column("kind")
    is_op = _dict_lookup(kind, lambda v: int(v == "cpu_op")).astype(bool)
    rank, tid, ts, end, step, mains = _timeline(events)
    out = []
    for r in np.unique(rank):
        r = int(r)
        if ranks is not None and r not in ranks:
            continue
        m = (rank == r) & is_op & (tid == mains.get(r, -2)) & ((classes == COMPUTE) | (classes == COMM))
        idx = np.flatnonzero(m)
        if idx.size == 0:
            continue
        order = idx[np.lexsort((-end[idx], ts[idx]))]
        s, e, c, st = ts[order], end[order], classes[order], step[order]
        # leaf: the next op (in start order) starts at or after its end
        nxt = np.append(s[1:], np.iinfo(np.int64).max)
        leaf = nxt >= e
        frames = ~leaf & (c == COMPUTE)
        leaves = iv.union(s[leaf], e[leaf])
        gaps = iv.subtract(iv.union(s[frames], e[frames]), leaves)
        for k in np.unique(st[st >= 0]):
            sel = st == k
            lo, hi = int(s[sel].min()), int(e[sel].max())
            host = int(iv.measure_in_windows(gaps, np.array([lo]), np.array([hi]))[0])
            out.append((r, int(k), int(np.sum(sel & (c == COMPUTE))), host))
    return pd.DataFrame(out, columns=cols)


def longest_gaps(events: pa.Table, ranks: set[int] | None = None) -> pd.DataFrame:
    """Per (rank, step) of CPU-timeline ranks: the longest interval of the step in which the rank neither ran
    a cpu op on its main thread nor had communication in flight on any thread (`gap_ns`): it waited for
    nothing and did nothing the profiler sees (a sleep, data loading in Python, a blocking read; user
    annotations such as `record_function("dataloader")` do not count as work). A wait for a collective or a
    receive is communication in flight (gloo's work spans), so it is no gap; descheduling stretches the op
    that was running far more often than it leaves a gap between two ops."""
    cols = ["rank", "step", "gap_ns"]
    if events.num_rows == 0:
        return pd.DataFrame(columns=cols)
    classes = classify(events)
    kind = events.column("kind")
    is_op = _dict_lookup(kind, lambda v: int(v == "cpu_op")).astype(bool)
    is_step = _dict_lookup(events.column("name"), lambda v: int(v.startswith("ProfilerStep#"))).astype(bool)
    rank, tid, ts, end, step, mains = _timeline(events)
    out = []
    for r in np.unique(rank):
        r = int(r)
        if ranks is not None and r not in ranks:
            continue
        mine = rank == r
        main = mine & (tid == mains.get(r, -2))
        windows = np.flatnonzero(main & is_step)
        if not windows.size:
            continue
        busy = np.flatnonzero((main & is_op) | (mine & (classes == COMM)))
        busy_s, busy_e = iv.union(ts[busy], end[busy])
        for w in windows:
            lo, hi, k = int(ts[w]), int(end[w]), int(step[w])
            if k < 0:
                continue
            gs, ge = iv.subtract((np.array([lo]), np.array([hi])), (busy_s, busy_e))
            out.append((r, k, int((ge - gs).max()) if gs.size else 0))
    return pd.DataFrame(out, columns=cols)


#: The `host_frame` of a stall outside any op (stall_gaps).
GAP_FRAME = "(no op and no communication in flight)"


def stall_gaps(
    events: pa.Table,
    ranks: set[int],
    group_of: dict[int, int],
    min_ns: int = STALL_MIN_NS,
    spread: float = STALL_SPREAD,
) -> pd.DataFrame:
    """Per (rank, step): a regular stall outside any op, {rank, step, gap_ns}: the rank's longest gap
    (`longest_gaps`) minus its peers' median longest gap, kept when the rank's gaps are regular (within
    STALL_SPREAD of each other in every step, each at least STALL_MIN_NS): a stall the program makes repeats;
    descheduling's gaps do not. Peers are the ranks of the same group (stage) in `group_of`, or every other
    rank when none shares the rank's group."""
    cols = ["rank", "step", "gap_ns"]
    g = longest_gaps(events, ranks)
    if g.empty:
        return pd.DataFrame(columns=cols)
    g["group"] = g["rank"].map(lambda r: group_of.get(int(r), -1))
    rows = []
    for r, mine in g.groupby("rank"):
        v = mine["gap_ns"].to_numpy(np.float64)
        if v.min() < min_ns or v.max() > spread * v.min():
            continue
        peers = g[(g["group"] == group_of.get(int(r), -1)) & (g["rank"] != r)]
        if peers.empty:
            # no rank shares its stage (a pipeline without data-parallel replicas): a gap is time with no op
            # to run and nothing awaited, which no stage's own work makes, so the other ranks are the reference
            peers = g[g["rank"] != r]
        if peers.empty:
            continue
        ref = peers.groupby("step")["gap_ns"].median()
        for st, own in zip(mine["step"], v):
            excess = own - float(ref.get(st, np.nan))
            if np.isfinite(excess) and excess > 0:
                rows.append((int(r), int(st), excess))
    return pd.DataFrame(rows, columns=cols)
