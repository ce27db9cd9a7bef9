"""The per-rank stage's cheaper routes give what the routes they replace give (tracelens.analyze.core.intset,
idle._gaps / _ByName, breakdown's parts by inclusion-exclusion, sync_calls without a join, dictcol.valid)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import Columns
from tracelens.analyze.core.intset import distinct, member
from tracelens.analyze.critical.critical_nodes import sync_calls
from tracelens.analyze.rank.breakdown import breakdown
from tracelens.analyze.rank.idle import _ByName, _gaps
from tracelens.schema import BREAKDOWN, SYNCS, RankSets


def _arrays(rng: np.random.Generator) -> list[np.ndarray]:
    out = [
        np.zeros(0, np.int64),
        np.full(7, 3, np.int32),
        np.full(5, -4, np.int64),
        np.array([127, -128, 0, 127], np.int8),  # (a range wider than int8's differences)
        np.array([2**62, -(2**62), 5], np.int64),  # a range far too wide for a table: numpy's route
        np.arange(10, dtype=np.float64),  # not integers: numpy's route
    ]
    for dtype in (np.int16, np.int32, np.int64):
        for span in (1, 5, 1000, 1 << 20, 1 << 40):
            lo = int(rng.integers(-1000, 1000))
            out.append((lo + rng.integers(0, span, int(rng.integers(1, 300)))).astype(dtype))
    return out


def test_distinct_and_member_are_numpys_unique_and_isin():
    rng = np.random.default_rng(7)
    arrays = _arrays(rng)
    for a in arrays:
        want = np.unique(a)
        got = distinct(a)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        for b in arrays:
            if a.dtype.kind == b.dtype.kind == "i" or a.size == 0 or b.size == 0:
                want_in = np.isin(a, b)
                got_in = member(a, b)
                assert got_in.dtype == want_in.dtype and np.array_equal(got_in, want_in)


def _canonical(rng: np.random.Generator, n: int) -> iv.Intervals:
    s = rng.integers(0, 10_000, n)
    return iv.union(s, s + rng.integers(0, 300, n))


def test_gaps_are_the_window_minus_the_clipped_busy_set():
    rng = np.random.default_rng(3)
    for _ in range(300):
        busy = _canonical(rng, int(rng.integers(0, 40)))
        lo = int(rng.integers(-500, 10_500))
        hi = lo + int(
            rng.integers(-50, 4000)
        )  # (also empty and negative windows: subtract keeps those as they are)
        want = iv.subtract((np.array([lo]), np.array([hi])), iv.clip(busy, lo, hi))
        got = _gaps(busy, lo, hi)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[0].dtype == want[0].dtype == np.int64


def _by_name_old(names: np.ndarray, values: np.ndarray, top: int) -> dict[str, int]:
    """The grouping _ByName replaced: np.unique of the names (or pandas' with a null name)."""
    if any(n is None for n in names):
        s = pd.Series(values, index=names).groupby(level=0).sum().sort_values(ascending=False)
        return {str(k): int(v) for k, v in s.head(top).items() if v > 0}
    keys, inv = np.unique(names, return_inverse=True)
    sums = np.zeros(keys.size, np.int64)
    np.add.at(sums, inv, values)
    rev = np.arange(sums.size)[::-1]
    first = rev[sums[::-1].argsort(kind="quicksort")][::-1][:top]
    return {str(keys[i]): int(sums[i]) for i in first if sums[i] > 0}


@pytest.mark.parametrize("with_null", [False, True])
def test_by_name_groups_on_codes_as_on_names(with_null: bool):
    # a dictionary repeating a value (two codes, one name) and names out of sorted order; ties in the sums
    values = ["zeta", "alpha", "mid", "alpha", "beta", *([None] if with_null else [])]
    name_of = np.array([*values, None], dtype=object)
    first: dict[str | None, int] = {}
    canon = np.array([first.setdefault(v, i) for i, v in enumerate(name_of.tolist())], np.int64)
    rng = np.random.default_rng(11)
    for _ in range(200):
        idx = rng.integers(0, len(values), int(rng.integers(1, 30)))
        vals = rng.integers(0, 4, idx.size) * 100
        for top in (1, 3, 10):
            got = _ByName(name_of, canon, idx).top(vals, top)
            want = _by_name_old(name_of[idx], vals, top)
            assert got == want and list(got) == list(want)


def test_breakdown_parts_by_inclusion_exclusion_equal_the_set_algebra():
    rng = np.random.default_rng(5)
    for _ in range(60):
        rs = RankSets(0, "gpu", _canonical(rng, 30), _canonical(rng, 30), _canonical(rng, 10))
        lo = np.sort(rng.integers(0, 9000, 3))
        hi = lo + rng.integers(0, 3000, 3)
        windows = pa.table(
            {
                "rank": pa.array([0, 0, 0], pa.int32()),
                "step": pa.array([1, 2, 3], pa.int32()),
                "start_ns": pa.array(lo, pa.int64()),
                "end_ns": pa.array(hi, pa.int64()),
            }
        )
        events = BREAKDOWN.empty_table()  # (not read when sets and windows are given)
        got = breakdown(events, sets={0: rs}, windows=windows).to_pydict()
        c_k = iv.union2(rs.compute, rs.comm)
        busy = iv.union2(c_k, rs.memory)
        assert (
            got["overlapped_comm_ns"]
            == iv.measure_in_windows(iv.intersect(rs.comm, rs.compute), lo, hi).tolist()
        )
        assert (
            got["exposed_comm_ns"] == iv.measure_in_windows(iv.subtract(rs.comm, rs.compute), lo, hi).tolist()
        )
        assert got["memcpy_ns"] == iv.measure_in_windows(iv.subtract(rs.memory, c_k), lo, hi).tolist()
        assert got["idle_ns"] == ((hi - lo) - iv.measure_in_windows(busy, lo, hi)).tolist()


def test_sync_calls_of_synchronize_calls_only():
    names = [
        "cudaStreamSynchronize",
        "cudaLaunchKernel",
        "cudaDeviceSynchronize",
        None,
        "cudaEventSynchronize",
    ]
    ev = pa.table(
        {
            "rank": pa.array([3] * 5, pa.int32()),
            "kind": pa.array(["cuda_runtime"] * 5).dictionary_encode(),
            "name": pa.array(names).dictionary_encode(),
            "tid": pa.array([9, 9, 8, 9, None], pa.int64()),
            "ts_ns": pa.array([100, 200, 300, 400, 500], pa.int64()),
            "dur_ns": pa.array([50, 5, None, 5, 10], pa.int64()),
            "correlation": pa.array([1, 2, 3, 4, 5], pa.int64()),
        }
    )
    out = sync_calls(ev)
    want = pa.table(
        {
            "rank": pa.array([3, 3], pa.int32()),
            "tid": pa.array([9, 8], pa.int64()),
            "start_ns": pa.array([100, 300], pa.int64()),
            "end_ns": pa.array([150, 300], pa.int64()),  # (a null duration: 0)
            "name": pa.array(["cudaStreamSynchronize", "cudaDeviceSynchronize"], pa.string()),
        },
        schema=SYNCS,
    )
    assert out.equals(want)


def test_valid_of_columns_without_nulls_or_all_null():
    t = pa.table(
        {
            "a": pa.array([1, 2, 3], pa.int64()),
            "b": pa.array([None, None, None], pa.int64()),
            "c": pa.array([None, 2, None], pa.int64()),
            "d": pa.chunked_array([pa.array([1], pa.int32()), pa.array([None, 4], pa.int32())]),
        }
    )
    cols = Columns(t)
    for name in t.column_names:
        got = cols.valid(name)
        assert got.dtype == np.bool_ and got.tolist() == t.column(name).is_valid().to_pylist()


def test_rank_nodes_labels_are_the_labels_of_relabel():
    """rank_nodes takes each kernel's label from the spans' module column; `_labels` (relabel's route) looks
    the same spans up as Python values."""
    from pathlib import Path

    from tracelens.analyze.critical.critical_nodes import _labels, rank_nodes
    from tracelens.analyze.pipeline.composition import module_spans
    from tracelens.ingest import kineto

    root = Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp4pp4"
    path = sorted(root.glob("*.json*"))[0]
    events = kineto.read(str(path), rank=0).events
    spans = module_spans(events)
    nodes, _ = rank_nodes(events, spans)
    want = _labels({k: nodes.column(k).to_numpy() for k in ("rank", "start_ns")}, spans)
    assert any(v is not None for v in want) and None in want
    assert nodes.column("label").to_pylist() == want
    assert rank_nodes(events, None)[0].column("label").null_count == nodes.num_rows


def test_innermost_enclosing_against_brute_force():
    """The op of the query's group with start <= t <= end and the latest start (ties: the later in the sort
    by (group, start), which is stable), on nested and overlapping ops; -1 when none."""
    from tracelens.analyze.rank.launch_link import innermost_enclosing

    rng = np.random.default_rng(13)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        g = rng.integers(0, 3, n).astype(np.int64)
        s = rng.integers(0, 1000, n).astype(np.int64)
        e = s + rng.integers(0, 400, n)
        nq = int(rng.integers(0, 30))
        qg = rng.integers(0, 4, nq).astype(np.int64)
        qt = rng.integers(-10, 1500, nq).astype(np.int64)
        got = innermost_enclosing(g, s, e, qg, qt)
        order = np.lexsort((s, g))
        for i in range(nq):
            best = -1
            for k in order:  # the last in sort order of the ops holding the query
                if g[k] == qg[i] and s[k] <= qt[i] <= e[k]:
                    best = int(k)
            assert got[i] == best


@pytest.mark.parametrize(
    "values",
    [["a", "b", "c"], ["a", "b", "a", "c", "b"], ["x", None, "y"], [None, "x", None], [], ["only"]],
)
def test_canonical_ids_are_the_first_entry_of_each_value(values: list[str | None]):
    """Columns.canonical: per dictionary entry and the null slot after them, the first entry of equal value
    (a dictionary may repeat a value or hold a null)."""
    dictionary = pa.array(values, pa.string())
    indices = pa.array([0, None] if values else [None], pa.int32())
    t = pa.table({"name": pa.DictionaryArray.from_arrays(indices, dictionary)})
    first: dict[str | None, int] = {}
    want = [first.setdefault(v, i) for i, v in enumerate(values)]
    want.append(first.setdefault(None, len(values)))
    got = Columns(t).canonical("name")
    assert got.dtype == np.int64 and got.tolist() == want


def test_int64_of_an_all_null_column_is_the_fill():
    t = pa.table(
        {
            "a": pa.array([None, None], pa.int64()),
            "b": pa.array([None, None], pa.int32()),
            "d": pa.array([None, 5], pa.int32()),
        }
    )
    empty = pa.table({"c": pa.array([], pa.int64())})
    assert Columns(empty).int64("c", -1).dtype == np.int64 and Columns(empty).int64("c", -1).size == 0
    for name in t.column_names:
        for fill in (-1, 0):
            got = Columns(t).int64(name, fill)
            want = t.column(name).fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64)
            assert got.dtype == np.int64 and got.tolist() == want.tolist()
