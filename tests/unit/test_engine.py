"""tracelens.engine and tracelens.run: per-rank stage + cross-rank reduction give what one all-ranks table
gives; the executors (in process, local pool) agree."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pipeline_tables import events_table, pipeline_run

from tests.damage import WAYS, damage
from tracelens.analyze.layout import grid_from_layout
from tracelens.analyze.pipeline.composition import module_spans
from tracelens.analyze.pipeline.pipeline import analyze_pipeline
from tracelens.analyze.rank.breakdown import breakdown, class_sets
from tracelens.analyze.rank.classify import classify
from tracelens.engine import stage as S
from tracelens.engine.executor import InlineExecutor, LocalPool
from tracelens.engine.reduce import reduce_stages
from tracelens.engine.tasks import needs_work
from tracelens.run import LoadOptions, load_run
from tracelens.store import pages
from tracelens.store import stages as ST
from tracelens.store.arrays import layout

US = 1_000


def _split(ev: pa.Table) -> list[ST.RankStage]:
    ranks = sorted(set(ev.column("rank").to_pylist()))
    return [S.rank_stage(ev.filter(pc.equal(ev.column("rank"), r)), r) for r in ranks]


def _gpu_rank_rows() -> list[dict]:
    """One GPU rank: a step, two compute kernels, their runtime launches, an NCCL kernel, its CPU record,
    an annotation and a plain cpu op."""
    return [
        {"rank": 0, "kind": "user_annotation", "name": "ProfilerStep#2", "ts_ns": 0, "dur_ns": 1000, "step": 2},
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 10, "dur_ns": 5, "step": 2},
        {"rank": 0, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": 11, "dur_ns": 2, "step": 2},
        {"rank": 0, "kind": "kernel", "name": "gemm_a", "ts_ns": 100, "dur_ns": 50, "step": 2},
        {"rank": 0, "kind": "kernel", "name": "gemm_b", "ts_ns": 160, "dur_ns": 40, "step": 2},
        {"rank": 0, "kind": "kernel", "name": "gemm_c", "ts_ns": 205, "dur_ns": 10, "step": 2},
        {"rank": 0, "kind": "cpu_op", "name": "record_param_comms", "ts_ns": 20, "dur_ns": 3, "step": 2,
         "collective": "allreduce", "external_id": 7},
        {"rank": 0, "kind": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts_ns": 300,
         "dur_ns": 100, "step": 2, "external_id": 7},
        {"rank": 0, "kind": "gpu_user_annotation", "name": "layers.0.mlp", "ts_ns": 99, "dur_ns": 120,
         "step": 2},
    ]  # fmt: skip


def test_cross_rank_mask_keeps_collectives_annotations_and_the_compute_marks():
    ev = events_table(_gpu_rank_rows())
    keep = S.cross_rank_mask(ev, classify(ev), "gpu")
    kept = [n for n, k in zip(ev.column("name").to_pylist(), keep) if k]
    # gemm_a: first device event and earliest compute start; gemm_c: latest compute end. gemm_b (in the
    # middle), the runtime launch and aten::mm are dropped.
    assert kept == [
        "ProfilerStep#2",
        "gemm_a",
        "gemm_c",
        "record_param_comms",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "layers.0.mlp",
    ]


def test_cpu_timeline_ranks_keep_every_row():
    ev = events_table([r for r in _gpu_rank_rows() if r["kind"] not in ("kernel", "gpu_user_annotation")])
    assert S.cross_rank_mask(ev, classify(ev), "cpu").all()


def test_stage_files_round_trip(tmp_path: Path):
    ev = events_table(_gpu_rank_rows())
    st = S.rank_stage(ev, 0)
    events_parquet = tmp_path / "k" / "rank0.events.parquet"
    assert not ST.stage_complete(events_parquet, 0)
    ST.write_stage(st, events_parquet)
    assert ST.stage_complete(events_parquet, 0)
    back = ST.read_stage(events_parquet, 0)
    assert back.breakdown.equals(st.breakdown)
    assert back.spans.equals(st.spans)
    assert back.xevents.equals(st.xevents)
    assert back.has_steps and back.time_range == (0, 1000)
    for k in ("compute", "comm", "memory"):
        for a, b in zip(getattr(back.sets, k), getattr(st.sets, k)):
            np.testing.assert_array_equal(a, b)
    # compute = the three gemms [100, 150) [160, 200) [205, 215); comm = [300, 400)
    np.testing.assert_array_equal(back.sets.compute[0], [100, 160, 205])
    np.testing.assert_array_equal(back.sets.compute[1], [150, 200, 215])
    np.testing.assert_array_equal(back.sets.comm[0], [300])
    assert back.breakdown.column("exposed_comm_ns").to_pylist() == [100]
    # the GPU idle rows: one per step, idle = the step's 1000 ns less the busy 50 + 40 + 10 + 100 (kernels)
    assert back.idle.equals(st.idle) and back.idle_error is None
    assert back.idle.select(["rank", "step", "idle_ns"]).to_pylist() == [
        {"rank": 0, "step": 2, "idle_ns": 800}
    ]
    # the critical path's device nodes: the four kernels, in trace order, the NCCL one as communication, each
    # labelled with the layer annotation around its start ([99, 219]: the gemms) when there is one
    assert back.nodes.equals(st.nodes) and back.syncs.equals(st.syncs) and back.nodes_stepped
    n = back.nodes.to_pydict()
    assert n["start_ns"] == [100, 160, 205, 300] and n["end_ns"] == [150, 200, 215, 400]
    assert n["is_comm"] == [False, False, False, True] and n["step"] == [2] * 4
    assert n["label"] == ["mlp", "mlp", "mlp", None]


def test_two_stage_files_a_rank(tmp_path: Path):
    """A rank's stage is two files: its cross-rank events (`xevents_file`, Arrow IPC) and the seven other tables
    in one stage file (`stage_file`), each at an aligned offset, read back as views of one mapping; nothing
    else is written into the stage folder."""
    st = S.rank_stage(events_table(_gpu_rank_rows()), 3)
    events_parquet = tmp_path / "k" / "rank3.events.parquet"
    ST.write_stage(st, events_parquet)
    assert sorted(p.name for p in ST.stage_dir(events_parquet).iterdir()) == [
        "rank3.stage",
        "rank3.xevents.arrow",
    ]
    f = ST.stage_file(events_parquet, 3)
    parts = ST.read_stage_parts(f)
    assert list(parts) == ["nodes", "syncs", "spans", "breakdown", "ops", "idle", "sets"]
    assert parts["breakdown"].equals(st.breakdown) and parts["ops"].equals(st.ops)
    assert parts["nodes"].equals(st.nodes) and parts["idle"].equals(st.idle)
    raw = f.read_bytes()
    spans, _ = layout(lambda lo, hi: raw[lo:hi], len(raw), f)
    starts = [spans[n][2] for n in parts]
    assert starts == sorted(starts) and all(a % 64 == 0 for a in starts)
    assert spans["sets"][2] + spans["sets"][3] == len(raw)  # (the last part ends the file)
    # one part alone; every table a view of the file's mapping
    assert list(ST.read_stage_parts(f, ("ops",))) == ["ops"]
    whole = pages._MAPS[id(parts["nodes"])]
    for t in parts.values():
        assert pages._MAPS[id(t)] is whole
        for col in t.columns:
            for chunk in col.chunks:
                for b in chunk.buffers():
                    if b is not None and b.size:
                        assert whole.address <= b.address < whole.address + whole.size


@pytest.mark.parametrize("how", (*WAYS, "image"))
def test_a_damaged_stage_file_is_an_error_and_not_complete(tmp_path: Path, how: str):
    st = S.rank_stage(events_table(_gpu_rank_rows()), 0)
    events_parquet = tmp_path / "k" / "rank0.events.parquet"
    ST.write_stage(st, events_parquet)
    f = ST.stage_file(events_parquet, 0)
    if how == "image":  # (garbage over the end of the last image, the sets table: its footer)
        raw = f.read_bytes()
        f.write_bytes(raw[:-200] + b"\xff" * 200)
    else:
        damage(f, how, cut=100)
    assert not ST.stage_complete(events_parquet, 0)
    with pytest.raises((OSError, pa.ArrowException)):
        ST.read_stage(events_parquet, 0)


def test_idle_failure_travels_through_the_stage_files(tmp_path: Path, monkeypatch):
    """A rank whose idle_breakdown fails: the stage keeps the error (as for module spans), the reduction
    reports the first one."""
    import tracelens.analyze.rank.idle as idle

    def boom(*a, **k):
        raise ValueError("boom")

    monkeypatch.setattr(idle, "idle_breakdown_table", boom)  # what the stage calls
    st = S.rank_stage(events_table(_gpu_rank_rows()), 0)
    assert st.idle_error == "ValueError: boom" and st.idle.num_rows == 0
    events_parquet = tmp_path / "k" / "rank0.events.parquet"
    ST.write_stage(st, events_parquet)
    back = ST.read_stage(events_parquet, 0)
    assert back.idle_error == "ValueError: boom"
    assert reduce_stages([back]).idle_error == "ValueError: boom"


@pytest.mark.parametrize("annotate", [True, False])
def test_staged_pipeline_equals_the_all_ranks_pipeline(annotate: bool):
    """4 stages, 6 microbatches, 2 steps; without annotations the pipeline falls back to compute-kernel
    marks, which the stage keeps only a few rows of."""
    rows, truth = pipeline_run([20 * US, 20 * US, 40 * US, 20 * US], [40 * US, 40 * US, 80 * US, 40 * US], 6,
                               steps=2, annotate=annotate)  # fmt: skip
    ev = events_table(rows)
    grid = grid_from_layout(4, pp=4)
    want = analyze_pipeline(ev, grid)
    staged = reduce_stages(_split(ev))
    assert staged.xevents.num_rows < ev.num_rows
    got = analyze_pipeline(
        staged.xevents, grid, breakdown=staged.breakdown, spans=staged.spans, sets=staged.sets
    )
    assert got.per_rank_step.equals(want.per_rank_step)
    assert got.stages == want.stages
    assert (got.microbatches, got.schedule, got.cause_stage) == (
        want.microbatches,
        want.schedule,
        want.cause_stage,
    )
    # and both against the schedule's own truth (bubble of each stage in each step)
    bub = {(r["rank"], r["step"]): r["bubble_ns"] for r in got.per_rank_step.to_pylist()}
    for s, per_step in truth["bubble_ns"].items():
        assert [bub[(s, st)] for st in range(2)] == per_step


def test_reduction_equals_all_ranks_breakdown_sets_and_spans():
    rows, _ = pipeline_run([20 * US] * 3, [40 * US] * 3, 4, steps=2)
    # rank by rank, trace order within a rank: the order of the loader's all-ranks table
    ev = events_table(sorted(rows, key=lambda r: r["rank"]))
    staged = reduce_stages(_split(ev))
    sets = class_sets(ev)
    assert staged.breakdown.equals(breakdown(ev, sets=sets))
    assert staged.spans.equals(module_spans(ev, None, sets=sets))
    assert staged.sets.keys() == sets.keys()
    for r in sets:
        for k in ("compute", "comm", "memory"):
            for a, b in zip(getattr(staged.sets[r], k), getattr(sets[r], k)):
                np.testing.assert_array_equal(a, b)


def test_whole_trace_windows_only_when_no_rank_has_steps():
    base = [
        {
            "rank": 0,
            "kind": "user_annotation",
            "name": "ProfilerStep#5",
            "ts_ns": 0,
            "dur_ns": 100,
            "step": 5,
        },
        {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 10, "dur_ns": 50, "step": 5},
        {"rank": 1, "kind": "kernel", "name": "gemm", "ts_ns": 10, "dur_ns": 70},
    ]
    ev = events_table(base)
    want = breakdown(ev)
    got = reduce_stages(_split(ev)).breakdown
    assert got.equals(want)
    assert got.column("rank").to_pylist() == [0]  # rank 1 has no step window, as over all ranks
    only1 = events_table(base[2:])
    got1 = reduce_stages(_split(only1)).breakdown
    assert got1.equals(breakdown(only1))
    assert got1.column("step_time_ns").to_pylist() == [70]


def _node_rows() -> list[dict]:
    """Three GPU ranks: ranks 0 and 1 have a step and kernels in it (rank 1's second kernel after its step);
    rank 2 has no ProfilerStep. Each kernel has its runtime launch (same correlation)."""
    rows = []
    for r in (0, 1, 2):
        if r < 2:
            rows.append({"rank": r, "kind": "user_annotation", "name": "ProfilerStep#3", "ts_ns": 0,
                         "dur_ns": 1000, "step": 3})  # fmt: skip
        for i, t in enumerate((100, 1200 if r == 1 else 300)):
            step = 3 if r < 2 and t < 1000 else None
            rows.append({"rank": r, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": t - 90 + r,
                         "dur_ns": 5, "tid": 40 + r, "correlation": 10 + i, "step": step})  # fmt: skip
            rows.append({"rank": r, "kind": "kernel", "name": f"gemm{i}", "ts_ns": t, "dur_ns": 50 + r,
                         "stream": 7, "correlation": 10 + i, "step": step})  # fmt: skip
    return rows


def test_device_nodes_rank_by_rank_equal_the_all_ranks_nodes():
    """The per-rank stage's nodes, selected (critical_nodes.select_nodes), are what device_nodes over all
    ranks' events at once gives: work without a step left out once some rank has steps, else all step 0."""
    from tracelens.analyze.critical.critical_nodes import device_nodes, rank_nodes, select_nodes

    ev = events_table(_node_rows())
    staged = reduce_stages(_split(ev))
    assert staged.nodes_stepped == (0, 1)  # rank 2's kernels carry no step
    got = select_nodes(staged.nodes, staged.nodes_stepped, [0, 1, 2])
    d = got.to_pydict()
    # rank 0's two kernels, rank 1's first (its second ran after the step); launch = the runtime call's start
    assert list(zip(d["rank"], d["start_ns"], d["end_ns"], d["launch_ns"], d["launch_tid"], d["step"])) == [
        (0, 100, 150, 10, 40, 3),
        (0, 300, 350, 210, 40, 3),
        (1, 100, 151, 11, 41, 3),
    ]
    want = device_nodes(ev)
    assert got.drop_columns(["label"]).equals(want.drop_columns(["label"]))
    assert got.column("label").to_pylist() == want.column("label").to_pylist() == [None] * 3
    # a run without any step: every rank's work, step 0
    no_steps = events_table(
        [{**r, "step": None} for r in _node_rows() if r["kind"] != "user_annotation" and r["rank"] != 1]
    )
    st2 = reduce_stages(_split(no_steps))
    assert st2.nodes_stepped == ()
    got2 = select_nodes(st2.nodes, st2.nodes_stepped, [0, 2])
    assert got2.column("rank").to_pylist() == [0, 0, 2, 2] and set(got2.column("step").to_pylist()) == {0}
    assert got2.drop_columns(["label"]).equals(device_nodes(no_steps).drop_columns(["label"]))
    # one rank alone: its own rule (rank 2 alone has no step, so step 0)
    assert rank_nodes(ev.filter(pc.equal(ev.column("rank"), 2)))[0].column("step").to_pylist() == [0, 0]


def _write_run(d: Path, ranks: int = 2) -> Path:
    from kineto_traces import doc, write, x

    d.mkdir()
    for r in range(ranks):
        evs = [
            x("user_annotation", "ProfilerStep#2", "1000.000", "500.000"),
            x("kernel", "gemm", "1100.000", f"{100 + 50 * r}.000", pid=0, tid=7),
            x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "1300.000", "40.000", pid=0, tid=20),
        ]
        write(d / f"rank{r}.json", doc(rank=r, world_size=ranks, events=evs))
    return d


