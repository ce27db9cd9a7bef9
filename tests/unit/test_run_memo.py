"""The run memo's collectives table (store.runs, `Staged.cross_collectives`): computed once when the memo is
written, read back on a warm open instead of recomputed, equal to what `collectives_from_events` gives; a
damaged part means the memo is not used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tracelens import schema
from tracelens.analyze import collectives as C
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
    first = plain.cross_collectives()
    assert first.equals(stored) and plain.cross_collectives() is first


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


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other schema", "missing"])
def test_damaged_collectives_part_means_the_memo_is_not_used(cached, damage):
    run, opts = cached
    loaded = load_run(run, opts)
    part = runs.memo_dir(loaded.entries) / "collectives.arrow"
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
