"""The cross-rank analysis kept in the run memo (store.results): JSON that reads back exactly, a kept result
that is the computed one field by field, a warm analysis that reads it instead of computing it and gives the
summary an uncached analysis gives, another key for another input, a damaged result computed again."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.comm import stragglers
from tracelens.engine import kept as engine_kept
from tracelens.run_analysis import Analysis, Options, analyze_run
from tracelens.store import results


# ------------------------------------------------------------------------------------------------ exact JSON
@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "b": 1.0, "c": None, "d": True, "e": "x", "f": [1, [2.5, "y"]]},
        {0: 5, 1: -65, 17: 8},  # int keys (a rank map)
        {"t": (1, 2, (3, "z")), (1, 2): "tuple key", 3.5: "float key", None: 0, True: "bool key"},
        [np.int64(3), np.float32(1.5), np.bool_(True), np.int32(-2), {np.int16(4): np.float64(2.25)}],
        {"~t": 1, "~d": [1], "~n": "x"},  # (keys that look like the tags)
        [float("nan"), float("inf"), -float("inf"), 1e-300, 2**70],
        [],
        {},
    ],
)
def test_exact_json_reads_back_the_same_types(value):
    back = results.exact_loads(results.exact_dumps(value))
    assert results.same(back, value)
    assert repr(back) == repr(value) or any(isinstance(v, float) and math.isnan(v) for v in value)


def test_same_tells_types_apart():
    assert not results.same(1, 1.0) and not results.same(True, 1) and not results.same((1,), [1])
    assert not results.same({1: 0}, {"1": 0}) and not results.same(np.int64(1), 1)
    assert not results.same({"a": 1, "b": 2}, {"b": 2, "a": 1})  # (order is part of a summary's text)
    assert results.same([float("nan")], [float("nan")]) and not results.same([float("nan")], [1.0])


@pytest.mark.parametrize("value", [{1, 2}, {"x": object()}, b"bytes", [np.array([1, 2])], {"e": 1 + 2j}])
def test_values_json_would_change_are_refused(value):
    with pytest.raises(results.NotExact):
        results.exact_dumps(value)


def test_subclasses_are_refused():
    class Code(str):
        pass

    with pytest.raises(results.NotExact):
        results.exact_dumps({"code": Code("X")})


# ------------------------------------------------------------------------------------- the kept cross result
@pytest.fixture()
def run_dir(straggler_run: Path) -> Path:
    return straggler_run


def _summary(a: Analysis) -> str:
    return json.dumps(a.summary(), sort_keys=True, default=str)


def _kept(cache: Path) -> list[Path]:
    return sorted(cache.rglob("cross-*.json"))


def _calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    compute = stragglers.analyze_cross_rank

    def counted(*a, **k):
        calls.append(1)
        return compute(*a, **k)

    monkeypatch.setattr(stragglers, "analyze_cross_rank", counted)
    return calls


def _same_result(a: stragglers.CrossRankResult, b: stragglers.CrossRankResult) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("collectives", "exposed_split", "arrival_lag"):
            assert x.schema.equals(y.schema, check_metadata=True) and x.equals(y), f.name
        elif f.name == "clock":
            assert dataclasses.asdict(x) == dataclasses.asdict(y)
            assert results.same(dataclasses.asdict(x), dataclasses.asdict(y))
        else:
            assert results.same(x, y), f.name


def test_warm_analysis_reads_the_kept_cross_result(run_dir: Path, tmp_path: Path, monkeypatch):
    plain = analyze_run(run_dir, Options(no_cache=True))
    plain_text = _summary(plain)
    cache = tmp_path / "cache"
    calls = _calls(monkeypatch)
    cold = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(cold) == plain_text and len(calls) == 1
    (kept,) = _kept(cache)
    assert kept.parent == cold.run.stages.memo
    warm = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert warm.cross is not None and len(calls) == 1  # (read, not computed)
    fresh = analyze_run(run_dir, Options(no_cache=True)).cross
    assert fresh is not None and fresh.stragglers and fresh.clock is not None
    assert {f["code"] for f in fresh.findings} == {"CLOCK_SKEW", "STRAGGLER"} and any(
        fresh.offsets_ns.values()
    )
    _same_result(warm.cross, fresh)
    assert _summary(warm) == plain_text and not warm.warnings
    # the critical path's graph, keyed by the cross-rank result's key, is read too
    assert warm.summary()["critical_path"] == plain.summary()["critical_path"]
    # another stage map (another layout), another key: computed, and kept in place of the first
    other = analyze_run(run_dir, Options(cache_dir=str(cache), layout="tp=2,pp=4,dp=1", force_layout=True))
    assert _summary(other) == _summary(
        analyze_run(run_dir, Options(no_cache=True, layout="tp=2,pp=4,dp=1", force_layout=True))
    )
    assert len(calls) == 4 and len(_kept(cache)) == 1 and _kept(cache) != [kept]


@pytest.mark.parametrize("damage", ["json", "table", "gone"])
def test_damaged_cross_result_is_computed_again(run_dir: Path, tmp_path: Path, monkeypatch, damage: str):
    cache = tmp_path / "cache"
    first = _summary(analyze_run(run_dir, Options(cache_dir=str(cache))))
    (kept,) = _kept(cache)
    table = kept.with_name(kept.stem + ".collectives.arrow")
    if damage == "json":
        kept.write_text(kept.read_text()[:-20])
    elif damage == "table":
        table.write_bytes(table.read_bytes()[:200])
    else:
        table.unlink()
    calls = _calls(monkeypatch)
    again = analyze_run(run_dir, Options(cache_dir=str(cache)))
    assert _summary(again) == first and len(calls) == 1 and not again.warnings
    assert engine_kept.read_cross(kept.parent, kept.stem[len("cross-") :]) is not None  # (kept again, whole)


def test_what_if_changes_to_findings_do_not_reach_the_kept_result(run_dir: Path, tmp_path: Path):
    """The what-if sets `saving_ms` on findings, the cross-rank ones included, while the result is written:
    what is kept is the result as computed."""
    cache = tmp_path / "cache"
    a = analyze_run(run_dir, Options(cache_dir=str(cache)))
    computed = json.loads(json.dumps(a.cross.findings))
    a.summary()
    (kept,) = _kept(cache)
    back = engine_kept.read_cross(kept.parent, kept.stem[len("cross-") :])
    assert back is not None and back.findings == computed


def test_a_result_json_would_change_is_not_kept(run_dir: Path, tmp_path: Path, monkeypatch):
    compute = stragglers.analyze_cross_rank

    def odd(*a, **k):
        res = compute(*a, **k)
        res.stragglers.append({"set": {1, 2}})
        return res

    monkeypatch.setattr(stragglers, "analyze_cross_rank", odd)
    a = analyze_run(run_dir, Options(cache_dir=str(tmp_path / "cache")))
    assert a.cross is not None
    a.wait_writes()
    assert not a.warnings and not _kept(tmp_path / "cache")
