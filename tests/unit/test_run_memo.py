"""What the run memo keeps of the cross-rank events besides the events (store.runs): their collectives table
(`engine.kept.cross_collectives`), their launch flags (`classify.comm_launched`) and their process-group rows
(`engine.kept.grid_rows`, what the grid inference reads), computed once when the memo is written and read back on
a warm open instead of recomputed, equal to what a fresh computation gives; a damaged part means the memo is
not used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tracelens import schema
from tracelens.analyze.comm import collectives as C
from tracelens.analyze.rank import classify as K
from tracelens.engine import kept as engine_kept
from tracelens.run import LoadOptions, load_run
from tracelens.run_analysis import Options, analyze_run
from tracelens.store import runs

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
#: a GPU run (6 ranks, pipeline and tensor parallel: kernels, their launches, record_param_comms) and a
#: CPU-only gloo run (the c10d / gloo pairing of `collectives_from_events`)
RUNS = ["qwen35-27b-seq4k-tp2pp3-split22-21-21", "cpu-gloo-4rank"]


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(SAMPLES / name, dst, ignore=shutil.ignore_patterns(".tracelens"))
    return dst


@pytest.fixture(scope="module", params=RUNS)
def cached(request, tmp_path_factory):
    """(run folder, load options) of a sample loaded once with a cache: its memo is written."""
    tmp = tmp_path_factory.mktemp("memo")
    run = _copy(request.param, tmp)
    opts = LoadOptions(workers=1, cache_dir=tmp / "cache", salvage=True)  # (as analyze_run loads)
    load_run(run, opts)
    return run, opts


def test_stored_collectives_equal_recomputed_ones(cached):
    run, opts = cached
    loaded = load_run(run, opts)
    memo = runs.read_run(loaded.entries)
    assert memo is not None
    stored = memo[1].collectives
    assert stored is not None and stored.schema.equals(schema.COLLECTIVES)
    assert stored.num_rows > 50  # (the samples' collectives: thousands on the GPU run, 56 on the gloo one)
    # what the analysis would compute from the memo's cross-rank events, and from every event of the run
    assert stored.equals(C.collectives_from_events(memo[1].xevents))
    assert stored.equals(C.collectives_from_events(loaded.events))
    # an uncached load computes the same table on first use, once
    plain = load_run(run, LoadOptions(no_cache=True, workers=1, salvage=True)).stages
    assert plain.collectives is None
    first = engine_kept.cross_collectives(plain)
    assert first.equals(stored) and engine_kept.cross_collectives(plain) is first


def test_warm_analysis_reads_the_stored_collectives(cached, monkeypatch):
    """A warm `Analysis.cross` takes the memo's table: `collectives_from_events` is not called, and the
    cross-rank results equal an uncached analysis' (which computes them)."""
    run, opts = cached
    cold = analyze_run(run, Options(no_cache=True))
    assert cold.cross is not None

    def refuse(events):
        raise AssertionError("collectives recomputed although the run memo holds them")

    monkeypatch.setattr(C, "collectives_from_events", refuse)
    warm = analyze_run(run, Options(cache_dir=str(opts.cache_dir)))
    got = warm.cross
    assert got is not None, warm.warnings
    assert got.collectives.equals(cold.cross.collectives)
    assert json.dumps(got.findings, default=str) == json.dumps(cold.cross.findings, default=str)
    assert got.offsets_ns == cold.cross.offsets_ns and got.stragglers == cold.cross.stragglers


def test_stored_launch_flags_equal_recomputed_ones(cached, monkeypatch):
    """The memo's per-row `comm_launched` flags are what the launch links give over its cross-rank events
    (a fresh table object: nothing memoized), and a warm open hands them out without the launch links."""
    run, opts = cached
    loaded = load_run(run, opts)
    fresh = loaded.stages.xevents.select(loaded.stages.xevents.column_names)  # (another table: no memo)
    want = K.comm_launched(fresh).copy()
    assert want.size == fresh.num_rows
    if run.name.startswith("qwen"):  # the NCCL kernels launched inside their record_param_comms
        assert 1000 < want.sum() < want.size
    import tracelens.analyze.rank.launch_link as L

    def refuse(events):
        raise AssertionError("launch links computed although the run memo holds the flags")

    monkeypatch.setattr(L, "launch_parents", refuse)
    memo = runs.read_run(loaded.entries)
    assert memo is not None
    engine_kept.apply_flags(memo[1])  # (as a warm open does: tracelens.run)
    got = K.comm_launched(memo[1].xevents)
    assert got.dtype == bool and (got == want).all()
    assert not got.flags.writeable  # (shared, as comm_launched's own)
    with pytest.raises(ValueError):  # flags of another table are refused
        K.keep_comm_launched(fresh, want[:-1])


