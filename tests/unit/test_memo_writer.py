"""The run memo written part by part (engine.reduce.write_memo: each table concatenated, written and dropped;
the derived tables computed over slices of whole ranks as executor tasks; the allocator samples gathered by
tasks) holds the tables the in-memory reduction gives (`reduce_stages`, the derived tables over the whole
events), down to one rank a slice and on a pool of worker interpreters; `Run.memory` reads the memo's
samples, equal to the entries' Parquet files; `pages.trim_heap` leaves every table as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens.analyze.comm.collectives import collectives_from_events
from tracelens.analyze.layout.groups import pg_rows
from tracelens.analyze.rank import classify as K
from tracelens.engine import kept as engine_kept
from tracelens.engine import reduce as RD
from tracelens.engine import tasks as TK
from tracelens.engine.executor import InlineExecutor, LocalPool
from tracelens.run import LoadOptions, load_run
from tracelens.store import cache, pages, runs

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
RUNS = ["qwen35-27b-seq4k-tp2pp3-split22-21-21", "cpu-gloo-4rank"]
TABLES = ("xevents", "breakdown", "ops", "idle", "time_ranges", "spans")


@pytest.fixture(scope="module", params=RUNS)
def loaded(request, tmp_path_factory):
    """(run folder, options, Run) of a sample loaded once with a cache (its memo written by write_memo)."""
    tmp = tmp_path_factory.mktemp("writer")
    run = tmp / request.param
    shutil.copytree(SAMPLES / request.param, run, ignore=shutil.ignore_patterns(".tracelens"))
    opts = LoadOptions(workers=1, cache_dir=tmp / "cache", salvage=True)
    return run, opts, load_run(run, opts)


def _whole(entries):
    """The in-memory reduction of the entries' stages and its derived tables over the whole events."""
    st = RD.reduce_stages(RD.read_stages(entries))
    x = st.xevents
    flags = pa.table({"comm_launched": pa.array(K.comm_launched(x.select(x.column_names)), pa.bool_())})
    return st, {"collectives": collectives_from_events(x), "pg": pg_rows(x), "xflags": flags}


def _check_memo(entries, st, derived):
    memo = runs.read_run(entries)
    assert memo is not None
    got = memo[1]
    for name in TABLES:
        a, b = getattr(got, name), getattr(st, name)
        assert a is not None and b is not None and a.equals(b), name
    nodes, syncs = got.critical_inputs()
    assert nodes.equals(st.nodes) and syncs.equals(st.syncs)
    assert sorted(got.sets) == sorted(st.sets)
    for r, rs in st.sets.items():
        for k in ("compute", "comm", "memory"):
            for a, b in zip(getattr(got.sets[r], k), getattr(rs, k)):
                assert np.array_equal(a, b)
    assert got.collectives is not None and got.collectives.equals(derived["collectives"].combine_chunks())
    assert got.pg is not None and got.pg.equals(derived["pg"].combine_chunks())
    assert (K.comm_launched(got.xevents) == derived["xflags"].column(0).to_numpy(zero_copy_only=False)).all()
    assert (got.spans_error, got.idle_error, got.nodes_stepped) == (
        st.spans_error,
        st.idle_error,
        st.nodes_stepped,
    )
    return memo


@pytest.mark.parametrize("rows", [1, 700, 10**9])
def test_memo_written_part_by_part_equals_the_whole_table_path(loaded, rows):
    """Down to one rank a slice (`rows`=1) and one slice for all (10**9)."""
    _, _, r = loaded
    st, derived = _whole(r.entries)
    shutil.rmtree(runs.memo_dir(r.entries))
    assert RD.write_memo(r.entries, r.metadata, RD.read_stages(r.entries), rows=rows)
    memo = _check_memo(r.entries, st, derived)
    assert memo[0].equals(r.metadata)
    assert not list(runs.memo_dir(r.entries).glob(".*"))  # (the tasks' part files removed)


