"""The GPU idle split computed for all windows of a rank at once (tracelens.analyze.rank.idle) gives, window by
window, what its definition gives one window at a time: the gaps of [lo, hi) between the clipped device
intervals, each split by the launch of the work that ends it, and the top-level ops overlapping each part.

The reference below is that definition written per window (a scan of the rank's rows for every window),
with the op grouping of pandas (`Series.groupby(level=0).sum().sort_values(ascending=False)`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_idle import _ev, _events

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.rank.breakdown import breakdown
from tracelens.analyze.rank.classify import is_step_name
from tracelens.analyze.rank.idle import CAUSES, COLUMNS, DEVICE_KINDS, RUNTIME_KINDS, SYNC, idle_breakdown
from tracelens.schema import BREAKDOWN


def _top(names: list[Any], values: np.ndarray, top: int) -> dict[str, int]:
    s = pd.Series(values, index=names, dtype=np.int64).groupby(level=0).sum().sort_values(ascending=False)
    return {str(k): int(v) for k, v in s.head(top).items() if v > 0}


def _measure(a: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Covered length of a inside each [lo, hi), by clipping (independent of iv.measure_in_windows)."""
    return np.array([iv.total(iv.clip(a, int(x), int(y))) if y > x else 0 for x, y in zip(lo, hi)], np.int64)


def _reference(events: pa.Table, bd: pa.Table, top: int = 3) -> list[tuple[Any, ...]]:
    """idle_breakdown's rows, one window at a time, from Python lists of the rows."""
    ev = events.to_pylist()
    rows = []
    for b in bd.to_pylist():
        if b["path"] != "gpu":
            continue
        r = b["rank"]
        mine = [e for e in ev if e["rank"] == r]
        dev = [e for e in mine if e["kind"] in DEVICE_KINDS]
        if not dev:
            continue
        end = lambda e: e["ts_ns"] + (e["dur_ns"] or 0)  # noqa: E731
        busy = iv.union([e["ts_ns"] for e in dev], [end(e) for e in dev])
        n_streams = len({e["stream"] if e["stream"] is not None else -1 for e in dev})
        rts = [e for e in mine if e["kind"] in RUNTIME_KINDS and e["correlation"] is not None]
        launch_of: dict[int, int] = {}
        for e in sorted(rts, key=lambda e: e["correlation"]):
            launch_of.setdefault(e["correlation"], e["ts_ns"])
        syncs = [e for e in mine if e["kind"] in RUNTIME_KINDS and e["name"] and SYNC.search(e["name"])]
        sync_set = iv.union([e["ts_ns"] for e in syncs], [end(e) for e in syncs])
        threads = {e["tid"] for e in rts}
        ops = [
            e
            for e in mine
            if e["kind"] == "cpu_op" and not (e["name"] and is_step_name(e["name"])) and e["tid"] in threads
        ]
        ops.sort(key=lambda e: (e["ts_ns"], -end(e)))
        top_ops, reach = [], None
        for e in ops:
            if reach is None or e["ts_ns"] >= reach:
                top_ops.append(e)
            reach = end(e) if reach is None else max(reach, end(e))
        lo, hi = b["window_start_ns"], b["window_end_ns"]
        bs, be = iv.clip(busy, lo, hi)
        g0 = np.concatenate([[lo], be]) if bs.size else np.array([lo])
        g1 = np.concatenate([bs, [hi]]) if bs.size else np.array([hi])
        keep = (g1 > g0) | (bs.size == 0)
        g0, g1 = g0[keep], g1[keep]
        parts = dict.fromkeys(CAUSES, 0)
        starts = sorted(dev, key=lambda e: e["ts_ns"])
        cpu_s, cpu_e = [], []
        for x, y in zip(g0.tolist(), g1.tolist()):
            nxt = next((e for e in starts if e["ts_ns"] >= y), None)
            c = nxt["correlation"] if nxt is not None and nxt["ts_ns"] == y else None
            launch = launch_of.get(c) if c is not None and c >= 0 else None
            if launch is None:
                parts["other"] += y - x
            elif launch < x:
                parts["other_stream" if n_streams > 1 else "launch_overhead"] += y - x
            else:
                parts["launch_overhead"] += y - max(launch, x)
                cpu_s.append(x)
                cpu_e.append(min(launch, y))
        cpu = iv.union(cpu_s, cpu_e)
        sync_part, host_part = iv.intersect(cpu, sync_set), iv.subtract(cpu, sync_set)
        parts["synchronization"], parts["host_bound"] = iv.total(sync_part), iv.total(host_part)
        o_lo = np.array([e["ts_ns"] for e in top_ops], np.int64)
        o_hi = np.array([end(e) for e in top_ops], np.int64)
        o_names = [e["name"] for e in top_ops]
        host_ops: dict[str, int] = {}
        sync_ops: dict[str, int] = {}
        if top_ops and parts["host_bound"]:
            host_ops = _top(o_names, _measure(host_part, o_lo, o_hi), top)
        if top_ops and parts["synchronization"]:
            sync_ops = _top(o_names, _measure(sync_part, o_lo, o_hi), top)
            if not sync_ops and syncs:
                s_lo = np.array([e["ts_ns"] for e in syncs], np.int64)
                s_hi = np.array([end(e) for e in syncs], np.int64)
                sync_ops = _top([e["name"] for e in syncs], _measure(sync_part, s_lo, s_hi), top)
        idle = int((g1 - g0).sum()) if g0.size else 0
        rows.append((r, b["step"], b["step_time_ns"], idle, *(parts[c] for c in CAUSES), host_ops, sync_ops))
    return rows


