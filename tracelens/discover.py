"""Find the trace files of a run and the rank of each.

A run is a folder (searched recursively; hidden folders such as `.tracelens/` are skipped) or a single file.
Formats are recognised by content (`ingest.sniff.detect_format`), never by name. The rank of a Kineto trace
comes from `distributedInfo.rank`, else from its file name (`rank-3`, `rank_3`, `rank3`), else it is an error
naming the file, except in a run of a single Kineto trace, which is rank 0.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from tracelens.errors import BadInputError, BadTraceError, NoTracesError, RankError
from tracelens.ingest import kineto
from tracelens.ingest.sniff import KINETO, detect_format

#: Folder names never searched (the cache and hidden folders are skipped as well).
SKIP_DIRS = {"__pycache__", "node_modules"}


@dataclass(frozen=True)
class TraceFile:
    """One input file of a run. `rank`/`world_size` are None when unknown (non-Kineto formats may be)."""

    path: Path
    rank: int | None
    world_size: int | None
    fmt: str
    size: int
    mtime: float
    #: where the rank came from: "distributedInfo", "filename", "default" (single-trace run) or None
    rank_source: str | None = None


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
        base = Path(dirpath)  # (parsed once per folder, not per file)
        out += [base / f for f in sorted(filenames) if not f.startswith(".")]
    return out


def parse_rank_filter(text: str | Iterable[int] | None) -> frozenset[int] | None:
    """Ranks chosen by a `--rank-filter` text such as "0-7,12" (ranges inclusive); None means all ranks."""
    if text is None:
        return None
    if not isinstance(text, str):
        return frozenset(int(r) for r in text)
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise BadInputError(f"--rank-filter {text!r}: expected ranks and ranges such as 0-7,12")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise BadInputError(f"--rank-filter {text!r}: range {part} is empty")
        if hi - lo > 1_000_000:
            raise BadInputError(f"--rank-filter {text!r}: range {part} is too large")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _corrupt_gzip(p: Path) -> bool:
    """A file with gzip magic whose first bytes do not decompress (a damaged trace, not some other file)."""
    try:
        with open(p, "rb") as fh:
            raw = fh.read(65536)
    except OSError:
        return False
    if raw[:2] != b"\x1f\x8b":
        return False
    try:
        zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, 1024)
    except zlib.error:
        return True
    return False


def _memo_key(p: Path, st: os.stat_result) -> str:
    """One version of a file: path, inode, size, mtime and ctime (a same-size edit whose mtime is put back
    with `touch -r` still moves the ctime)."""
    from tracelens.store.cache import real_path

    return f"{real_path(p)}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def discover(
    path: str | Path, ranks: str | Iterable[int] | None = None, memo: dict | None = None
) -> list[TraceFile]:
    """Trace files of the run at `path` (folder or file): Kineto files sorted by rank, then other formats.

    `ranks` (a set, or a `--rank-filter` text such as "0-7,12") keeps only those Kineto ranks (and rank-named
    files of other formats), before duplicates and world sizes are checked: the way to pick one run's ranks
    out of a mixed folder. Raises BadInputError (no such path, bad filter, filter matching nothing),
    BadTraceError (a single file given directly that is not a trace, with the reason; a corrupt gzip file),
    NoTracesError (nothing recognised) and RankError (a Kineto trace without rank in a multi-trace run, two
    traces with the same rank, or traces whose world sizes disagree).

    `memo` (a dict the caller keeps, e.g. beside the cache) remembers what the file contents said
    (format; rank and world size of Kineto files) per (path, size, mtime): an unchanged file is not opened
    again. Entries are added for files read.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise BadInputError(f"{root}: no such file or folder")
    if not root.is_dir() and not root.is_file():
        raise BadInputError(f"{root}: not a regular file or folder")
    chosen = parse_rank_filter(ranks)
    single_file = root.is_file()
    candidates = [root] if single_file else _walk(root)
    found: list[tuple[Path, str, os.stat_result]] = []
    keys: dict[Path, str] = {}  # each file's memo key, made once (it resolves the file's real path)
    for p in candidates:
        try:
            st = p.stat()
        except OSError:
            continue
        if single_file and st.st_size == 0:
            raise BadTraceError(f"{p}: empty file")
        if st.st_size == 0 or not stat.S_ISREG(st.st_mode):  # (p.is_file() would stat it again)
            continue
        key = keys[p] = _memo_key(p, st) if memo is not None else ""
        known = memo.get(key) if memo is not None else None
        if isinstance(known, list) and len(known) == 4:
            if known[0] is not None:
                found.append((p, known[0], st))
            continue
        fmt = detect_format(p)
        if memo is not None and fmt is not None and fmt != KINETO:
            memo[key] = [fmt, None, None, None]
        if fmt is None and _corrupt_gzip(p):
            raise BadTraceError(f"{p}: corrupt gzip data (not a readable trace)")
        if fmt is None and single_file:
            fmt = KINETO  # given by name: read it as Kineto, whose reader says precisely what is wrong
        if fmt is not None:
            found.append((p, fmt, st))
    if not found:
        where = "file" if root.is_file() else "folder"
        raise NoTracesError(
            f"{root}: no trace files found in this {where} (Kineto JSON, Flight Recorder, NCCL)"
        )

    kin = [(p, st) for p, fmt, st in found if fmt == KINETO]
    single = len(kin) == 1
    out: list[TraceFile] = []
    for p, st in kin:
        known = memo.get(keys[p]) if memo is not None else None
        if isinstance(known, list) and len(known) == 4 and known[0] == KINETO:
            info = {"rank": known[1], "world_size": known[2]}
        else:
            info = kineto.peek(p)
            # (a file given by name that its content does not show to be a trace is read as one for this
            # call only: the memo keeps what the content says)
            if memo is not None and not (single_file and detect_format(p) != KINETO):
                memo[keys[p]] = [KINETO, info["rank"], info["world_size"], None]
        rank, source = info["rank"], "distributedInfo"
        if rank is None:
            rank, source = kineto.rank_from_name(p), "filename"
        if rank is None:
            if not single:
                raise RankError(
                    f"{p}: no rank in distributedInfo or file name; rename it with its rank "
                    "(e.g. rank3.json) or analyze it on its own"
                )
            rank, source = 0, "default"
        out.append(TraceFile(p, int(rank), info["world_size"], KINETO, st.st_size, st.st_mtime, source))
    if chosen is not None:
        kept = [t for t in out if t.rank in chosen]
        if out and not kept:
            # every Kineto file has a rank (the default 0 at least)
            have = ", ".join(str(t.rank) for t in sorted(out, key=lambda t: cast(int, t.rank))[:16])
            raise BadInputError(f"{root}: --rank-filter keeps none of the Kineto ranks found ({have})")
        out = kept
    _check_ranks(out)
    others = []
    for p, fmt, st in found:
        if fmt != KINETO:
            r = kineto.rank_from_name(p)
            if chosen is not None and r is not None and r not in chosen:
                continue
            others.append(
                TraceFile(p, r, None, fmt, st.st_size, st.st_mtime, None if r is None else "filename")
            )
    out.sort(key=lambda t: (t.rank, str(t.path)))
    others.sort(key=lambda t: (t.fmt, -1 if t.rank is None else t.rank, str(t.path)))
    return out + others


