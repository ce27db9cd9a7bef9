"""The integer-code paths of the cross-rank analysis against independent ground truth: hand-computed
link ratios, per-rank interval algebra, tuple codes from a Python dict, and the Arrow table rebuilt from the
frame."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens.analyze.comm import collectives as C
from tracelens.analyze.comm import stragglers as S
from tracelens.analyze.comm.wait_split import RankLanes, lanes_for
from tracelens.analyze.core import frame_cells as FC
from tracelens.analyze.core import intervals as iv
from tracelens.schema import RankSets


def first_appearance_codes(*cols) -> list[int]:
    """Codes of the rows' tuples in order of first appearance (None / NaN one value), by a dict."""
    seen: dict = {}
    out = []
    for row in zip(*cols):
        key = tuple("<null>" if (v is None or (isinstance(v, float) and np.isnan(v))) else v for v in row)
        out.append(seen.setdefault(key, len(seen)))
    return out


def test_factorize_objects_is_pd_factorize_with_shared_and_equal_objects():
    """Cells holding one object per value, equal values in distinct objects, tuples, None and NaN."""
    rng = np.random.default_rng(0)
    shared = [(0, 1), (2, 3), "pg:1", None, float("nan"), (0, 1, 2, 3)]
    cells = np.empty(500, dtype=object)
    for i, j in enumerate(rng.integers(0, len(shared) + 2, cells.size)):
        # the last two: equal to shared ones but new objects each time
        cells[i] = shared[j] if j < len(shared) else (tuple([0, 1]) if j == len(shared) else "pg:" + "1")
    codes, uniq = FC.factorize_objects(cells)
    want_codes, want_uniq = pd.factorize(cells)
    assert codes.tolist() == list(want_codes)
    assert list(uniq) == list(want_uniq)
    # the dict ground truth: equal values one code, nulls -1, in order of first appearance
    valid = [i for i in range(cells.size) if cells[i] is not None and cells[i] == cells[i]]
    dense = first_appearance_codes([cells[i] for i in valid])
    assert [codes[i] for i in valid] == dense
    assert all(codes[i] == -1 for i in range(cells.size) if i not in set(valid))
    with pytest.raises(TypeError):
        FC.factorize_objects(np.array([[1], [2]] + [None], dtype=object)[:2])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_codes_of_small_and_wide_integer_columns_match_a_dict(seed):
    """Small-span integers (coded by value) next to wide ones (hashed), negatives and booleans."""
    rng = np.random.default_rng(seed)
    n = 400
    small = rng.integers(-3, 5, n)
    wide = rng.choice(np.array([-(10**15), 7, 10**15, 123456789012]), n)
    flag = rng.random(n) < 0.3
    strs = rng.choice(np.array(["a", "b", None], dtype=object), n)
    got = FC.row_codes(small, wide, flag, strs)
    assert got.tolist() == first_appearance_codes(small.tolist(), wide.tolist(), flag.tolist(), strs.tolist())


def link_frame():
    """Groups A {0,1}, B {2,3}, D {3,4}: 4 calls each of one kind (allreduce, 1 KiB, 2 ranks, one host);
    A moves its bytes in 100 ns, B and D in 200 ns."""
    rows = []
    inst = 0
    for name, members, xfer in (("pg:A", (0, 1), 100), ("pg:B", (2, 3), 200), ("pg:D", (3, 4), 200)):
        for k in range(4):
            for r in members:
                rows.append({"rank": r, "step": k // 2, "op": "allreduce", "bytes": 1024, "is_p2p": False,
                             "peer": None, "group_key": name, "instance": inst, "n_expected": 2,
                             "n_participants": 2, "transfer_ns": xfer})  # fmt: skip
            inst += 1
    df = pd.DataFrame(rows)
    for c in ("peer", "instance", "n_expected", "bytes"):
        df[c] = df[c].astype("Int64")
    df["is_p2p"] = df["is_p2p"].astype("boolean")
    return df


