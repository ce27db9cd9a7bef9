"""Process groups: what the traces declare (`distributedInfo.pg_config`, the `Process Group Ranks` of
collective records, Flight Recorder entries), what traffic each carries, and the axis a group's *name*
states (a hint that confirms evidence, never the verdict).

A Megatron-style grid makes every axis a *family* of process groups: disjoint groups of one size whose
members are a constant stride apart, together covering the world. What a family carries says its axis:

- all-to-all traffic (Ulysses sequence <-> head exchanges)            -> cp
- point-to-point traffic (send/recv on the group), or, in a run that sends point-to-point but whose groups
  carry no P2P record (gloo), the one family that carries no collective at all -> pp
- all-reduce traffic: with two such families, the one with more calls per rank (per-layer TP all-reduces
  outnumber the gradient buckets) -> tp, the other -> dp; with one -> dp

Traffic per group comes from record_param_comms / NCCL kernel args (events with `pg_ranks`) and from the
Flight Recorder (`pg_name` mapped to ranks through distributedInfo.pg_config). A family without traffic
takes the axis its names give (`name_axis`): the axis token that is not a coordinate, so `tp_stage0_dp1`
is tp (stage0 and dp1 are coordinates), `pp_dp0_tp0` is pp, `cp_dp0` is cp, Megatron's
TENSOR_MODEL_PARALLEL_GROUP is tp, a torchtitan mesh dimension name `dp_shard` is dp. The evidence for
every axis is kept (docs/pipeline.md, "How the grid is inferred").
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.analyze.core.frame_cells import list_codes
from tracelens.schema import PG_COLUMNS, PG_ROWS


def parse_ranks(v: object) -> tuple[int, ...] | None:
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


def pg_config_entries(metadata: pa.Table | None) -> Iterable[dict[str, Any]]:
    """Every process-group entry (a dict) of every rank's `distributedInfo.pg_config` (metadata column
    `pg_config_json`; a dict keyed by group or a list); unreadable JSON and non-dict entries are skipped.
    Ranks that declare the same text (usually every rank: PyTorch writes the whole world's groups) give their
    entries once: callers collect sets of groups. Entries equal in their JSON text are one shared dict
    (`pg_config_distinct`): read them, never change them."""
    entries, seq = pg_config_distinct(metadata)
    for i in seq:
        yield entries[i]


def pg_config_distinct(metadata: pa.Table | None) -> tuple[tuple[dict[str, Any], ...], tuple[int, ...]]:
    """(the distinct entries, in order of first appearance; the index into them of every entry that
    `pg_config_entries` gives, in its order): parsed once per metadata table and shared, so that callers that
    collect sets of groups read each distinct entry once. At 1,024 ranks each rank declares its own groups and
    the world group (1,024 ranks listed 1,024 times): ~321 distinct entries of 4,096."""
    if metadata is None or "pg_config_json" not in metadata.column_names:
        return (), ()
    from tracelens.analyze.core.dictcol import per_object

    memo = per_object(metadata)  # (parsed once per metadata table: the grid and the matching both read it)
    got = memo.get("pg_config_distinct")
    if got is None:
        got = memo["pg_config_distinct"] = _parse_pg_configs(metadata.column("pg_config_json"))
    return got  # type: ignore[return-value]


def _parse_pg_configs(texts: pa.ChunkedArray) -> tuple[tuple[dict[str, Any], ...], tuple[int, ...]]:
    """`pg_config_distinct` of the texts: each distinct text once; an entry's JSON text (msgspec.Raw: the
    entries are cut without being parsed) parsed by json.loads once however many texts hold it. A text
    msgspec does not cut (NaN, a top-level scalar, odd bytes) is read whole by json.loads as before."""
    import msgspec

    cut = msgspec.json.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
    index: dict[object, int] = {}  # an entry's raw bytes (or id of a dict parsed whole) -> its index
    entries: list[dict[str, Any]] = []
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


def groups_from_metadata(metadata: pa.Table | None) -> list[tuple[str | None, tuple[int, ...]]]:
    out: list[tuple[str | None, tuple[int, ...]]] = []
    for e in pg_config_distinct(metadata)[0]:  # (each distinct entry once: the callers collect sets)
        ranks = parse_ranks(e.get("ranks"))
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


def groups_from_events(
    events: pa.Table | None, pg: pa.Table | None = None
) -> list[tuple[str | None, tuple[int, ...]]]:
    """One (desc, ranks) per distinct (rank, pg_name, pg_desc) carrying a rank list (record_param_comms).
    `pg`: `pg_rows(events)` (its rows in row order, each the first of the rows it stands
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
        ranks = parse_ranks(ranks)
        if ranks is None or (size is not None and size != len(ranks)):
            continue
        out.append((desc, ranks))
    return out


_AXIS_WORDS = {
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
    "sp": "cp",
    "ulysses": "cp",
}
#: Words of groups that are no axis of the grid (expert, embedding, position-embedding, amax, model-parallel
#: or hierarchical groups, intra/inter-node sub-groups): such a name states no axis.
_OTHER_WORDS = {
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
    "amax",
    "mp",
    "hsdp",
    "intra",
    "inter",
}
_A2A = ("alltoall", "all_to_all", "alltoall_base", "all_to_all_single")
_REDUCE = ("allreduce", "all_reduce", "reducescatter", "reduce_scatter", "allgather", "all_gather")
_P2P = ("send", "recv", "isend", "irecv")


def name_axis(desc: object) -> str | None:
    """The axis a group name states: its axis word that is not a coordinate (a word followed by digits, or
    `stage`), e.g. tp_stage0_dp1 -> tp; None when no single axis is named (or an expert/embedding group, or
    a description that is not a string, e.g. `pg_desc: true` in a damaged trace)."""
    if not isinstance(desc, str) or not desc:
        return None
    return _name_axis(desc)


@functools.lru_cache(maxsize=4096)
def _name_axis(desc: str) -> str | None:
    """`name_axis` of a non-empty string (once per distinct text: asked once per rank and group)."""
    toks = [t for t in re.split(r"[^a-z0-9]+", desc.lower()) if t]
    if any(re.sub(r"\d+$", "", t) in _OTHER_WORDS for t in toks):
        return None
    bare = {_AXIS_WORDS[t] for t in toks if t in _AXIS_WORDS}
    if len(bare) == 1:
        return bare.pop()
    if not bare:
        coord = {_AXIS_WORDS[re.sub(r"\d+$", "", t)] for t in toks if re.sub(r"\d+$", "", t) in _AXIS_WORDS}
        return coord.pop() if len(coord) == 1 else None
    return None


@dataclass
class GroupInfo:
    ranks: tuple[int, ...]
    names: set[str] = field(default_factory=set)
    calls: Counter[str] = field(default_factory=Counter)  # op kind (a2a | reduce | p2p | other) -> calls
    members_seen: set[int] = field(default_factory=set)  # ranks whose records count toward `calls`


def _kind(op: str | None) -> str | None:
    if not op:
        return None
    o = op.lower()
    if any(o.startswith(a) for a in _A2A):
        return "a2a"
    if o in _P2P:
        return "p2p"
    if any(o.startswith(a) for a in _REDUCE):
        return "reduce"
    return "other"


def _ranks(v: object) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(sorted(int(x) for x in v))
    return None


def _text_codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """(code per row, the distinct texts) of a column as its string cast reads, nulls "nan" (as pandas'
    `astype(str)` of a category gives): equal texts share a code, from the dictionary, not a string a row."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    words = pc.fill_null(arr.dictionary.cast(pa.string()), "nan").to_pylist() + ["nan"]
    idx = arr.indices.fill_null(len(words) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    canon, texts = pd.factorize(pd.Series(words, dtype=object))
    return np.asarray(canon, dtype=np.int64)[idx], [str(t) for t in texts]


def pg_rows(events: pa.Table) -> pa.Table:
    """The event rows that carry pg_ranks, only PG_COLUMNS (events of schema.EVENTS): rows equal in all of them
    as one, the first of them, with their number in `rows`, in row order (a few rows per rank and group where
    the events have one per call). `collect_groups` and `infer.infer_grid` given these (`pg=`) find what
    they find in the events. Rank lists with null elements are kept one row each (`rows` 1)."""
    sub = events.select(list(PG_COLUMNS)).filter(events.column("pg_ranks").is_valid())
    n = sub.num_rows
    if n == 0:
        return PG_ROWS.empty_table()
    lists = _exact_list_codes(sub.column("pg_ranks").combine_chunks())
    if lists is None:  # (null elements in a list): every row as it is
        return sub.append_column("rows", pa.array(np.ones(n, np.int64)))
    codes = [lists, sub.column("rank").to_numpy().astype(np.int64)]
    for c in ("kind", "pg_name", "pg_desc", "collective"):  # equal values share a code, null is -1
        col = sub.column(c).combine_chunks()
        vals = pd.factorize(pd.Series(col.dictionary.to_pylist(), dtype=object))[0]
        vals = np.append(vals, -1)  # (the null's code; a column of nulls only has an empty dictionary)
        idx = col.indices.fill_null(vals.size - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        codes.append(vals[idx])
    size = sub.column("group_size")
    codes.append(size.is_valid().to_numpy(zero_copy_only=False).astype(np.int64))
    codes.append(size.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
    _, first, count = np.unique(
        _matrix_row_codes(np.stack(codes, axis=1)), return_index=True, return_counts=True
    )
    order = np.argsort(first)
    return sub.take(pa.array(first[order])).append_column("rows", pa.array(count[order].astype(np.int64)))


def _exact_list_codes(pr: pa.ListArray) -> np.ndarray | None:
    """A code per row of an integer list column without nulls, equal exactly for equal lists (the lists of
    each length compared as the rows of one matrix); None when some list holds a null."""
    vals = pr.values
    if vals.null_count:
        return None
    offs = pr.offsets.to_numpy().astype(np.int64)
    v = vals.to_numpy(zero_copy_only=False).astype(np.int64)
    lo, length = offs[:-1], np.diff(offs)
    codes = np.zeros(lo.size, np.int64)
    base = 0
    for n in np.unique(length).tolist():
        rows = np.flatnonzero(length == n)
        got = _matrix_row_codes(v[lo[rows][:, None] + np.arange(n)])
        codes[rows] = base + got
        base += int(got.max(initial=0)) + 1
    return codes


def _matrix_row_codes(mat: np.ndarray) -> np.ndarray:
    """A code per row of an int64 matrix (0 .. distinct rows - 1), equal exactly for equal rows: the columns
    as digits of one int64 key when their ranges allow, else the rows sorted (lexsort) and compared."""
    n, k = mat.shape
    if n == 0 or k == 0:
        return np.zeros(n, np.int64)
    low = mat.min(axis=0)
    span = (mat.max(axis=0) - low + 1).tolist()
    size = 1
    for x in span:
        size *= int(x)
    if size < 1 << 62:  # (Python ints: no overflow in the check)
        key = np.zeros(n, np.int64)
        for j in range(k):
            key = key * np.int64(span[j]) + (mat[:, j] - low[j])
        return np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
    order = np.lexsort(mat.T[::-1])
    srt = mat[order]
    new = np.ones(n, bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    codes = np.empty(n, np.int64)
    codes[order] = np.cumsum(new) - 1
    return codes


def _event_groups(sub: pa.Table) -> list[tuple[tuple[int, ...], str, str, int, set[int]]]:
    """(pg_ranks, collective, pg_desc, rows, ranks) per distinct (pg_ranks, collective, pg_desc) of the rows
    with pg_ranks, in sorted key order; one record per op: CPU record_param_comms rows are preferred over
    their kernel copies. Nulls read "nan" (as pandas' `astype(str)` of a category gives). A `rows` column
    (`pg_rows`): the number of event rows each row stands for."""
    kind, kinds = _text_codes(sub.column("kind"))
    present = {kinds[c] for c in np.unique(kind)}
    pick = "cpu_op" if "cpu_op" in present else next(iter(present))
    weighted = "rows" in sub.column_names
    sub = sub.select(["pg_ranks", "collective", "pg_desc", "rank"] + (["rows"] if weighted else [])).filter(
        pa.array(kind == kinds.index(pick))
    )
    pr = sub.column("pg_ranks").combine_chunks()
    got = list_codes(pr)
    if got is None:  # group on the ranks' bytes (converting list cells to Python costs ~5 µs a row)
        offs = pr.offsets.to_numpy().tolist()
        vals = pr.values.to_numpy(zero_copy_only=False)
        keys = [vals[a:b].tobytes() for a, b in zip(offs[:-1], offs[1:])]
        codes, uniq = pd.factorize(pd.Series(keys, dtype=object))
        firsts = [np.frombuffer(u, vals.dtype).tolist() for u in uniq]
    else:
        codes, first = got
        firsts = [pr[int(i)].as_py() for i in first]
    coll, colls = _text_codes(sub.column("collective"))
    desc, descs = _text_codes(sub.column("pg_desc"))
    rank = sub.column("rank").to_numpy().astype(np.int64)
    key = np.asarray(codes, dtype=np.int64)
    key = (key * (len(colls) + 1) + coll) * (len(descs) + 1) + desc
    ukey, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    if weighted:
        counts = np.zeros(ukey.size, np.int64)
        np.add.at(counts, inv.reshape(-1), sub.column("rows").to_numpy().astype(np.int64))
    r_lo = int(rank.min(initial=0))
    width = int(rank.max(initial=0)) - r_lo + 1
    pairs = np.unique(inv.reshape(-1) * width + (rank - r_lo))  # distinct (group, rank)
    members: list[set[int]] = [set() for _ in range(ukey.size)]
    for g, r in zip((pairs // width).tolist(), (pairs % width + r_lo).tolist()):
        members[g].add(r)
    out = []
    for j, k in enumerate(ukey.tolist()):
        d = k % (len(descs) + 1)
        c = (k // (len(descs) + 1)) % (len(colls) + 1)
        ranks = tuple(firsts[k // (len(descs) + 1) // (len(colls) + 1)])
        out.append((ranks, colls[c], descs[d], int(counts[j]), members[j]))
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    return out


def collect_groups(
    declared: Iterable[tuple[str | None, str | None, tuple[int, ...]]],
    events: pa.Table | None,
    collectives: pa.Table | None,
    pg: pa.Table | None = None,
) -> dict[tuple[int, ...], GroupInfo]:
    """Groups (sorted rank tuple -> GroupInfo) with their names and traffic.

    declared: (pg_name, desc, ranks) from distributedInfo.pg_config; events: rows with pg_ranks and a
    collective name; collectives: a COLLECTIVES table (Flight Recorder) with pg_name, op, rank; `pg`:
    `pg_rows(events)` when the caller has it (then the events are not read)."""
    groups: dict[tuple[int, ...], GroupInfo] = {}
    by_name: dict[str, tuple[int, ...]] = {}
    key: tuple[int, ...] | None  # None below: ranks that do not parse
    for name, desc, ranks in declared:
        key = tuple(sorted(ranks))
        gi = groups.get(key)
        if gi is None:  # (not setdefault: a GroupInfo built per declared entry costs ~15 µs)
            gi = groups[key] = GroupInfo(key)
        if desc:
            gi.names.add(str(desc))
        if name is not None:
            by_name[str(name)] = key
    sub = None
    cols = ["kind", "pg_ranks", "collective", "pg_desc", "rank"]  # (what _event_groups reads)
    if pg is not None:
        sub = pg.select(cols + ["rows"])
    elif events is not None and events.num_rows and "pg_ranks" in events.column_names:
        sub = events.select(cols).filter(events.column("pg_ranks").is_valid())
    if sub is not None and sub.num_rows:
        for pr, coll, desc, n, members in _event_groups(sub):
            key = _ranks(pr)
            if key is None:
                continue
            gi = groups.setdefault(key, GroupInfo(key))
            if desc not in ("None", "nan", ""):
                gi.names.add(desc)
            k = _kind(coll)
            if k:
                gi.calls[k] += n
                gi.members_seen |= members
    if collectives is not None and collectives.num_rows:
        cols = [c for c in ("rank", "pg_name", "pg_ranks", "op") if c in collectives.column_names]
        df = collectives.select(cols).to_pandas()
        for (name, op), g in df.groupby([df["pg_name"].astype(str), df["op"].astype(str)]):
            key = by_name.get(name)
            if key is None and "pg_ranks" in df.columns:
                key = _ranks(list(g["pg_ranks"].iloc[0])) if g["pg_ranks"].iloc[0] is not None else None
            if key is None:
                continue
            gi = groups.setdefault(key, GroupInfo(key))
            k = _kind(op)
            if k:
                gi.calls[k] += len(g)
                gi.members_seen |= {int(r) for r in g["rank"].unique()}
    return groups


def _stride(g: tuple[int, ...]) -> int | None:
    if len(g) < 2:
        return None
    d = np.diff(np.asarray(g))
    return int(d[0]) if (d == d[0]).all() else None


def structural_axes(
    groups: dict[tuple[int, ...], GroupInfo], world: int | None, any_p2p: bool
) -> tuple[dict[str, set[tuple[int, ...]]], dict[str, dict[str, Any]]]:
    """Axis -> its groups, and axis -> evidence, for the families of `groups` (see the module doc)."""
    fams: dict[tuple[int, int], list[GroupInfo]] = {}
    for key, gi in groups.items():
        n = len(key)
        if n < 2 or (world is not None and n >= world):
            continue
        s = _stride(key)
        if s is None:
            continue
        fams.setdefault((n, s), []).append(gi)
    families: list[dict[str, Any]] = []
    for (n, s), gs in fams.items():
        members = [r for g in gs for r in g.ranks]
        if len(members) != len(set(members)):
            continue  # overlapping groups: not one axis of a grid
        if world is not None and len(members) != world:
            continue  # a grid axis partitions the world (ranks not traced: the names decide, as before)
        calls: Counter[str] = Counter()
        seen: set[int] = set()
        for g in gs:
            calls.update(g.calls)
            seen |= g.members_seen
        per_rank = {k: v / max(len(seen), 1) for k, v in calls.items()}
        names = sorted({nm for g in gs for nm in g.names})
        label = Counter(a for a in (name_axis(nm) for nm in names) if a)
        families.append(
            {
                "size": n,
                "stride": s,
                "groups": sorted(g.ranks for g in gs),
                "calls_per_rank": per_rank,
                "names": names,
                "name_axis": label.most_common(1)[0][0] if len(label) == 1 else None,
                "covers_world": world is not None and len(members) == world,
            }
        )
    axis_of: dict[int, tuple[str, str]] = {}
    for i, f in enumerate(families):
        c = f["calls_per_rank"]
        if c.get("a2a"):
            axis_of[i] = ("cp", f"all_to_all traffic ({c['a2a']:.0f} calls per rank)")
        elif c.get("p2p") and not c.get("reduce"):
            axis_of[i] = ("pp", f"point-to-point traffic ({c['p2p']:.0f} per rank)")
    reducers = [i for i, f in enumerate(families) if i not in axis_of and f["calls_per_rank"].get("reduce")]
    reducers.sort(key=lambda i: -families[i]["calls_per_rank"]["reduce"])
    if len(reducers) >= 2:
        a, b = reducers[0], reducers[1]
        ca, cb = families[a]["calls_per_rank"]["reduce"], families[b]["calls_per_rank"]["reduce"]
        if ca >= 2 * cb:
            axis_of[a] = ("tp", f"per-layer all-reduces ({ca:.0f} per rank, vs {cb:.0f} on the dp groups)")
            axis_of[b] = ("dp", f"gradient all-reduces ({cb:.0f} per rank)")
    elif len(reducers) == 1 and not any(families[i]["name_axis"] == "tp" for i in reducers):
        c = families[reducers[0]]["calls_per_rank"]["reduce"]
        axis_of[reducers[0]] = ("dp", f"the only all-reducing family ({c:.0f} per rank)")
    silent = [
        i
        for i, f in enumerate(families)
        if i not in axis_of and f["covers_world"] and not f["calls_per_rank"]
    ]
    traffic_seen = any(f["calls_per_rank"] for f in families)
    if any_p2p and traffic_seen and len(silent) == 1 and "pp" not in {a for a, _ in axis_of.values()}:
        axis_of[silent[0]] = ("pp", "no collective traffic while the run sends point-to-point")
    by_axis: dict[str, set[tuple[int, ...]]] = {}
    evidence: dict[str, dict[str, Any]] = {}
    taken: set[str] = set()
    for i, f in enumerate(families):
        if i in axis_of:
            axis, why = axis_of[i]
            basis = "traffic"
        elif f["name_axis"] is not None:
            axis, why, basis = f["name_axis"], "named", "names"
        else:
            continue
        if axis in taken:
            continue  # two families claim one axis: keep the first (traffic before names)
        taken.add(axis)
        by_axis[axis] = set(f["groups"])
        evidence[axis] = {
            "basis": basis,
            "groups": len(f["groups"]),
            "size": f["size"],
            "stride": f["stride"],
            "traffic": why if basis == "traffic" else None,
            "names": f["names"][:3],
            "names_agree": None if f["name_axis"] is None else f["name_axis"] == axis,
        }
    return by_axis, evidence
