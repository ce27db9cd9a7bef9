"""Forward/backward blocks per microbatch of one pipeline and one step, for the report's pipeline timeline.

Blocks come from, in order of preference:
1. microbatch annotations (`forward_mb3`, `backward_mb3`, `fwd 3`, ...), GPU-side when the trace has them;
2. module annotations (`layers.N.<module>[.backward]`, see analyze/composition.py) grouped into one block per
   microbatch: a new block starts when the direction changes or a (layer, module) pair repeats;
3. CPU-side module annotations (CPU-only runs have no GPU spans).
Times are aligned with the clock offsets when given (aligned = raw - offset), relative to the earliest block.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.analyze.composition import BACKWARD, DEFAULT_PATTERNS, MODULE_TYPES, module_spans

MICROBATCH = re.compile(
    r"(?i)(?:^|[.\s/:#_])(?P<phase>forward|backward|fwd|bwd)[_\-\s.#:]*(?:mb|microbatch|micro_batch|micro)?"
    r"[_\-\s.#:]*(?P<mb>\d+)$"
)
_MODULE = [re.compile(p) for p in DEFAULT_PATTERNS]


def pick_step(per_step: Sequence[Mapping]) -> int | None:
    """The analyzed step whose mean step time is the median one (a typical step, not warm-up)."""
    by: dict[int, list[float]] = {}
    for r in per_step:
        if r.get("step") is not None and r.get("step_time_ms") is not None:
            by.setdefault(int(r["step"]), []).append(float(r["step_time_ms"]))
    if not by:
        return None
    steps = sorted(by)
    means = np.array([np.mean(by[s]) for s in steps])
    return steps[int(np.argsort(means, kind="stable")[(len(steps) - 1) // 2])]


def _rows_of(events: pa.Table, rank: int, step: int | None) -> pa.Table:
    mask = pc.equal(events.column("rank"), rank)
    if step is not None:
        mask = pc.and_(mask, pc.equal(events.column("step"), step))
    return events.filter(mask)


def _mb_blocks(ev: pa.Table) -> list[tuple[str, int, int, int]]:
    """(phase, microbatch, start, end) from microbatch annotations; GPU annotations preferred."""
    kinds = ev.column("kind").cast(pa.string())
    for want in ("gpu_user_annotation", "user_annotation"):
        sub = ev.filter(pc.equal(kinds, want))
        if not sub.num_rows:
            continue
        names = sub.column("name").cast(pa.string()).to_pylist()
        ts = sub.column("ts_ns").to_numpy(zero_copy_only=False)
        dur = sub.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False)
        out = []
        for i, n in enumerate(names):
            m = MICROBATCH.search(n or "")
            if m:
                phase = "backward" if m.group("phase").lower() in ("backward", "bwd") else "forward"
                out.append((phase, int(m.group("mb")), int(ts[i]), int(ts[i] + dur[i])))
        if out:
            return out
    return []


def _group_modules(
    layer: np.ndarray, module: list[str], backward: np.ndarray, start: np.ndarray, end: np.ndarray
) -> list[tuple[str, int, int, int]]:
    """One block per microbatch from time-ordered module spans of one rank and step."""
    order = np.argsort(start, kind="stable")
    out: list[tuple[str, int, int, int]] = []
    seen: set = set()
    cur: list[Any] | None = None  # [phase, microbatch, start, end] of the block being built
    count = {"forward": 0, "backward": 0}
    for i in order:
        phase = "backward" if backward[i] else "forward"
        key = (int(layer[i]), module[i])
        if cur is None or cur[0] != phase or key in seen:
            if cur is not None:
                out.append(tuple(cur))
            cur = [phase, count[phase], int(start[i]), int(end[i])]
            count[phase] += 1
            seen = set()
        seen.add(key)
        cur[3] = max(cur[3], int(end[i]))
    if cur is not None:
        out.append(tuple(cur))
    return out


def _cpu_module_blocks(ev: pa.Table) -> list[tuple[str, int, int, int]]:
    """Module annotations on the CPU timeline (no GPU spans: CPU-only runs)."""
    kinds = ev.column("kind").cast(pa.string())
    sub = ev.filter(pc.equal(kinds, "user_annotation"))
    if not sub.num_rows:
        return []
    names = sub.column("name").cast(pa.string()).to_pylist()
    ts = sub.column("ts_ns").to_numpy(zero_copy_only=False)
    end = ts + sub.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False)
    rows = []
    for i, n in enumerate(names):
        for p in _MODULE:
            m = p.search(n or "")
            if m and "layer" in p.groupindex:
                mod = MODULE_TYPES.get(m.group("module").lower(), m.group("module").lower())
                rows.append((int(m.group("layer")), mod, bool(BACKWARD.search(n)), ts[i], end[i]))
                break
    if not rows:
        return []
    lay, mod, bwd, s, e = zip(*rows)
    return _group_modules(np.array(lay), list(mod), np.array(bwd), np.array(s), np.array(e))


def rank_blocks(events: pa.Table, rank: int, step: int | None) -> list[tuple[str, int, int, int]]:
    """(phase, microbatch, start_ns, end_ns) blocks of one rank in one step (raw clock)."""
    ev = _rows_of(events, rank, step)
    if not ev.num_rows:
        return []
    blocks = _mb_blocks(ev)
    if blocks:
        return blocks
    sp = module_spans(ev)
    sp = sp.filter(pc.greater_equal(sp.column("layer"), 0)) if sp.num_rows else sp
    if sp.num_rows:
        return _group_modules(
            sp.column("layer").to_numpy(),
            sp.column("module").to_pylist(),
            sp.column("backward").to_numpy(zero_copy_only=False),
            sp.column("gpu_start_ns").to_numpy(),
            sp.column("gpu_end_ns").to_numpy(),
        )
    return _cpu_module_blocks(ev)


def pipeline_blocks(
    events: pa.Table,
    chain: Sequence[int],
    stage_of: Mapping[int, int | None],
    step: int | None,
    offsets_ns: Mapping[int, int] | None = None,
) -> list[dict]:
    """Blocks of one pipeline (`chain`: its ranks in stage order) in `step`, in ms from the earliest block."""
    offsets_ns = offsets_ns or {}
    raw = []
    for r in chain:
        off = int(offsets_ns.get(int(r), 0))
        for phase, mb, s, e in rank_blocks(events, int(r), step):
            raw.append((stage_of.get(int(r)), int(r), phase, mb, s - off, e - off))
    if not raw:
        return []
    t0 = min(b[4] for b in raw)
    return [
        {
            "stage": st,
            "rank": r,
            "phase": ph,
            "microbatch": mb,
            "start_ms": (s - t0) / 1e6,
            "end_ms": (e - t0) / 1e6,
            "t0_ms": t0 / 1e6,  # aligned absolute time of the timeline's zero (critical-path overlay)
        }
        for st, r, ph, mb, s, e in sorted(raw, key=lambda b: (b[0] if b[0] is not None else -1, b[4]))
    ]
