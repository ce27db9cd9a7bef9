"""Point-to-point traffic as evidence of pipeline parallelism: the global peer of every send and receive,
and the pipelines (chains of peers) they form.

Where the peers come from:
- NCCL: `record_param_comms` and the SendRecv kernels carry `Src Rank` / `Dst Rank`, global ranks
  (PyTorch maps the group-local peer through the group's ranks before recording);
- gloo (and any backend without `record_param_comms`): the dispatcher ops `c10d::send` / `c10d::recv_` record
  the peer *within the op's process group* (`peer_local`, tracelens.ingest.kineto.p2p_local), and which
  group it was is not recorded. `resolve_peers` maps it through the groups the rank belongs to (its
  `distributedInfo.pg_config`, and the world): a peer that only one group can map is that group's; where
  several can (a rank in the world group and in a DeviceMesh's `pp` group), the group whose mapping the
  other side confirms (the peer receives from, or sends to, this rank as many times as this rank sends to,
  or receives from, it) wins, and a tie leaves the peer unknown.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.analyze.layout.groups import parse_ranks

P2P_NAMES = re.compile(
    r"(^c10d::(send|recv_?)$|^gloo:(send|recv)$|SendRecv|^nccl:(send|recv))", re.IGNORECASE
)


def p2p_edges(events: pa.Table | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Directed P2P edges (src, dst, first ts) from send/recv peers, and whether any P2P op exists at all."""
    empty = np.empty(0, np.int64)
    if events is None or events.num_rows == 0:
        return empty, empty, empty, False
    any_p2p = _any_p2p_collective(events) or _any_p2p_name(events)
    dst = events.column("dst_rank")
    src = events.column("src_rank")
    dv = dst.is_valid().to_numpy(zero_copy_only=False)
    sv = src.is_valid().to_numpy(zero_copy_only=False)
    # only the rows with a peer (a few per rank and step): the columns of those rows, in row order
    rows = np.flatnonzero(dv | sv)
    sub = events.select(["rank", "ts_ns", "dst_rank", "src_rank"]).take(pa.array(rows))
    dv, sv = dv[rows], sv[rows]
    rank = sub.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ts = sub.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    d = sub.column("dst_rank").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    s = sub.column("src_rank").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    a_src = np.concatenate([rank[dv], s[sv]])
    a_dst = np.concatenate([d[dv], rank[sv]])
    # a receive is observed after the matching send started: only sends date an edge's first use
    a_ts = np.concatenate([ts[dv], np.full(int(sv.sum()), np.iinfo(np.int64).max)])
    keep = (a_src != a_dst) & (a_src >= 0) & (a_dst >= 0)
    a_src, a_dst, a_ts = a_src[keep], a_dst[keep], a_ts[keep]
    if a_src.size == 0:
        return empty, empty, empty, any_p2p or bool(dv.any() or sv.any())
    key = a_src * (1 << 32) + a_dst
    uk, inv = np.unique(key, return_inverse=True)
    first = np.full(uk.size, np.iinfo(np.int64).max)
    np.minimum.at(first, inv, a_ts)
    return uk >> 32, uk & 0xFFFFFFFF, first, True


def send_first_ranks(events: pa.Table | None) -> set[int]:
    """Ranks whose first point-to-point op (by their own clock) is a send: in a pipeline only stage 0 sends
    before it receives (its first forward needs no input), whatever the CPU issue order across ranks."""
    if events is None or events.num_rows == 0:
        return set()
    dv = events.column("dst_rank").is_valid().to_numpy(zero_copy_only=False)
    sv = events.column("src_rank").is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(dv | sv)
    if not rows.size:
        return set()
    sub = events.select(["rank", "ts_ns", "dst_rank", "src_rank"]).take(pa.array(rows))
    rank = sub.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ts = sub.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    d = sub.column("dst_rank").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    s = sub.column("src_rank").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    send = (d >= 0) & (d != rank)  # (a receive records itself as the destination)
    recv = (s >= 0) & (s != rank) & ~send
    big = np.iinfo(np.int64).max
    out = set()
    for r in np.unique(rank).tolist():
        m = rank == r
        if ts[m & send].min(initial=big) < ts[m & recv].min(initial=big):
            out.add(int(r))
    return out


