"""The one error policy: an optional step's failure is one warning line, strict mode re-raises, user errors
always reach the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.errors import BadInputError
from tracelens.policy import contained


def test_failure_becomes_one_warning(monkeypatch):
    monkeypatch.delenv("TRACELENS_STRICT", raising=False)
    monkeypatch.delenv("TRACELENS_DEBUG", raising=False)
    warnings: list[str] = []
    assert contained("pipeline analysis skipped", lambda: 1 // 0, warnings) is None
    assert warnings == ["pipeline analysis skipped: ZeroDivisionError: integer division or modulo by zero"]
    assert contained("fine", lambda: 42, warnings) == 42 and len(warnings) == 1


@pytest.mark.parametrize("var", ["TRACELENS_STRICT", "TRACELENS_DEBUG"])
def test_strict_and_debug_reraise(monkeypatch, var):
    monkeypatch.delenv("TRACELENS_STRICT", raising=False)
    monkeypatch.setenv(var, "1")
    with pytest.raises(ZeroDivisionError):
        contained("x", lambda: 1 // 0, [])


def test_user_errors_always_propagate(monkeypatch):
    monkeypatch.delenv("TRACELENS_STRICT", raising=False)
    warnings: list[str] = []

    def bad():
        raise BadInputError("--layout tp=3: does not divide 8 ranks")

    with pytest.raises(BadInputError):
        contained("x", bad, warnings)
    assert warnings == []


SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"


@pytest.mark.parametrize(
    ("module", "name", "line"),
    [
        ("tracelens.analyze.critical.whatif", "what_if", "what-if skipped: RuntimeError: planted"),
        ("tracelens.ops_view", "ops_view", "per-op view skipped: RuntimeError: planted"),
    ],
)
def test_a_late_part_failing_is_in_the_summarys_warnings(monkeypatch, module, name, line):
    """The what-if replays and the op view are built after the rest of summary.json: a failure of theirs is
    still one line of run.warnings (it was appended after the list was copied, and lost)."""
    import importlib

    from tracelens.run_analysis import Options, analyze_run

    monkeypatch.delenv("TRACELENS_STRICT", raising=False)
    monkeypatch.delenv("TRACELENS_DEBUG", raising=False)

    def planted(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(importlib.import_module(module), name, planted)
    s = analyze_run(SAMPLE, Options(no_cache=True)).summary()
    assert line in s["run"]["warnings"]
    assert s["run"]["warnings"].count(line) == 1
    if name == "what_if":
        # the rest of the summary is there (the schedule what-ifs replay the measured pipeline, not the graph)
        assert [w for w in s["what_if"] if w["kind"] not in ("schedule", "layout")] == []
        assert s["critical_path"] is not None
    else:
        assert s["ops"] == [] and s["what_if"]
