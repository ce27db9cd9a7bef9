"""summary.rank_rows (per-rank means of the per-step fields, one array reduction when every rank has as
many steps with values) against the per-rank np.mean of each field's list it replaces (kept here as the
reference), on random per-step rows with a fixed seed, and on hand-built rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tracelens.summary import rank_rows

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
