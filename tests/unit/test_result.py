"""The typed result (tracelens.result): summary.json is its serialisation, the round trip gives the same
document byte for byte, and it cannot be changed once built."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tracelens.errors import BadInputError
from tracelens.result import SECTIONS, Finding, Result, freeze, thaw
from tracelens.run_analysis import Options, analyze_run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def analysed():
    run = SAMPLES / "cpu-gloo-4rank"
    if not run.is_dir():
        pytest.skip(f"bundled sample absent: {run}")
    return analyze_run(run, Options(no_cache=True))


def test_sections_are_the_result_fields_in_document_order():
    names = [f.name for f in dataclasses.fields(Result) if f.name != "tracelens_version"]
    assert sorted(names) == sorted(SECTIONS)


def test_round_trip_of_a_real_analysis_is_byte_identical(analysed):
    result = analysed.result()
    doc = result.to_json()
    assert list(doc)[:3] == ["schema", "tracelens_version", "run"]
    back = Result.from_json(json.loads(result.to_bytes()))
    assert back.to_bytes() == result.to_bytes()
    assert back == Result.from_json(doc)  # (frozen values compare by content)
    # the findings are typed: the same codes and numbers as the document's
    assert [f.code for f in result.findings] == [f["code"] for f in doc["findings"]]
    assert all(isinstance(f, Finding) for f in back.findings)


def test_result_cannot_be_changed(analysed):
    result = analysed.result()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.run = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        result.run["name"] = "x"  # type: ignore[index]
    if result.ranks:
        with pytest.raises(TypeError):
            result.ranks[0]["step_time_ms"] = 0.0  # type: ignore[index]
    # a document taken from it is a copy: changing it leaves the result as it was
    doc = result.to_json()
    doc["run"]["name"] = "changed"
    assert result.run["name"] != "changed"


def test_finding_keeps_its_numbers_in_order():
    d = {"code": "STRAGGLER", "severity": "warning", "message": "m", "ranks": [3], "stages": [],
         "threshold": 0.1, "saving_ms": 2.5}  # fmt: skip
    f = Finding.from_json(d)
    assert f.get("saving_ms") == 2.5 and f.get("absent") is None
    assert f.to_json() == d and list(f.to_json()) == list(d)


def test_freeze_and_thaw_are_inverse():
    x = {"a": [1, {"b": [2.5, None]}], "c": "t"}
    assert thaw(freeze(x)) == x


def test_a_document_of_another_format_is_refused():
    with pytest.raises(BadInputError):
        Result.from_json({"schema": "tracelens.summary/0"})


def test_notebook_result_is_the_summary_typed():
    run_dir = SAMPLES / "cpu-gloo-4rank"
    if not run_dir.is_dir():
        pytest.skip(f"bundled sample absent: {run_dir}")
    import tracelens

    run = tracelens.load(run_dir, no_cache=True)
    result = run.result()
    assert run.result() is result and result.to_json() == run.summary()
    assert [f.code for f in result.findings] == [f["code"] for f in run.summary()["findings"]]
