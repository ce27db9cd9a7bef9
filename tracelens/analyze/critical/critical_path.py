"""The step's dependency graph across ranks, its replay, and the critical path per step.

Nodes come from device work (kernels, memcpy, memset) and their CPU launches, one step at a time (no edge
crosses a step boundary, so every step is its own graph and all steps are replayed together):

- per rank and stream, device work runs in order (stream edges);
- a kernel can start no earlier than its launch reached the GPU (`release` = CPU launch + the rank's launch
  latency; the CPU launch -> kernel edge);
- a kernel that starts when a kernel of another stream of the same rank ends waits for it (a stream-wait
  edge, inferred from the timestamps: start within `CROSS_TOL_NS` after that end, and that end explains the
  start better than the kernel's own stream and launch);
- a collective instance (`analyze.comm.collectives.match`: every participant of one call, P2P send/recv pairs
  included) is three kinds of node: each participant arrives (its kernel starts), the transfer starts when the
  last one has arrived, and each participant ends `transfer` after that.
- a CPU that blocked on the GPU (a synchronize, a blocking device-to-host copy: `sync_calls`) launches what
  follows when the device work it waited for (X) ended: every kernel that thread launches after the sync
  returned, until its next sync, has a release that moves with X (`release' = release + finish'(X) - end_X`,
  a sync edge). A sync-type call blocked when device work of its rank ended inside the call and the call
  returned within `SYNC_TOL_NS` after the latest such end; X is that work.

Per-kernel chains are coarsened into per-stream segments wherever no edge leaves or enters mid-chain: a
segment is max-plus linear in its entry time, `finish = max(entry + D, Q)` with D the sum of its durations
(and unexplained gaps) and Q the latest release plus what follows it, so a segment replays in one step.
Segments also break where the sync epoch of the launching thread changes (so a segment has at most one sync
predecessor X) and after a kernel a sync waited for; a segment with launches after a sync has two release
terms, `finish = max(entry + D, Q_fixed, Q_sync + finish[X] - end_X)`, with X before it in the topological
order but not one of its entry edges. Every node (segment, arrival, instance, finish) replays that way, level
by level in topological order, vectorised over all ranks and steps. Times are aligned by the clock offsets.

With nothing changed the replay reproduces the observed times (the unexplained gap before each kernel is kept
as a constant); `whatif.py` changes durations, releases or transfers and replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core.dictcol import per_object
from tracelens.analyze.critical.critical_keys import (
    Cells,
    as_pandas_ints,
    cells,
    code_type,
    coll_bytes,
    coll_cells,
    coll_lookup,
    launch_latency,
    per_rank,
    sort_order,
    sync_epochs,
    unique_inverse,
)
from tracelens.analyze.critical.critical_nodes import SYNC_TOL_NS as SYNC_TOL_NS
from tracelens.analyze.critical.critical_nodes import device_nodes as device_nodes
from tracelens.analyze.critical.critical_nodes import sync_calls as sync_calls
from tracelens.analyze.critical.critical_replay import NEG as NEG
from tracelens.analyze.critical.critical_replay import Replay as Replay
from tracelens.analyze.critical.critical_replay import ReplayPlan as ReplayPlan
from tracelens.analyze.critical.critical_replay import mean_step_time_ns
from tracelens.analyze.critical.critical_replay import replay as replay
from tracelens.analyze.critical.critical_replay import replay_plan as replay_plan
from tracelens.schema import NODES as NODES
from tracelens.schema import SYNCS as SYNCS

#: A kernel starting this soon after another stream's kernel ends (and not explained otherwise) waited for it.
CROSS_TOL_NS = 5_000
#: At most this many critical-path segments in summary.json (the longest first).
MAX_SEGMENTS = 200
SEG, ARR, INST, FIN = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------------
# graph
# ----------------------------------------------------------------------------------------------------
@dataclass
class Graph:
    """Per kernel (k_*) and per node arrays of one run's dependency graph; times in ns from `origin_ns`."""

    origin_ns: int
    # kernels, sorted by (step, rank, stream, start)
    k_rank: np.ndarray
    k_step: np.ndarray
    k_end: np.ndarray
    k_dur: np.ndarray  # float ns
    k_release: np.ndarray  # float ns (NEG: no launch constraint)
    k_res: np.ndarray  # unexplained gap before the kernel (kept constant)
    k_comm: np.ndarray
    k_label: Cells  # layer label (None: none)
    k_node: np.ndarray  # node holding the kernel (segment; for a collective kernel its FIN node)
    k_transfer: np.ndarray  # collective kernels: observed transfer (end - latest arrival)
    k_op: Cells  # collective op or ""
    k_group: Cells  # collective group key or ""
    k_instance: np.ndarray  # collective instance id or -1
    ck_bytes: np.ndarray  # bytes of each collective kernel (k_instance >= 0), in kernel order
    # nodes
    n_type: np.ndarray
    n_rank: np.ndarray
    n_step: np.ndarray
    n_first_k: np.ndarray  # first kernel of the node (SEG), the kernel (ARR/FIN), -1 (INST)
    n_last_k: np.ndarray
    e_src: np.ndarray
    e_dst: np.ndarray
    levels: list[np.ndarray] = field(default_factory=list)  # node ids per topological level
    level_edges: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    level_of: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int8))  # each node's level
    step_origin: dict[int, float] = field(default_factory=dict)  # step -> earliest release/start (ns)
    stage_of: dict[int, int] | None = None
    dropped_instances: int = 0  # collective instances left out: their matching formed a cycle
    # sync edges (see module docstring)
    # (the four below are empty when no launch follows a blocking sync)
    k_sync_x: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # X per kernel, or -1
    k_sync_ret: np.ndarray = field(default_factory=lambda: np.empty(0))  # that sync's return + launch latency
    n_sync_src: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # node of X, or -1
    n_sync_end: np.ndarray = field(default_factory=lambda: np.empty(0))  # observed end of X
    s_src: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # sync edges (X's node)
    s_dst: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    n_syncs: int = 0  # CPU calls found blocked on the GPU
    early_instances: int = 0  # collective instances left out: a participant ended before the last arrived

    @property
    def k_start(self) -> np.ndarray:
        """Kernel starts (end - duration: exact, whole ns below 2**53)."""
        out: np.ndarray = self.k_end - self.k_dur
        return out

    @property
    def n_nodes(self) -> int:
        return int(self.n_type.size)


