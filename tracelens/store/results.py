"""Analysis results a run memo keeps beside its tables, so that a cached re-analysis does not compute them
again: the cross-rank analysis (matched collectives, clock offsets, wait / transfer split, stragglers and their
findings: `engine.kept.read_cross` converts it), ~2.2 s of a 1,024-rank re-analysis on a 2-core machine;
and the critical path's part of summary.json with the what-if (`read_tail`: the graph's replays, ~2-3 s).

A result is kept under a key of everything it was computed from (`cross_key`: the memo's identity, the
inputs the analysis derives beside it, and `cache.code_digest`, so any change of the code is another key),
one at a time per memo (`cross-<key>.json` with its tables in `cross-<key>.<table>.arrow`; the JSON, written
last, marks it whole; `whatif-<key>.json`). Tables are Arrow IPC files read back memory-mapped; the rest is
JSON written so that it reads back exactly as it was (`exact_dumps`: tuples, dicts with keys other than
strings and NumPy scalars are tagged); a result with a value it cannot promise to read back (a set, a
subclass of int or str) is not kept. A kept result that cannot be read (damaged, cut short, of another
layout) is computed again.
"""

from __future__ import annotations

import contextlib
import json
import math
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracelens.store.arrays import table_digest, text_digest
from tracelens.store.atomic import write_ipc, write_later, write_text
from tracelens.store.cache import code_digest, read_ipc

_CROSS_GLOB = "cross-*"


# -------------------------------------------------------------------------------- JSON that reads back exactly
class NotExact(TypeError):
    """A value `exact_dumps` cannot write so that it reads back the same."""


def _enc(x: Any) -> Any:
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is list:
        return [_enc(v) for v in x]
    if type(x) is tuple:
        return {"~t": [_enc(v) for v in x]}
    if type(x) is dict:
        if all(type(k) is str for k in x) and not any(k in ("~t", "~d", "~n") for k in x):
            return {k: _enc(v) for k, v in x.items()}
        return {"~d": [[_enc(k), _enc(v)] for k, v in x.items()]}
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return {"~n": [x.dtype.str, x.item()]}
    raise NotExact(f"{type(x).__name__} is not kept as JSON")


def _dec(x: Any) -> Any:
    if type(x) is list:
        return [_dec(v) for v in x]
    if type(x) is dict:
        if len(x) == 1:
            ((k, v),) = x.items()
            if k == "~t":
                return tuple(_dec(i) for i in v)
            if k == "~d":
                return {_dec(a): _dec(b) for a, b in v}
            if k == "~n":
                return np.dtype(v[0]).type(v[1])
        return {k: _dec(v) for k, v in x.items()}
    return x


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (NaN equals NaN): what a round trip must give."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
            and all(type(x) is type(y) for x, y in zip(a, b))
        )
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return bool(math.isnan(b))
    return bool(a == b)


def exact_dumps(x: Any) -> str:
    """JSON text of `x` that `exact_loads` turns back into a value `same` as `x` (tuples, dicts with other
    keys than strings and NumPy scalars tagged). Raises NotExact when that cannot be promised."""
    text = json.dumps(_enc(x), separators=(",", ":"))
    if not same(exact_loads(text), x):  # (e.g. a subclass of int or str, which JSON would not keep)
        raise NotExact("the value does not read back the same")
    return text


def exact_loads(text: str) -> Any:
    return _dec(json.loads(text))


# ------------------------------------------------------------------------------------- the cross-rank analysis
def cross_key(
    memo_id: str,
    metadata: pa.Table | None,
    breakdown: pa.Table,
    stage_of: dict[int, int] | None,
    thresholds: dict[str, float] | None = None,
) -> str:
    """Key of the cross-rank analysis of a memo's tables (`memo_id`: `Staged.memo_id`; its cross-rank events,
    rank sets and collectives) with this metadata, breakdown (steps that hung left out) and stage map, by
    this code."""
    stages = json.dumps(None if stage_of is None else sorted((int(k), int(v)) for k, v in stage_of.items()))
    parts = [code_digest(), "cross", memo_id, table_digest(metadata), table_digest(breakdown), stages]
    if thresholds:  # (verdict thresholds other than the defaults: another result)
        parts.append(json.dumps(sorted(thresholds.items())))
    return text_digest(parts)[:20]


def read_result(
    memo: Path, key: str, tables: tuple[str, ...]
) -> tuple[dict[str, pa.Table], dict[str, Any]] | None:
    """The result `write_result` kept under `key` in the run memo `memo`: (its tables `tables` by name,
    memory-mapped; what it holds beside them), or None when there is none or it cannot be read."""
    try:
        rest = exact_loads((memo / f"cross-{key}.json").read_text(encoding="utf-8"))
        got = {name: read_ipc(memo / f"cross-{key}.{name}.arrow") for name in tables}
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    if type(rest) is not dict:
        return None
    return got, rest


