"""Rules for writing outputs: never overwrite a file tracelens did not write, unless --force."""

from __future__ import annotations

import os
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


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def check_writable(path: Path) -> None:
    """Before any analysis: `path` can be written. Its folder is created (as the write would) and a probe
    file is created and removed in it, so permissions, read-only mounts and a file in the way are found
    before minutes of analysis, not after."""
    path = Path(path)
    if path.is_dir():
        raise BadInputError(f"{path} is a directory; give a file path")
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise BadInputError(f"cannot write {path}: {anc} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
            with open(probe, "xb"):
                pass
            probe.unlink()
    except OSError as err:
        raise BadInputError(f"cannot write {path}: {err.strerror or err}") from None


def guard_outputs(outputs: list[Path], inputs: list[Path | None], force: bool = False) -> None:
    """Before any analysis: no output is one of the command's inputs (never, even with --force), an output
    that would replace an existing file inside an input folder (a stored report used as a baseline) needs
    --force, and every output can be written (check_writable)."""
    ins = [Path(p) for p in inputs if p is not None]
    for out in outputs:
        out = Path(out)
        for inp in ins:
            if not inp.exists():
                continue
            if inp.is_file() and out.exists() and _same_file(out, inp):
                raise BadInputError(f"{out} is an input of this command; write the output elsewhere")
            if inp.is_dir() and out.exists() and not force and _inside(out, inp):
                raise BadInputError(
                    f"{out} is inside the input folder {inp} and would be replaced; "
                    "write the output elsewhere or use --force"
                )
        check_writable(out)
