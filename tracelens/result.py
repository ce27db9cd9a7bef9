"""The one result of an analysis, typed and immutable; summary.json is its serialisation.

`Result` holds what `tracelens analyze` reports of a run, section by section (docs/summary.md names every
field); `Finding` is one finding. Both are frozen, and every nested JSON object or list in them is read-only
(`types.MappingProxyType`, tuples), so a renderer cannot change what another one reads. `Result.to_json()`
is the summary.json document (the keys in their documented order), `Result.from_json(doc)` reads one back
after checking it against the format (`summary_check.validate_summary`): the round trip gives the same
document. The format's version is `summary_check.SCHEMA`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tracelens.summary_check import SCHEMA, validate_summary

#: A JSON value of summary.json, read-only: None, bool, int, float, str, a tuple of JSON values or a mapping
#: of str to JSON values (NumPy scalars are kept as they are until the document is written).
JSON = Any
Object = Mapping[str, JSON]


def freeze(x: JSON) -> JSON:
    """`x` with every dict made a read-only mapping and every list a tuple, all the way down."""
    if isinstance(x, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple(freeze(v) for v in x)
    return x


def thaw(x: JSON) -> JSON:
    """The plain JSON document of a frozen value: dicts and lists again, keys in the same order."""
    if isinstance(x, Mapping):
        return {k: thaw(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [thaw(v) for v in x]
    return x


#: The keys every finding has, in their order in summary.json; the numbers backing the message follow them.
FINDING_KEYS = ("code", "severity", "message", "ranks", "stages")


@dataclass(frozen=True)
class Finding:
    """One finding (docs/summary.md, "Findings"): its code and severity, a one-line message, the ranks and
    stages it names, and the numbers backing it (`numbers`: name -> value, in order; `saving_ms` among them
    when the what-if replayed its fix)."""

    code: str
    severity: str
    message: str
    ranks: tuple[int, ...] = ()
    stages: tuple[int, ...] = ()
    numbers: Object = field(default_factory=lambda: MappingProxyType({}))

    def get(self, name: str, default: JSON = None) -> JSON:
        """One of the numbers backing the finding (`threshold`, `saving_ms`...), or `default`."""
        return self.numbers.get(name, default)

    def to_json(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "ranks": list(self.ranks),
            "stages": list(self.stages),
        }
        out.update(thaw(self.numbers))
        return out

    @classmethod
    def from_json(cls, d: Object) -> Finding:
        return cls(
            code=str(d["code"]),
            severity=str(d["severity"]),
            message=str(d["message"]),
            ranks=tuple(int(r) for r in d.get("ranks") or ()),
            stages=tuple(int(s) for s in d.get("stages") or ()),
            numbers=freeze({k: v for k, v in d.items() if k not in FINDING_KEYS}),
        )


@dataclass(frozen=True)
class Result:
    """What an analysis found, section by section, in summary.json's order (docs/summary.md). `inference`
    and `compat` are present only for inference traces and `--compat hta`."""

    run: Object
    ranks: tuple[Object, ...]
    stages: tuple[Object, ...]
    stragglers: tuple[Object, ...]
    mfu: Object | None
    findings: tuple[Finding, ...]
    per_step: tuple[Object, ...]
    headlines: tuple[str, ...]
    composition: Object | None
    pipeline: Object | None
    clock: Object | None
    collectives: Object
    audit: Object | None
    ops: tuple[Object, ...]
    op_totals: tuple[Object, ...]
    what_if: tuple[Object, ...]
    critical_path: Object | None
    losses: tuple[Object, ...]
    inference: Object | None = None
    compat: Object | None = None
    tracelens_version: str = ""

    @property
    def warnings(self) -> tuple[str, ...]:
        """The run's warnings: what could not be analyzed or was left out, one line each."""
        return tuple(self.run.get("warnings") or ())

    def to_bytes(self) -> bytes:
        """summary.json's text (`summary_bytes` of `to_json()`)."""
        return summary_bytes(self.to_json())

    def to_json(self) -> dict[str, JSON]:
        """The summary.json document (plain dicts and lists, keys in the documented order)."""
        out: dict[str, JSON] = {"schema": SCHEMA, "tracelens_version": self.tracelens_version}
        for name in SECTIONS:
            value = getattr(self, name)
            if name in _OPTIONAL and value is None:
                continue
            if name == "findings":
                out[name] = [f.to_json() for f in value]
            else:
                out[name] = thaw(value)
        return out

    @classmethod
    def from_json(cls, doc: Object, label: str = "summary") -> Result:
        """The result a summary.json document holds. BadInputError when it is not a document of this format."""
        validate_summary(doc, label)
        kw: dict[str, JSON] = {}
        for name in SECTIONS:
            value = doc.get(name)
            if name == "findings":
                kw[name] = tuple(Finding.from_json(f) for f in value or ())
            elif name in _LISTS:
                kw[name] = freeze(value or [])
            elif name == "collectives":
                kw[name] = freeze(value or {})
            else:
                kw[name] = freeze(value)
        return cls(**kw, tracelens_version=str(doc.get("tracelens_version") or ""))


#: The sections in summary.json's order (`schema` and `tracelens_version` come first).
SECTIONS = (
    "run",
    "ranks",
    "stages",
    "stragglers",
    "mfu",
    "findings",
    "per_step",
    "headlines",
    "composition",
    "pipeline",
    "clock",
    "collectives",
    "audit",
    "ops",
    "op_totals",
    "inference",
    "what_if",
    "critical_path",
    "losses",
    "compat",
)
#: Sections written only when present.
_OPTIONAL = ("inference", "compat")
#: Sections that are lists (empty when there is nothing to say).
_LISTS = ("ranks", "stages", "stragglers", "per_step", "headlines", "ops", "op_totals", "what_if", "losses")


def summary_bytes(summary: Object) -> bytes:
    """summary.json's text (UTF-8, indented by 2): msgspec's encoder (~0.03 s for the 1.2 MB summary of a
    1,024-rank run, where `json.dumps(indent=2)`, a pure-Python encoder, takes ~0.4 s). The same JSON values
    as `json.dumps` (numpy scalars and arrays, paths through `_json_default`); a NaN is written as null
    (`json.dumps(allow_nan=False)` raised). A dict key msgspec does not take (None, a bool) falls back to
    `json.dumps`."""
    import msgspec

    try:
        return msgspec.json.format(msgspec.json.encode(summary, enc_hook=_json_default), indent=2) + b"\n"
    except (TypeError, msgspec.EncodeError):
        text = json.dumps(summary, indent=2, allow_nan=False, default=_json_default) + "\n"
        return text.encode("utf-8")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        f = float(o)
        return None if math.isnan(f) else f
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


__all__ = [
    "FINDING_KEYS",
    "SECTIONS",
    "summary_bytes",
    "JSON",
    "Finding",
    "Object",
    "Result",
    "freeze",
    "thaw",
]