#: Rounds of leaving out cycle-forming collective instances before giving up.
MAX_CYCLE_ROUNDS = 8


def build_graph(
    nodes: pa.Table,
    collectives: pa.Table | None,
    offsets_ns: dict[int, int] | None = None,
    stage_of: dict[int, int] | None = None,
    syncs: pa.Table | None = None,
    nodes_read: Callable[[], object] | None = None,
) -> Graph | None:
    """The step-bounded dependency graph (see module docstring); None when there is no device work.
    `nodes_read`: see `analyze_critical_path`.

    Collective instances whose matching the ranks' stream order contradicts (a cycle through their arrival,
    instance and finish nodes: rank 0 runs A then B, rank 1 runs B then A) are left out of the graph as
    rendezvous (their kernels stay, as plain stream work); `Graph.dropped_instances` counts them.
    """
    excluded = np.empty(0, dtype=np.int64)
    for _ in range(MAX_CYCLE_ROUNDS):
        g = _build_graph(nodes, collectives, offsets_ns, stage_of, excluded, syncs, nodes_read)
        if g is None:
            return None
        try:
            _levels(g)
        except GraphCycleError:
            cyc = _cycle_instances(g)
            if cyc.size == 0:
                raise
            excluded = np.union1d(excluded, cyc)
            continue
        g.dropped_instances = int(excluded.size)
        return g
    raise GraphCycleError(
        f"dependency graph has a cycle after leaving out {excluded.size} collective instances"
    )


