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

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def chains(src: np.ndarray, dst: np.ndarray, first: np.ndarray) -> tuple[list[list[int]], list[str]]:
    """Pipelines from the P2P graph: connected components walked from stage 0; problems as messages."""
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
            _t0, head, second = sends[0] if sends else (0, comp[0], min(adj[comp[0]]))
            order = [head, second]
            while len(order) < len(comp):
                nxt = [m for m in adj[order[-1]] if m != order[-2]]
                order.append(nxt[0])
        chains.append(order)
    return chains, problems