def _random_events(rng: np.random.Generator, ranks: int, steps: int) -> pa.Table:
    """Ranks with kernels on one or two streams, launches (some missing, some long before the kernel),
    sync calls, nested and top-level cpu ops on two threads with few names (sums tie often; some null)."""
    ev = []
    corr = 0
    names = ["aten::mm", "aten::add", "python_work", "aten::item", None]
    for r in range(ranks):
        streams = [7] if rng.random() < 0.5 else [7, 8]
        for s in range(steps):
            t0 = s * 1000
            ev.append(_ev("user_annotation", f"ProfilerStep#{s}", t0, 1000, step=s) | {"rank": r})
            for _ in range(int(rng.integers(0, 8))):
                corr += 1
                k0 = t0 + int(rng.integers(0, 100)) * 10
                ev.append(
                    _ev(
                        str(rng.choice(["kernel", "kernel", "gpu_memcpy"])),
                        "K",
                        k0,
                        int(rng.integers(0, 15)) * 10,
                        tid=7,
                        corr=corr,
                        stream=int(rng.choice(streams)),
                        step=s,
                    )
                    | {"rank": r}
                )
                if rng.random() < 0.85:
                    at = k0 - int(rng.integers(0, 40)) * 10
                    ev.append(_ev("cuda_runtime", "cudaLaunchKernel", at, 5, corr=corr, step=s) | {"rank": r})
            for _ in range(int(rng.integers(0, 3))):
                a = t0 + int(rng.integers(0, 100)) * 10
                ev.append(
                    _ev("cuda_runtime", "cudaStreamSynchronize", a, int(rng.integers(1, 30)) * 10, step=s)
                    | {"rank": r}
                )
            for _ in range(int(rng.integers(0, 10))):
                a = t0 + int(rng.integers(-5, 100)) * 10
                name = names[int(rng.integers(0, len(names)))]
                ev.append(
                    _ev("cpu_op", name, a, int(rng.integers(0, 30)) * 10, tid=int(rng.choice([1, 2])), step=s)
                    | {"rank": r}
                )
    return _events(ev)


def _compare(t: pa.Table, bd: pa.Table) -> int:
    got = idle_breakdown(t, bd)
    want = _reference(t, bd)
    assert list(got.columns) == COLUMNS
    assert len(got) == len(want)
    for g, w in zip(got.itertuples(index=False), want):
        g = tuple(g)
        assert g[:2] == w[:2] or (g[1] != g[1] and w[1] is None)
        assert g[2:-2] == w[2:-2]
        assert g[-2] == w[-2] and list(g[-2]) == list(w[-2])  # the ops in the same order
        assert g[-1] == w[-1] and list(g[-1]) == list(w[-1])
    return len(want)