def _cycle_instances(g: Graph) -> np.ndarray:
    """Collective instance ids whose nodes lie on a cycle (a strongly connected component of 2+ nodes)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    n = g.n_nodes
    src, dst = np.r_[g.e_src, g.s_src], np.r_[g.e_dst, g.s_dst]
    adj = csr_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(n, n))
    _, lab = connected_components(adj, directed=True, connection="strong")
    on_cycle = np.bincount(lab, minlength=int(lab.max()) + 1 if n else 0)[lab] > 1
    ck = np.flatnonzero(g.k_instance >= 0)
    return np.unique(g.k_instance[ck[on_cycle[g.k_node[ck]]]])


def _build_graph(
    nodes: pa.Table,
    collectives: pa.Table | None,
    offsets_ns: dict[int, int] | None,
    stage_of: dict[int, int] | None,
    excluded: np.ndarray,
    syncs: pa.Table | None = None,
    nodes_read: Callable[[], object] | None = None,
) -> Graph | None:
    if nodes.num_rows == 0:
        return None
    off = {int(k): int(v) for k, v in (offsets_ns or {}).items()}

    def ints(name: str) -> np.ndarray:
        out: np.ndarray = nodes.column(name).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return out

    def key_col(name: str) -> np.ndarray:
        """rank, step, stream: int32 when the column's type is (schema NODES)."""
        a: np.ndarray = nodes.column(name).to_numpy(zero_copy_only=False)
        small = (a.dtype.kind == "i" and a.dtype.itemsize <= 4) or (
            a.dtype.kind == "u" and a.dtype.itemsize < 4
        )
        return a.astype(np.int32 if small else np.int64, copy=False)

    rank, step, stream = key_col("rank"), key_col("step"), key_col("stream")
    raw_start, raw_end = ints("start_ns"), ints("end_ns")
    o = per_rank(rank, off)
    origin = int((raw_start - o).min())
    o += origin  # (whole ns: x - o - origin as x - (o + origin))
    s = (raw_start - o).astype(float)
    e = (raw_end - o).astype(float)
    launch = as_pandas_ints(nodes.column("launch_ns"))
    no_launch = np.isnan(launch) if launch.dtype.kind == "f" else None
    li = launch - o if no_launch is None else np.where(no_launch, 0, launch).astype(np.int64)
    if no_launch is not None:
        li -= o
    L = li.astype(float)
    if no_launch is not None:
        L[no_launch] = np.nan
    del launch, o, no_launch, li
    # kernels sorted by (step, rank, stream, start), stably (each array reordered in turn: one copy at a time)
    order = sort_order(step, rank, stream, s)
    rank = rank[order]
    step = step[order]
    stream = stream[order]
    raw_start = raw_start[order]
    raw_end = raw_end[order]
    s = s[order]
    e = e[order]
    L = L[order]
    is_comm = nodes.column("is_comm").to_numpy(zero_copy_only=False).astype(bool, copy=False)[order]
    label = cells(nodes.column("label"), order)
    if syncs is None or syncs.num_rows == 0:
        tid = np.empty(0)  # (read by `sync_epochs` only when there are sync calls)
    elif "launch_tid" in nodes.column_names:
        tid = as_pandas_ints(nodes.column("launch_tid"))[order].astype(float, copy=False)
    else:
        tid = np.full(order.size, np.nan)
    del order
    if nodes_read is not None:  # (nothing below reads `nodes`)
        nodes_read()
    n = rank.size

    # collectives: instance, transfer per participant (op, group and bytes from the matched rows)
    inst = np.full(n, -1, dtype=np.int64)
    transfer = np.full(n, np.nan)
    c_hit = c_row = np.zeros(0, dtype=np.int64)  # the kernels matched, their collective rows
    if collectives is not None and collectives.num_rows:
        q = np.flatnonzero(is_comm)
        c_hit, c_row = coll_lookup(collectives, rank, raw_start, raw_end, s, e, q, inst, transfer)
        del q
    del raw_start, raw_end
    op = coll_cells(collectives, "op", c_hit, c_row, n)
    group = coll_cells(collectives, "group_key", c_hit, c_row, n)
    # an instance seen by one participant only is no rendezvous
    on = inst >= 0
    u_inst, i_inv = unique_inverse(inst[on])  # (np.unique's: by a table when the ids are dense)
    i_cnt = np.bincount(i_inv, minlength=u_inst.size)
    lone = np.zeros(n, dtype=bool)
    lone[on] = i_cnt[i_inv.reshape(-1)] < 2
    # nor is one where a participant ended before the last one arrived (aligned): a wrong match, or a send
    # that completed eagerly; replayed as a rendezvous it would finish that participant late
    s_max = np.full(u_inst.size, -np.inf)
    e_min = np.full(u_inst.size, np.inf)
    np.maximum.at(s_max, i_inv.reshape(-1), s[on])
    np.minimum.at(e_min, i_inv.reshape(-1), e[on])
    early_ids = u_inst[s_max - e_min > CROSS_TOL_NS].astype(np.int64)
    inst = np.where(lone | np.isin(inst, excluded) | np.isin(inst, early_ids), -1, inst)
    del lone, on, i_inv
    # ids in the smallest integer type that holds them (int32 up to ~700 M kernels: nodes <= 3 per kernel)
    ix = np.int32 if 3 * n + 1 < 2**31 - 1 and int(np.abs(inst).max(initial=0)) < 2**31 - 1 else np.int64
    inst = inst.astype(ix, copy=False)
    coll = inst >= 0

    np.maximum(e, s, out=e)

    # launch latency per rank: the smallest launch -> start seen on that rank
    lat_k = launch_latency(rank, step, s, L)
    release = np.where(np.isnan(L), NEG, L + lat_k)
    np.minimum(release, s, out=release)

    # stream predecessor
    n_r = int(rank.max()) + 1
    fits = n == 0 or (int(np.abs(step).max()) + 1) * n_r < 2**31 - 1 and int(rank.min()) >= 0
    grp_rs = step.astype(np.int32 if fits else np.int64) * n_r + rank  # (step, rank) group id
    same_stream = np.r_[False, (grp_rs[1:] == grp_rs[:-1]) & (stream[1:] == stream[:-1])]

    # sync edges: the kernel X whose end the launching thread's last blocking sync waited for
    sync_x, sync_ret, n_syncs = sync_epochs(syncs, off, origin, rank, step, e, L, tid, lat_k)
    sync_x = sync_x.astype(ix)
    if not (sync_x >= 0).any():
        sync_ret = np.empty(0)  # (all NaN: no launch follows a blocking sync)
    del tid, lat_k
    # a kernel without a launch takes the epoch of the kernel before it on its stream (it has no release term)
    known = np.where(np.isnan(L), -1, np.arange(n))
    del L
    last_known = np.maximum.accumulate(known) if n else known
    del known
    run_start = np.maximum.accumulate(np.where(~same_stream, np.arange(n), 0)) if n else last_known
    ep = np.where(last_known >= run_start, sync_x[np.maximum(last_known, 0)], -1)
    del last_known, run_start

    # cross-stream predecessor: the latest end on another stream of the same (step, rank) at or before start
    sp = np.where(same_stream, np.arange(n) - 1, -1).astype(ix)
    prev_e = np.empty(n)  # (the end before each kernel: a shifted copy, not a gather by `sp`)
    prev_e[:1] = NEG
    prev_e[1:] = e[:-1]
    explained = np.maximum(np.where(same_stream, prev_e, NEG), release)
    del prev_e
    # with exact keys (whole ns below 2**40, (step, rank) ids below 2**13: below 2**53) a predecessor ends at or
    # before the start, so a kernel whose start its stream or release explains has none (one ending later than
    # `explained` is needed): only the others are looked up
    exact = int(grp_rs.min()) >= 0 and int(grp_rs.max()) < 2**13 and float(e.max()) < 2**40
    need = explained < s if exact else np.ones(n, dtype=bool)
    # on a tie (a batched send/recv pair ends together) the receive is what the next kernel waits for
    send = op.mask("send")
    got = cross_candidates_exact(stream, grp_rs, s, e, need, send, ix) if exact else None
    best_end, best_idx = got or cross_candidates(stream, grp_rs, s, e, need, e - 0.5 * send, ix)
    del got, send
    del stream, grp_rs, need
    cross_ok = (best_idx >= 0) & (s - best_end <= CROSS_TOL_NS) & (best_end > explained)
    cp = np.where(cross_ok, best_idx, -1).astype(ix)
    del cross_ok, best_idx
    pred_end = np.maximum(explained, np.where(cp >= 0, best_end, NEG))
    del explained, best_end
    no_pred = (sp < 0) & (cp < 0) & (release <= NEG / 2)
    release = np.where(no_pred, s, release)  # a source with nothing known starts when it started
    pred_end = np.where(no_pred, s, pred_end)
    del no_pred
    res = np.clip(s - np.maximum(pred_end, release), 0, None)
    del pred_end
    dur = e - s
    # kernels are sorted by step: the earliest release or start per step is one reduction per run of a step
    so = np.minimum(s, np.where(release > NEG / 2, release, s))
    bounds = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    step_origin = {int(k): float(v) for k, v in zip(step[bounds], np.minimum.reduceat(so, bounds))}
    del so, bounds, s

    # segments: breaks at collectives, at kernels with a cross-stream predecessor, after a kernel another
    # stream (or a sync) waits for, where the sync epoch changes, and at a new stream
    has_out = np.zeros(n, dtype=bool)
    has_out[cp[cp >= 0]] = True
    has_out[sync_x[sync_x >= 0]] = True
    brk = ~same_stream | coll | (cp >= 0)
    del same_stream
    brk[1:] |= coll[:-1] | has_out[:-1] | (ep[1:] != ep[:-1])
    del has_out, ep
    seg_of = (np.cumsum(brk) - 1).astype(
        ix
    )  # kernel -> segment (collective kernels: their own "segment" slot)
    n_seg = int(seg_of[-1]) + 1 if n else 0

    # node ids: plain segments first, then per collective kernel ARR and FIN, then instances
    seg_is_coll = np.zeros(n_seg, dtype=bool)
    seg_is_coll[seg_of[coll]] = True
    plain = np.flatnonzero(~seg_is_coll).astype(ix)
    del seg_is_coll
    seg_node = np.full(n_seg, -1, dtype=ix)
    seg_node[plain] = np.arange(plain.size)
    ck = np.flatnonzero(coll).astype(ix)
    arr_node = (plain.size + np.arange(ck.size)).astype(ix)
    fin_node = (plain.size + ck.size + np.arange(ck.size)).astype(ix)
    inst_ids, inst_row = unique_inverse(inst[ck])
    inst_row = inst_row.reshape(-1).astype(ix)
    inst_node = (plain.size + 2 * ck.size + np.arange(inst_ids.size)).astype(ix)
    n_nodes = plain.size + 2 * ck.size + inst_ids.size

    k_in = np.full(n, -1, dtype=ix)  # node a kernel's incoming edges attach to
    k_out = np.full(n, -1, dtype=ix)  # node whose finish is the kernel's end
    k_in[~coll] = seg_node[seg_of[~coll]]
    del seg_of
    k_out[~coll] = k_in[~coll]
    k_in[ck] = arr_node
    k_out[ck] = fin_node
    first_of_seg = brk
    del brk

    src, dst = [], []
    # stream and cross edges enter at segment starts (and collective arrivals)
    ent = np.flatnonzero(first_of_seg)
    for pred in (sp, cp):
        m = ent[pred[ent] >= 0]
        src.append(k_out[pred[m]])
        dst.append(k_in[m])
    del sp, cp, ent, m, pred
    src.append(arr_node)
    dst.append(inst_node[inst_row])
    src.append(inst_node[inst_row])
    dst.append(fin_node)
    e_src = np.concatenate(src).astype(ix)
    e_dst = np.concatenate(dst).astype(ix)
    del src, dst
    # sync edges: X's node (its segment ends at X; a collective X: its FIN node) -> the launching node; the
    # per-kernel and per-node sync arrays are empty when no launch follows a blocking sync (nothing to replay)
    hs = np.flatnonzero(sync_x >= 0)
    if hs.size:
        n_sync_src = np.full(n_nodes, -1, dtype=ix)
        n_sync_end = np.full(n_nodes, NEG)
        n_sync_src[k_in[hs]] = k_out[sync_x[hs]]
        n_sync_end[k_in[hs]] = e[sync_x[hs]]
    else:
        sync_x, sync_ret = np.empty(0, dtype=ix), np.empty(0)
        n_sync_src, n_sync_end = np.empty(0, dtype=ix), np.empty(0)
    del k_in, hs
    s_dst = np.flatnonzero(n_sync_src >= 0).astype(ix)
    s_src = n_sync_src[s_dst]

    n_type = np.full(n_nodes, SEG, dtype=np.int8)
    n_type[arr_node] = ARR
    n_type[fin_node] = FIN
    n_type[inst_node] = INST
    n_first = np.full(n_nodes, -1, dtype=ix)
    n_last = np.full(n_nodes, -1, dtype=ix)
    seg_first_k = np.flatnonzero(first_of_seg).astype(ix)
    seg_last_k = np.r_[seg_first_k[1:] - 1, n - 1].astype(ix)
    n_first[seg_node[plain]] = seg_first_k[plain]
    n_last[seg_node[plain]] = seg_last_k[plain]
    del seg_first_k, seg_last_k, seg_node, plain
    n_first[arr_node] = ck
    n_last[arr_node] = ck
    n_first[fin_node] = ck
    n_last[fin_node] = ck
    n_rank = np.full(n_nodes, -1, dtype=ix)
    n_step = np.full(n_nodes, -1, dtype=ix)
    kn = n_first >= 0
    n_rank[kn] = rank[n_first[kn]]
    n_step[kn] = step[n_first[kn]]
    del kn
    first_ck = np.zeros(inst_ids.size, dtype=np.int64)
    first_ck[inst_row[::-1]] = ck[::-1]
    n_step[inst_node] = step[first_ck]

    g = Graph(
        origin_ns=origin,
        k_rank=rank.astype(ix, copy=False),
        k_step=step.astype(ix, copy=False),
        k_end=e,
        k_dur=dur,
        k_release=release,
        k_res=res,
        k_comm=is_comm,
        k_label=label,
        k_node=k_out,
        k_transfer=np.nan_to_num(transfer, nan=0.0, copy=False),
        k_op=op,
        k_group=group,
        k_instance=inst,
        ck_bytes=coll_bytes(collectives, c_hit, c_row, ck),
        n_type=n_type,
        n_rank=n_rank,
        n_step=n_step,
        n_first_k=n_first,
        n_last_k=n_last,
        e_src=e_src,
        e_dst=e_dst,
        stage_of=stage_of,
    )
    g.k_sync_x, g.k_sync_ret, g.n_syncs = sync_x, sync_ret, n_syncs
    g.early_instances = int(early_ids.size)
    g.n_sync_src, g.n_sync_end, g.s_src, g.s_dst = n_sync_src, n_sync_end, s_src, s_dst
    g.step_origin = step_origin
    return g