def test_memo_written_on_a_pool_of_workers(loaded):
    """The derived tables' and samples' tasks sent to worker interpreters (what the cold load does)."""
    _, _, r = loaded
    st, derived = _whole(r.entries)
    shutil.rmtree(runs.memo_dir(r.entries))
    pool = LocalPool(2)
    try:
        assert RD.write_memo(r.entries, r.metadata, RD.read_stages(r.entries), pool, rows=1)
    finally:
        pool.shutdown()
    _check_memo(r.entries, st, derived)
    assert runs.read_memory(r.entries).equals(cache.read_part(r.entries, "memory"))


@pytest.mark.parametrize("rows", [1, 700, 10**9])
def test_derived_tables_from_the_stage_files(loaded, rows, monkeypatch):
    """The derived tables computed from the stage files while they are read (`derive_from_stages`, what the
    cold load does), down to one rank a slice: the memo equals the whole-table path's, and none is computed
    again from the written events."""
    _, _, r = loaded
    st, derived = _whole(r.entries)
    shutil.rmtree(runs.memo_dir(r.entries))
    folder = runs.memo_dir(r.entries)
    folder.mkdir()
    parts = RD.derived_parts(RD.derive_from_stages(InlineExecutor(), r.entries, folder, rows))
    assert parts is not None and len(parts) >= 1
    if rows == 1:
        assert len(parts) == len(r.entries)  # (one slice a rank)

    def refuse(*a, **k):
        raise AssertionError("derived tables computed again from the written events")

    monkeypatch.setattr(TK, "derive_rows", refuse)
    monkeypatch.setattr(engine_kept, "derive_or_none", refuse)
    assert RD.write_memo(r.entries, r.metadata, RD.read_stages(r.entries), derived=parts)
    _check_memo(r.entries, st, derived)
    assert not list(folder.glob(".*"))  # (the part files removed)


def test_derived_tables_from_damaged_stage_files_fall_back(loaded, tmp_path):
    """A stage file missing when the derivation reads it: its parts are removed and `derived_parts` gives None
    (the memo's derived tables are then computed from its written events)."""
    _, _, r = loaded
    from tracelens.store.stages import xevents_file

    xev = xevents_file(r.entries[-1].events, r.entries[-1].rank)
    saved = tmp_path / "xevents.arrow"
    shutil.copy(xev, saved)
    xev.unlink()
    folder = tmp_path / "memo"
    folder.mkdir()
    try:
        assert RD.derived_parts(RD.derive_from_stages(InlineExecutor(), r.entries, folder, 1)) is None
        assert list(folder.iterdir()) == []
    finally:
        shutil.copy(saved, xev)


def test_memory_from_the_memo_equals_the_parquet_files(loaded, monkeypatch):
    run, opts, r = loaded
    want = cache.read_part(r.entries, "memory")
    assert want.schema.equals(schema.MEMORY)
    assert want.num_rows > 0 or run.name.startswith("cpu")  # (the CPU-only run has no samples)
    again = load_run(run, opts)  # (the memo's)

    def refuse(*a, **k):
        raise AssertionError("per-rank memory files read although the run memo holds them")

    monkeypatch.setattr(cache, "read_part", refuse)
    assert again.memory.equals(want)
    monkeypatch.undo()
    # a memo without them (written before they were kept): read from the entries
    d = runs.memo_dir(r.entries)
    import json

    m = json.loads((d / "manifest.json").read_text())
    m["parts"].remove("memory")
    (d / "manifest.json").write_text(json.dumps(m))
    assert runs.read_memory(r.entries) is None
    assert load_run(run, opts).memory.equals(want)


