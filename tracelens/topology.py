"""Rank <-> (dp, pp, tp, cp) grid: from a layout (tracelens.toml / --layout) or inferred from the traces.

A layout follows Megatron's ordering convention: in `order="tp-cp-dp-pp"` the first axis varies fastest,
so rank = tp + TP*(cp + CP*(dp + DP*pp)). Inference (see docs/pipeline.md) reads, in this order:

1. process groups: `distributedInfo.pg_config` of every rank (metadata) and the `Process Group
   Description/Ranks` of record_param_comms (events); a group's description names its axis
   (`TENSOR_MODEL_PARALLEL_GROUP`, `mesh_tp`, `dp_stage0`, `pp`, `context`...), its size is the degree
   and a rank's position in the group's rank list is its coordinate on that axis;
2. P2P peers (`Src Rank`/`Dst Rank` of send/recv): the connected components of the send/recv graph are
   the pipelines; walking a chain from the rank that sends first gives the stage order;
3. what is left: world_size / (product of known degrees) goes to the single unknown axis, if only one.

Contradictions (groups of mixed sizes, a P2P chain that disagrees with the pipeline groups, degrees that
do not divide the world) become LAYOUT_INCONSISTENT findings, never exceptions.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.errors import BadConfigError
from tracelens.findings import finding

AXES = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"
#: Position of each axis inside a coordinate tuple (rank -> (dp, pp, tp, cp)).
COORD_INDEX = {"dp": 0, "pp": 1, "tp": 2, "cp": 3}

Coord = tuple  # (dp, pp, tp, cp); entries are int, or None when unknown


@dataclass
class Grid:
    """Parallel layout of a run. Degrees are None when unknown; `source` says where they came from."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    order: str | None = None
    source: str = "none"  # config | inferred | none
    coords: dict[int, Coord] = field(default_factory=dict)
    world_size: int | None = None
    #: Pipelines as rank lists in stage order (stage 0 first); derived from coords when not given.
    chains: list[list[int]] = field(default_factory=list)
    #: Assumptions made while inferring (for run.warnings), e.g. an axis assumed to be 1.
    notes: list[str] = field(default_factory=list)
    #: What each inferred axis rested on: basis traffic | p2p | names | remainder (docs/pipeline.md).
    evidence: dict[str, dict] = field(default_factory=dict)

    def stage_of(self, rank: int) -> int | None:
        """Pipeline stage of `rank`, None when unknown."""
        c = self.coords.get(int(rank))
        return None if c is None else c[1]

    def ranks_of_stage(self, stage: int) -> list[int]:
        """Ranks holding pipeline stage `stage`, ascending."""
        return sorted(r for r, c in self.coords.items() if c[1] == stage)

    @property
    def stages(self) -> list[int]:
        """Known stage indices, ascending."""
        return sorted({c[1] for c in self.coords.values() if c[1] is not None})

    def stage_lookup(self, ranks: np.ndarray) -> np.ndarray:
        """Vectorised stage_of: stage per rank in `ranks`, -1 where unknown."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if not self.coords or ranks.size == 0:
            return np.full(ranks.shape, -1, dtype=np.int64)
        hi = max(max(self.coords), int(ranks.max())) + 1
        lut = np.full(hi, -1, dtype=np.int64)
        known = [(r, c[1]) for r, c in self.coords.items() if c[1] is not None]
        if known:
            k = np.array(known, dtype=np.int64)
            lut[k[:, 0]] = k[:, 1]
        if int(ranks.min()) >= 0:
            out: np.ndarray = lut[ranks]
            return out
        out = np.full(ranks.shape, -1, dtype=np.int64)
        ok = ranks >= 0
        out[ok] = lut[ranks[ok]]
        return out

    def pipelines(self) -> list[list[int]]:
        """Every pipeline as its ranks in stage order."""
        if self.chains:
            return [list(c) for c in self.chains]
        if self.pp is None:
            return []
        groups: dict[tuple, dict[int, int]] = {}
        for r, (d, s, t, c) in self.coords.items():
            if s is None or None in (d, t, c):
                continue
            groups.setdefault((d, t, c), {})[s] = r
        return [[g[s] for s in sorted(g)] for _, g in sorted(groups.items())]

    def to_dict(self) -> dict:
        """The summary.json `run.layout` record."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "order": self.order,
            "source": self.source,
            **({"evidence": self.evidence} if self.source == "inferred" and self.evidence else {}),
        }