def test_slow_links_ratios_and_excess_by_hand():
    """Reference of the kind: the lower quartile (lower) of the per-group medians 100/1024, 200/1024, 200/1024
    = 100/1024, so A's ratio is 1 and B's and D's 2. Rank 3 is in B and D only: its link is slow (2.0).
    Ranks 0 and 1 have their one group healthy (1.0). Ranks 2 and 4 have one slow group whose other member
    (3) has no healthy group: not named. Excess per call: (200 - 100) / 1024 x 1024 = 100 ns on B and D."""
    df = link_frame()
    slow, d = S._slow_links(df, S.StragglerConfig(min_link_calls=4), {r: "host h0" for r in range(5)})
    assert slow == {0: 1.0, 1: 1.0, 3: 2.0}
    want = np.where(df["group_key"] == "pg:A", 0.0, 100.0)
    assert d["excess"].tolist() == want.tolist()
    assert (
        d["rank"].tolist() == df["rank"].tolist() and d["transfer_ns"].tolist() == df["transfer_ns"].tolist()
    )
    # a different host per rank makes the kind inter-host: the same ratios (all groups share that kind)
    slow2, _ = S._slow_links(df, S.StragglerConfig(min_link_calls=4), {r: f"host h{r}" for r in range(5)})
    assert slow2 == slow
    # an unknown group size makes the kind unknown: nothing to compare, no verdict
    slow3, _ = S._slow_links(
        df.assign(n_expected=pd.array([None] * len(df), dtype="Int64")), S.StragglerConfig()
    )
    assert slow3 == {}
    # too few calls per group to judge: no group ratio, every rank unnamed; the measured excess stays
    slow4, d4 = S._slow_links(df, S.StragglerConfig(min_link_calls=5))
    assert slow4 == {} and d4["excess"].tolist() == want.tolist()


def ivs(*pairs):
    return iv.union(np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))


def test_rank_lanes_give_each_rank_its_own_interval_algebra():
    """Random per-rank sets and windows: subtract, intersect, union and window measures on lanes equal the
    same operations rank by rank."""
    rng = np.random.default_rng(4)
    ranks = np.array([0, 3, 7], dtype=np.int64)
    a, b, lo, hi, rk = [], [], [], [], []
    for r in ranks:
        s = rng.integers(0, 1000, 20)
        a.append(iv.union(s, s + rng.integers(1, 60, 20)))
        s = rng.integers(0, 1000, 20)
        b.append(iv.union(s, s + rng.integers(1, 60, 20)))
        w = np.sort(rng.integers(-50, 1100, 8))
        lo.append(w[:-1])
        hi.append(w[1:])
        rk.append(np.full(w.size - 1, r))
    lanes = lanes_for(ranks, a + b, np.concatenate(lo), np.concatenate(hi))
    assert lanes.ok
    shift = lanes.of(np.concatenate(rk))
    diff = iv.subtract(lanes.sets(a), lanes.sets(b))
    both = iv.intersect(lanes.sets(a), lanes.sets(b))
    got_d = iv.measure_in_windows(diff, np.concatenate(lo) + shift, np.concatenate(hi) + shift)
    got_i = iv.measure_in_windows(both, np.concatenate(lo) + shift, np.concatenate(hi) + shift)
    want_d = np.concatenate(
        [iv.measure_in_windows(iv.subtract(x, y), w0, w1) for x, y, w0, w1 in zip(a, b, lo, hi)]
    )
    want_i = np.concatenate(
        [iv.measure_in_windows(iv.intersect(x, y), w0, w1) for x, y, w0, w1 in zip(a, b, lo, hi)]
    )
    assert got_d.tolist() == want_d.tolist() and got_i.tolist() == want_i.tolist()
    # lanes too wide for int64: refused (callers go rank by rank)
    assert not RankLanes(np.arange(4), -(2**62), 2**62).ok


def test_exposed_split_rank_by_rank_when_times_are_too_far_apart():
    """Two ranks whose clocks are ~2^62 ns apart cannot share one line: the rank-by-rank path gives each
    rank the same split as when they are close (the sets and windows moved with their rank)."""
    far = 2**62

    def case(off1):
        sets = {
            0: RankSets(0, "", ivs((50, 60)), ivs((50, 150)), ivs()),
            1: RankSets(1, "", ivs(), ivs((off1, off1 + 100)), ivs()),
        }
        bd = pa.table(
            {
                "rank": pa.array([0, 1], pa.int32()),
                "step": pa.array([0, 0], pa.int32()),
                "window_start_ns": pa.array([0, off1], pa.int64()),
                "window_end_ns": pa.array([200, off1 + 100], pa.int64()),
                "exposed_comm_ns": pa.array([90, 100], pa.int64()),
            }
        )
        df = pd.DataFrame(
            {
                "rank": [0, 1],
                "start_ns": pd.array([70, off1 + 10], dtype="Int64"),
                "end_ns": pd.array([95, off1 + 60], dtype="Int64"),
                "wait_ns": [20, 30],
                "n_participants": [2, 2],
                "n_expected": pd.array([2, 2], dtype="Int64"),
            }
        )
        return C.exposed_split(df, bd, sets).column("exposed_wait_ns").to_pylist()

    # rank 0: exposed [60,150), wait [70,90) -> 20; rank 1: exposed [0,100), wait [10,40) -> 30
    assert case(0) == case(far) == [20, 30]


