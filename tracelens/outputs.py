"""Rules for writing outputs: never overwrite a file tracelens did not write, unless --force."""

from __future__ import annotations

from pathlib import Path

from tracelens.errors import BadInputError

GENERATOR_MARK = '<meta name="generator" content="tracelens'


def written_by_tracelens(path: Path) -> bool:
    """True for a summary.json or report.html that tracelens wrote earlier (safe to replace)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    text = head.decode("utf-8", "replace")
    return '"schema": "tracelens.' in text or GENERATOR_MARK in text


def guard_overwrite(path: Path, force: bool) -> None:
    """Refuse to replace a user's file (anything tracelens did not write) without --force."""
    path = Path(path)
    if path.is_dir():
        raise BadInputError(f"{path} is a directory; give a file path")
    if path.exists() and not force and not written_by_tracelens(path):
        raise BadInputError(f"{path} exists and was not written by tracelens; use --force to overwrite it")