def test_load_run_caches_stages_and_rebuilds_damaged_ones(tmp_path: Path):
    run = _write_run(tmp_path / "run")
    opts = LoadOptions(workers=1, cache_dir=tmp_path / "cache")
    loaded = load_run(run, opts)
    staged = loaded.stages
    assert loaded.metadata.num_rows == 2
    assert staged.breakdown.column("compute_ns").to_pylist() == [100_000, 150_000]
    assert staged.breakdown.column("exposed_comm_ns").to_pylist() == [40_000, 40_000]
    # events are read lazily from the cache, and equal an uncached load's
    from tracelens.run import load_tables

    eager = load_tables(run, no_cache=True, workers=1)
    assert loaded.events.equals(eager.events)
    assert not any(needs_work(e, True) for e in loaded.entries)  # everything cached
    bad = ST.stage_file(loaded.entries[1].events, 1)
    bad.write_bytes(b"not a stage file")
    assert [e.rank for e in loaded.entries if needs_work(e, True)] == [1]
    again = load_run(run, opts).stages
    assert again.breakdown.equals(staged.breakdown)


def _same_staged(a, b) -> None:
    for f in ("breakdown", "spans", "xevents", "time_ranges", "ops", "idle"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None) and (x is None or x.equals(y)), f
    for x, y in zip(a.critical_inputs(), b.critical_inputs()):  # (kept, or read from the memo when asked)
        assert x.equals(y)
    assert (a.spans_error, a.idle_error, a.nodes_stepped) == (b.spans_error, b.idle_error, b.nodes_stepped)
    assert list(a.sets) == list(b.sets)
    for r, rs in a.sets.items():
        assert rs.path == b.sets[r].path
        for k in ("compute", "comm", "memory"):
            for x, y in zip(getattr(rs, k), getattr(b.sets[r], k)):
                assert np.array_equal(x, y) and x.dtype == y.dtype


