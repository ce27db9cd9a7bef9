"""The one error policy for optional work (an analyzer, a report section) that fails on odd input.

`contained(what, fn, warnings)` runs `fn`; a failure that is not a TracelensError becomes one line in
`warnings` (the run's warnings, shown in summary.json and by the CLI) and the result is None. Strict mode
re-raises instead: `--debug` (which sets TRACELENS_DEBUG=1) or TRACELENS_STRICT=1. TracelensErrors are the
user's to see and always propagate.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from tracelens.errors import TracelensError

T = TypeVar("T")


def strict() -> bool:
    """True when failures must propagate (`--debug`, TRACELENS_DEBUG=1 or TRACELENS_STRICT=1)."""
    return os.environ.get("TRACELENS_STRICT") == "1" or os.environ.get("TRACELENS_DEBUG") == "1"


def contained(what: str, fn: Callable[[], T], warnings: list[str]) -> T | None:
    """fn(), or None with "`what`: <error>" appended to `warnings` when it fails (see the module docstring)."""
    try:
        return fn()
    except TracelensError:
        raise
    except Exception as err:
        if strict():
            raise
        warnings.append(f"{what}: {type(err).__name__}: {err}")
        return None


__all__ = ["contained", "strict"]