@pytest.mark.parametrize("seed", range(6))
def test_all_windows_at_once_equal_one_window_at_a_time(seed: int):
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(12):
        t = _random_events(rng, ranks=int(rng.integers(1, 3)), steps=int(rng.integers(1, 6)))
        checked += _compare(t, breakdown(t))
    assert checked > 0


def test_overlapping_and_empty_windows_equal_one_window_at_a_time():
    """Windows a caller made (overlapping, empty, reversed), not step windows: each still gets the
    definition's values (they are computed in batches of disjoint windows)."""
    rng = np.random.default_rng(99)
    for _ in range(20):
        t = _random_events(rng, ranks=1, steps=4)
        n = 7
        lo = rng.integers(-100, 4000, n)
        hi = lo + rng.integers(-50, 1500, n)
        bd = pa.table(
            {
                "rank": pa.array([0] * n, pa.int32()),
                "step": pa.array(list(range(n)), pa.int32()),
                "window_start_ns": pa.array(lo, pa.int64()),
                "window_end_ns": pa.array(hi, pa.int64()),
                "step_time_ns": pa.array(hi - lo, pa.int64()),
                **{
                    f.name: pa.array([0] * n, f.type)
                    for f in BREAKDOWN
                    if f.name.endswith("_ns")
                    and f.name not in ("window_start_ns", "window_end_ns", "step_time_ns")
                },
                "path": pa.array(["gpu"] * n),
            }
        ).select(BREAKDOWN.names)
        _compare(t, bd)


def test_host_and_sync_ops_found_in_the_random_traces():
    """The comparison above is not vacuous: the random traces have host-bound and synchronization time
    with named ops, ties among them, and the sync calls' own names as the fallback."""
    rng = np.random.default_rng(0)
    host = sync = 0
    for _ in range(30):
        t = _random_events(rng, ranks=1, steps=5)
        got = idle_breakdown(t, breakdown(t))
        host += int((got["host_ops"].map(len) > 0).sum())
        sync += int((got["sync_ops"].map(len) > 0).sum())
    assert host > 20 and sync > 5


def test_top_per_window_equals_top_of_each_windows_dense_values():
    """Many names and many equal sums (numpy's quicksort orders ties in no fixed way from ~16 values on):
    the sparse per-window route gives each window exactly `top` of its dense values, order included."""
    from tracelens.analyze.rank.idle import _ByName

    rng = np.random.default_rng(4)
    ties = 0
    for _ in range(40):
        k = int(rng.integers(1, 60))
        values = [f"op{i:02d}" for i in rng.permutation(k)] + [None]
        name_of = np.array([*values, None], dtype=object)
        canon = np.arange(name_of.size, dtype=np.int64)
        n_rows, n_win = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        by = _ByName(name_of, canon, rng.integers(0, len(values), n_rows))
        window = rng.integers(0, n_win, 300)
        row = rng.integers(0, n_rows, 300)
        val = rng.integers(1, 4, 300) * 100
        for top in (1, 3, 10):
            got = by.top_per_window(window, row, val, n_win, top)
            for wi in range(n_win):
                dense = np.zeros(n_rows, np.int64)
                np.add.at(dense, row[window == wi], val[window == wi])
                want = by.top(dense, top)
                assert got[wi] == want and list(got[wi]) == list(want)
                ties += len(set(want.values())) < len(want)
    assert ties > 10


def test_ties_beyond_the_dense_limit_are_ordered_by_name(monkeypatch):
    """With more names than DENSE_TIES_MAX, tied sums are ordered by name (no dense pass a window)."""
    from tracelens.analyze.rank import idle

    monkeypatch.setattr(idle, "DENSE_TIES_MAX", 2)
    name_of = np.array(["zeta", "alpha", "mid", "beta", None], dtype=object)
    by = idle._ByName(name_of, np.arange(5), np.array([0, 1, 2, 3]))
    got = by.top_per_window(
        np.array([0, 0, 0, 0, 1]), np.array([0, 1, 2, 3, 0]), np.array([5, 5, 7, 5, 9]), 2, 3
    )
    assert list(got[0].items()) == [("mid", 7), ("alpha", 5), ("beta", 5)]
    assert got[1] == {"zeta": 9}