def test_run_memo_reopens_a_run_without_its_per_rank_files(tmp_path: Path, monkeypatch):
    """The second open of a cached run reads its memo (store.runs): no per-rank stage file or metadata
    is read, and what it gives equals the first open's."""
    import tracelens.engine.reduce as RD
    import tracelens.run as R
    from tracelens.store import runs

    run = _write_run(tmp_path / "run")
    opts = LoadOptions(workers=1, cache_dir=tmp_path / "cache")
    first = load_run(run, opts)
    assert (runs.memo_dir(first.entries) / "manifest.json").is_file()

    def refuse(*a):
        raise AssertionError("per-rank files read although the run memo is there")

    monkeypatch.setattr(RD, "read_stage", refuse)
    monkeypatch.setattr(R, "_read_metadata", refuse)
    again = load_run(run, opts)
    assert again.metadata.equals(first.metadata)
    _same_staged(again.stages, first.stages)
    assert again.events.equals(first.events)
    monkeypatch.undo()
    # a damaged memo, or an entry evicted since, is not used: the run is opened from its entries again
    # (replaced by a new file, as a program that rewrites it does: `first` maps the old one; truncating a
    # file in place under a process that maps it is the SIGBUS risk docs/scale.md names)
    bad = runs.memo_dir(first.entries) / "xevents.arrow.new"
    bad.write_bytes(b"garbage")
    os.replace(bad, runs.memo_dir(first.entries) / "xevents.arrow")
    assert runs.read_run(first.entries) is None
    _same_staged(load_run(run, opts).stages, first.stages)
    assert runs.read_run(first.entries) is not None  # and the memo written anew
    shutil.rmtree(first.entries[1].folder)
    assert runs.read_run(first.entries) is None
    reopened = load_run(run, opts)
    _same_staged(reopened.stages, first.stages)
    assert reopened.events.equals(first.events)