def cross_candidates(
    stream: np.ndarray,
    grp_rs: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    need: np.ndarray,
    score: np.ndarray,
    ix: type[np.signedinteger[Any]],
) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel with `need`: of the kernels of its (step, rank) group `grp_rs` on each other stream, the
    last ending at or before its start (by end, stably), and of those the one of highest `score` (the first
    stream in ascending order on a tie); returns its end (NEG: none) and index (-1: none)."""
    n = s.size
    SH = float(2**40)
    best_end = np.full(n, NEG)
    best_score = np.full(n, NEG)
    best_idx = np.full(n, -1, dtype=ix)
    # the rows that need a look-up, their stream and (step, rank) above the start: once for all streams
    need_k = np.flatnonzero(need)
    need_st = stream[need_k]
    need_key = grp_rs[need_k].astype(float) * SH + s[need_k]
    end_key = grp_rs.astype(float) * SH + e  # (step, rank) above the end
    st_lo, st_hi = int(stream.min()), int(stream.max())
    streams = (
        np.flatnonzero(np.bincount(stream - st_lo)) + st_lo if st_hi - st_lo < 2**20 else np.unique(stream)
    )
    for st in streams:
        # one sorted search per stream (keys of the rows it needs)
        mine = np.flatnonzero(stream == st)
        keys = end_key[mine]
        if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):  # (in stream order already: as is)
            order = np.argsort(keys, kind="stable")
            keys, mine = keys[order], mine[order]
            del order
        at = np.flatnonzero(need_st != st)
        other = need_k[at]
        if other.size == 0 or mine.size == 0:
            continue
        j = np.searchsorted(keys, need_key[at], side="right") - 1
        del at
        cand = mine[np.maximum(j, 0)]
        ok = (j >= 0) & (grp_rs[cand] == grp_rs[other])
        del j
        sc = score[cand]
        better = ok & (sc > best_score[other])
        o, c = other[better], cand[better]
        best_score[o] = sc[better]
        best_end[o] = e[c]
        best_idx[o] = c
        del mine, keys, other, cand, ok, sc, better, o, c
    return best_end, best_idx


def cross_candidates_exact(
    stream: np.ndarray,
    grp_rs: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    need: np.ndarray,
    send: np.ndarray,
    ix: type[np.signedinteger[Any]],
) -> tuple[np.ndarray, np.ndarray] | None:
    """`cross_candidates` with score `e - 0.5 * send`, by one sort of all kernels instead of a search per
    stream; None when its keys do not fit (the caller then takes `cross_candidates`).

    Starts and ends are whole ns, so a score orders as (end, not a send): a stream's kernel ending earlier than
    its candidate (the last ending at or before the start, stably) never scores higher, and the best of the
    other streams' candidates is the best kernel of the (step, rank) by (end, not a send, lowest stream)
    among those ending at or before the start on another stream, counting of the kernels sharing a stream
    and an end only the last. Sorted by that priority, it is the last before the start (p) if its stream is
    not the kernel's own, else the last before the run of one stream that ends at p."""
    n = s.size
    if n == 0 or not need.any():
        return None
    st_lo, st_hi = int(stream.min()), int(stream.max())
    g_lo, g_hi = int(grp_rs.min()), int(grp_rs.max())
    if st_hi - st_lo >= 2**20 or g_lo < 0 or g_hi >= 2**13 or float(s.min()) < 0 or float(e.max()) >= 2**40:
        return None
    present = np.bincount(stream - st_lo) > 0
    if int(present.sum()) > 2**9:
        return None
    # per stream code 511 - (its place among the streams): the lower stream ranks higher
    code = (2**9 - 1) - (np.cumsum(present) - 1)
    del present
    # of the kernels sharing (step, rank, stream) and end, only the last (kernels are by stream and start)
    same = grp_rs[1:] == grp_rs[:-1]
    same &= stream[1:] == stream[:-1]
    if bool((e[1:] >= e[:-1])[same].all()):  # ends in order within each stream: ties are neighbours
        same &= e[1:] == e[:-1]
        cand = np.flatnonzero(np.r_[~same, True]) if same.any() else None
    else:  # (overlapping kernels on a stream: ties by a stable sort of (step, rank, stream, end))
        k2 = grp_rs.astype(np.int64) << 49
        k2 |= code[stream - st_lo] << 40
        k2 |= e.astype(np.int64)
        o2 = np.argsort(k2, kind="stable")
        k2 = k2[o2]
        cand = np.sort(o2[np.r_[k2[1:] != k2[:-1], True]])
        del k2, o2
    del same
    # priority key: (step, rank) above the end above "not a send" above the stream code
    rows = slice(None) if cand is None else cand
    key = grp_rs[rows].astype(np.int64) << 50
    key |= e[rows].astype(np.int64) << 10
    key |= np.where(send[rows], 0, 2**9)
    key |= code[stream[rows] - st_lo]
    o = np.argsort(key, kind="stable")  # (kernel order is by stream first: a merge of sorted runs)
    key = key[o]
    if cand is not None:
        o = cand[o]
    q = np.flatnonzero(need)
    qkey = grp_rs[q].astype(np.int64) << 50
    qkey |= s[q].astype(np.int64) << 10
    qkey |= 2**10 - 1
    p = np.searchsorted(key, qkey, side="right")
    del qkey
    p -= 1
    none = p < 0
    np.maximum(p, 0, out=p)
    low = key & (2**9 - 1)  # each sorted kernel's stream code
    del key
    own = low[p] == code[stream[q] - st_lo]
    # the last before the run of the own stream that ends at p
    # (the last of each run but the final one, after a -1 for "none before the first run")
    runs = np.r_[-1, np.flatnonzero(low[1:] != low[:-1])]
    del low
    po = p[own]
    po = runs[np.searchsorted(runs, po, side="left") - 1]  # the last run end before p's run
    none[own] |= po < 0
    p[own] = np.maximum(po, 0)
    del po, own, runs
    c = o[p]
    del o, p
    ok = ~none
    ok &= grp_rs[c] == grp_rs[q]
    q, c = q[ok], c[ok]
    best_end = np.full(n, NEG)
    best_idx = np.full(n, -1, dtype=ix)
    best_end[q] = e[c]
    best_idx[q] = c
    return best_end, best_idx


