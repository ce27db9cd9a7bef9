"""Which CPU op launched each device event: the innermost `cpu_op` / `user_annotation` enclosing the
kernel's launch (the `cuda_runtime` / `cuda_driver` event with the same correlation id) on the launching
thread. Without a launch in the trace, the cpu op with the kernel's External id stands in.

Old PyTorch (< ~2.3) writes no collective args on NCCL kernels; the kind and size of a collective are then
on the CPU ops around its launch (`nccl:all_to_all`, `c10d::alltoall_base_`, `record_param_comms`).
Vectorized: one sparse table of interval ends answers "innermost enclosing op" for all launches at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tracelens.analyze.core.dictcol import Columns, columns, per_object
from tracelens.analyze.core.intset import member
from tracelens.ingest.comm_families import is_comm_cpu_op


def innermost_enclosing(
    op_group: np.ndarray, op_start: np.ndarray, op_end: np.ndarray, q_group: np.ndarray, q_t: np.ndarray
) -> np.ndarray:
    """For each query (group, t): index of the op of the same group with start <= t <= end and the latest
    start (the innermost of nested ops), else -1. Groups are threads (any int64 key)."""
    nq = q_t.size
    out = np.full(nq, -1, dtype=np.int64)
    n = op_start.size
    if n == 0 or nq == 0:
        return out
    order = np.lexsort((op_start, op_group))
    g, s, e = op_group[order], op_start[order], op_end[order]
    # J: last op of the query's group with start <= t
    seg_lo = np.searchsorted(g, q_group, side="left")
    seg_hi = np.searchsorted(g, q_group, side="right")
    uniq = g[np.r_[True, g[1:] != g[:-1]]]  # (np.unique of the sorted groups)
    qcode = np.searchsorted(uniq, q_group)
    qcode_ok = (qcode < uniq.size) & (uniq[np.minimum(qcode, uniq.size - 1)] == q_group)
    # lexicographic search: within [seg_lo, seg_hi) find the last start <= t
    j = seg_lo + _count_at_most(np.searchsorted(uniq, g), s, seg_lo, seg_hi, qcode, q_t) - 1
    valid = qcode_ok & (j >= seg_lo)
    # the latest-starting op holds the query (the usual case: the launch is inside the op that started last)
    jc = np.where(valid, j, 0)
    direct = valid & (e[jc] >= q_t)
    out[direct] = order[jc[direct]]
    rest = np.flatnonzero(valid & ~direct)
    if rest.size == 0:
        return out
    q_t, seg_lo, j = q_t[rest], seg_lo[rest], j[rest]
    # the others: the latest op before j still running at t, by binary lifting over a sparse table of the
    # running maximum of the ends, m[k][i] = max(e[i - 2^k + 1 .. i])
    levels = [e]
    k = 1
    while (1 << k) <= n:
        prev = levels[-1]
        half = 1 << (k - 1)
        cur = prev.copy()
        cur[half:] = np.maximum(prev[half:], prev[:-half])
        levels.append(cur)
        k += 1
    pos = j
    for k in range(len(levels) - 1, -1, -1):
        step = 1 << k
        can = (pos - step + 1 >= 0) & (pos >= 0)
        idx = np.where(can, pos, 0)
        move = can & (levels[k][idx] < q_t)
        pos = np.where(move, pos - step, pos)
    ok = (pos >= seg_lo) & (pos >= 0)
    pos_c = np.where(ok, pos, 0)
    ok &= e[pos_c] >= q_t
    out[rest[ok]] = order[pos_c[ok]]
    return out


def _pair_keys(
    a: np.ndarray, b: np.ndarray, qa: np.ndarray, qb: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """One int64 key per (a, b) pair and per query pair, ordered as the pairs are (a major), when the value
    ranges allow it without overflow; None otherwise."""
    if a.size == 0 or qa.size == 0:
        return None
    a_lo, a_hi = min(int(a.min()), int(qa.min())), max(int(a.max()), int(qa.max()))
    b_lo, b_hi = min(int(b.min()), int(qb.min())), max(int(b.max()), int(qb.max()))
    width = b_hi - b_lo + 1
    if (a_hi - a_lo + 1) * width >= 1 << 62:
        return None
    return _pair_key(a, a_lo, b, b_lo, width), _pair_key(qa, a_lo, qb, b_lo, width)


def _pair_key(a: np.ndarray, a_lo: int, b: np.ndarray, b_lo: int, width: int) -> np.ndarray:
    """(a - a_lo) * width + (b - b_lo), in one new int64 array (no temporaries the size of `a`)."""
    k = a.astype(np.int64)  # (a copy)
    k -= a_lo
    k *= width
    k += b
    k -= b_lo
    return k


def _count_at_most(
    code: np.ndarray, s: np.ndarray, lo: np.ndarray, hi: np.ndarray, q_code: np.ndarray, t: np.ndarray
) -> np.ndarray:
    """Per query, the number of values <= t within s[lo:hi], where [lo, hi) is the run of `code` == q_code
    in `code` (sorted, and s sorted within each run); one searchsorted over combined keys when they fit
    in int64, else the vectorised binary search."""
    keys = _pair_keys(code, s, q_code, t)
    if keys is None:
        return _searchsorted_segments(s, lo, hi, t)
    found = np.searchsorted(keys[0], keys[1], side="right")
    out: np.ndarray = np.clip(found, lo, hi) - lo
    return out


def _count_below(s: np.ndarray, lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per query, the number of values < t within s[lo:hi] (int values)."""
    return _searchsorted_segments(s, lo, hi, t - 1)