_P2P_OPS = r"^(send|recv|isend|irecv)$"


def _any_p2p_collective(events: pa.Table) -> bool:
    """Any row whose `collective` is send/recv/isend/irecv (the pattern once per distinct value)."""
    coll = events.column("collective").combine_chunks()
    if not pa.types.is_dictionary(coll.type):
        return bool(pc.any(pc.fill_null(pc.match_substring_regex(coll, _P2P_OPS), False)).as_py())
    words = coll.dictionary.cast(pa.string())
    hit = np.flatnonzero(
        pc.fill_null(pc.match_substring_regex(words, _P2P_OPS), False).to_numpy(zero_copy_only=False)
    )
    if not hit.size:
        return False
    used = pc.is_in(coll.indices, value_set=pa.array(hit, coll.indices.type))
    return bool(pc.any(pc.fill_null(used, False)).as_py())


def _any_p2p_name(events: pa.Table) -> bool:
    """Any row named as a P2P op (P2P_NAMES) that carries no `collective` (the pattern once per name)."""
    names = events.column("name").combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = names.dictionary_encode()
    vals = names.dictionary.to_pylist()
    hit = np.flatnonzero([bool(v and P2P_NAMES.search(v)) for v in vals])
    if not hit.size:
        return False
    named = pc.fill_null(pc.is_in(names.indices, value_set=pa.array(hit, names.indices.type)), False)
    bare = pc.and_(named, events.column("collective").combine_chunks().is_null())
    return bool(pc.any(bare).as_py())


def chains(
    src: np.ndarray, dst: np.ndarray, first: np.ndarray, send_first: set[int] | None = None
) -> tuple[list[list[int]], list[str]]:
    """Pipelines from the P2P graph: connected components walked from stage 0; problems as messages. A ring
    (interleaved schedules send from the last stage back to the first) starts at its one rank in
    `send_first` (the ranks that send before they receive, `send_first_ranks`), towards that rank's earliest
    send; without one, at the source of the ring's earliest send."""
    adj: dict[int, set[int]] = {}
    for a, b in zip(src.tolist(), dst.tolist()):
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    first_send: dict[tuple[int, int], int] = {
        (a, b): t for a, b, t in zip(src.tolist(), dst.tolist(), first.tolist())
    }
    never = int(np.iinfo(np.int64).max)
    first_out: dict[int, int] = {}  # node -> its earliest send
    for (a, _), t in first_send.items():
        first_out[a] = min(first_out.get(a, never), t)
    seen: set[int] = set()
    chains, problems = [], []
    for start in sorted(adj):
        if start in seen:
            continue
        comp, todo = [], [start]
        seen.add(start)
        while todo:
            n = todo.pop()
            comp.append(n)
            for m in adj[n]:
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        comp.sort()
        deg = {n: len(adj[n]) for n in comp}
        ends = [n for n in comp if deg[n] == 1]
        if len(comp) == 2:
            ends = comp
        is_path = len(ends) == 2 and all(deg[n] <= 2 for n in comp)
        is_ring = not ends and all(deg[n] == 2 for n in comp)
        if not (is_path or is_ring):
            problems.append(f"P2P peers of ranks {comp} do not form a chain or ring")
            continue
        if is_path:
            # stage 0 is the end whose earliest send comes first (the first forward activation)
            head = min(ends, key=lambda n: (first_out.get(n, never), n))
            order, prev = [head], None
            while len(order) < len(comp):
                nxt = [m for m in adj[order[-1]] if m != prev]
                prev = order[-1]
                order.append(nxt[0])
        else:
            sends = sorted((t, a, b) for (a, b), t in first_send.items() if a in deg)
            starters = [x for x in sends if x[1] in (send_first or set())]
            if len({x[1] for x in starters}) == 1:
                sends = starters
            _t0, head, second = sends[0] if sends else (0, comp[0], min(adj[comp[0]]))
            order = [head, second]
            while len(order) < len(comp):
                nxt = [m for m in adj[order[-1]] if m != order[-2]]
                order.append(nxt[0])
        chains.append(order)
    return chains, problems