# ----- layouts given by the user --------------------------------------------------------------------


def parse_order(order: str | None) -> tuple[str, ...]:
    """Axis order, fastest first, e.g. 'tp-cp-dp-pp' -> ('tp','cp','dp','pp'); missing axes are appended in
    the default order and 'ep' (experts fold over dp) is ignored."""
    if order is None:
        return tuple(DEFAULT_ORDER.split("-"))
    toks = [t for t in re.split(r"[-_,\s]+", order.strip().lower()) if t]
    bad = [t for t in toks if t not in AXES and t != "ep"]
    if bad or not toks:
        raise BadConfigError(f"bad order '{order}': use axes tp, cp, dp, pp joined by '-', fastest first")
    toks = [t for t in toks if t != "ep"]
    if len(set(toks)) != len(toks):
        raise BadConfigError(f"bad order '{order}': an axis appears twice")
    return tuple(toks) + tuple(a for a in DEFAULT_ORDER.split("-") if a not in toks)


def parse_layout(text: str) -> dict[str, int | None]:
    """'tp=4,pp=4,dp=2,cp=1' -> {'tp': 4, 'pp': 4, 'dp': 2, 'cp': 1}; axes not named are None."""
    out: dict[str, int | None] = {a: None for a in ("tp", "pp", "dp", "cp")}
    parts = [p for p in re.split(r"[,\s]+", (text or "").strip()) if p]
    if not parts:
        raise BadConfigError("empty layout: expected e.g. tp=4,pp=4,dp=2,cp=1")
    for p in parts:
        m = re.fullmatch(r"(tp|pp|dp|cp)\s*[=:]\s*(\d+)", p.strip().lower())
        if not m:
            raise BadConfigError(f"bad layout item '{p}': expected e.g. tp=4,pp=4,dp=2,cp=1")
        if out[m.group(1)] is not None:
            raise BadConfigError(f"layout names {m.group(1)} twice")
        v = int(m.group(2))
        if v < 1:
            raise BadConfigError(f"layout {m.group(1)} must be >= 1, got {v}")
        out[m.group(1)] = v
    return out