def test_stored_process_group_rows_give_the_grid_of_the_events(cached):
    """The memo's `pg` rows are `pg_rows` of its cross-rank events, and the grid inferred from them (groups,
    their traffic and names) is the one inferred from the events."""
    from tracelens.analyze.layout.groups import collect_groups, pg_rows
    from tracelens.analyze.layout.groups import groups_from_events as _groups_from_events
    from tracelens.analyze.layout.infer import infer_grid

    run, opts = cached
    loaded = load_run(run, opts)
    memo = runs.read_run(loaded.entries)
    assert memo is not None and memo[1].pg is not None
    x, pg = memo[1].xevents, memo[1].pg
    assert pg.equals(pg_rows(x))
    n_pg = int(x.column("pg_ranks").is_valid().to_numpy(zero_copy_only=False).sum())
    assert int(pg.column("rows").to_numpy().sum()) == n_pg
    if run.name.startswith("qwen"):  # thousands of records, a few rows per rank and group
        assert 0 < pg.num_rows < n_pg / 10
    assert collect_groups([], None, None, pg) == collect_groups([], x, None)
    assert _groups_from_events(None, pg) == _groups_from_events(x)
    grid, findings = infer_grid(x, loaded.metadata, None, pg)
    assert repr(infer_grid(x, loaded.metadata)) == repr((grid, findings))  # (Grid: evidence, notes and all)
    if run.name.startswith("qwen"):
        assert (grid.tp, grid.pp, grid.dp) == (2, 3, 1)


