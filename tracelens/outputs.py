"""Rules for writing outputs: nothing tracelens reads is ever written over or written into (an input file,
a file inside an input folder, or a file an input folder links to), with or without --force; any other file
tracelens did not write is replaced only with --force (docs/bad-input.md, "Outputs and summaries")."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Sequence
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
    if head[:2] == b"\x1f\x8b":  # a gzip output (`report export-trace -o merged.json.gz`)
        import zlib

        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4096)
        except zlib.error:
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


def _files_under(folder: Path) -> set[tuple[int, int]]:
    """(device, inode) of every regular file under `folder`, links followed (what discovery may read)."""
    out: set[tuple[int, int]] = set()
    for root, _dirs, files in os.walk(folder, followlinks=False):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            out.add((st.st_dev, st.st_ino))
    return out


def _is_input(out: Path, inputs: list[Path]) -> str | None:
    """Why writing `out` would destroy or change an input, or None."""
    for inp in inputs:
        if not inp.exists():
            continue
        if inp.is_dir():
            if _inside(out, inp):
                return f"{out} is inside the input folder {inp}; write the output elsewhere"
        elif out.exists() and _same_file(out, inp):
            return f"{out} is an input of this command; write the output elsewhere"
    if out.exists() and not out.is_dir():
        try:
            st = os.stat(out)
        except OSError:
            return None
        for inp in inputs:
            if inp.is_dir() and (st.st_dev, st.st_ino) in _files_under(inp):
                return (
                    f"{out} is a file in the input folder {inp} (through a link); write the output elsewhere"
                )
    return None


def guard_outputs(outputs: Sequence[Path], inputs: Sequence[Path | None], force: bool = False) -> None:
    """Before any analysis: no output is one of the command's inputs, inside an input folder, or a file an
    input folder holds through a link (never, --force or not: the user's traces are not written over or
    into); an existing file tracelens did not write is replaced only with `force` (guard_overwrite); every
    output can be written (check_writable)."""
    ins = [Path(p) for p in inputs if p is not None]
    for out in outputs:
        out = Path(out)
        why = _is_input(out, ins)
        if why:
            raise BadInputError(why)
    for out in outputs:
        guard_overwrite(Path(out), force)
        check_writable(Path(out))


def default_out_dir(name: str, inputs: Sequence[Path]) -> Path:
    """The default output folder `reports/<name>`: under the current folder, or, when that is inside an input
    folder (`cd RUN && tracelens analyze .`), beside the outermost such input folder (`RUN/../reports/<name>`),
    so that nothing is written into the input."""
    ins = [Path(p) for p in inputs if Path(p).is_dir()]
    first = Path("reports") / name
    holders = [i for i in ins if _inside(first, i)]
    if not holders:
        return first
    outer = min((i.resolve() for i in holders), key=lambda p: len(p.parts))
    alt = outer.parent / "reports" / name
    if any(_inside(alt, i) for i in ins) or outer.parent == outer:
        raise BadInputError(
            f"the default output folder {first} is inside the input folder {holders[0]}; give one with -o"
        )
    return alt


def write_outputs(writes: Sequence[tuple[Path, Callable[[Path], object]]]) -> None:
    """Write a command's outputs together: each `fn(tmp)` fills a temporary file beside its `dest`, and only
    when all are written are they renamed into place. A write that fails (a full disk, a quota) replaces
    none of them, leaves no temporary file and is a one-line error (BadInputError, exit 2)."""
    tmps: list[tuple[Path, Path]] = []
    dest = writes[0][0] if writes else Path()
    try:
        for dest, fn in writes:
            dest = Path(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
            tmps.append((tmp, dest))
            fn(tmp)
        for tmp, dest in tmps:
            os.replace(tmp, dest)
    except OSError as err:
        raise BadInputError(f"cannot write {dest}: {err.strerror or _reason(err)}") from None
    finally:
        for tmp, _ in tmps:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _reason(err: OSError) -> str:
    text = str(err)
    for known in ("No space left on device", "Disk quota exceeded"):
        if known in text:
            return known
    return text