def test_deferred_stages_are_computed_on_first_use(tmp_path: Path):
    """`defer_stages` (the notebook API): the load ingests only; the first `stages` computes them, equal to
    an eager load's; a second deferred load finds them cached."""
    run = _write_run(tmp_path / "run")
    opts = LoadOptions(workers=1, cache_dir=tmp_path / "cache", defer_stages=True)
    lazy = load_run(run, opts)
    assert lazy.events.num_rows == 6
    assert not any(ST.stage_complete(e.events, e.rank) for e in lazy.entries)  # nothing staged yet
    staged = lazy.stages
    assert all(ST.stage_complete(e.events, e.rank) for e in lazy.entries)
    eager = load_run(run, LoadOptions(no_cache=True, workers=1)).stages
    assert staged.breakdown.equals(eager.breakdown)
    assert staged.breakdown.column("compute_ns").to_pylist() == [100_000, 150_000]
    assert not any(needs_work(e, True) for e in load_run(run, opts).entries)  # all cached now


def test_deferred_stages_still_refuse_traces_of_different_runs(tmp_path: Path):
    """A deferred load of two runs' traces gives the same RankError, at the first analysis."""
    from tracelens.errors import RankError

    run = _write_run(tmp_path / "run")
    late = run / "rank1.json"
    d = json.loads(late.read_text())
    d["baseTimeNanoseconds"] = d.get("baseTimeNanoseconds", 0) + 3 * 3600 * 10**9
    late.write_text(json.dumps(d))
    with pytest.raises(RankError, match="different runs"):
        load_run(run, LoadOptions(no_cache=True, workers=1))
    lazy = load_run(run, LoadOptions(no_cache=True, workers=1, defer_stages=True))
    with pytest.raises(RankError, match="different runs"):
        lazy.stages  # noqa: B018


