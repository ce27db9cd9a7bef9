"""The critical path's dependency graph kept in the run memo (engine.kept.read_graph / write_graph,
analyze.critical.graph_state): read back, it is the graph that was built, field by field; a warm analysis replays it
instead of building it again and gives the summary an uncached analysis gives; any other input of the build
(an option, the code, the memo) is another key; a damaged graph file is built again."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.core.dictcol import per_object
from tracelens.analyze.critical import critical_path as cp
from tracelens.analyze.critical import whatif
from tracelens.analyze.critical.critical_keys import Cells
from tracelens.analyze.critical.critical_replay import ReplayPlan, replay_plan
from tracelens.engine import kept as engine_kept
from tracelens.run_analysis import Analysis, Options, analyze_run
from tracelens.store import runs

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
RUN = "qwen35-27b-seq4k-tp2pp3-split22-21-21"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"


def _same_graph(a: cp.Graph, b: cp.Graph) -> None:
    for f in fields(cp.Graph):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        elif isinstance(x, Cells):
            np.testing.assert_array_equal(x.codes, y.codes, err_msg=f.name)
            assert x.codes.dtype == y.codes.dtype
            assert [v if v == v else "NaN" for v in x.values] == [v if v == v else "NaN" for v in y.values]
        elif f.name == "levels":
            assert len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))
        elif f.name == "level_edges":
            assert len(x) == len(y)
            assert all(np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1]) for p, q in zip(x, y))
        else:
            assert x == y, f.name


def test_kept_graph_reads_back_as_built(sample_cp, tmp_path: Path):
    g = sample_cp.graph
    assert g.n_nodes > 1000 and len(g.levels) > 10 and g.stage_of
    engine_kept.write_graph(tmp_path, "k1", g)
    back = engine_kept.read_graph(tmp_path, "k1")
    assert back is not None
    _same_graph(g, back)
    # its replay and critical path are the built graph's
    assert cp.critical_path_of(back).to_dict() == cp.critical_path_of(g).to_dict()
    # NumPy scalars in its dicts (a stage map built from arrays) are kept as the numbers they are
    np_keys = dataclasses.replace(g, stage_of={np.int32(k): np.int64(v) for k, v in g.stage_of.items()})
    engine_kept.write_graph(tmp_path, "k1", np_keys)
    back = engine_kept.read_graph(tmp_path, "k1")
    assert back is not None and back.stage_of == g.stage_of
    # one graph a memo: keeping another drops the first
    engine_kept.write_graph(tmp_path, "k2", g)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph-k2.bin"]
    assert engine_kept.read_graph(tmp_path, "k1") is None


def _same_plan(a: ReplayPlan, b: ReplayPlan) -> None:
    for f in fields(ReplayPlan):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        elif f.name == "levels":
            assert len(x) == len(y)
            for p, q in zip(x, y):
                assert p[:5] == q[:5] and p[5].dtype == q[5].dtype and np.array_equal(p[5], q[5])
        elif f.name == "sync":
            assert len(x) == len(y) and [s is None for s in x] == [s is None for s in y]
            for p, q in zip(x, y):
                for u, v in zip(p or (), q or ()):
                    assert u.dtype == v.dtype and np.array_equal(u, v)
        else:
            assert x is None and y is None, f.name  # (sy_ks / sy_ck without syncs; no prefix yet)


@pytest.mark.parametrize(
    "where",
    [
        SAMPLES / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew",  # (~2,500 levels, no sync terms)
        SAMPLES / "h200-qwen35-block-seq4k",  # (a recorded GPU trace: kernels launched after syncs)
        SHARED / "hta" / "df_index_resolver",  # (313 levels with sync terms)
    ],
    ids=lambda p: p.name,
)
def test_kept_plan_reads_back_as_made(where: Path, tmp_path: Path):
    """The graph's replay plan kept with it: read back field by field as `replay_plan` made it, taken by
    `plan_of` instead of making it again, with the same critical path."""
    if not where.exists():
        pytest.skip(f"{where} is absent")
    crit = analyze_run(where, Options(no_cache=True)).critical
    assert crit is not None
    g = crit.graph
    plan = replay_plan(g)
    assert plan.prefix is None
    engine_kept.write_graph(tmp_path, "k", g, plan)
    back = engine_kept.read_graph(tmp_path, "k")
    assert back is not None
    kept = per_object(back)["replay_plan"]
    assert isinstance(kept, ReplayPlan)
    _same_plan(plan, kept)
    # its arrays in memory of their own (handed back when the what-if drops it), the graph's mapped
    assert all(a.base is None or a.base.base is None for a in (kept.pos, kept.ks, kept.e_src))
    assert back.k_end.base is not None and back.k_end.base.base is not None
    if where.name != "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew":
        assert any(s is not None for s in kept.sync) and kept.sy_ks is not None
    assert cp.plan_of(back) is kept
    assert cp.critical_path_of(back).to_dict() == crit.to_dict()
    # a graph kept without its plan reads back without one (made when first asked for)
    engine_kept.write_graph(tmp_path, "k", g)
    back = engine_kept.read_graph(tmp_path, "k")
    assert back is not None and "replay_plan" not in per_object(back)


def _summary(a: Analysis) -> str:
    return json.dumps(a.summary(), sort_keys=True, default=str)


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    dst = tmp_path / RUN
    shutil.copytree(SAMPLES / RUN, dst, ignore=shutil.ignore_patterns(".tracelens"))
    return dst


def _builds(monkeypatch) -> list[int]:
    """Counts `Analysis._build_graph` calls (each still builds)."""
    calls: list[int] = []
    build = Analysis._build_graph

    def counted(self, cross, stage_of):
        calls.append(1)
        return build(self, cross, stage_of)

    monkeypatch.setattr(Analysis, "_build_graph", counted)
    return calls


def _graphs(cache: Path) -> list[Path]:
    return sorted(cache.rglob("graph-*.bin"))


def test_warm_analysis_replays_the_kept_graph(run_dir: Path, tmp_path: Path, monkeypatch):
    plain = _summary(analyze_run(run_dir, Options(no_cache=True)))
    cache = tmp_path / "cache"
    builds = _builds(monkeypatch)
    cold = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(cold) == plain and len(builds) == 1
    kept = _graphs(cache)
    assert len(kept) == 1 and kept[0].parent == cold.run.stages.memo
    made: list[int] = []

    def counted_plan(g):
        made.append(1)
        return replay_plan(g)

    monkeypatch.setattr(cp, "replay_plan", counted_plan)
    monkeypatch.setattr(whatif, "replay_plan", counted_plan)
    warm = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(warm) == plain
    assert len(builds) == 1  # (replayed from the memo: not built again)
    assert not made  # (nor its replay plan made again: kept with it)
    assert warm.critical is not None and warm.critical.graph.k_end.base is not None  # (a view of the file)
    # another input of the build, another key: built with it, and kept in place of the first
    pattern = r"layers\.(?P<layer>\d+)\.(?P<module>[a-z_]+)"
    other = analyze_run(run_dir, Options(cache_dir=str(cache), layer_pattern=pattern))
    assert _summary(other) == _summary(analyze_run(run_dir, Options(no_cache=True, layer_pattern=pattern)))
    assert len(builds) == 3 and _graphs(cache) != kept and len(_graphs(cache)) == 1
    assert len(made) == 2  # (the new graph's plan, and the uncached analysis')


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_damaged_kept_graph_is_built_again(run_dir: Path, tmp_path: Path, monkeypatch, damage: str):
    cache = tmp_path / "cache"
    first = _summary(analyze_run(run_dir, Options(cache_dir=str(cache))))
    (kept,) = _graphs(cache)
    raw = kept.read_bytes()
    kept.write_bytes(raw[: len(raw) // 2] if damage == "cut" else raw[:100] + b"\xff" * 64 + raw[164:])
    for tail in cache.rglob("whatif-*.json"):  # (kept beside it, read instead of replaying the graph)
        tail.unlink()
    builds = _builds(monkeypatch)
    again = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(again) == first and len(builds) == 1 and not again.warnings
    assert kept.read_bytes() == raw  # (written again whole)


def test_a_rewritten_memo_drops_its_graph_and_no_cache_keeps_none(run_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    a = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert a.summary()["critical_path"]
    (kept,) = _graphs(cache)
    runs.MemoWriter(a.run.entries)  # (a memo written again: what it held before is gone)
    assert not kept.exists()
    other = tmp_path / "nocache"
    b = analyze_run(run_dir, Options(no_cache=True, cache_dir=str(other)))
    assert b.summary()["critical_path"] and b.run.stages.memo is None
    assert not other.exists() or not _graphs(other)


def test_graph_written_while_it_is_replayed(run_dir: Path, tmp_path: Path, monkeypatch):
    """A cold analysis writes the graph in a thread of its own (`engine.kept.write_graph_later`) while it replays
    it; the file, waited for, holds the graph and plan as built, before the replays of the critical path and
    the what-if (which drop the plan and keep terms of their own): the same as a graph built without a cache."""
    cache = tmp_path / "cache"
    gate = threading.Event()
    write = runs._write_graph_state

    def held(*args):  # (the write waits until the critical path and the what-if have replayed the graph)
        assert gate.wait(60)
        write(*args)

    monkeypatch.setattr(runs, "_write_graph_state", held)
    a = analyze_run(run_dir, Options(cache_dir=str(cache)))
    crit = a.critical
    graph_writes = [done for what, done in a._writes if "graph" in what]
    assert crit is not None and len(graph_writes) == 1 and not graph_writes[0].done() and not _graphs(cache)
    a.what_if(a.base_findings())  # (replays; drops the plan)
    assert "replay_plan" not in per_object(crit.graph)
    gate.set()
    a.wait_writes()
    assert not a._writes
    (kept,) = _graphs(cache)
    back = engine_kept.read_graph(kept.parent, kept.stem[len("graph-") :])
    assert back is not None
    fresh = analyze_run(run_dir, Options(no_cache=True)).critical
    assert fresh is not None
    _same_graph(back, fresh.graph)
    _same_plan(per_object(back)["replay_plan"], replay_plan(fresh.graph))
    # summary() waits for what it started: the file is complete when it returns
    monkeypatch.setattr(runs, "_write_graph_state", write)
    shutil.rmtree(cache)
    b = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(b) == _summary(analyze_run(run_dir, Options(no_cache=True)))
    assert not b._writes and len(_graphs(cache)) == 1


def test_a_cache_that_cannot_take_the_graph_is_no_error(run_dir: Path, tmp_path: Path, monkeypatch):
    def refuse(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs, "write_arrays", refuse)
    a = analyze_run(run_dir, Options(cache_dir=str(tmp_path / "cache")))
    assert _summary(a) == _summary(analyze_run(run_dir, Options(no_cache=True)))
    assert not a.warnings and not _graphs(tmp_path / "cache")


def test_a_graph_write_that_fails_otherwise_is_a_warning(run_dir: Path, tmp_path: Path, monkeypatch):
    """Not an OSError (a bug): one line in the run's warnings of summary.json, the analysis itself whole;
    raised in strict mode (tracelens.policy)."""

    def broken(*args):
        raise TypeError("array 'x' holds Python objects: not storable")

    monkeypatch.setattr(runs, "write_arrays", broken)
    monkeypatch.delenv("TRACELENS_STRICT", raising=False)
    monkeypatch.delenv("TRACELENS_DEBUG", raising=False)
    s = analyze_run(run_dir, Options(cache_dir=str(tmp_path / "cache"))).summary()
    plain = analyze_run(run_dir, Options(no_cache=True)).summary()
    said = [w for w in s["run"]["warnings"] if w not in plain["run"]["warnings"]]
    assert said == [
        "keeping the critical path's graph in the cache skipped: TypeError: array 'x' holds Python objects: not storable"
    ]
    assert s["critical_path"] == plain["critical_path"] and s["what_if"] == plain["what_if"]
    assert not _graphs(tmp_path / "cache")
    monkeypatch.setenv("TRACELENS_STRICT", "1")
    with pytest.raises(TypeError):
        analyze_run(run_dir, Options(cache_dir=str(tmp_path / "cache2"))).summary()