class GraphCycleError(RuntimeError):
    """The cross-rank dependency graph has a cycle: collective instances or P2P pairs were matched in an
    order that the ranks' stream order contradicts, so no longest path exists."""


def _levels(g: Graph) -> None:
    """Topological levels (Kahn's algorithm, one vectorised round per level) and each level's in-edges."""
    n = g.n_nodes
    all_src, all_dst = g.e_src, g.e_dst  # (read only)
    if g.s_src.size:  # sync edges order, do not enter
        all_src, all_dst = np.r_[g.e_src, g.s_src], np.r_[g.e_dst, g.s_dst]
    indeg = np.bincount(all_dst, minlength=n)
    order = np.argsort(all_src, kind="stable")
    dst_by_src = all_dst[order]
    out_deg = np.bincount(all_src, minlength=n)
    starts = np.cumsum(out_deg) - out_deg  # (CSR by source: counts, not a search)
    del order, all_src, all_dst
    slot = np.zeros(n, dtype=np.int64)  # (to take each node once from a list that may repeat it)
    frontier = np.flatnonzero(indeg == 0)
    fronts: list[np.ndarray] = []  # (each level's nodes: their levels set at the end, in one call)
    # (each level: a few whole-array calls on its frontier and edges; their per-call overhead is the cost)
    while frontier.size:
        fronts.append(frontier)
        cnt = out_deg[frontier]
        cs = np.cumsum(cnt)
        tot = int(cs[-1])
        if tot == 0:
            break
        idx = np.repeat(starts[frontier] - (cs - cnt), cnt) + np.arange(tot)
        del cs
        d = dst_by_src[idx]  # (work per level: its edges, not n)
        np.subtract.at(indeg, d, 1)
        z = d[indeg[d] == 0]
        slot[z] = np.arange(z.size)
        frontier = z[slot[z] == np.arange(z.size)]  # each node once (the order within a level is not used)
    level = np.full(n, -1, dtype=np.int64)
    if fronts:
        level[np.concatenate(fronts)] = np.repeat(np.arange(len(fronts)), [f.size for f in fronts])
    del fronts
    if (level < 0).any():
        raise GraphCycleError(f"dependency graph has a cycle ({int((level < 0).sum())} nodes unreached)")
    del slot, indeg, dst_by_src, starts, out_deg
    _by_level(g, level)


