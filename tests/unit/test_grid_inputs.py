"""The grid inference's inputs (tracelens/analyze/layout): pg_config parsed once with shared entries, P2P edges from the
rows with a peer, chains with precomputed first sends. Checked against the implementations they replaced
(kept here as the truth) on hand-built tables and real runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pipeline_tables import events_table, megatron_groups, metadata_table, pipeline_run

from tracelens import schema
from tracelens._testing import table_from_rows
from tracelens.analyze.comm.collectives import _pg_candidates
from tracelens.analyze.layout import groups, infer, p2p

ROOT = Path(__file__).resolve().parents[2]


# ----- the replaced implementations --------------------------------------------------------------------


def old_pg_entries(texts: list[str | None]) -> list[dict]:
    seen: set[str] = set()
    out: list[dict] = []
    for text in texts:
        if not text or text in seen:
            continue
        seen.add(text)
        try:
            cfg = json.loads(text)
        except ValueError:
            continue
        entries = cfg.values() if isinstance(cfg, dict) else cfg if isinstance(cfg, list) else ()
        out.extend(e for e in entries if isinstance(e, dict))
    return out


def old_p2p_edges(events: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    empty = np.empty(0, np.int64)
    if events is None or events.num_rows == 0:
        return empty, empty, empty, False
    names = events.column("name").combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = names.dictionary_encode()
    vals = names.dictionary.to_pylist()
    is_p2p_name = np.array([bool(v and p2p.P2P_NAMES.search(v)) for v in vals] + [False])
    idx = names.indices.fill_null(len(vals)).to_numpy(zero_copy_only=False)
    coll = events.column("collective").combine_chunks()
    has_coll = coll.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_dictionary(coll.type):
        words = coll.dictionary.cast(pa.string())
        hit = pc.fill_null(pc.match_substring_regex(words, r"^(send|recv|isend|irecv)$"), False)
        used = np.unique(coll.indices.drop_null().to_numpy(zero_copy_only=False))
        any_coll = bool(hit.to_numpy(zero_copy_only=False)[used].any()) if used.size else False
    else:
        is_p2p_coll = pc.fill_null(pc.match_substring_regex(coll, r"^(send|recv|isend|irecv)$"), False)
        any_coll = bool(pc.any(is_p2p_coll).as_py())
    any_p2p = bool((is_p2p_name[idx] & ~has_coll).any()) or any_coll
    rank = events.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ts = events.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    dst = events.column("dst_rank")
    src = events.column("src_rank")
    dv = dst.is_valid().to_numpy(zero_copy_only=False)
    sv = src.is_valid().to_numpy(zero_copy_only=False)
    d = dst.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    s = src.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    a_src = np.concatenate([rank[dv], s[sv]])
    a_dst = np.concatenate([d[dv], rank[sv]])
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


def old_chains(src: np.ndarray, dst: np.ndarray, first: np.ndarray) -> tuple[list[list[int]], list[str]]:
    adj: dict[int, set[int]] = {}
    for a, b in zip(src.tolist(), dst.tolist()):
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    first_send = {(a, b): t for a, b, t in zip(src.tolist(), dst.tolist(), first.tolist())}
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
        sends = sorted((t, a, b) for (a, b), t in first_send.items() if a in deg)
        if is_path:

            def first_out(n: int) -> int:
                return min((t for (a, _), t in first_send.items() if a == n), default=np.iinfo(np.int64).max)

            head = min(ends, key=lambda n: (first_out(n), n))
            order, prev = [head], None
            while len(order) < len(comp):
                nxt = [m for m in adj[order[-1]] if m != prev]
                prev = order[-1]
                order.append(nxt[0])
        else:
            _t0, head, second = sends[0] if sends else (0, comp[0], min(adj[comp[0]]))
            order = [head, second]
            while len(order) < len(comp):
                nxt = [m for m in adj[order[-1]] if m != order[-2]]
                order.append(nxt[0])
        chains.append(order)
    return chains, problems


# ----- pg_config -----------------------------------------------------------------------------------------


def _typed(v: object) -> object:
    """A value with the type of every scalar (1, 1.0 and True differ; -0.0 and 0.0 differ)."""
    if isinstance(v, dict):
        return ("d", tuple((k, _typed(x)) for k, x in v.items()))
    if isinstance(v, list):
        return ("l", tuple(_typed(x) for x in v))
    return (type(v).__name__, repr(v))


def _metadata(texts: list[str | None]) -> pa.Table:
    return table_from_rows(
        [{"rank": i, "world_size": len(texts), "pg_config_json": t} for i, t in enumerate(texts)],
        schema.METADATA,
    )


def _same_entries(texts: list[str | None]) -> None:
    md = _metadata(texts)
    want = old_pg_entries(texts)
    got = list(groups.pg_config_entries(md))
    assert [_typed(e) for e in got] == [_typed(e) for e in want]
    entries, seq = groups.pg_config_distinct(md)
    assert [entries[i] for i in seq] == got
    assert len({id(e) for e in entries}) == len(entries)


WORLD = list(range(64))
HAND = [
    # every rank its own groups and the world's: the world entry is shared
    [
        json.dumps(
            [
                {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 64, "ranks": WORLD},
                {
                    "pg_name": str(1 + r // 8),
                    "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP",
                    "ranks": WORLD[r // 8 * 8 :][:8],
                },
            ],
            separators=(",", ":"),
        )
        for r in range(64)
    ],
    # keyed by group, duplicate keys (the last wins), spacing that differs, entries that are not objects
    [
        '{"0": {"ranks": [0, 1]}, "1": 5, "0": {"ranks": [2, 3], "pg_desc": "tp"}}',
        '{"0":{"ranks":[2,3],"pg_desc":"tp"}, "x": [1, 2], "y": "text", "z": null}',
        '[{"ranks": [0, 1]}, {"ranks": [0,1]}, 3, "s", [4], {"ranks": "[0, 1]"}]',
    ],
    # types that compare equal but are not the same JSON: never one entry
    [
        '[{"pg_size": 1, "ranks": [0]}]',
        '[{"pg_size": 1.0, "ranks": [0]}]',
        '[{"pg_size": true, "ranks": [true]}]',
        '[{"x": 0.0}, {"x": -0.0}, {"x": 1e400}, {"x": 12345678901234567890123}]',
    ],
    # what msgspec does not cut: read whole by json, as before (NaN), or skipped (broken, scalar, empty)
    [
        '[{"ranks": [0, 1], "x": NaN}]',
        '[{"ranks": [0, 1], "x": Infinity}, {"ranks": [0, 1]}]',
        '[{"ranks": [0, 1]',
        "7",
        '"text"',
        "",
        None,
        "null",
        '{"a": {"ranks": [0, 1]}}',
        '{"a": {"ranks": [0, 1]}}',
        '[{"s": "\\ud800", "ranks": [0]}]',
        '[{"s": "é\\u00e9", "ranks": [0]}]',
        ' \n [ { "ranks" : [ 0 , 1 ] } ] \n',
    ],
]


@pytest.mark.parametrize("texts", HAND)
def test_pg_entries_hand_built(texts):
    _same_entries(texts)


def test_pg_entries_megatron_and_consumers():
    """Per-rank configs whose pg_name is only the group's index on that rank (names mean different groups on
    different ranks): the groups, the collective candidates and the grid are what they were."""
    md = metadata_table(32, megatron_groups(2, 4, 4))
    _same_entries(md.column("pg_config_json").to_pylist())
    want_groups = []
    for e in old_pg_entries(md.column("pg_config_json").to_pylist()):
        ranks = groups.parse_ranks(e.get("ranks"))
        if ranks is not None:
            want_groups.append((e.get("pg_desc", e.get("desc")), ranks))
    assert set(groups.groups_from_metadata(md)) == set(want_groups)
    cands = set()
    for e in old_pg_entries(md.column("pg_config_json").to_pylist()):
        if isinstance(e.get("ranks"), list) and len(e["ranks"]) >= 2:
            cands.add(tuple(sorted(e["ranks"])))
    assert _pg_candidates(md) == sorted(cands, key=lambda t: (len(t), t))
    grid, findings = infer.infer_grid(None, md)
    assert (grid.tp, grid.pp, grid.dp, grid.cp) == (2, 4, 4, 1)


# ----- P2P edges and chains ------------------------------------------------------------------------------


def _same_edges(events: pa.Table) -> None:
    want = old_p2p_edges(events)
    got = p2p.p2p_edges(events)
    for a, b in zip(want[:3], got[:3]):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    assert want[3] == got[3]
    assert old_chains(*want[:3]) == p2p.chains(*got[:3])


def _p2p_rows(pairs, ts0=0, collective="send", name="ncclDevKernel_SendRecv"):
    rows = []
    for i, (r, dst, src) in enumerate(pairs):
        rows.append(
            {
                "rank": r,
                "kind": "kernel",
                "name": name,
                "ts_ns": ts0 + 1000 * i,
                "dur_ns": 10,
                "collective": collective,
                "dst_rank": dst,
                "src_rank": src,
            }
        )
    return rows


def test_edges_hand_built():
    # two pipelines of 4, a ring of 3, a star (not a chain), sends and receives, self and negative peers
    pairs = [(0, 1, None), (1, 2, None), (2, 3, None), (3, None, 2), (2, None, 1), (1, None, 0)]
    pairs += [(4 + r, None, None) for r in range(4)]
    pairs += [(11, 10, None), (10, 9, None), (9, 8, None), (8, None, 9)]
    pairs += [(20, 21, None), (21, 22, None), (22, 20, None)]
    pairs += [(30, 31, None), (30, 32, None), (30, 33, None)]
    pairs += [(40, 40, None), (41, -1, None), (42, None, -5)]
    _same_edges(events_table(_p2p_rows(pairs)))
    # P2P only by name (gloo: no collective column), and nothing P2P at all
    gloo = _p2p_rows([(0, None, None), (1, None, None)], collective=None, name="gloo:send")
    _same_edges(events_table(gloo))
    plain = _p2p_rows([(0, None, None)], collective="all_reduce", name="ncclDevKernel_AllReduce")
    _same_edges(events_table(plain))
    _same_edges(events_table(_p2p_rows([(0, None, None)], collective=None, name="aten::mm")))


def test_edges_pipeline_tables():
    rows, _truth = pipeline_run([100, 100, 100, 100], [200, 200, 200, 200], m=6, steps=2)
    _same_edges(events_table(rows))


@pytest.mark.parametrize(
    "run",
    [
        "qwen35-27b-seq4k-tp4pp4",
        "qwen35-27b-seq256k-tp2pp4cp2",
        "cpu-gloo-4rank",
        "qwen35-27b-seq4k-tp2pp3-split22-21-21",
    ],
)
def test_real_runs(run, tmp_path):
    path = ROOT / "sample_traces" / run
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    from tracelens.run_analysis import Options, analyze_run

    a = analyze_run(path, Options(cache_dir=str(tmp_path)))
    _same_edges(a._xevents)
    _same_edges(a.events)
    _same_entries(a.metadata.column("pg_config_json").to_pylist())


def test_distinct_ints():
    rng = np.random.default_rng(3)
    for v in (
        np.array([], np.int32),
        rng.integers(0, 1024, 5000),
        rng.integers(-3, 3, 50),
        np.array([0, 2**40]),
    ):
        assert np.array_equal(infer._distinct_ints(v), np.unique(v))
