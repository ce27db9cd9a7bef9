"""Shape check of a summary.json read back (a baseline for `check`, a side of `compare`).

A file that says `"schema": "tracelens.summary/1"` but lacks the run, or holds values of the wrong JSON type
(`mfu.value` a string, `stragglers[].rank` a list), is a BadInputError naming the field, not a crash later in
the comparison. Nulls are always allowed (unknown values are null).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracelens.errors import BadInputError

#: The summary.json format this tracelens writes and reads (its `schema` field).
SCHEMA = "tracelens.summary/1"

_NUM = "number"
_INT = "integer"
_STR = "string"
_LIST = "list"
_DICT = "object"

_RANK_FIELDS = {
    "rank": _INT,
    "stage": _INT,
    "steps": _INT,
    **{
        f: _NUM
        for f in (
            "step_time_ms",
            "compute_ms",
            "exposed_comm_ms",
            "exposed_wait_ms",
            "exposed_transfer_ms",
            "overlapped_comm_ms",
            "memcpy_ms",
            "idle_ms",
            "bubble_ms",
        )
    },
}
_PER_STEP_FIELDS = {**_RANK_FIELDS, "step": _INT}
_STRAGGLER_FIELDS = {"rank": _INT, "cause": _STR, "steps_flagged": _INT, "steps_total": _INT, "score": _NUM}
_MFU_FIELDS = {
    "value": _NUM,
    "hfu": _NUM,
    "flops_per_token": _NUM,
    "tokens_per_step": _NUM,
    "peak_flops_per_gpu": _NUM,
    "convention": _STR,
}
_FINDING_FIELDS = {"code": _STR, "severity": _STR, "message": _STR, "ranks": _LIST, "stages": _LIST}
_STAGE_FIELDS = {
    "stage": _INT,
    "ranks": _LIST,
    "compute_ms": _NUM,
    "bubble_ms": _NUM,
    "bubble_fraction": _NUM,
}
_RUN_FIELDS = {"name": _STR, "world_size": _INT, "ranks": _LIST, "steps": _LIST, "warnings": _LIST}


def _is(v: Any, kind: str) -> bool:
    if v is None:
        return True
    if kind == _NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _LIST:
        return isinstance(v, list)
    return isinstance(v, dict)


def _fields(obj: Any, spec: dict[str, str], where: str, label: str) -> None:
    if not isinstance(obj, dict):
        raise BadInputError(f"{label}: summary field {where} must be an object")
    for k, kind in spec.items():
        if not _is(obj.get(k), kind):
            raise BadInputError(
                f"{label}: summary field {where}.{k} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind} or "
                f"null, not {type(obj.get(k)).__name__}"
            )


def _items(data: dict, key: str, spec: dict[str, str], label: str) -> None:
    v = data.get(key)
    if v is None:
        return
    if not isinstance(v, list):
        raise BadInputError(f"{label}: summary field {key} must be a list")
    for i, item in enumerate(v):
        _fields(item, spec, f"{key}[{i}]", label)


def check_shape(data: dict, label: str) -> None:
    """Raise BadInputError unless the summary has a run and every field tracelens reads has its type."""
    missing = [k for k in ("run", "ranks") if k not in data]
    if missing:
        raise BadInputError(
            f"{label}: not a complete tracelens summary (no {' or '.join(repr(k) for k in missing)})"
        )
    _fields(data["run"], _RUN_FIELDS, "run", label)
    for key, spec in (
        ("ranks", _RANK_FIELDS),
        ("per_step", _PER_STEP_FIELDS),
        ("stragglers", _STRAGGLER_FIELDS),
        ("findings", _FINDING_FIELDS),
        ("stages", _STAGE_FIELDS),
    ):
        _items(data, key, spec, label)
    if data.get("mfu") is not None:
        _fields(data["mfu"], _MFU_FIELDS, "mfu", label)
    for i, f in enumerate(data.get("findings") or []):
        if any(not _is(r, _INT) or r is None for r in f.get("ranks") or []):
            raise BadInputError(f"{label}: summary field findings[{i}].ranks must hold integers")
    for i, r in enumerate(data.get("stragglers") or []):
        if r.get("rank") is None:
            raise BadInputError(f"{label}: summary field stragglers[{i}].rank must be an integer")


def load_summary(path: str | Path) -> dict:
    """Read and validate a summary.json written by tracelens (the one loader: check, compare, the API)."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such file")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise BadInputError(f"{path}: not a JSON summary ({err.__class__.__name__})") from err
    validate_summary(data, str(path))
    return data


def validate_summary(data: Any, label: str) -> None:
    """Raise BadInputError unless `data` is a `tracelens.summary/1` document (the one validator)."""
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("tracelens.summary/"):
        raise BadInputError(f"{label}: not a tracelens summary (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise BadInputError(f"{label}: unsupported summary schema {data['schema']!r} (expected {SCHEMA!r})")
    for key, kind in (("run", dict), ("ranks", list)):
        if key in data and data[key] is not None and not isinstance(data[key], kind):
            raise BadInputError(f"{label}: summary field {key!r} must be a {kind.__name__}")
    per_step = data.get("per_step")
    if per_step is not None and not (
        isinstance(per_step, list) and all(isinstance(r, dict) for r in per_step)
    ):
        raise BadInputError(f"{label}: summary field 'per_step' must be a list of objects")
    check_shape(data, label)