def _by_level(g: Graph, level: np.ndarray) -> None:
    """Lay the graph out by its nodes' topological `level` (int64, every node reached): `levels` (each level's
    nodes), `level_of`, and the edges in order of their target's level with each level's in-edges."""
    n_lv = int(level.max()) + 1
    level = level.astype(code_type(n_lv))  # (a small type: the stable sorts below are radix sorts)
    byl = np.argsort(level, kind="stable").astype(g.n_first_k.dtype)
    bounds = np.r_[0, np.cumsum(np.bincount(level, minlength=n_lv))]
    g.levels = [byl[bounds[i] : bounds[i + 1]] for i in range(n_lv)]
    g.level_of = level
    # the edges themselves in order of their target's level (stable: a node's in-edges keep their order), so
    # that each level's in-edges are views of them, not copies
    elev = level[g.e_dst]
    eo = np.argsort(elev, kind="stable")
    eb = np.r_[0, np.cumsum(np.bincount(elev, minlength=n_lv))]
    del elev
    g.e_src, g.e_dst = g.e_src[eo], g.e_dst[eo]
    g.level_edges = [(g.e_src[eb[i] : eb[i + 1]], g.e_dst[eb[i] : eb[i + 1]]) for i in range(n_lv)]


def mean_step_ns(rp: Replay) -> float:
    return mean_step_time_ns(rp.step_time)