def grid_from_layout(
    world_size: int | None,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    cp: int | None = None,
    order: str | None = DEFAULT_ORDER,
    source: str = "config",
) -> Grid:
    """Grid for a given layout; omitted tp/pp/cp are 1 and an omitted dp fills the world."""
    tp, pp, cp = tp or 1, pp or 1, cp or 1
    for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)):
        if v is not None and v < 1:
            raise BadConfigError(f"{k} must be >= 1, got {v}")
    if dp is None:
        if world_size is None:
            dp = 1
        elif world_size % (tp * pp * cp):
            raise BadConfigError(f"tp*pp*cp = {tp * pp * cp} does not divide world size {world_size}")
        else:
            dp = world_size // (tp * pp * cp)
    total = tp * pp * dp * cp
    if world_size is not None and total != world_size:
        raise BadConfigError(
            f"layout tp={tp} pp={pp} dp={dp} cp={cp} covers {total} ranks, "
            f"but the run has world size {world_size}"
        )
    axes = parse_order(order)
    deg = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    r = np.arange(total, dtype=np.int64)
    cols: dict[str, np.ndarray] = {}
    stride = 1
    for a in axes:
        cols[a] = (r // stride) % deg[a]
        stride *= deg[a]
    coords = {
        int(i): (int(cols["dp"][i]), int(cols["pp"][i]), int(cols["tp"][i]), int(cols["cp"][i]))
        for i in range(total)
    }
    return Grid(
        tp=tp, pp=pp, dp=dp, cp=cp, order="-".join(axes), source=source, coords=coords, world_size=total
    )


# ----- inference --------------------------------------------------------------------------------------

_AXIS_TOKENS = {
    "tp": "tp",
    "tensor": "tp",
    "tmp": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "pipe": "pp",
    "dp": "dp",
    "data": "dp",
    "ddp": "dp",
    "fsdp": "dp",
    "cp": "cp",
    "context": "cp",
}
_SKIP_TOKENS = {
    "expert",
    "experts",
    "ep",
    "etp",
    "edp",
    "moe",
    "embedding",
    "embd",
    "pos",
    "position",
    "shard",
    "replicate",
    "hsdp",
    "amax",
    "intra",
    "inter",
    "mp",
}
P2P_NAMES = re.compile(
    r"(^c10d::(send|recv_?)$|^gloo:(send|recv)$|SendRecv|^nccl:(send|recv))", re.IGNORECASE
)


def axis_of_desc(desc: object) -> str | None:
    """The one parallel axis a process-group description names, or None (combined, unrelated or unknown;
    a description that is not a string, e.g. `pg_desc: true` in a damaged trace, names none)."""
    if not isinstance(desc, str) or not desc:
        return None
    return _axis_of_text(desc)


@functools.lru_cache(maxsize=4096)
def _axis_of_text(desc: str) -> str | None:
    """`axis_of_desc` of a non-empty string (once per distinct text: the grid inference asks once per rank and
    group, ~900 times at 128 ranks, for four texts)."""
    toks = {re.sub(r"\d+$", "", t) for t in re.split(r"[^a-z0-9]+", desc.lower()) if t}
    if toks & _SKIP_TOKENS:
        return None
    axes = {_AXIS_TOKENS[t] for t in toks if t in _AXIS_TOKENS}
    return axes.pop() if len(axes) == 1 else None


def _parse_ranks(v) -> tuple[int, ...] | None:
    if isinstance(v, str):
        if "..." in v:
            return None
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, (list, tuple)):
        if set(map(type, v)) <= {int}:  # (the common case, checked at C speed: plain ints)
            return tuple(v)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return tuple(int(x) for x in v)
    return None


def pg_config_entries(metadata: pa.Table | None) -> Iterable[dict]:
    """Every process-group entry (a dict) of every rank's `distributedInfo.pg_config` (metadata column
    `pg_config_json`; a dict keyed by group or a list); unreadable JSON and non-dict entries are skipped.
    Ranks that declare the same text (usually every rank: PyTorch writes the whole world's groups) give their
    entries once: callers collect sets of groups. Entries equal in their JSON text are one shared dict
    (`pg_config_distinct`): read them, never change them."""
    entries, seq = pg_config_distinct(metadata)
    for i in seq:
        yield entries[i]


def pg_config_distinct(metadata: pa.Table | None) -> tuple[tuple[dict, ...], tuple[int, ...]]:
    """(the distinct entries, in order of first appearance; the index into them of every entry that
    `pg_config_entries` gives, in its order): parsed once per metadata table and shared, so that callers that
    collect sets of groups read each distinct entry once. At 1,024 ranks each rank declares its own groups and
    the world group (1,024 ranks listed 1,024 times): ~321 distinct entries of 4,096."""
    if metadata is None or "pg_config_json" not in metadata.column_names:
        return (), ()
    from tracelens.analyze.dictcol import per_object

    memo = per_object(metadata)  # (parsed once per metadata table: the grid and the matching both read it)
    got = memo.get("pg_config_distinct")
    if got is None:
        got = memo["pg_config_distinct"] = _parse_pg_configs(metadata.column("pg_config_json"))
    return got  # type: ignore[return-value]