def test_no_cache_temp_folder_lives_with_the_run(tmp_path: Path):
    run = _write_run(tmp_path / "run")
    loaded = load_run(run, LoadOptions(no_cache=True, workers=1, cache_dir=tmp_path / "cache"))
    folder = loaded.entries[0].events.parents[2]
    assert folder.exists() and not (run / ".tracelens").exists()
    assert not (tmp_path / "cache" / "entries").exists()
    n = loaded.events.num_rows
    assert n == 6
    del loaded
    import gc

    gc.collect()
    assert not folder.exists()


def test_simulated_run_summary_identical_across_executors(tmp_path: Path):
    """A small simulated TP2 x PP2 run with a straggler: summary.json with the per-rank tasks in this
    process equals the one with them on a pool of worker interpreters, byte for byte once serialised."""
    from tracelens.run_analysis import Analysis, Options
    from tracelens.simulate import TINY_MODEL, SimConfig, simulate

    run = tmp_path / "sim"
    simulate(SimConfig(model=TINY_MODEL, seq_len=256, tp=2, pp=2, microbatches=4, steps=2,
                       stragglers=[(3, 1.4, None)], compress_level=1), run)  # fmt: skip
    opts = LoadOptions(no_cache=True, salvage=True)
    inline = Analysis(run, Options(), load_run(run, opts, InlineExecutor())).summary()
    pool = LocalPool(2)
    try:
        pooled = Analysis(run, Options(), load_run(run, opts, pool)).summary()
    finally:
        pool.shutdown()
    assert json.dumps(pooled, sort_keys=True, default=str) == json.dumps(inline, sort_keys=True, default=str)
    assert any(s["rank"] == 3 for s in pooled["stragglers"])