# ----------------------------------------------------------------------------------------------------
# critical path
# ----------------------------------------------------------------------------------------------------
Row = tuple[int, int, str, str, float, float]


def critical_segments(g: Graph, rp: Replay, plan: ReplayPlan | None = None) -> pd.DataFrame:
    """Per step, the longest chain backwards from the last finish: rows (step, rank, kind, op, start, ms).

    At each node the term that bound its finish is followed: the latest predecessor (entry + D), the sync
    term (to the device work X the CPU waited for, with a "host" segment for the CPU time from X's end to the
    launch), or the fixed release (a "host" segment from the step's start, where the walk ends). A node's
    predecessors are the sources of its in-edges among its level's (in edge order)."""
    p = replay_plan(g) if plan is None else plan
    level_of = g.level_of
    named = _named(g.k_label)
    rows: list[Row] = []
    # (the replay's own level-ordered arrays, read at each node's place: no copy in node order)
    pos = rp.pos
    fin = rp.level_finish
    D, Q, _, qk, qs = rp.terms
    S = rp.level_S if rp.level_S.size == g.n_nodes else np.full(g.n_nodes, NEG)
    sx = g.n_sync_src if g.n_sync_src.size == g.n_nodes else np.full(g.n_nodes, -1, dtype=np.int64)
    entry = rp.level_entry
    for i, st in enumerate(p.steps.tolist()):
        if st < 0:
            continue
        b0 = int(p.step_bounds[i])
        b1 = int(p.step_bounds[i + 1]) if i + 1 < p.steps.size else g.n_nodes
        idx = p.by_step[b0:b1]
        node = int(idx[np.argmax(fin[pos[idx]])])
        origin = g.step_origin.get(st, 0.0)
        guard = 0
        while node >= 0 and guard < 10_000_000:
            guard += 1
            t = int(g.n_type[node])
            es, ed = g.level_edges[level_of[node]]
            ps = es[ed == node]
            j = int(pos[node])
            d = D[j]
            via_pred = ps.size > 0 and entry[j] + d >= max(Q[j], S[j])
            via_sync = not via_pred and sx[node] >= 0 and S[j] >= Q[j]
            nxt = int(ps[np.argmax(fin[pos[ps]])]) if via_pred else int(sx[node]) if via_sync else -1
            end = fin[j]
            if t == INST:
                node = nxt
                continue
            k0 = int(g.n_first_k[node])
            r = int(g.n_rank[node])
            # the kernel whose release bound the node, and the CPU before it
            kq = int(qs[j]) if via_sync else int(qk[j])
            if t == FIN:
                rows.append((st, r, "transfer", _op(g, k0), end - d, d))
            elif t == ARR:
                if d > 0:
                    rows.append((st, r, "wait", _op(g, k0), end - d, d))
                kq = k0
            else:  # SEG
                k1 = int(g.n_last_k[node])
                if via_pred or kq < 0:
                    kq = k0
                ks = slice(kq, k1 + 1)
                comp = float(rp.dur[ks].sum())
                wait = float(g.k_res[ks].sum())
                lab = _label(g, kq, k1, named)
                rows.append((st, r, "compute", lab, end - comp - wait, comp))
                if wait > 0:
                    rows.append((st, r, "wait", "gap", end - comp - wait, wait))
            if via_sync:  # the CPU between the end of the work it waited for and this launch
                xf = float(fin[pos[sx[node]]])
                rows.append((st, r, "host", "after sync", xf, max(rp.release[kq] - g.n_sync_end[node], 0.0)))
            elif not via_pred and t != FIN:
                rows.append((st, r, "host", "launch", origin, max(rp.release[kq] - origin, 0.0)))
            node = nxt
    df = pd.DataFrame(rows, columns=["step", "rank", "kind", "op", "start_ns", "dur_ns"])
    df = df[df["dur_ns"] > 0].iloc[::-1].reset_index(drop=True)
    if g.stage_of and len(df):
        df["stage"] = df["rank"].map(g.stage_of)
        # pipeline fill and drain: path compute on a stage other than the one carrying most of the step
        per = df.groupby(["step", "stage"])["dur_ns"].sum().reset_index()
        steady = per.loc[per.groupby("step")["dur_ns"].idxmax()].set_index("step")["stage"]
        other = df["stage"] != df["step"].map(steady)
        if df["stage"].nunique() > 1:
            df.loc[other & (df["kind"] == "compute"), "kind"] = "bubble"
    else:
        df["stage"] = None
    return df