def _rank_groups(metadata: pa.Table | None, world: int | None) -> dict[int, list[tuple[int, ...]]]:
    """rank -> the groups it belongs to (its `pg_config`; older PyTorch lists every group of the world, so
    only those holding the rank count), the world group always among them (the default group is never left
    out of `pg_config` on purpose, but a trace may not list it)."""
    out: dict[int, list[tuple[int, ...]]] = {}
    if metadata is None or metadata.num_rows == 0:
        return out
    ranks = metadata.column("rank").to_pylist()
    texts = (
        metadata.column("pg_config_json").to_pylist()
        if "pg_config_json" in metadata.column_names
        else [None] * len(ranks)
    )
    for r, text in zip(ranks, texts):
        if r is None:
            continue
        got: list[tuple[int, ...]] = []
        if text:
            try:
                cfg = json.loads(text)
            except ValueError:
                cfg = None
            items = cfg.values() if isinstance(cfg, dict) else cfg if isinstance(cfg, list) else ()
            for e in items:
                g = parse_ranks(e.get("ranks")) if isinstance(e, dict) else None
                if g and int(r) in g and g not in got:
                    got.append(g)
        if world and tuple(range(world)) not in got:
            got.append(tuple(range(world)))
        out[int(r)] = got
    return out


def resolve_peers(events: pa.Table, metadata: pa.Table | None) -> tuple[pa.Table, dict[str, int]]:
    """`events` with the global peer of every send / receive that recorded only a group-local one
    (`peer_local`) in `dst_rank` / `src_rank` (see the module docstring), and what was done:
    {"resolved": rows, "ambiguous": rows left unknown because two groups map them equally well,
    "unmapped": rows no group of the rank can map}. Rows that already carry a global peer are left alone."""
    none = {"resolved": 0, "ambiguous": 0, "unmapped": 0}
    if events.num_rows == 0 or "peer_local" not in events.column_names:
        return events, none
    local = events.column("peer_local")
    rows = np.flatnonzero(local.is_valid().to_numpy(zero_copy_only=False))
    if not rows.size:
        return events, none
    world = None
    if metadata is not None and metadata.num_rows:
        ws = [w for w in metadata.column("world_size").to_pylist() if w is not None]
        world = max(ws) if ws else None
    sub = events.select(["rank", "name", "peer_local"]).take(pa.array(rows))
    rank = sub.column("rank").to_pylist()
    names = sub.column("name").cast(pa.string()).to_pylist()
    peer = sub.column("peer_local").to_pylist()
    if world is None:
        world = max(max(rank), max(peer)) + 1
    groups = _rank_groups(metadata, world)
    sends = [bool(n) and "send" in n.lower() for n in names]
    # one key per (rank, direction, local peer): a rank sends to one neighbour through one group
    count: Counter[tuple[int, bool, int]] = Counter(zip(rank, sends, peer))
    # the (global peer, group) each key can mean
    cands: dict[tuple[int, bool, int], set[tuple[int, tuple[int, ...]]]] = {}
    for r, s, p in count:
        gs = groups.get(r) or [tuple(range(world))]
        cands[(r, s, p)] = {(g[p], g) for g in gs if p < len(g) and g[p] != r}
    # what each rank's ops could mean: (rank, is_send) -> [(their (peer, group) candidates, count)]
    by_rank: dict[tuple[int, bool], list[tuple[set[tuple[int, tuple[int, ...]]], int]]] = {}
    for k, c in cands.items():
        by_rank.setdefault((k[0], k[1]), []).append((c, count[k]))
    chosen: dict[tuple[int, bool, int], int] = {}
    stats = dict(none)
    for k, c in cands.items():
        r, s, _ = k
        peers = {g for g, _ in c}
        if len(peers) == 1:
            chosen[k] = next(iter(peers))
            continue
        if not peers:
            stats["unmapped"] += count[k]
            continue
        # the candidate whose opposite ops map back to this rank through the same group, weighted by how many
        score: Counter[int] = Counter()
        for g, grp in c:  # (the best group per candidate: a peer two groups map alike counts once)
            confirmed = sum(n for cc, n in by_rank.get((g, not s), []) if (r, grp) in cc)
            score[g] = max(score[g], confirmed)
        best = score.most_common()
        if best and best[0][1] > 0 and (len(best) == 1 or best[0][1] > best[1][1]):
            chosen[k] = best[0][0]
        else:
            stats["ambiguous"] += count[k]
    if not chosen:
        return events, stats
    dst = events.column("dst_rank").to_numpy(zero_copy_only=False)
    src = events.column("src_rank").to_numpy(zero_copy_only=False)
    dst = np.where(events.column("dst_rank").is_valid().to_numpy(zero_copy_only=False), dst, -1).astype(
        np.int64
    )
    src = np.where(events.column("src_rank").is_valid().to_numpy(zero_copy_only=False), src, -1).astype(
        np.int64
    )
    for i, r, s, p in zip(rows.tolist(), rank, sends, peer):
        got = chosen.get((r, s, p))
        if got is None:
            continue
        stats["resolved"] += 1
        if s:
            dst[i] = got
        else:
            src[i] = got
    out = events.set_column(
        events.schema.get_field_index("dst_rank"), "dst_rank", pa.array(dst.astype(np.int32), mask=dst < 0)
    )
    out = out.set_column(
        out.schema.get_field_index("src_rank"), "src_rank", pa.array(src.astype(np.int32), mask=src < 0)
    )
    return out, stats