def test_concat_released_equals_concat(loaded):
    _, _, r = loaded
    stages = RD.read_stages(r.entries)
    for attr, sch in (("xevents", schema.EVENTS), ("breakdown", None), ("nodes", None)):
        tabs = [getattr(s, attr) for s in stages]
        want = cache.concat(tabs, sch or tabs[0].schema)
        got = RD.concat_released(tabs, sch or tabs[0].schema)
        assert got.equals(want) and got.schema.equals(want.schema)
        assert [c.num_chunks for c in got.columns] == [c.num_chunks for c in want.columns]
    assert RD.concat_released([], schema.EVENTS).equals(schema.EVENTS.empty_table())


def test_trim_heap_is_harmless(loaded):
    _, _, r = loaded
    x = r.stages.xevents
    before = x.to_pylist()[:50], x.column("ts_ns").to_numpy().copy()
    arr = np.arange(1_000_000)
    big = [np.ones(100_000) for _ in range(20)]
    del big
    pages.trim_heap()
    pages.trim_heap()
    assert x.to_pylist()[:50] == before[0] and np.array_equal(x.column("ts_ns").to_numpy(), before[1])
    assert arr.sum() == 999_999 * 1_000_000 // 2


def test_cold_load_on_a_pool_keeps_the_samples_in_the_memo(tmp_path):
    """A cold load with two workers: the pool gathers the samples and computes the derived tables while the
    stages are read, then the memo is written (the pool shut down) and holds them; the load's tables equal an
    uncached load's."""
    name = RUNS[0]
    run = tmp_path / name
    shutil.copytree(SAMPLES / name, run, ignore=shutil.ignore_patterns(".tracelens"))
    r = load_run(run, LoadOptions(workers=2, cache_dir=tmp_path / "cache", salvage=True))
    mem = runs.read_memory(r.entries)
    assert mem is not None and mem.num_rows > 0
    plain = load_run(run, LoadOptions(no_cache=True, workers=1, salvage=True))
    assert mem.equals(plain.memory) and r.memory.equals(plain.memory)
    for name_ in TABLES:
        assert getattr(r.stages, name_).equals(getattr(plain.stages, name_)), name_
    _, derived = _whole(r.entries)  # (the derived tables made by the pool from the stage files)
    assert r.stages.collectives is not None and r.stages.collectives.equals(
        derived["collectives"].combine_chunks()
    )
    assert r.stages.pg is not None and r.stages.pg.equals(derived["pg"].combine_chunks())
    assert not list(runs.memo_dir(r.entries).glob(".*"))


def test_two_gathers_into_one_memo_folder_keep_their_own_parts(loaded, tmp_path):
    """Two analyses of one run at once gather the allocator samples into the same memo folder: each reads back
    and removes its own part files (their names were the same in both: the first to finish removed the other's,
    which then failed to map it: tests/reliability/test_security.py's two analyses at once)."""
    run, opts, r = loaded
    want = cache.read_part(r.entries, "memory")
    folder = tmp_path / "memo"
    folder.mkdir()
    ex = InlineExecutor()
    first = RD.gather_memory(ex, r.entries, folder)
    second = RD.gather_memory(ex, r.entries, folder)
    assert RD.collect_memory(second).equals(want)
    assert RD.collect_memory(first).equals(want)
    assert list(folder.iterdir()) == []  # (each removed its own parts)
    # a part removed by someone else before it is read: no samples from the gather (Run.memory reads the entries)
    third = RD.gather_memory(ex, r.entries, folder)
    for p in folder.iterdir():
        p.unlink()
    assert RD.collect_memory(third) is None


def test_stages_read_by_threads_equal_the_serial_read(loaded):
    """The threaded read (files a cluster wrote to shared storage) gives the serial read's stages, in order."""
    _, _, r = loaded
    one = RD.reduce_stages(RD.read_stages(r.entries))
    four = RD.reduce_stages(RD.read_stages(r.entries, 4))
    assert one.xevents.equals(four.xevents) and one.breakdown.equals(four.breakdown)
    assert one.spans is not None and four.spans is not None and one.spans.equals(four.spans)