def _searchsorted_segments(s: np.ndarray, lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per query, the number of values <= t within s[lo:hi] (s sorted within each segment): a binary search
    vectorized over the queries."""
    a = lo.copy()
    b = hi.copy()
    while True:
        act = a < b
        if not act.any():
            break
        mid = (a + b) // 2
        midc = np.where(act, mid, 0)
        le = act & (s[midc] <= t)
        gt = act & ~le
        a = np.where(le, mid + 1, a)
        b = np.where(gt, mid, b)
    out: np.ndarray = a - lo
    return out


@dataclass
class Launches:
    """Per events row (aligned with the table): the row of the innermost CPU op around the launch of each
    device event (-1: none, and for every non-device row), and the row of the innermost communication
    cpu op around it (comm_families.COMM_CPU_OP; -1: none)."""

    parent: np.ndarray
    comm_parent: np.ndarray


@dataclass
class _Queries:
    rows: np.ndarray  # device rows whose launch is in the trace
    rank: np.ndarray  # rank and tid (-1: null) of every events row, as the table holds them
    tid: np.ndarray
    q_g: np.ndarray  # launch (rank, tid) key and start, aligned with rows
    q_t: np.ndarray
    ops: np.ndarray  # cpu_op | user_annotation
    cpu_op: np.ndarray
    device: np.ndarray
    cols: Columns

    def group(self, rows: np.ndarray) -> np.ndarray:
        """The (rank, tid) key of these rows (one int64; computed at the rows: 8 bytes a row otherwise)."""
        g: np.ndarray = self.tid[rows] & 0xFFFFFFFF
        g += self.rank[rows] * (1 << 32)
        return g


def _queries(events: pa.Table) -> _Queries:
    """The launch queries of `events` (not kept: ~10 bytes a row, while the links they give are 8). Columns
    are read at the device and launch rows only (no whole-column copies of the correlations)."""
    cols = columns(events)
    device = cols.kinds("kernel", "gpu_memcpy", "gpu_memset")
    rank = cols.int64("rank")
    tid = cols.int64("tid", -1)
    dev_rows, dev_corr = _with_corr(cols, device)
    l_rows, l_corr = _with_corr(cols, cols.kinds("cuda_runtime", "cuda_driver"))
    rows = np.zeros(0, dtype=np.int64)
    the_launch = rows
    if dev_rows.size and l_rows.size:
        j = _find_pairs(rank[l_rows], l_corr, rank[dev_rows], dev_corr)
        hit = j >= 0
        rows, the_launch = dev_rows[hit], l_rows[j[hit]]
    del dev_rows, dev_corr, l_rows, l_corr
    ops = cols.kinds("cpu_op", "user_annotation")
    q = _Queries(rows, rank, tid, rows, rows, ops, cols.kinds("cpu_op"), device, cols)
    q.q_g, q.q_t = q.group(the_launch), cols.int64_at("ts_ns", the_launch)
    return q


def _with_corr(cols: Columns, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows of `mask` with a correlation id >= 0, their correlation ids)."""
    rows = np.flatnonzero(mask)
    corr = cols.int64_at("correlation", rows, -1)
    ok = corr >= 0
    return rows[ok], corr[ok]


def _enclosing(q: _Queries, mask: np.ndarray, only: np.ndarray | None = None) -> np.ndarray:
    """Per events row: the innermost op of `mask` (cpu_op / user_annotation rows) around the launch of each
    device row (of the rows `only` selects, when given), -1 elsewhere."""
    out = np.full(mask.size, -1, dtype=np.int64)
    rows, q_g, q_t = q.rows, q.q_g, q.q_t
    if only is not None:
        keep = only[rows]
        rows, q_g, q_t = rows[keep], q_g[keep], q_t[keep]
    op_rows = np.flatnonzero(mask & q.ops)
    if not rows.size or not op_rows.size:
        return out
    op_group = q.group(op_rows)
    launching = member(op_group, q_g)  # only threads that launch
    op_rows, op_group = op_rows[launching], op_group[launching]
    del launching
    ts, end = q.cols.int64_at("ts_ns", op_rows), q.cols.end_at(op_rows)
    inner = innermost_enclosing(op_group, ts, end, q_g, q_t)
    out[rows[inner >= 0]] = op_rows[inner[inner >= 0]]
    return out


def enclosing_ops(events: pa.Table, mask: np.ndarray) -> np.ndarray:
    """Per events row: the row of the innermost cpu op / user annotation selected by `mask` around the launch
    of each device event (-1: none found, and for every other row)."""
    return _enclosing(_queries(events), mask)


def link_launches(events: pa.Table) -> Launches:
    """Launching CPU op of every kernel / memcpy / memset (see the module docstring); computed once per
    table (the arrays are shared: read only)."""
    memo = per_object(events)  # (the launch links, computed once per live table)
    got = memo.get("launches")
    if got is None:
        got = memo["launches"] = _link_launches(events)
    return got  # type: ignore[return-value]


def _link_launches(events: pa.Table) -> Launches:
    n = events.num_rows
    if n == 0:
        return Launches(np.full(0, -1, dtype=np.int64), np.full(0, -1, dtype=np.int64))
    parent, via = _parents(events)
    comm_name = columns(events).flag("name", is_comm_cpu_op)
    comm_parent = _enclosing(_queries(events), comm_name)
    is_c = comm_name[parent[via]]
    comm_parent[via[is_c]] = parent[via[is_c]]
    comm_parent.flags.writeable = False
    return Launches(parent, comm_parent)


def launch_parents(events: pa.Table, keep: bool = True) -> np.ndarray:
    """`link_launches(events).parent` alone (computed once per table; shared: read only). `keep=False`: not
    kept for the table's later calls unless already computed (8 bytes a row held for a caller that asks once)."""
    if not keep and "parents" not in per_object(events):
        return _build_parents(events)[0]
    return _parents(events)[0]


def _parents(events: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(the launching op of every row, as `Launches.parent`; the rows linked through their External id)."""
    memo = per_object(events)  # (the launch links, computed once per live table)
    got = memo.get("parents")
    if got is None:
        got = memo["parents"] = _build_parents(events)
    return got  # type: ignore[return-value]


def _build_parents(events: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    n = events.num_rows
    q = _queries(events)
    cols = q.cols
    parent = _enclosing(q, np.ones(n, dtype=bool))
    via = np.zeros(0, dtype=np.int64)
    # no launch found: the cpu op with the device event's External id (same rank)
    rank = cols.int64("rank")
    todo, todo_ext = _with_ext(cols, q.device & (parent < 0))
    cands, cand_ext = _with_ext(cols, q.cpu_op)
    if todo.size and cands.size:
        j = _find_pairs(rank[cands], cand_ext, rank[todo], todo_ext)
        hit = j >= 0
        via = todo[hit]
        parent[via] = cands[j[hit]]
    parent.flags.writeable = False
    return parent, via


def _with_ext(cols: Columns, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows of `mask` with an External id >= 0, their External ids)."""
    rows = np.flatnonzero(mask)
    ext = cols.int64_at("external_id", rows, -1)
    ok = ext >= 0
    return rows[ok], ext[ok]


def _find_pairs(a: np.ndarray, b: np.ndarray, qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """For each query (qa, qb): an index i with (a[i], b[i]) == (qa, qb) (the first in sorted order), else -1."""
    keys = _pair_keys(a, b, qa, qb)
    if keys is not None:  # one sorted int64 key: the first of equal pairs in a stable sort, as below
        o = np.argsort(keys[0], kind="stable")
        sk = keys[0][o]
        j = np.searchsorted(sk, keys[1], side="left")
        jc = np.minimum(j, max(sk.size - 1, 0))
        return np.where((j < sk.size) & (sk[jc] == keys[1]), o[jc], -1)
    o = np.lexsort((b, a))
    sa, sb = a[o], b[o]
    lo = np.searchsorted(sa, qa, side="left")
    hi = np.searchsorted(sa, qa, side="right")
    j = lo + _count_below(sb, lo, hi, qb)
    jc = np.minimum(j, max(sa.size - 1, 0))
    hit = (j < hi) & (sb[jc] == qb)
    return np.where(hit, o[jc], -1)