def fill_collective_peers(coll: pa.Table, events: pa.Table) -> pa.Table:
    """`coll` (schema.COLLECTIVES rows of the Kineto events) with the peers `resolve_peers` found for the sends
    and receives that recorded only a group-local one: a row of a c10d send / recv op is keyed by its rank and
    start (`enqueue_ns`, the op's `ts_ns`). Rows that have a peer keep it; the rest of the table is unchanged."""
    if coll.num_rows == 0 or "peer_local" not in events.column_names:
        return coll
    local = np.flatnonzero(events.column("peer_local").is_valid().to_numpy(zero_copy_only=False))
    if not local.size:
        return coll
    sub = events.select(["rank", "ts_ns", "src_rank", "dst_rank"]).take(pa.array(local))
    dst = sub.column("dst_rank").to_numpy(zero_copy_only=False)
    src = sub.column("src_rank").to_numpy(zero_copy_only=False)
    dv = sub.column("dst_rank").is_valid().to_numpy(zero_copy_only=False)
    sv = sub.column("src_rank").is_valid().to_numpy(zero_copy_only=False)
    found = {
        (int(r), int(t)): int(d if dok else s)
        for r, t, d, s, dok, sok in zip(
            sub.column("rank").to_pylist(), sub.column("ts_ns").to_pylist(), dst, src, dv, sv
        )
        if dok or sok
    }
    if not found:
        return coll
    peer = coll.column("peer").to_pylist()
    p2p = coll.column("is_p2p").to_pylist()
    ranks = coll.column("rank").to_pylist()
    enq = coll.column("enqueue_ns").to_pylist()
    changed = False
    for i, (pe, is_p, r, t) in enumerate(zip(peer, p2p, ranks, enq)):
        if pe is None and is_p and t is not None:
            got = found.get((int(r), int(t)))
            if got is not None:
                peer[i] = got
                changed = True
    if not changed:
        return coll
    i = coll.schema.get_field_index("peer")
    return coll.set_column(i, coll.schema.field("peer"), pa.array(peer, coll.schema.field("peer").type))