def _write_result(memo: Path, key: str, tables: dict[str, pa.Table], text: str) -> None:
    _remove(memo, _CROSS_GLOB, keep=f"cross-{key}.")
    for name, t in tables.items():
        write_ipc(memo / f"cross-{key}.{name}.arrow", t)
    write_text(memo / f"cross-{key}.json", text)  # (last: the mark of a whole result)


def write_result(memo: Path, key: str, tables: dict[str, pa.Table], rest: dict[str, Any]) -> None:
    """Keep a result (its Arrow tables by name, and what it holds beside them as exact JSON) in the run memo
    `memo` under `key`, in place of any kept before. OSError when the cache cannot take it; NotExact when a
    value of `rest` would not read back the same (then nothing is kept)."""
    _write_result(memo, key, tables, exact_dumps(rest))


def write_result_later(
    memo: Path, key: str, tables: dict[str, pa.Table], rest: dict[str, Any]
) -> Future[None]:
    """`write_result` with its files written in a thread of its own (the writes release the GIL while the
    analysis goes on): the future is done when they are. `rest` is taken now, as text, so that later changes
    of what it holds do not reach the files; Arrow tables do not change. A cache that cannot take them, or a
    value that JSON would change, is no error (nothing is kept); any other exception is the future's."""
    try:
        text = exact_dumps(rest)
    except NotExact:
        return _nothing_written()
    return write_later("tracelens-cross-write", lambda: _write_result(memo, key, tables, text))


# ---------------------------------------------------------------- the critical path's summary and the what-if
_TAIL_GLOB = "whatif-*"
#: What a kept tail holds: summary.json's `what_if` list and `critical_path` object, the `saving_ms` the
#: what-if set on the findings ([index, value] pairs) and the warnings their computation gave.
_TAIL_PARTS = ("what_if", "critical_path", "savings", "warnings")


def tail_key(graph_key: str, inputs: dict[str, Any]) -> str | None:
    """Key of the critical path's summary and the what-if computed on the graph kept under `graph_key`
    (`store.runs.graph_key`: all it was built from) with these other inputs (the findings as they are before
    the what-if, and the rest of what it reads), by this code; None when the inputs cannot be written exactly
    (nothing is kept then)."""
    try:
        text = exact_dumps(inputs)
    except NotExact:
        return None
    return text_digest([code_digest(), "whatif", graph_key, text])[:20]


def read_tail(memo: Path, key: str, findings: int | None = None) -> dict[str, Any] | None:
    """What `write_tail_later` kept under `key` in the run memo `memo` (a dict of `_TAIL_PARTS`), or None
    when there is none, it cannot be read, or (`findings`: how many findings it was kept for) its savings
    name a finding there is not."""
    try:
        kept = exact_loads((memo / f"whatif-{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if type(kept) is not dict or tuple(kept) != _TAIL_PARTS:
        return None
    if type(kept["what_if"]) is not list or type(kept["warnings"]) is not list:
        return None
    if not all(type(w) is str for w in kept["warnings"]) or type(kept["critical_path"]) not in (
        dict,
        type(None),
    ):
        return None
    savings = kept["savings"]
    if type(savings) is not list or not all(
        type(p) is list and len(p) == 2 and type(p[0]) is int for p in savings
    ):
        return None
    if findings is not None and not all(0 <= p[0] < findings for p in savings):
        return None
    return kept


def write_tail_later(memo: Path, key: str, tail: dict[str, Any]) -> Future[None]:
    """Keep `tail` (a dict of `_TAIL_PARTS`) in the run memo `memo` under `key`, in place of any kept before,
    written in a thread of its own; its text is taken now. A cache that cannot take it, or a value JSON would
    change, is no error (it is computed again next time)."""
    try:
        if tuple(tail) != _TAIL_PARTS:
            raise NotExact(f"a kept tail holds {', '.join(_TAIL_PARTS)}")
        text = exact_dumps(tail)
    except NotExact:
        return _nothing_written()

    def write() -> None:
        _remove(memo, _TAIL_GLOB, keep=f"whatif-{key}.")
        write_text(memo / f"whatif-{key}.json", text)

    return write_later("tracelens-whatif-write", write)


def _nothing_written() -> Future[None]:
    done: Future[None] = Future()
    done.set_result(None)
    return done


def _remove(memo: Path, pattern: str, keep: str) -> None:
    for p in memo.glob(pattern):
        if not p.name.startswith(keep):
            with contextlib.suppress(OSError):
                p.unlink()


__all__ = [
    "NotExact",
    "cross_key",
    "exact_dumps",
    "exact_loads",
    "read_result",
    "read_tail",
    "same",
    "tail_key",
    "write_result",
    "write_result_later",
    "write_tail_later",
]