def _op(g: Graph, k: int) -> str:
    op = str(g.k_op[k]) or "comm"
    grp = str(g.k_group[k])
    return f"{op} {grp}".strip() if grp and not grp.startswith("p2p") else op


def _label(g: Graph, k0: int, k1: int, named: np.ndarray | None = None) -> str:
    """The most frequent label of kernels k0..k1 (the smallest on a tie); "compute" when none has one.
    `named`: per distinct label value, whether it is one (not None / NaN), when the caller has it."""
    lab = g.k_label
    if named is None:
        named = _named(lab)
    if k1 == k0:
        c = int(lab.codes[k0])
        return str(lab.values[c]) if named[c] else "compute"
    cnt = np.bincount(lab.codes[k0 : k1 + 1], minlength=named.size)[: named.size] * named
    if not cnt.any():
        return "compute"
    return min(str(lab.values[i]) for i in np.flatnonzero(cnt == cnt.max()))


def _named(lab: Cells) -> np.ndarray:
    return np.array([v is not None and v == v for v in lab.values], dtype=bool)


@dataclass
class CriticalPath:
    graph: Graph
    baseline: Replay
    segments: pd.DataFrame  # all steps' path segments

    def to_dict(self) -> dict[str, Any]:
        """summary.json `critical_path`: per-step means by rank, kind and stage, and the longest segments."""
        df = self.segments
        nsteps = max(len(self.baseline.step_time), 1)

        def per(col: str) -> dict[str, float]:
            if not len(df) or df[col].isna().all():
                return {}
            s = df.groupby(col)["dur_ns"].sum() / nsteps / 1e6
            return {str(int(k)) if not isinstance(k, str) else k: round(float(v), 6) for k, v in s.items()}

        segs = df.sort_values("dur_ns", ascending=False).head(MAX_SEGMENTS).sort_values(["step", "start_ns"])
        return {
            "step_time_ms": round(mean_step_ns(self.baseline) / 1e6, 6),
            "by_rank_ms": per("rank"),
            "by_kind_ms": per("kind"),
            "by_stage_ms": per("stage") if "stage" in df and df["stage"].notna().any() else {},
            "segments": [
                {
                    "step": int(r.step),
                    "rank": int(r.rank),
                    "stage": None if r.stage is None or r.stage != r.stage else int(r.stage),
                    "kind": r.kind,
                    "op": r.op,
                    "start_ms": round((float(r.start_ns) + self.graph.origin_ns) / 1e6, 6),
                    "ms": round(float(r.dur_ns) / 1e6, 6),
                }
                for r in segs.itertuples()
            ],
            "segments_total": int(len(df)),
        }


def analyze_critical_path(
    nodes: pa.Table,
    collectives: pa.Table | None,
    offsets_ns: dict[int, int] | None = None,
    stage_of: dict[int, int] | None = None,
    syncs: pa.Table | None = None,
    nodes_read: Callable[[], object] | None = None,
) -> CriticalPath | None:
    """Graph, observed replay and critical path of every step; None without device work.

    `syncs` (schema SYNCS, from `sync_calls`): the CPU calls that may have blocked on the GPU; without them
    every release is fixed on the CPU clock. `nodes_read`: called once the build has taken what it needs of
    `nodes` (the caller may then give the table's memory back: it is read again only to rebuild)."""
    g = build_graph(nodes, collectives, offsets_ns, stage_of, syncs, nodes_read)
    return None if g is None else critical_path_of(g)


def plan_of(g: Graph) -> ReplayPlan:
    """The replay plan of a built graph: the one kept with it (`per_object`: made before, or read with the
    graph from the cache), else made (`replay_plan`) and kept."""
    kept = per_object(g)
    plan = kept.get("replay_plan")
    if not isinstance(plan, ReplayPlan):
        plan = kept["replay_plan"] = replay_plan(g)
    return plan


def critical_path_of(g: Graph) -> CriticalPath:
    """Observed replay and critical path of every step of a built graph (`build_graph`)."""
    plan = plan_of(g)  # (kept for `whatif.what_if`'s replays, which drops it)
    rp = replay(g, plan=plan)
    return CriticalPath(g, rp, critical_segments(g, rp, plan))