@pytest.mark.parametrize("part", ["collectives", "xflags", "pg"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "other schema", "missing"])
def test_damaged_part_means_the_memo_is_not_used(cached, part, damage):
    run, opts = cached
    loaded = load_run(run, opts)
    part = runs.memo_dir(loaded.entries) / f"{part}.arrow"
    good = part.read_bytes()
    assert runs.read_run(loaded.entries) is not None
    if damage == "garbage":
        part.write_bytes(b"garbage")
    elif damage == "truncated":  # a part cut short (a copy or a disk that gave out)
        part.write_bytes(good[: len(good) // 2])
    elif damage == "other schema":
        import pyarrow as pa

        from tracelens.store.atomic import write_ipc

        write_ipc(part, pa.table({"rank": pa.array([0], pa.int64())}))
    else:
        part.unlink()
    assert runs.read_run(loaded.entries) is None
    # the run is opened from its entries, which writes the memo again, with the right table
    again = load_run(run, opts)
    memo = runs.read_run(again.entries)
    assert memo is not None and memo[1].collectives is not None
    assert memo[1].collectives.equals(C.collectives_from_events(again.events))
    fresh = memo[1].xevents.select(memo[1].xevents.column_names)
    assert (K.comm_launched(memo[1].xevents) == K.comm_launched(fresh)).all()


def test_launch_flags_of_another_length_mean_the_memo_is_not_used(cached):
    """xflags.arrow of the right schema but not one row per cross-rank event (a memo put together from two
    writes) is not used."""
    import pyarrow as pa

    from tracelens.store.atomic import write_ipc

    run, opts = cached
    loaded = load_run(run, opts)
    part = runs.memo_dir(loaded.entries) / "xflags.arrow"
    n = loaded.stages.xevents.num_rows
    write_ipc(part, pa.table({"comm_launched": pa.array([False] * (n + 1))}))
    assert runs.read_run(loaded.entries) is None
    load_run(run, opts)  # (written anew)
    assert runs.read_run(loaded.entries) is not None


def test_collectives_that_fail_are_left_out_of_the_memo(tmp_path: Path, monkeypatch):
    """When `collectives_from_events` fails on the events, the memo is written without the table (the load
    does not fail) and the analysis computes it itself, where the failure is reported as without a memo."""
    run = _copy(RUNS[1], tmp_path)
    opts = LoadOptions(workers=1, cache_dir=tmp_path / "cache", salvage=True)

    def fail(events):
        raise ValueError("odd events")

    monkeypatch.setattr(C, "collectives_from_events", fail)
    loaded = load_run(run, opts)
    manifest = json.loads((runs.memo_dir(loaded.entries) / "manifest.json").read_text())
    assert "collectives" not in manifest["parts"] and "xevents" in manifest["parts"]
    memo = runs.read_run(loaded.entries)
    assert memo is not None and memo[1].collectives is None
    an = analyze_run(run, Options(cache_dir=str(opts.cache_dir)))
    with pytest.raises(ValueError, match="odd events"):  # strict mode (the tests'): the failure propagates
        _ = an.cross
    monkeypatch.setenv("TRACELENS_STRICT", "0")
    an = analyze_run(run, Options(cache_dir=str(opts.cache_dir)))
    assert an.cross is None
    assert any(w.startswith("cross-rank analysis skipped: ValueError: odd events") for w in an.warnings)
    monkeypatch.undo()  # then the same memo, read again, computes them on first use
    an = analyze_run(run, Options(cache_dir=str(opts.cache_dir)))
    assert an.cross is not None
    assert an.run.stages.collectives is not None
    assert an.run.stages.collectives.equals(C.collectives_from_events(an.run.events))


def test_process_group_rows_with_a_column_of_nulls_only(cached):
    """A column `pg_rows` codes that holds no value at all (an empty dictionary: hta/ns_resolution_trace has
    no pg_desc) codes its nulls as one value, and the grid inferred from the rows is the events' one."""
    import pyarrow as pa

    from tracelens.analyze.layout import infer_grid
    from tracelens.analyze.layout.groups import collect_groups, pg_rows

    run, opts = cached
    loaded = load_run(run, opts)
    x = loaded.stages.xevents
    for c in ("pg_desc", "pg_name", "collective"):
        i = x.column_names.index(c)
        empty = pa.DictionaryArray.from_arrays(
            pa.nulls(x.num_rows, pa.int32()), pa.array([], x.schema.field(c).type.value_type)
        )
        x = x.set_column(i, x.schema.field(c), empty)
    pg = pg_rows(x)
    assert pg.num_rows <= x.column("pg_ranks").is_valid().to_numpy(zero_copy_only=False).sum()
    assert collect_groups([], None, None, pg) == collect_groups([], x, None)
    assert repr(infer_grid(x, loaded.metadata, None, pg)) == repr(infer_grid(x, loaded.metadata))


@pytest.mark.parametrize("rows", [1, 500, 5_000])
def test_per_rank_derivations_over_rank_slices_equal_the_whole(cached, rows):
    """The memo's derived tables computed over slices of whole ranks (store.stages.by_rank_chunks, what bounds
    their memory at scale) equal the whole table's, dictionaries and all; the launch flags too."""
    import numpy as np

    from tracelens.analyze.layout.groups import pg_rows
    from tracelens.store.stages import by_rank_chunks, rank_slices

    run, opts = cached
    x = load_run(run, opts).stages.xevents
    parts = rank_slices(x, rows)
    assert parts is not None and len(parts) > 1
    assert sum(p.num_rows for p in parts) == x.num_rows
    assert all(len(set(p.column("rank").to_pylist())) >= 1 for p in parts)
    for fn in (C.collectives_from_events, pg_rows):
        whole = fn(x)
        got = by_rank_chunks(fn, x, rows)
        assert got.equals(whole.combine_chunks()), fn.__name__
    fresh = x.select(x.column_names)  # (no memo of this table's launch flags)
    flags = np.concatenate([K.comm_launched(p.select(p.column_names)) for p in rank_slices(fresh, rows)])
    assert (flags == K.comm_launched(fresh)).all()
