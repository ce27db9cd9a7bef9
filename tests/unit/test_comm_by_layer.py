"""Communication per layer type (analyze/comm/comm_by_layer.py): the vectorised attribution against the per-rank,
per-call loop it replaced (kept here as the reference), on hand-built calls with known answers, random
inputs and a bundled sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens.analyze.comm.comm_by_layer import comm_by_layer_type

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def comm_by_layer_reference(coll: pd.DataFrame, spans: pa.Table | None, n_steps: dict[int, int]):
    """The implementation before vectorisation: a boolean mask over the spans per rank, a Python walk per
    call, a lambda per (rank, op, size) group and per rank of every (type, op) group."""
    if spans is None or spans.num_rows == 0 or not len(coll):
        return None
    sp = spans.select(["rank", "module", "backward", "gpu_start_ns", "gpu_end_ns"]).to_pandas()
    sp = sp[~sp["backward"].astype(bool)]
    c = coll[coll["enqueue_ns"].notna() & (coll["step"].fillna(-1).astype(int) >= 0)].copy()
    if not len(c) or not len(sp):
        return None
    c["rank"] = c["rank"].astype("int64")
    c["t"] = c["enqueue_ns"].astype("int64")
    c["type"] = None
    for r, g in c.groupby("rank"):
        s = sp[sp["rank"] == r].sort_values("gpu_start_ns")
        if not len(s):
            continue
        starts = s["gpu_start_ns"].to_numpy(np.int64)
        ends = s["gpu_end_ns"].to_numpy(np.int64)
        mods = s["module"].to_numpy(object)
        t = g["t"].to_numpy(np.int64)
        i = np.searchsorted(starts, t, side="right") - 1
        typ = np.full(len(t), None, dtype=object)
        for k in range(len(t)):
            j = i[k]
            while j >= 0 and j >= i[k] - 8:
                if ends[j] >= t[k]:
                    typ[k] = mods[j]
                    break
                j -= 1
        c.loc[g.index, "type"] = typ
    c["in_span"] = c["type"].notna()
    if not c["in_span"].any():
        return None
    c["bytes_k"] = c["bytes"].fillna(-1)
    held = (
        c[c["in_span"]]
        .groupby(["rank", "op", "bytes_k"])["type"]
        .agg(lambda s: s.iloc[0] if s.nunique() == 1 else None)
    )
    out_mask = ~c["in_span"]
    if out_mask.any():
        j = c.loc[out_mask, ["rank", "op", "bytes_k"]].join(held.rename("held"), on=["rank", "op", "bytes_k"])
        c.loc[out_mask, "type"] = j["held"]
    c = c[c["type"].notna()]
    begin = (
        c["start_ns"].where(c["start_ns"].notna(), c["enqueue_ns"]) if "start_ns" in c else c["enqueue_ns"]
    )
    c["dur"] = (c["end_ns"].astype("float64") - begin.astype("float64")).clip(lower=0)
    res: dict = {}
    ranks = sorted(c["rank"].unique())
    steps = {r: max(n_steps.get(int(r), 1), 1) for r in ranks}
    for (typ, op), g in c.groupby(["type", "op"]):
        per = g.groupby("rank").agg(
            calls=("t", "size"),
            bytes=("bytes", lambda s: float(s.fillna(0).sum())),
            dur=("dur", "sum"),
            inspan=("in_span", "sum"),
        )
        div = per.index.map(lambda r: steps[r]).to_numpy(np.float64)
        sized = bool(g["bytes"].notna().all())
        res.setdefault(str(typ), {})[str(op)] = {
            "calls_per_step": float(np.mean(per["calls"].to_numpy() / div)),
            "bytes_per_step": float(np.mean(per["bytes"].to_numpy() / div)) if sized else None,
            "ms_per_step": float(np.mean(per["dur"].to_numpy() / div)) / 1e6,
            "in_span_calls": int(per["inspan"].sum()),
            "inferred_calls": int(per["calls"].sum() - per["inspan"].sum()),
        }
    return res or None


def _spans(rows):
    """rows: (rank, module, backward, start, end)"""
    r, m, b, s, e = zip(*rows)
    n = len(rows)
    return pa.table(
        {
            "rank": pa.array(r, pa.int32()),
            "step": pa.array([0] * n, pa.int32()),
            "layer": pa.array([0] * n, pa.int32()),
            "module": pa.array(m, pa.string()),
            "backward": pa.array(b, pa.bool_()),
            "gpu_start_ns": pa.array(s, pa.int64()),
            "gpu_end_ns": pa.array(e, pa.int64()),
            "compute_ns": pa.array([0] * n, pa.int64()),
        }
    )


def _coll(rows, categorical_op=True):
    """rows: (rank, op, enqueue, start, end, step, bytes); op categorical as cross.collectives has it."""
    df = pd.DataFrame(rows, columns=["rank", "op", "enqueue_ns", "start_ns", "end_ns", "step", "bytes"])
    if categorical_op:
        df["op"] = df["op"].astype("category")
    df["rank"] = df["rank"].astype("int32")
    return df


def _same(a, b):
    assert a == b  # dicts of floats and ints, compared exactly; key order too
    if a is not None:
        assert list(a) == list(b) and all(list(a[k]) == list(b[k]) for k in a)


def test_known_answer_nested_spans_twins_and_two_ranks():
    # rank 0: attention [0, 100) holding a nested mlp [20, 40); rank 1: one mlp span [0, 50); a backward span
    # on rank 1 over everything does not count. Rank 2 has calls but no span.
    spans = _spans(
        [
            (0, "full_attention", False, 0, 100),
            (0, "mlp", False, 20, 40),
            (1, "mlp", False, 0, 50),
            (1, "full_attention", True, 0, 1_000),
        ]
    )
    coll = _coll(
        [
            [0, "allreduce", 10, 10, 14, 0, 8],  # in attention (before the mlp starts)
            [0, "allreduce", 30, 30, 33, 0, 16],  # innermost: mlp
            [0, "allreduce", 40, 41, 45, 0, 16],  # t == mlp end: still inside (ends >= t)
            [0, "allreduce", 60, 60, 70, 0, 8],  # back in attention
            [0, "allreduce", 500, 500, 510, 0, 8],  # outside: twin of the 8-byte attention calls
            [0, "alltoall", 700, 700, 701, 0, 4],  # outside, no in-span call of its size: dropped
            [0, "allreduce", 5, 5, 6, -1, 8],  # step -1 (outside every step): ignored
            [1, "allreduce", 49, 49, 59, 0, None],  # rank 1 mlp, unsized
            [1, "allreduce", 900, 900, 905, 1, None],  # outside (the backward span is not used)
            [2, "allreduce", 10, 10, 20, 0, 8],  # rank without spans: unattributed
        ]
    )
    want = {
        "full_attention": {
            "allreduce": {
                "calls_per_step": 3 / 2,  # 3 calls on rank 0, 2 steps
                "bytes_per_step": 24 / 2,
                "ms_per_step": (4 + 10 + 10) / 2 / 1e6,
                "in_span_calls": 2,
                "inferred_calls": 1,
            }
        },
        "mlp": {
            "allreduce": {
                # rank 0: 2 calls in 2 steps; rank 1: 2 calls (one inferred, null size held as -1) in 4 steps
                "calls_per_step": (2 / 2 + 2 / 4) / 2,
                "bytes_per_step": None,  # rank 1's are unsized
                "ms_per_step": ((3 + 4) / 2 + (10 + 5) / 4) / 2 / 1e6,
                "in_span_calls": 3,
                "inferred_calls": 1,
            }
        },
    }
    n_steps = {0: 2, 1: 4, 2: 1}
    got = comm_by_layer_type(coll, spans, n_steps)
    _same(got, want)
    _same(comm_by_layer_reference(coll, spans, n_steps), want)


def test_ambiguous_size_is_not_inferred_and_walk_back_is_bounded():
    # a long attention span [0, 1000) and ten short mlp spans [10 + 10k, 15 + 10k) after its start
    rows = [(0, "full_attention", False, 0, 1000)]
    rows += [(0, "mlp", False, 10 + 10 * k, 15 + 10 * k) for k in range(10)]
    spans = _spans(rows)
    coll = _coll(
        [
            [0, "allreduce", 5, 5, 6, 0, 8],  # attention
            [0, "allreduce", 12, 12, 13, 0, 8],  # mlp 0
            [0, "allreduce", 93, 93, 94, 0, 8],  # mlp 8
            # inside attention, but the last span starting before it is mlp 8 and attention lies 9 spans
            # back: the walk stops after 9 (the approximation), so it counts as outside every span ...
            [0, "allreduce", 97, 97, 98, 0, 8],
            [0, "allreduce", 2000, 2000, 2001, 0, 8],  # ... and, as this one, 8 bytes is held by two types
            [0, "allreduce", 30, 30, 32, 0, 16],  # mlp 2
            [0, "allreduce", 3000, 3000, 3004, 0, 16],  # outside; 16 bytes only in mlp: inferred
        ]
    )
    got = comm_by_layer_type(coll, spans, {0: 1})
    _same(got, comm_by_layer_reference(coll, spans, {0: 1}))
    assert got == {
        "full_attention": {
            "allreduce": {
                "calls_per_step": 1.0,
                "bytes_per_step": 8.0,
                "ms_per_step": 1 / 1e6,
                "in_span_calls": 1,
                "inferred_calls": 0,
            }
        },
        "mlp": {
            "allreduce": {
                "calls_per_step": 4.0,
                "bytes_per_step": 48.0,
                "ms_per_step": (1 + 1 + 2 + 4) / 1e6,
                "in_span_calls": 3,
                "inferred_calls": 1,
            }
        },
    }


def test_equal_starts_keep_the_per_rank_sort_order():
    # nested spans starting at the same instant (an outer and an inner annotation around the same first
    # kernel), listed out of order: which one a call falls in depends on how the rank's spans sort (numpy's
    # default argsort, not a stable one), as it did per rank
    rng = np.random.default_rng(7)
    rows = []
    for r in range(3):
        per = [(r, "full_attention", False, 100 * k, 100 * k + 80) for k in range(12)]
        per += [(r, "mlp", False, 100 * k, 100 * k + 40) for k in range(12)]
        rows += [per[i] for i in rng.permutation(len(per))]
    spans = _spans(rows)
    coll = _coll([[r, "allreduce", 100 * k + 20, 0, 5, 0, 4] for r in range(3) for k in range(12)])
    got = comm_by_layer_type(coll, spans, {})
    _same(got, comm_by_layer_reference(coll, spans, {}))
    assert set(got) == {"full_attention", "mlp"}  # the ties split both ways


@st.composite
def _inputs(draw):
    n_ranks = draw(st.integers(1, 4))
    mods = ["full_attention", "linear_attention", "mlp"]
    rows = []
    for r in range(n_ranks):
        for _ in range(draw(st.integers(0, 12))):
            s = draw(st.integers(0, 400)) * 5
            rows.append(
                (r, draw(st.sampled_from(mods)), draw(st.booleans()), s, s + draw(st.integers(0, 60)) * 5)
            )
    calls = []
    for r in range(n_ranks + 1):
        for _ in range(draw(st.integers(0, 15))):
            t = draw(st.integers(0, 420)) * 5
            calls.append(
                [
                    r,
                    draw(st.sampled_from(["allreduce", "alltoall", "allgather"])),
                    t,
                    draw(st.sampled_from([None, t + 1])),
                    t + draw(st.integers(0, 30)),
                    draw(st.sampled_from([None, -1, 0, 1])),
                    draw(st.sampled_from([None, 8, 16])),
                ]
            )
    n_steps = {r: draw(st.integers(0, 3)) for r in range(n_ranks + 1)}
    return rows, calls, n_steps


@settings(deadline=None, max_examples=60)
@given(_inputs())
def test_matches_reference_on_random_inputs(data):
    rows, calls, n_steps = data
    if not rows or not calls:
        return
    spans = _spans(rows)
    coll = _coll(calls)
    coll["start_ns"] = coll["start_ns"].astype("float64")
    coll["step"] = coll["step"].astype("float64")
    _same(comm_by_layer_type(coll, spans, n_steps), comm_by_layer_reference(coll, spans, n_steps))


def test_matches_reference_on_a_sample(tmp_path):
    from tracelens.run_analysis import Options, analyze_run

    an = analyze_run(SAMPLES / "qwen35-27b-seq256k-tp2pp4cp2", Options(cache_dir=str(tmp_path)))
    coll, spans = an.sized_collectives, an.spans
    n = {r: len(an.steps) or 1 for r in an.ranks}
    got = comm_by_layer_type(coll, spans, n)
    assert got  # the sample's layers exchange
    _same(got, comm_by_layer_reference(coll, spans, n))


@settings(deadline=None, max_examples=60)
@given(_inputs())
def test_categorical_ops_match_the_group_by_exactly(data):
    # the collectives table's op column is categorical (categories in the table's order, not sorted): the
    # lexsort path gives the group-by path's numbers and order exactly (the reference's group-by order too)

    rows, calls, n_steps = data
    if not rows or not calls:
        return
    spans = _spans(rows)
    coll = _coll(calls)
    coll["op"] = pd.Categorical(coll["op"], categories=["alltoall", "allreduce", "allgather"])
    got = comm_by_layer_type(coll, spans, n_steps)
    want = comm_by_layer_reference(coll, spans, n_steps)
    assert repr(got) == repr(want)


def test_grouping_per_type_op_rank_matches_pandas():
    # a null op is in no group, a NaN duration sums as 0, groups come in (type, op category, rank) order
    from tracelens.analyze.comm import comm_by_layer as C

    c = pd.DataFrame(
        {
            "type": ["mlp", "full_attention", "mlp", "mlp"],
            "op": pd.Categorical(
                ["allreduce", "alltoall", None, "allreduce"], categories=["allreduce", "alltoall"]
            ),
            "rank": np.array([1, 0, 0, 0], np.int64),
            "t": [1, 2, 3, 4],
            "bytes0": [8.0, 0.0, 16.0, 8.0],
            "dur": [5.0, np.nan, 1.0, 2.0],
            "in_span": [True, False, True, True],
            "sized": [True, False, True, True],
        }
    )
    ranks, _, _, typ_op, calls, byt, dur, inspan, sized = C._per_type_op_rank(c)
    per = c.groupby(["type", "op", "rank"]).agg(
        calls=("t", "size"),
        bytes=("bytes0", "sum"),
        dur=("dur", "sum"),
        inspan=("in_span", "sum"),
        sized=("sized", "all"),
    )  # (the null op's row is in no group; the NaN duration sums as 0)
    assert list(per.index) == [(t, o, r) for (t, o), r in zip(typ_op, ranks.tolist())]
    assert per["calls"].tolist() == calls.tolist() and per["inspan"].tolist() == inspan.tolist()
    assert per["bytes"].tolist() == byt.tolist() and per["dur"].tolist() == dur.tolist()
    assert per["sized"].tolist() == sized.tolist()


def _brute_last_at_or_before(sr, ss, c_rank, t):
    """Reference: for each call, the largest index k with (sr[k], ss[k]) <= (rank, t) in (rank, time) order."""
    out = []
    for r, x in zip(c_rank, t):
        k = -1
        for j, (a, b) in enumerate(zip(sr, ss)):
            if (a, b) <= (r, x):
                k = j
        out.append(k)
    return np.array(out)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_last_span_at_or_before_both_paths(data):
    """The one-key search and the merge fallback (times too far apart for one int64 key) agree with brute force."""
    from tracelens.analyze.comm.comm_by_layer import _last_at_or_before

    far = data.draw(st.booleans())
    hi = 2**62 if far else 50
    n = data.draw(st.integers(1, 12))
    sr = np.sort(np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64))
    ss = np.array(data.draw(st.lists(st.integers(0, hi), min_size=n, max_size=n)), np.int64)
    o = np.lexsort((ss, sr))
    sr, ss = sr[o], ss[o]
    m = data.draw(st.integers(1, 12))
    cr = np.array(data.draw(st.lists(st.integers(0, 4), min_size=m, max_size=m)), np.int64)
    ct = np.array(data.draw(st.lists(st.integers(0, hi), min_size=m, max_size=m)), np.int64)
    got = _last_at_or_before(sr, ss, cr, ct)
    assert got.tolist() == _brute_last_at_or_before(sr, ss, cr, ct).tolist()