def _check_ranks(files: list[TraceFile]) -> None:
    by_rank: dict[int, TraceFile] = {}
    for t in files:
        assert t.rank is not None
        if t.rank in by_rank:
            raise RankError(f"rank {t.rank} appears twice: {by_rank[t.rank].path} and {t.path}")
        by_rank[t.rank] = t
    sized = [t for t in files if t.world_size is not None]
    sizes = {t.world_size for t in sized}
    if len(sizes) > 1:
        a = sized[0]
        b = next(t for t in sized if t.world_size != a.world_size)
        raise RankError(
            f"world sizes disagree: {a.path} says {a.world_size}, {b.path} says {b.world_size} "
            "(traces of different runs in one folder?)"
        )
    if sizes:
        ws = cast(int, sizes.pop())  # `sized` holds no None
        bad = [t for t in files if t.rank is not None and not 0 <= t.rank < ws]
        if bad:
            raise RankError(f"{bad[0].path}: rank {bad[0].rank} is outside world size {ws}")


def left_out(path: str | Path, files: Iterable[TraceFile]) -> list[str]:
    """Why files of a run folder that discovery did not take were left out, when a user would want to
    know: a file that cannot be read (permissions, a dangling link) or one that tracelens wrote itself (an
    exported trace saved in the run folder). Only the files not taken are looked at."""
    from tracelens.ingest.sniff import own_output, read_head

    root = Path(path).expanduser()
    if not root.is_dir():
        return []
    taken = {Path(f.path) for f in files}
    out = []
    for p in _walk(root):
        if p in taken:
            continue
        try:
            if p.stat().st_size == 0:
                continue
            head = read_head(p, 4096)
        except OSError as err:
            out.append(f"left out {p}: cannot read ({err.strerror or err})")
            continue
        if own_output(head):
            out.append(f"left out {p}: written by tracelens (an output, not a trace)")
    return out


__all__ = ["TraceFile", "discover", "left_out", "parse_rank_filter"]
