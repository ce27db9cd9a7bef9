"""Command-line interface (Typer). Thin: parses options, calls the library, prints, maps errors to exit codes.

Exit codes: 0 success, 1 regression found (`check`), 2 bad input (any TracelensError). The app itself is
in `tracelens._app`; each sub-command lives in tracelens/commands/<name>.py and registers on it when imported
here (the commands never import this module).
"""

from __future__ import annotations

from tracelens._app import app, main
from tracelens.commands import analyze as _analyze  # noqa: F401
from tracelens.commands import audit_layout as _audit_layout  # noqa: F401
from tracelens.commands import check as _check  # noqa: F401
from tracelens.commands import compare as _compare  # noqa: F401
from tracelens.commands import ingest as _ingest  # noqa: F401
from tracelens.commands import report as _report  # noqa: F401
from tracelens.commands import simulate as _simulate  # noqa: F401

__all__ = ["app", "main"]