def _parse_pg_configs(texts: pa.ChunkedArray) -> tuple[tuple[dict, ...], tuple[int, ...]]:
    """`pg_config_distinct` of the texts: each distinct text once; an entry's JSON text (msgspec.Raw: the
    entries are cut without being parsed) parsed by json.loads once however many texts hold it. A text
    msgspec does not cut (NaN, a top-level scalar, odd bytes) is read whole by json.loads as before."""
    import msgspec

    cut = msgspec.json.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
    index: dict[object, int] = {}  # an entry's raw bytes (or id of a dict parsed whole) -> its index
    entries: list[dict] = []
    seq: list[int] = []

    def take(key: object, e: object) -> None:
        i = index.get(key)
        if i is None:
            i = index[key] = len(entries)
            entries.append(e)  # type: ignore[arg-type]
        seq.append(i)

    seen: set[str] = set()
    for text in texts.to_pylist():
        if not text or text in seen:
            continue
        seen.add(text)
        got: list[tuple[bytes, object]] | None = None
        try:
            cfg = cut.decode(text.encode())
            raws = cfg.values() if isinstance(cfg, dict) else cfg
            got = []
            for r in raws:
                b = bytes(r)
                if b[:1] != b"{":
                    continue  # (not an object: skipped, as a parsed non-dict entry is)
                i = index.get(b)
                got.append((b, None if i is not None else json.loads(b.decode())))
        except Exception:  # noqa: BLE001  (anything msgspec or json refuses here: the whole text as before)
            got = None
        if got is not None:
            for b, e in got:
                if isinstance(e, dict) or b in index:
                    take(b, e)
            continue
        try:
            whole = json.loads(text)
        except ValueError:
            continue
        items = whole.values() if isinstance(whole, dict) else whole if isinstance(whole, list) else ()
        for e in items:
            if isinstance(e, dict):
                take(("parsed", id(e)), e)
    return tuple(entries), tuple(seq)


def _groups_from_metadata(metadata: pa.Table | None) -> list[tuple[str | None, tuple[int, ...]]]:
    out: list[tuple[str | None, tuple[int, ...]]] = []
    for e in pg_config_distinct(metadata)[0]:  # (each distinct entry once: the callers collect sets)
        ranks = _parse_ranks(e.get("ranks"))
        size = e.get("pg_size")
        if ranks is None or (isinstance(size, int) and size != len(ranks)):
            continue
        out.append((e.get("pg_desc", e.get("desc")), ranks))
    return out


