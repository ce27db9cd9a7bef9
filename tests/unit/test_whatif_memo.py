"""The critical path's part of summary.json and the what-if kept in the run memo (store.results.read_tail):
a warm analysis reads them instead of replaying the graph and gives the summary an uncached analysis gives
(the findings' `saving_ms` included), other findings are another key, a damaged file is computed again, and
a what-if that failed is not kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracelens.analyze.critical import critical_path, whatif
from tracelens.run_analysis import Analysis, Options, analyze_run
from tracelens.store import results


@pytest.fixture()
def run_dir(straggler_run: Path) -> Path:
    return straggler_run


def _text(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True, default=str)


def _kept(cache: Path) -> list[Path]:
    return sorted(cache.rglob("whatif-*.json"))


def _count(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


def _analysis(run_dir: Path, cache: Path, **options) -> Analysis:
    return analyze_run(run_dir, Options(cache_dir=str(cache), **options))


def test_warm_analysis_reads_the_kept_what_if(run_dir: Path, tmp_path: Path, monkeypatch):
    plain = analyze_run(run_dir, Options(no_cache=True)).summary()
    fixed = [f for f in plain["findings"] if "saving_ms" in f]
    assert plain["what_if"] and fixed and plain["critical_path"]  # (what the kept result must give back)
    cache = tmp_path / "cache"
    replays = _count(monkeypatch, whatif, "what_if")
    paths = _count(monkeypatch, critical_path, "critical_path_of")
    cold = _analysis(run_dir, cache)
    assert _text(cold.summary()) == _text(plain) and len(replays) == len(paths) == 1
    (kept,) = _kept(cache)
    assert kept.parent == cold.run.stages.memo
    warm = _analysis(run_dir, cache)
    warm_summary = warm.summary(release=True)
    assert len(replays) == len(paths) == 1  # (read back, not replayed)
    assert _text(warm_summary) == _text(plain) and not warm.warnings
    assert [f["saving_ms"] for f in warm_summary["findings"] if "saving_ms" in f] == [
        f["saving_ms"] for f in fixed
    ]
    # the notebook's critical path is still there, computed when asked for
    assert warm.critical is not None and warm.critical.to_dict() == plain["critical_path"]


def test_other_findings_are_another_key(run_dir: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    first = _text(_analysis(run_dir, cache).summary())
    (kept,) = _kept(cache)
    base = Analysis.base_findings

    def one_more(self):
        return base(self) + [{"code": "PLANTED", "severity": "info", "message": "planted", "ranks": [0]}]

    monkeypatch.setattr(Analysis, "base_findings", one_more)
    uncached = _text(analyze_run(run_dir, Options(no_cache=True)).summary())
    replays = _count(monkeypatch, whatif, "what_if")
    other = _analysis(run_dir, cache).summary()
    assert len(replays) == 1 and any(f["code"] == "PLANTED" for f in other["findings"])
    assert _text(other) == uncached
    assert _kept(cache) != [kept] and len(_kept(cache)) == 1  # (in place of the first)
    monkeypatch.setattr(Analysis, "base_findings", base)
    assert _text(_analysis(run_dir, cache).summary()) == first and len(replays) == 2  # (replaced: again)


def test_tail_key_follows_every_input():
    findings = [{"code": "STRAGGLER", "ranks": [3], "lost_ms": 1.5}]
    inputs = {"findings": findings, "stage_of": {0: 0, 1: 1}, "layer_ns": None}
    key = results.tail_key("g" * 20, inputs)
    assert key == results.tail_key(
        "g" * 20, {"findings": [dict(findings[0])], "stage_of": {0: 0, 1: 1}, "layer_ns": None}
    )
    assert key != results.tail_key("h" * 20, inputs)
    assert key != results.tail_key("g" * 20, {**inputs, "findings": [{**findings[0], "lost_ms": 1.5000001}]})
    assert key != results.tail_key("g" * 20, {**inputs, "stage_of": {0: 0, 1: 0}})
    assert key != results.tail_key("g" * 20, {**inputs, "layer_ns": 0.0})
    assert results.tail_key("g" * 20, {**inputs, "odd": {1, 2}}) is None  # (a set: not keyed, not kept)


@pytest.mark.parametrize(
    "damage",
    ["cut", "other layout", "not json", "saving of no finding", "warning not text", "path not object"],
)
def test_damaged_tail_is_computed_again(run_dir: Path, tmp_path: Path, monkeypatch, damage: str):
    cache = tmp_path / "cache"
    first = _text(_analysis(run_dir, cache).summary())
    (kept,) = _kept(cache)
    text = kept.read_text()
    if damage == "cut":
        kept.write_text(text[:-20])
    elif damage == "not json":
        kept.write_bytes(b"\xff\x00")
    else:
        body = json.loads(text)
        if damage == "other layout":
            body["savings"] = [[0]]
        elif damage == "saving of no finding":  # (an index past the findings: never set, never raised)
            body["savings"].append([10_000, 1.0])
        elif damage == "warning not text":
            body["warnings"] = [1]
        else:
            body["critical_path"] = [1]
        kept.write_text(json.dumps(body))
    replays = _count(monkeypatch, whatif, "what_if")
    again = _analysis(run_dir, cache)
    assert _text(again.summary()) == first and len(replays) == 1 and not again.warnings
    assert results.read_tail(kept.parent, kept.stem[len("whatif-") :]) is not None  # (kept again, whole)


def test_a_failed_what_if_is_not_kept(run_dir: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"

    def fails(*a, **k):
        raise MemoryError("planted")

    monkeypatch.delenv("TRACELENS_STRICT", raising=False)  # (the tests' strict mode re-raises)
    monkeypatch.setattr(whatif, "what_if", fails)
    failed = _analysis(run_dir, cache)
    summary = failed.summary()
    # (the schedule and layout what-ifs replay the pipeline's measured work, not the graph: they remain)
    replayed = [w for w in summary["what_if"] if w["kind"] not in ("schedule", "layout")]
    assert replayed == [] and any("what-if skipped: MemoryError" in w for w in failed.warnings)
    assert failed.failures == 1 and not _kept(cache)
    monkeypatch.undo()
    healthy = _analysis(run_dir, cache).summary()
    assert healthy["what_if"] and _kept(cache)
    assert _text(healthy) == _text(analyze_run(run_dir, Options(no_cache=True)).summary())


def test_no_cache_keeps_nothing(run_dir: Path, tmp_path: Path):
    a = analyze_run(run_dir, Options(no_cache=True))
    assert a.what_if_key([]) is None
    a.summary()
    assert not _kept(tmp_path)