def test_top_operations_and_events_of_without_the_all_ranks_table(tmp_path: Path):
    from tracelens.report.figures import top_operations
    from tracelens.views import top_operations_of_stages

    run = _write_run(tmp_path / "run", ranks=3)
    loaded = load_run(run, LoadOptions(workers=1, cache_dir=tmp_path / "cache"))
    kind, rows = top_operations_of_stages(loaded.stages.ops)
    # 3 ranks: gemm 100 + 150 + 200 us, one call each
    assert rows[0] == {"name": "gemm", "calls": 3, "total_ms": 0.45, "per_rank_ms": 0.15}
    got = loaded.events_of([2, 0])
    assert "events" not in vars(loaded)  # the all-ranks table was never built
    assert sorted(set(got.column("rank").to_pylist())) == [0, 2]
    assert got.num_rows == 6
    ev = loaded.events
    assert (kind, rows) == top_operations(ev)
    assert ev.filter(pc.is_in(ev.column("rank"), pa.array([0, 2], pa.int32()))).equals(got)


def test_no_cache_temp_folder_removed_when_loading_fails(tmp_path: Path, monkeypatch):
    import tempfile

    from kineto_traces import doc, write, x

    from tracelens.errors import RankError

    run = _write_run(tmp_path / "run")
    # a third trace from another job, an hour later: RankError after ingest
    late = [x("user_annotation", "ProfilerStep#2", "3600001000.000", "500.000")]
    write(run / "rank2.json", doc(rank=2, world_size=3, events=late))
    for r in (0, 1):  # same world size for all files of the folder
        (run / f"rank{r}.json").unlink()
    _write_run(tmp_path / "run2", ranks=2)
    for r in (0, 1):
        d = json.loads((tmp_path / "run2" / f"rank{r}.json").read_text())
        d["distributedInfo"]["world_size"] = 3
        write(run / f"rank{r}.json", d)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(RankError):
        load_run(run, LoadOptions(no_cache=True, workers=1))
    assert list((tmp_path / "tmp").iterdir()) == []
