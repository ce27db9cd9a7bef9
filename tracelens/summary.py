"""summary.json: the stable, versioned result of `tracelens analyze` (schema "tracelens.summary/1").

Times are per-step means over the analyzed steps, in milliseconds. Unknown values are null, never invented.
See docs/summary.md for every field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracelens import __version__
from tracelens.errors import BadInputError

SCHEMA = "tracelens.summary/1"

_NS_PER_MS = 1e6


def _ms(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    return round(x / _NS_PER_MS, 6)


def per_step_rows(bd: pa.Table, extra: dict[str, pa.Table] | None = None) -> list[dict]:
    """Per (rank, step) samples in ms: the breakdown plus any extra per (rank, step) columns (bubble, wait...)."""
    rows = bd.to_pylist()
    lookups: dict[str, dict] = {}
    for col, tab in (extra or {}).items():
        if tab is None:
            continue
        d = {}
        for r in tab.to_pylist():
            d[(r["rank"], r["step"])] = r[col]
        lookups[col] = d
    out = []
    for r in rows:
        row = {
            "rank": r["rank"],
            "step": r["step"],
            "step_time_ms": _ms(r["step_time_ns"]),
            "compute_ms": _ms(r["compute_ns"]),
            "exposed_comm_ms": _ms(r["exposed_comm_ns"]),
            "overlapped_comm_ms": _ms(r["overlapped_comm_ns"]),
            "memcpy_ms": _ms(r["memcpy_ns"]),
            "idle_ms": _ms(r["idle_ns"]),
        }
        for col, d in lookups.items():
            v = d.get((r["rank"], r["step"]))
            row[col.replace("_ns", "_ms")] = _ms(v)
        out.append(row)
    return out


def rank_rows(per_step: list[dict], stage_of: dict[int, int] | None) -> list[dict]:
    """Per-rank means over analyzed steps of every per-step field."""
    fields = [
        "step_time_ms",
        "compute_ms",
        "exposed_comm_ms",
        "exposed_wait_ms",
        "exposed_transfer_ms",
        "overlapped_comm_ms",
        "memcpy_ms",
        "idle_ms",
        "bubble_ms",
    ]
    by_rank: dict[int, list[dict]] = {}
    for row in per_step:
        by_rank.setdefault(row["rank"], []).append(row)
    out = []
    for rank in sorted(by_rank):
        rows = by_rank[rank]
        rec = {"rank": rank, "stage": (stage_of or {}).get(rank)}
        for f in fields:
            vals = [r.get(f) for r in rows]
            vals = [v for v in vals if v is not None]
            rec[f] = round(float(np.mean(vals)), 6) if vals else None
        rec["steps"] = len(rows)
        out.append(rec)
    return out


def write_summary(summary: dict, path: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(o):
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


def load_summary(path: str | Path) -> dict:
    """Read and validate a summary.json written by tracelens."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise BadInputError(f"{path}: not a JSON summary ({err.__class__.__name__})") from err
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("tracelens.summary/"):
        raise BadInputError(f"{path}: not a tracelens summary (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise BadInputError(f"{path}: summary schema {data['schema']} is not supported (expected {SCHEMA})")
    from tracelens.summary_check import check_shape

    check_shape(data, str(path))
    return data


def summarize(path: str | Path, **options) -> dict:
    """Analyze a run folder (or load a summary.json) and return the summary dict."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json" and path.name.startswith("summary"):
        return load_summary(path)
    from tracelens.run_analysis import Options, analyze_run

    return analyze_run(path, Options(**options)).summary()


__all__ = [
    "SCHEMA",
    "summarize",
    "load_summary",
    "write_summary",
    "per_step_rows",
    "rank_rows",
    "__version__",
]
