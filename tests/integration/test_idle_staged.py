"""The GPU idle breakdown computed in the per-rank stage (engine/stage.py, stage part "idle") equals
`idle_breakdown` over every event of the run and the run's breakdown: same rows, order, values and op dicts
(key order and Python types included), on the bundled GPU samples, real traces and hand-built runs."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from tracelens.analyze.rank.idle import idle_breakdown
from tracelens.run_analysis import Options, analyze_run

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "traces"
sys.path.insert(0, str(ROOT / "tests" / "unit"))
import kineto_traces as kt  # noqa: E402

GPU_SAMPLES = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and not p.name.startswith("cpu-"))
REAL = [SHARED / "hta" / "trace_filter", SHARED / "hta" / "negative_queue_length_values_check"]


def _assert_same(got: pd.DataFrame | None, want: pd.DataFrame) -> None:
    assert got is not None
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in ("host_ops", "sync_ops"):  # dict equality ignores order: compare the items in order
        assert [list(d.items()) for d in got[col]] == [list(d.items()) for d in want[col]]
        assert all(type(k) is str and type(v) is int for d in got[col] for k, v in d.items())


def _old(a) -> pd.DataFrame:
    """What Analysis.idle computed before the stage held it: over all events and the breakdown."""
    return idle_breakdown(a.events, a.breakdown)


def test_every_cpu_named_sample_is_cpu_only():
    """The samples left out of GPU_SAMPLES (by name) have no GPU rank: nothing is skipped unseen."""
    for p in SAMPLES.iterdir():
        if p.is_dir() and p.name.startswith("cpu-") and any(p.rglob("*.json*")):
            assert analyze_run(p, Options(no_cache=True)).idle is None, p.name


@pytest.mark.parametrize("name", GPU_SAMPLES)
def test_staged_idle_equals_all_events_on_samples(tmp_path: Path, name: str):
    a = analyze_run(SAMPLES / name, Options(cache_dir=str(tmp_path / "cache")))
    want = _old(a)
    assert len(want) == a.breakdown.num_rows > 0  # one row per (GPU rank, step)
    _assert_same(a.idle, want)  # read back from the stage files the per-rank tasks wrote


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_staged_idle_equals_all_events_on_real_traces(tmp_path: Path, path: Path):
    if not path.exists():
        pytest.skip(f"{path} is absent")
    a = analyze_run(path, Options(cache_dir=str(tmp_path / "cache")))
    want = _old(a)
    assert len(want) > 0 and want["idle_ns"].sum() > 0
    _assert_same(a.idle, want)


def _rank_events(steps: list[int]) -> list[dict]:
    """Per window of 100 µs (a ProfilerStep when `steps`, else one whole-trace window): a cpu op launching
    (at 15 µs) a 20 µs kernel, a 20 µs stream sync inside `aten::item`, a second kernel, then nothing for 10 µs."""
    evs = []
    for i, s in enumerate(steps or [None]):
        o = 1000 + 100 * i
        if s is not None:
            evs.append(kt.x("user_annotation", f"ProfilerStep#{s}", f"{o}.000", "100.000", pid=1, tid=1))
        c = 10 * (i + 1)
        evs += [
            kt.x("cpu_op", "aten::mm", f"{o}.000", "30.000", pid=1, tid=1),
            kt.x("cuda_runtime", "cudaLaunchKernel", f"{o + 15}.000", "5.000", pid=1, tid=1, correlation=c),
            kt.x("kernel", "gemm", f"{o + 20}.000", "20.000", pid=0, tid=7, correlation=c, stream=7),
            kt.x("cpu_op", "aten::item", f"{o + 40}.000", "30.000", pid=1, tid=1),
            kt.x("cuda_runtime", "cudaStreamSynchronize", f"{o + 45}.000", "20.000", pid=1, tid=1),
            kt.x(
                "cuda_runtime", "cudaLaunchKernel", f"{o + 70}.000", "5.000", pid=1, tid=1, correlation=c + 1
            ),
            kt.x("kernel", "gemm2", f"{o + 80}.000", "10.000", pid=0, tid=7, correlation=c + 1, stream=7),
        ]
    return evs


def _run(d: Path, steps_of: dict[int, list[int]]) -> Path:
    d.mkdir()
    for r, steps in steps_of.items():
        kt.write(d / f"rank{r}.json", kt.doc(rank=r, world_size=len(steps_of), events=_rank_events(steps)))
    return d


US = 1000
# the hand-built window (device busy [20, 40) and [80, 90)): host-bound [0, 15) + [40, 45) + [65, 70),
# launch overhead [15, 20) + [70, 80), synchronization [45, 65), nothing launched after the last kernel
# [90, 100)
WINDOW = {"idle_ns": 70 * US, "host_bound_ns": 25 * US, "synchronization_ns": 20 * US,
          "launch_overhead_ns": 15 * US, "other_stream_ns": 0, "other_ns": 10 * US}  # fmt: skip


def test_rank_without_profiler_step_is_left_out_as_in_the_breakdown(tmp_path: Path):
    """Rank 1 has no ProfilerStep while rank 0 has two: the breakdown keeps rank 0 only, so do the idle
    rows (the stage of rank 1 computed a whole-trace window that the reduction drops)."""
    a = analyze_run(_run(tmp_path / "run", {0: [3, 4], 1: []}), Options(cache_dir=str(tmp_path / "c")))
    got = a.idle
    _assert_same(got, _old(a))
    assert got[["rank", "step"]].values.tolist() == [[0, 3], [0, 4]]
    for row in got.to_dict("records"):
        assert {k: row[k] for k in WINDOW} == WINDOW
        assert row["step_time_ns"] == 100 * US
        # 15 µs in mm, then 5 + 5 in item: by time, not by name (the order survives the stage file)
        assert list(row["host_ops"].items()) == [("aten::mm", 15 * US), ("aten::item", 10 * US)]
        assert row["sync_ops"] == {"aten::item": 20 * US}


def test_no_rank_with_steps_gives_whole_trace_windows(tmp_path: Path):
    a = analyze_run(_run(tmp_path / "run", {0: [], 1: []}), Options(cache_dir=str(tmp_path / "c")))
    got = a.idle
    _assert_same(got, _old(a))
    assert got["rank"].tolist() == [0, 1] and got["step"].isna().all()  # step null: one whole-trace window
    # the whole-trace window runs from the first kernel's start to the last one's end, [20, 90) µs: its one
    # gap [40, 80) is host-bound [40, 45) + [65, 70), synchronization [45, 65), launch overhead [70, 80)
    whole = {"step_time_ns": 70 * US, "idle_ns": 40 * US, "host_bound_ns": 10 * US,
             "synchronization_ns": 20 * US, "launch_overhead_ns": 10 * US, "other_stream_ns": 0, "other_ns": 0}  # fmt: skip
    for row in got.to_dict("records"):
        assert {k: row[k] for k in whole} == whole
        assert row["host_ops"] == {"aten::item": 10 * US} and row["sync_ops"] == {"aten::item": 20 * US}


def test_hung_steps_are_left_out_of_idle_as_of_the_breakdown(tmp_path: Path):
    """Steps that hung through point-to-point (P2P_HANG) leave the breakdown; the staged idle rows follow."""
    a = analyze_run(_run(tmp_path / "run", {0: [3, 4], 1: [3, 4]}), Options(cache_dir=str(tmp_path / "c")))
    a.__dict__["p2p"] = SimpleNamespace(hung_steps=[4], findings=[{"code": "P2P_HANG"}])
    got = a.idle
    _assert_same(got, _old(a))
    assert got[["rank", "step"]].values.tolist() == [[0, 3], [1, 3]]
