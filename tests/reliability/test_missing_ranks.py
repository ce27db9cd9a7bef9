"""Missing ranks, duplicate ranks and mixed runs: analyze what is there and name what is not; traces of
different runs in one folder are an error naming the files, or `--rank-filter` picks one run."""

from __future__ import annotations

import json

import pytest
from broken_traces import BASE_NS, cli, kineto_doc, run, write

from tracelens.discover import parse_rank_filter
from tracelens.errors import BadInputError, RankError
from tracelens.run import load_tables
from tracelens.run_analysis import Options, analyze_run


def _codes(summary: dict, code: str) -> list[dict]:
    return [f for f in summary["findings"] if f["code"] == code]


def test_world_of_16_with_15_traces_names_the_missing_rank(tmp_path):
    d = run(tmp_path / "run", 16, [r for r in range(16) if r != 11])
    a = analyze_run(d, Options(no_cache=True))
    s = a.summary()
    assert s["run"]["world_size"] == 16
    assert s["run"]["ranks"] == [r for r in range(16) if r != 11]
    assert len(s["ranks"]) == 15  # every present rank is analyzed
    (m,) = _codes(s, "MISSING_RANKS")
    assert m["ranks"] == [11]
    assert m["message"] == "1 of 16 ranks have no trace (11); cross-rank results are incomplete"


def test_missing_ranks_through_the_cli(tmp_path):
    d = run(tmp_path / "run", 4, [0, 2])
    r = cli("analyze", d, "-o", tmp_path / "out", "--no-report")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert _codes(s, "MISSING_RANKS")[0]["ranks"] == [1, 3]
    assert "MISSING_RANKS: 2 of 4 ranks have no trace (1, 3)" in r.stdout


def test_duplicate_rank_is_an_error_naming_both_files(tmp_path):
    d = run(tmp_path / "run", 4, [0, 1, 2, 3])
    write(d / "again" / "copy_of_rank2.json", kineto_doc(2, 4))
    with pytest.raises(RankError, match=r"rank 2 appears twice: .*run/rank2\.json and .*copy_of_rank2\.json"):
        load_tables(d, no_cache=True)
    r = cli("analyze", d, "-o", tmp_path / "out", "--no-report")
    assert r.returncode == 2
    assert r.stderr.startswith("tracelens: error: rank 2 appears twice")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    # --rank-filter leaves the duplicated rank out; the ranks filtered out are not reported missing
    s = analyze_run(d, Options(no_cache=True, rank_filter="0-1,3")).summary()
    assert s["run"]["ranks"] == [0, 1, 3]
    assert _codes(s, "MISSING_RANKS") == []


def test_mixed_world_sizes_error_then_rank_filter(tmp_path):
    d = run(tmp_path / "run", 8, range(8))
    write(d / "other_job" / "rank12.json", kineto_doc(12, 16))
    with pytest.raises(
        RankError, match=r"world sizes disagree: .*rank0\.json says 8, .*rank12\.json says 16"
    ):
        load_tables(d, no_cache=True)
    r = cli("analyze", d, "-o", tmp_path / "out", "--no-report", "--rank-filter", "0-7")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["run"]["ranks"] == list(range(8)) and s["run"]["world_size"] == 8
    assert _codes(s, "MISSING_RANKS") == []


def test_runs_far_apart_in_time_are_an_error_naming_the_files(tmp_path):
    d = run(tmp_path / "run", 4, [0, 1])
    later = BASE_NS + 2 * 3600 * 10**9  # another job, two hours later
    for r in (2, 3):
        write(d / f"rank{r}.json", kineto_doc(r, 4, baseTimeNanoseconds=later))
    with pytest.raises(
        RankError, match=r"different runs.*rank 2 \(.*rank2\.json\) starts 120 min after rank"
    ):
        load_tables(d, no_cache=True)
    s = analyze_run(d, Options(no_cache=True, rank_filter="0,1")).summary()
    assert s["run"]["ranks"] == [0, 1]
    # ranks a few seconds apart (unsynchronised clocks, late start) are one run
    write(d / "rank2.json", kineto_doc(2, 4, baseTimeNanoseconds=BASE_NS + 5 * 10**9))
    write(d / "rank3.json", kineto_doc(3, 4, baseTimeNanoseconds=BASE_NS - 3 * 10**9))
    assert analyze_run(d, Options(no_cache=True)).ranks == [0, 1, 2, 3]


def test_different_trace_ids_are_one_run(tmp_path):
    """Kineto's trace_id is per process (every rank has its own), so it does not tell runs apart."""
    for r in range(2):
        write(tmp_path / f"rank{r}.json", kineto_doc(r, 2, trace_id=f"{r:032X}"))
    t = load_tables(tmp_path, no_cache=True)
    assert t.metadata.column("trace_id").to_pylist() == [f"{0:032X}", f"{1:032X}"]


def test_rank_filter_text():
    assert parse_rank_filter("0-3,7, 9-10") == frozenset({0, 1, 2, 3, 7, 9, 10})
    assert parse_rank_filter(None) is None
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(BadInputError, match="--rank-filter"):
            parse_rank_filter(bad)


def test_rank_filter_matching_nothing_and_bad_text_exit_2(tmp_path):
    d = run(tmp_path / "run", 2, [0, 1])
    r = cli("analyze", d, "-o", tmp_path / "o1", "--rank-filter", "5-6")
    assert r.returncode == 2 and "--rank-filter keeps none of the Kineto ranks found (0, 1)" in r.stderr
    r = cli("analyze", d, "-o", tmp_path / "o2", "--rank-filter", "zero")
    assert r.returncode == 2 and "expected ranks and ranges such as 0-7,12" in r.stderr