def _value_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """(code per row, number of codes): equal values share a code, null is -1."""
    arr = col.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    canon, uniq = pd.factorize(pd.Series(arr.dictionary.to_pylist(), dtype=object))
    canon = np.append(np.asarray(canon, dtype=np.int64), -1)
    idx = arr.indices.fill_null(len(canon) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return canon[idx], len(uniq)


def _groups_from_events(
    events: pa.Table | None, pg: pa.Table | None = None
) -> list[tuple[str | None, tuple[int, ...]]]:
    """One (desc, ranks) per distinct (rank, pg_name, pg_desc) carrying a rank list (record_param_comms).
    `pg`: `layout_structure.pg_rows(events)` (its rows in row order, each the first of the rows it stands
    for: the same first rows), read instead of the events when given."""
    cols = ["rank", "pg_name", "pg_desc", "pg_ranks", "group_size"]
    if pg is not None:
        sub = pg.select(cols)
    elif events is None or events.num_rows == 0 or "pg_ranks" not in events.column_names:
        return []
    else:
        sub = events.select(cols).filter(events.column("pg_ranks").is_valid())
    if sub.num_rows == 0:
        return []
    # the first row of each distinct (rank, pg_name, pg_desc), in row order (codes, not a frame)
    key = sub.column("rank").to_numpy().astype(np.int64)
    key = key - (key.min() if key.size else 0)
    for c in ("pg_name", "pg_desc"):
        codes, n = _value_codes(sub.column(c))
        key = key * (n + 1) + (codes + 1)
    first = np.sort(np.unique(key, return_index=True)[1])
    picked = sub.take(pa.array(first))
    out = []
    for desc, ranks, size in zip(
        picked.column("pg_desc").to_pylist(),
        picked.column("pg_ranks").to_pylist(),
        picked.column("group_size").to_pylist(),
    ):
        ranks = _parse_ranks(ranks)
        if ranks is None or (size is not None and size != len(ranks)):
            continue
        out.append((desc, ranks))
    return out


def _p2p_edges(events: pa.Table | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
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


def _chains(src: np.ndarray, dst: np.ndarray, first: np.ndarray) -> tuple[list[list[int]], list[str]]:
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


def _uniform_stride(groups: Sequence[Sequence[int]]) -> int | None:
    strides = set()
    for g in groups:
        if len(g) < 2:
            continue
        d = np.diff(np.asarray(g))
        if not (d == d[0]).all():
            return None
        strides.add(int(d[0]))
    return strides.pop() if len(strides) == 1 else None


def _distinct_ints(v: np.ndarray) -> np.ndarray:
    """np.unique of an integer array; by counting (no sort) when its values span a small range (ranks)."""
    if v.size == 0:
        return np.unique(v)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo > 4 * v.size + (1 << 16):
        return np.unique(v)
    return np.flatnonzero(np.bincount((v - lo).astype(np.intp, copy=False))) + lo


def infer_grid(
    events: pa.Table | None,
    metadata: pa.Table | None,
    collectives: pa.Table | None = None,
    pg: pa.Table | None = None,
) -> tuple[Grid, list[dict]]:
    """Grid inferred from process groups (structure and traffic first, then names) and P2P peers;
    (Grid(source='none'), []) when nothing is known. `collectives`: Flight Recorder records, if any; `pg`:
    `layout_structure.pg_rows(events)` when the caller has it (the run memo's)."""
    findings: list[dict] = []
    notes: list[str] = []

    def inconsistent(msg: str, ranks: Iterable[int] = ()) -> None:
        findings.append(finding("LAYOUT_INCONSISTENT", "warning", msg, ranks=ranks))

    ranks_seen: set[int] = set()
    world: int | None = None
    if metadata is not None and metadata.num_rows:
        ranks_seen |= {int(r) for r in metadata.column("rank").to_pylist() if r is not None}
        ws = {int(w) for w in metadata.column("world_size").to_pylist() if w is not None}
        if len(ws) > 1:
            inconsistent(f"ranks report different world sizes {sorted(ws)}")
        world = max(ws) if ws else None
    if events is not None and events.num_rows:
        ranks_seen |= set(_distinct_ints(events.column("rank").to_numpy(zero_copy_only=False)).tolist())
    if world is None and ranks_seen:
        world = max(ranks_seen) + 1
    if world == 1:
        return grid_from_layout(1, 1, 1, 1, 1, source="inferred"), findings

    # 1. process groups: axes from their structure and traffic first (layout_structure), names for the rest
    by_axis: dict[str, set[tuple[int, ...]]] = {a: set() for a in AXES}
    src, dst, first, any_p2p = _p2p_edges(events)  # (once: the structure and the chains below read it)
    evidence = _structure(events, metadata, collectives, world, any_p2p, pg)
    for axis, ev in evidence.items():
        by_axis[axis] = ev.pop("_groups")
    for desc, ranks in _groups_from_metadata(metadata) + _groups_from_events(events, pg):
        named = axis_of_desc(desc)
        # names add to axes that rest on names only (so their groups are still checked against each other)
        if named is not None and (named not in evidence or evidence[named].get("basis") == "names"):
            by_axis[named].add(ranks)
    for axis in AXES:
        if by_axis[axis] and axis not in evidence:
            evidence[axis] = {"basis": "names"}
    degree: dict[str, int | None] = {a: None for a in AXES}
    coord: dict[str, dict[int, int]] = {a: {} for a in AXES}
    strides: dict[str, int | None] = {a: None for a in AXES}
    for axis, groups in by_axis.items():
        if not groups:
            continue
        sizes = {len(g) for g in groups}
        members = [r for g in groups for r in g]
        if len(sizes) > 1:
            inconsistent(f"{axis} process groups have different sizes {sorted(sizes)}")
            continue
        if len(members) != len(set(members)):
            dup = sorted({r for r in members if members.count(r) > 1})
            inconsistent(f"{axis} process groups overlap (ranks {dup[:8]} are in two groups)", dup)
            continue
        degree[axis] = sizes.pop()
        strides[axis] = _uniform_stride(sorted(groups))
        for g in groups:
            for i, r in enumerate(g):
                coord[axis][r] = i

    # 2. P2P chains
    chains, problems = _chains(src, dst, first)
    for p in problems:
        inconsistent(p)
    if chains:
        sizes = {len(c) for c in chains}
        if len(sizes) > 1:
            inconsistent(f"pipelines found from P2P peers have different lengths {sorted(sizes)}")
            chains = []
    if chains:
        p2p_deg = len(chains[0])
        if degree["pp"] is not None:
            group_sets = {frozenset(g) for g in by_axis["pp"]}
            ordered = {tuple(g) for g in by_axis["pp"]}
            if degree["pp"] != p2p_deg or not {frozenset(c) for c in chains} <= group_sets:
                inconsistent(
                    f"pipeline process groups (size {degree['pp']}) disagree with the P2P chains "
                    f"(length {p2p_deg}); the P2P chains are used"
                )
            elif (
                not {tuple(c) for c in chains} <= ordered
                and not {tuple(reversed(c)) for c in chains} <= ordered
            ):
                inconsistent(
                    "stage order of the pipeline process groups differs from the P2P direction; "
                    "the P2P direction is used"
                )
        degree["pp"] = p2p_deg
        evidence["pp"] = {"basis": "p2p", "traffic": f"send/recv chains of {p2p_deg} ranks"}
        coord["pp"] = {r: i for c in chains for i, r in enumerate(c)}
        strides["pp"] = _uniform_stride(chains)
    elif degree["pp"] is None and not any_p2p and events is not None and _has_comm(events):
        degree["pp"] = 1  # communication is traced but nothing is ever sent point-to-point
        coord["pp"] = {r: 0 for r in ranks_seen}

    known = {a: d for a, d in degree.items() if d is not None}
    if not known:
        return Grid(source="none", world_size=world), findings

    # 3. the rest of the world
    prod = int(np.prod(list(known.values())))
    unknown = [a for a in AXES if degree[a] is None]
    if world is not None:
        if world % prod:
            inconsistent(f"inferred degrees {known} do not divide world size {world}")
            return Grid(source="none", world_size=world), findings
        rest = world // prod
        if rest == 1:
            for a in unknown:
                degree[a] = 1
        elif len(unknown) == 1:
            degree[unknown[0]] = rest
            evidence[unknown[0]] = {"basis": "remainder"}
        else:
            # several axes without evidence: P2P traffic means a pipeline, otherwise data parallelism
            guess = "pp" if "pp" in unknown and any_p2p else "dp" if "dp" in unknown else None
            if guess is not None:
                for a in unknown:
                    degree[a] = rest if a == guess else 1
                missing = ", ".join(a for a in unknown if a != guess)
                notes.append(
                    f"no process groups name {missing}: assumed 1, and {guess}={rest} fills the world"
                )
    all_ranks = sorted(ranks_seen | {r for a in AXES for r in coord[a]})
    for a in AXES:
        if degree[a] == 1 and not coord[a]:
            coord[a] = {r: 0 for r in all_ranks}
    # an axis known only by its degree: position among ranks that agree on every other axis
    for a in AXES:
        if degree[a] is None or coord[a] or degree[a] == 1:
            continue
        others = [b for b in AXES if b != a]
        if any(not coord[b] for b in others):
            continue
        buckets: dict[tuple, list[int]] = {}
        for r in all_ranks:
            key = tuple(coord[b].get(r) for b in others)
            if None not in key:
                buckets.setdefault(key, []).append(r)
        if all(len(v) == degree[a] for v in buckets.values()):
            coord[a] = {r: i for v in buckets.values() for i, r in enumerate(sorted(v))}
            strides[a] = _uniform_stride([tuple(sorted(v)) for v in buckets.values()])

    coords: dict[int, Coord] = {
        r: (coord["dp"].get(r), coord["pp"].get(r), coord["tp"].get(r), coord["cp"].get(r)) for r in all_ranks
    }
    coords = {r: c for r, c in coords.items() if any(x is not None for x in c)}
    full = [c for c in coords.values() if None not in c]
    if len(full) != len(set(full)):
        inconsistent("two ranks share the same (dp, pp, tp, cp) coordinates")
    order, layout_coords = _infer_order(degree, coords)
    partial = sorted(r for r, c in coords.items() if None in c)
    ambiguous = sum(1 for a in AXES if (degree[a] or 1) > 1) > 1
    if order is not None and partial:
        # ranks whose groups were not all traced: their missing coordinates follow the order found
        for r in partial:
            coords[r] = tuple(x if x is not None else y for x, y in zip(coords[r], layout_coords[r]))
        if ambiguous:
            notes.append(
                f"coordinates of {len(partial)} rank(s) not fully covered by the traced groups follow "
                f"the order {order}"
            )
    grid = Grid(
        tp=degree["tp"],
        pp=degree["pp"],
        dp=degree["dp"],
        cp=degree["cp"],
        order=order,
        source="inferred",
        coords=coords,
        world_size=world,
        chains=chains,
        notes=notes,
        evidence={a: evidence[a] for a in AXES if a in evidence},
    )
    return grid, findings


def _structure(events, metadata, collectives, world, any_p2p: bool, pg=None) -> dict[str, dict]:
    """Axis -> evidence (with its groups under `_groups`) from the groups' structure and traffic."""
    from tracelens.layout_structure import collect_groups, structural_axes

    entries, seq = pg_config_distinct(metadata)
    once = [  # (each distinct entry read once, then every entry in order: names map to groups, last wins)
        None
        if (r := _parse_ranks(e.get("ranks"))) is None
        else (e.get("pg_name"), e.get("pg_desc", e.get("desc")), r)
        for e in entries
    ]
    declared = [d for i in seq if (d := once[i]) is not None]
    groups = collect_groups(declared, events, collectives, pg)
    by_axis, evidence = structural_axes(groups, world, any_p2p)
    for a, g in by_axis.items():
        evidence[a]["_groups"] = g
    return evidence


def _has_comm(events: pa.Table) -> bool:
    """True when any collective or process-group activity is traced (so absent P2P means pp = 1)."""
    if bool(events.column("collective").is_valid().to_numpy(zero_copy_only=False).any()):
        return True
    names = events.column("name").combine_chunks()
    vals = names.dictionary.to_pylist() if pa.types.is_dictionary(names.type) else set(names.to_pylist())
    return any(v and (v.startswith(("c10d::", "gloo:", "nccl")) or v == "record_param_comms") for v in vals)


def _infer_order(degree: dict[str, int | None], coords: dict[int, Coord]) -> tuple[str | None, dict]:
    """The axis order (Megatron convention, default first) that reproduces every known coordinate, and
    that order's coordinates for all ranks ({} when no order fits)."""
    if any(degree[a] is None for a in AXES) or not coords:
        return None, {}
    total = int(np.prod(cast("list[int]", [degree[a] for a in AXES])))  # none is None (checked above)
    default = tuple(DEFAULT_ORDER.split("-"))
    candidates = [default] + [p for p in itertools.permutations(AXES) if p != default]
    for perm in candidates:
        g = grid_from_layout(
            total,
            degree["tp"],
            degree["pp"],
            degree["dp"],
            degree["cp"],
            order="-".join(perm),
            source="inferred",
        )
        if all(
            r in g.coords and all(x is None or x == y for x, y in zip(c, g.coords[r]))
            for r, c in coords.items()
        ):
            return "-".join(perm), g.coords
    return None, {}


def grid_for_run(
    events: pa.Table | None,
    metadata: pa.Table | None,
    layout: dict[str, int | None] | None = None,
    order: str | None = None,
    force: bool = False,
    collectives: pa.Table | None = None,
    pg: pa.Table | None = None,
) -> tuple[Grid, list[dict]]:
    """Grid from a user layout when given (checked against the traces' groups), else inferred.

    When the given layout contradicts a complete layout inferred from the process groups, the findings use
    the inferred one (the evidence) and LAYOUT_INCONSISTENT says so; `force` keeps the given layout.
    """
    inferred, findings = infer_grid(events, metadata, collectives, pg)
    if not layout or all(v is None for v in layout.values()):
        return inferred, findings
    world = inferred.world_size
    grid = grid_from_layout(
        world,
        layout.get("tp"),
        layout.get("pp"),
        layout.get("dp"),
        layout.get("cp"),
        order=order or DEFAULT_ORDER,
        source="config",
    )
    if inferred.source == "inferred":
        diff = [
            a for a in AXES if getattr(inferred, a) is not None and getattr(inferred, a) != getattr(grid, a)
        ]
        if diff:
            msg = ", ".join(f"{a}={getattr(grid, a)} (traces say {getattr(inferred, a)})" for a in diff)
            use_traces = not force and _complete(inferred)
            findings.append(
                finding(
                    "LAYOUT_INCONSISTENT",
                    "warning",
                    f"the given layout disagrees with the traces' process groups: {msg}; "
                    + _which_layout(inferred if use_traces else grid, use_traces),
                    given=_layout_text(grid),
                    inferred=_layout_text(inferred),
                    used="inferred" if use_traces else "given",
                )
            )
            if use_traces:
                return inferred, findings
        else:
            moved = sorted(
                r
                for r, c in inferred.coords.items()
                if r in grid.coords and any(x is not None and x != y for x, y in zip(c, grid.coords[r]))
            )
            if moved:
                use_traces = not force and _complete(inferred)
                findings.append(
                    finding(
                        "LAYOUT_INCONSISTENT",
                        "warning",
                        f"the given order '{grid.order}' places {len(moved)} rank(s) differently "
                        f"from the traces' process groups (check --order); "
                        + _which_layout(inferred if use_traces else grid, use_traces),
                        ranks=moved[:16],
                        given=_layout_text(grid),
                        inferred=_layout_text(inferred),
                        used="inferred" if use_traces else "given",
                    )
                )
                if use_traces:
                    return inferred, findings
    return grid, findings


def _complete(g: Grid) -> bool:
    """Every degree known and every rank placed: a layout the findings can use."""
    return None not in (g.tp, g.pp, g.dp, g.cp) and bool(g.coords)


def _layout_text(g: Grid) -> str:
    return f"tp={g.tp},pp={g.pp},dp={g.dp},cp={g.cp}" + (f" order {g.order}" if g.order else "")


def _which_layout(g: Grid, from_traces: bool) -> str:
    """The clause of LAYOUT_INCONSISTENT saying which layout the findings use."""
    if from_traces:
        return (
            f"the findings use the traces' layout {_layout_text(g)} (the evidence; --force-layout keeps "
            f"the given one)"
        )
    return f"the findings use the given layout {_layout_text(g)}" + (
        " (--force-layout)" if g.source == "config" else ""
    )
