"""tracelens: why is my multi-GPU training run slow?

Light imports only: heavy modules load on first use.
"""

from __future__ import annotations

from tracelens._version import __version__

__all__ = ["__version__", "load", "Run"]


def load(path, **kwargs):
    """Open a run folder (or a single trace file) for notebook analysis; see `tracelens.api.Run`."""
    from tracelens.api import Run

    return Run(path, **kwargs)


def __getattr__(name: str):
    if name == "Run":
        from tracelens.api import Run

        return Run
    raise AttributeError(name)