def gloo_coll():
    """A small COLLECTIVES table: two 2-rank groups without process-group info (inferred) and a send/recv
    pair without peers (inferred)."""
    rows = []
    for k in range(3):
        for g, base in (((0, 1), 1000), ((2, 3), 5000)):
            for r in g:
                t = base + 10_000 * k + r
                rows.append({"rank": r, "source": "kineto", "op": "allreduce", "is_p2p": False,
                             "start_ns": t, "end_ns": t + 300, "enqueue_ns": t, "step": 1, "order": k,
                             "state": "completed", "dtype": "Float"})  # fmt: skip
        t = 8000 + 10_000 * k
        rows.append({"rank": 0, "source": "kineto", "op": "send", "is_p2p": True, "start_ns": t,
                     "end_ns": t + 200, "step": 1, "order": k, "state": "completed"})  # fmt: skip
        rows.append({"rank": 2, "source": "kineto", "op": "recv", "is_p2p": True, "start_ns": t - 50,
                     "end_ns": t + 205, "step": 1, "order": k, "state": "completed"})  # fmt: skip
    rows.sort(key=lambda r: (r["rank"], r["start_ns"]))
    return C._to_coll_table(pd.DataFrame(rows))


PG = '[{"ranks": [0, 1]}, {"ranks": [2, 3]}, {"ranks": [0, 2]}]'


def test_matched_table_from_its_source_is_the_frames_own():
    """The table rebuilt from the frame and the one reusing the matched table's columns are equal, dictionary
    encodings included; a source whose rows were re-sorted, or whose dictionary is not in order of first
    appearance, is converted from the frame instead."""
    coll = gloo_coll()
    meta = pa.table({"rank": [0, 1, 2, 3], "pg_config_json": [PG] * 4})
    df, _ = C.match_with_findings(coll, meta)
    assert df["peer"].notna().sum() == 6  # (inferred: the frame's peer column differs from the source's)
    want = C.matched_table(df)

    def same(t):
        ok = t.schema == want.schema and t.equals(want)
        for name in want.column_names:
            x, y = want.column(name).combine_chunks(), t.column(name).combine_chunks()
            if pa.types.is_dictionary(x.type):
                ok = ok and x.dictionary.equals(y.dictionary) and x.indices.equals(y.indices)
        return ok

    assert same(C.matched_table(df, coll))
    assert C._same_rows(df, coll)
    # rows out of (rank, start) order: the matching sorts them, the source's rows are not the frame's
    shuffled = coll.take(pa.array(np.r_[np.arange(1, coll.num_rows), 0]))
    df2, _ = C.match_with_findings(shuffled, meta)
    assert not C._same_rows(df2, shuffled) and same(C.matched_table(df2, shuffled))
    # a dictionary in another order than first appearance is not what converting the frame gives
    op = coll.column("op").combine_chunks()
    words = op.dictionary.to_pylist()
    rev = pa.DictionaryArray.from_arrays(
        pa.array([len(words) - 1 - i for i in op.indices.to_pylist()], pa.int32()), pa.array(words[::-1])
    )
    assert not C._reusable(rev) and C._reusable(op)
    other = coll.set_column(coll.schema.get_field_index("op"), schema.COLLECTIVES.field("op"), rev)
    df3, _ = C.match_with_findings(other, meta)
    assert same(C.matched_table(df3, other))


@pytest.mark.parametrize(
    "values", [[5, 3, 3, -2, 9, 5], [10**15, 3, 10**15, -7], [0], list(range(50, 0, -3))]
)
def test_unique_inverse_is_np_unique(values):
    """Small spans by a table, wide ones by np.unique: both give np.unique's sorted values and inverse."""
    x = np.array(values, dtype=np.int64)
    u, inv = FC.unique_inverse(x)
    want_u, want_inv = np.unique(x, return_inverse=True)
    assert u.tolist() == want_u.tolist() and inv.tolist() == want_inv.reshape(-1).tolist()
    assert u[inv].tolist() == values


def test_first_rows_of_dense_codes():
    codes = FC.row_codes(np.array([4, 4, 1, 4, 7, 1, 9]))
    assert codes.tolist() == [0, 0, 1, 0, 2, 1, 3]
    assert FC.first_rows(codes).tolist() == [0, 2, 4, 6] == np.unique(codes, return_index=True)[1].tolist()
