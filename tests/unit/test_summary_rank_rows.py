"""summary.rank_rows (per-rank means of the per-step fields, one array reduction when every rank has as
many steps with values) and summary.per_step_rows (read column by column) against the row-by-row code
they replace (kept here as the reference), on random inputs with a fixed seed, and on hand-built rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tracelens.summary import _ms, per_step_rows, rank_rows

FIELDS = [
    "step_time_ms",
    "compute_ms",
    "exposed_comm_ms",
    "exposed_wait_ms",
    "exposed_transfer_ms",
    "overlapped_comm_ms",
    "memcpy_ms",
    "idle_ms",
    "bubble_ms",
]


def _old(per_step: list[dict], stage_of: dict[int, int] | None) -> list[dict]:
    by_rank: dict[int, list[dict]] = {}
    for row in per_step:
        by_rank.setdefault(row["rank"], []).append(row)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        rec: dict[str, Any] = {"rank": rank, "stage": (stage_of or {}).get(rank)}
        for f in FIELDS:
            vals = [v for v in (r.get(f) for r in rows) if v is not None]
            rec[f] = round(float(np.mean(vals)), 6) if vals else None
        rec["steps"] = len(rows)
        out.append(rec)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_rank_rows_match_the_per_rank_means(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_ranks, n_steps = int(rng.integers(1, 40)), int(rng.integers(1, 20))
    uneven, nulls = bool(rng.random() < 0.3), float(rng.choice([0.0, 0.0, 0.1]))
    absent = set(rng.choice(FIELDS, int(rng.integers(0, 3)), replace=False).tolist())
    rows = []
    for r in rng.permutation(n_ranks).tolist():  # (rows not in rank order)
        for s in range(n_steps - (int(rng.integers(0, 2)) if uneven else 0)):
            row: dict[str, Any] = {"rank": r, "step": s}
            for f in FIELDS:
                if f in absent:
                    continue
                v = round(float(rng.lognormal(2, 1.5)), 6)
                row[f] = None if rng.random() < nulls else v
            rows.append(row)
    stage_of = {r: r % 3 for r in range(n_ranks) if r % 5}
    got = rank_rows(rows, stage_of)
    want = _old(rows, stage_of)
    assert got == want
    assert [list(g) for g in got] == [list(w) for w in want]  # same keys in the same order


def test_rank_rows_hand_built() -> None:
    rows = [
        {"rank": 1, "step": 0, "compute_ms": 1.0, "idle_ms": None},
        {"rank": 0, "step": 0, "compute_ms": 2.0, "idle_ms": 4.0},
        {"rank": 1, "step": 1, "compute_ms": 2.0, "idle_ms": 3.0},
        {"rank": 0, "step": 1, "compute_ms": 3.0, "idle_ms": 5.0},
    ]
    got = rank_rows(rows, {0: 0, 1: 1})
    assert [g["rank"] for g in got] == [0, 1] and [g["stage"] for g in got] == [0, 1]
    assert [g["compute_ms"] for g in got] == [2.5, 1.5]
    assert [g["idle_ms"] for g in got] == [4.5, 3.0]  # (rank 1's null step left out of its mean)
    assert got[0]["step_time_ms"] is None and got[1]["steps"] == 2


def _old_per_step_rows(bd: pa.Table, extra: dict[str, pa.Table] | None = None) -> list[dict]:
    rows = bd.to_pylist()
    lookups: dict[str, dict] = {}
    for col, tab in (extra or {}).items():
        if tab is None:
            continue
        d = {}
        for r in tab.to_pylist():
            d[(r["rank"], r["step"])] = r[col]
        lookups[col] = d
    out = []
    for r in rows:
        row = {
            "rank": r["rank"],
            "step": r["step"],
            "step_time_ms": _ms(r["step_time_ns"]),
            "compute_ms": _ms(r["compute_ns"]),
            "exposed_comm_ms": _ms(r["exposed_comm_ns"]),
            "overlapped_comm_ms": _ms(r["overlapped_comm_ns"]),
            "memcpy_ms": _ms(r["memcpy_ns"]),
            "idle_ms": _ms(r["idle_ns"]),
        }
        for col, d in lookups.items():
            v = d.get((r["rank"], r["step"]))
            row[col.replace("_ns", "_ms")] = _ms(v)
        out.append(row)
    return out


def _ns(rng: np.random.Generator, n: int, nulls: float, floats: bool) -> pa.Array:
    v = rng.integers(0, 10**9, n)
    vals: list[Any] = [float(x) + 0.5 if floats else int(x) for x in v.tolist()]
    vals = [None if rng.random() < nulls else x for x in vals]
    if floats and n:
        vals[0] = float("nan")  # (NaN is unknown: null in the summary)
    return pa.array(vals, pa.float64() if floats else pa.int64())


@pytest.mark.parametrize("seed", range(10))
def test_per_step_rows_match_the_row_by_row_reading(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    rank = rng.integers(0, 8, n).astype(np.int32)
    step = rng.integers(0, 5, n).astype(np.int32)
    bd = {"rank": pa.array(rank), "step": pa.array(step), "other": pa.array(rng.random(n))}
    for c in ("step_time", "compute", "exposed_comm", "overlapped_comm", "memcpy", "idle"):
        bd[f"{c}_ns"] = _ns(rng, n, 0.1, bool(rng.random() < 0.5))
    m = int(
        rng.integers(0, 80)
    )  # extra tables: other pairs, repeated pairs (the later row wins), extra columns
    ex = {
        "rank": pa.array(rng.integers(0, 8, m).astype(np.int32)),
        "step": pa.array(rng.integers(0, 5, m).astype(np.int32)),
    }
    ex["exposed_wait_ns"] = _ns(rng, m, 0.2, True)
    ex["exposed_transfer_ns"] = _ns(rng, m, 0.2, False)
    extra = {
        "exposed_wait_ns": pa.table(ex),
        "exposed_transfer_ns": pa.table(ex),
        "bubble_ns": None,
    }
    got = per_step_rows(pa.table(bd), extra)
    want = _old_per_step_rows(pa.table(bd), extra)
    assert got == want
    assert [list(g) for g in got] == [list(w) for w in want]


def test_per_step_rows_hand_built() -> None:
    bd = pa.table(
        {
            "rank": pa.array([0, 1], pa.int32()),
            "step": pa.array([3, 3], pa.int32()),
            **{f"{c}_ns": pa.array([2_500_000, None], pa.int64()) for c in ("step_time", "compute")},
            **{
                f"{c}_ns": pa.array([0, 1], pa.int64()) for c in ("exposed_comm", "overlapped_comm", "memcpy")
            },
            "idle_ns": pa.array([1.0e6, float("nan")]),
        }
    )
    bub = pa.table({"rank": [1, 1], "step": [3, 3], "bubble_ns": [1e6, 3e6]})
    got = per_step_rows(bd, {"bubble_ns": bub})
    assert got[0]["step_time_ms"] == 2.5 and got[1]["step_time_ms"] is None
    assert got[0]["idle_ms"] == 1.0 and got[1]["idle_ms"] is None and got[1]["memcpy_ms"] == 1e-6
    assert got[0]["bubble_ms"] is None and got[1]["bubble_ms"] == 3.0  # (the later row of the pair)
