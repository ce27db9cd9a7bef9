"""tracelens: why is my multi-GPU training run slow?

Light imports only: heavy modules load on first use.
"""

from __future__ import annotations

from tracelens._version import __version__

__all__ = ["__version__", "load", "Run", "compare", "check"]


def load(path, **kwargs):
    """Open a run folder (or a single trace file) for notebook analysis; see `tracelens.api.Run`."""
    from tracelens.api import Run

    return Run(path, **kwargs)


def compare(a, b, labels=None):
    """`tracelens compare` in Python: runs, summaries or paths -> the compare.json dict (tracelens.api)."""
    from tracelens.api import compare as _compare

    return _compare(a, b, labels)


def check(baseline, current, rules=None, strict=False, allow_setup_change=False):
    """`tracelens check` in Python: -> a CheckReport (`.exit_code`, `.results`), see tracelens.api.check."""
    from tracelens.api import check as _check

    return _check(baseline, current, rules, strict, allow_setup_change)


def __getattr__(name: str):
    if name == "Run":
        from tracelens.api import Run

        return Run
    raise AttributeError(name)
