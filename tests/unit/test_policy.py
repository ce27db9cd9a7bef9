"""The one error policy: an optional step's failure is one warning line, strict mode re-raises, user errors
always reach the user."""

from __future__ import annotations

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
