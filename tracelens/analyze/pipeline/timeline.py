"""Forward/backward blocks per microbatch of one pipeline and one step, for the report's pipeline timeline
(`tracelens.views.ReportViews.pipeline_blocks` hands them to the report).

Blocks come from, in order of preference:
1. microbatch annotations (`forward_mb3`, `backward_mb3`, `fwd 3`, ...), GPU-side when the trace has them,
   each cut to the layer work inside it (the module spans of analyze/pipeline/composition.py that start in it): an
   annotation opens before the receive of the microbatch's input, so a stage's annotation starts while it
   still waits for the previous stage, and only the layers show when it computes;
2. module annotations (`layers.N.<module>[.backward]`, see analyze/pipeline/composition.py) grouped into one block per
   microbatch: a new block starts when the direction changes or a (layer, module) pair repeats;
3. CPU-side module annotations (CPU-only runs have no GPU spans).
Waits: the rank's point-to-point sends and receives (GPU kernels, or CPU ops and `gloo:` annotations on a
CPU-only rank) outside its blocks, as blocks of phase "wait". Times are aligned with the clock offsets when
given (aligned = raw - offset), relative to the pipeline window's start (the earliest block), as the
pipeline analysis measures it (analyze/pipeline/pipeline.py); waits are clipped to that window.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.layout.p2p import P2P_NAMES
from tracelens.analyze.pipeline.composition import BACKWARD, DEFAULT_PATTERNS, MODULE_TYPES, module_spans
from tracelens.analyze.rank.classify import COMM, classify, gpu_ranks

MICROBATCH = re.compile(
    r"(?i)(?:^|[.\s/:#_])(?P<phase>forward|backward|fwd|bwd)[_\-\s.#:]*(?:mb|microbatch|micro_batch|micro)?"
    r"[_\-\s.#:]*(?P<mb>\d+)$"
)
_MODULE = [re.compile(p) for p in DEFAULT_PATTERNS]


def _rows_of(events: pa.Table, rank: int, step: int | None) -> pa.Table:
    mask = pc.equal(events.column("rank"), rank)
    if step is not None:
        mask = pc.and_(mask, pc.equal(events.column("step"), step))
    return events.filter(mask)


def _mb_blocks(ev: pa.Table) -> tuple[list[tuple[str, int, int, int]], str | None]:
    """(phase, microbatch, start, end) from microbatch annotations, GPU annotations preferred, and the kind
    of annotation they came from (None: no microbatch annotation)."""
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
            return out, want
    return [], None


def _group_modules(
    layer: np.ndarray, module: list[str], backward: np.ndarray, start: np.ndarray, end: np.ndarray
) -> list[tuple[str, int, int, int]]:
    """One block per microbatch from time-ordered module spans of one rank and step."""
    order = np.argsort(start, kind="stable")
    out: list[tuple[str, int, int, int]] = []
    seen: set[Any] = set()
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


def _module_spans(ev: pa.Table) -> pa.Table:
    sp = module_spans(ev)
    return sp.filter(pc.greater_equal(sp.column("layer"), 0)) if sp.num_rows else sp


def _cut_to_layers(blocks: list[tuple[str, int, int, int]], sp: pa.Table) -> list[tuple[str, int, int, int]]:
    """Each microbatch block cut to the module spans that start inside it (a block without any is kept)."""
    if not sp.num_rows:
        return blocks
    s = sp.column("gpu_start_ns").to_numpy()
    e = sp.column("gpu_end_ns").to_numpy()
    out = []
    for phase, mb, b0, b1 in blocks:
        inside = (s >= b0) & (s < b1)
        if inside.any():
            b0, b1 = int(s[inside].min()), int(e[inside].max())
        out.append((phase, mb, b0, b1))
    return out


def rank_blocks(events: pa.Table, rank: int, step: int | None) -> list[tuple[str, int, int, int]]:
    """(phase, microbatch, start_ns, end_ns) blocks of one rank in one step (raw clock)."""
    ev = _rows_of(events, rank, step)
    if not ev.num_rows:
        return []
    blocks, kind = _mb_blocks(ev)
    if blocks:
        # the layer work inside each annotation, when the annotations and the module spans are on the same
        # timeline (GPU annotations of a GPU rank, CPU annotations of a CPU-only rank)
        on_gpu = bool(gpu_ranks(ev))
        if (kind == "gpu_user_annotation") == on_gpu:
            return _cut_to_layers(blocks, _module_spans(ev))
        return blocks
    sp = _module_spans(ev)
    if sp.num_rows:
        return _group_modules(
            sp.column("layer").to_numpy(),
            sp.column("module").to_pylist(),
            sp.column("backward").to_numpy(zero_copy_only=False),
            sp.column("gpu_start_ns").to_numpy(),
            sp.column("gpu_end_ns").to_numpy(),
        )
    return _cpu_module_blocks(ev)


def _is_p2p_name(v: str) -> bool:
    return P2P_NAMES.search(v) is not None


def _is_p2p_collective(v: str) -> bool:
    return v.lower() in ("send", "recv", "isend", "irecv")


def rank_p2p(events: pa.Table, rank: int, step: int | None) -> iv.Intervals:
    """The union of one rank's point-to-point sends and receives in one step (raw clock): P2P kernels on a
    GPU rank, P2P CPU ops and `gloo:send/recv` annotations on a CPU-only rank (analyze/rank/classify.py's
    communication class, named as analyze.layout.p2p.P2P_NAMES or carrying a send/recv collective)."""
    ev = _rows_of(events, rank, step)
    if not ev.num_rows:
        return iv.empty()
    comm = classify(ev) == COMM
    cols = columns(ev)  # (per distinct name, not per row)
    p2p = cols.flag("name", _is_p2p_name) | cols.flag("collective", _is_p2p_collective)
    sel = comm & p2p
    ts = ev.column("ts_ns").to_numpy(zero_copy_only=False)[sel]
    dur = ev.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False)[sel]
    return iv.union(ts, ts + dur)


def pipeline_blocks(
    events: pa.Table,
    chain: Sequence[int],
    stage_of: Mapping[int, int | None],
    step: int | None,
    offsets_ns: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Blocks of one pipeline (`chain`: its ranks in stage order) in `step`, in ms from the earliest block:
    forward and backward blocks per microbatch, then the waits in sends and receives outside them (phase
    "wait", microbatch None) inside the pipeline window."""
    offsets_ns = offsets_ns or {}
    raw: list[tuple[int | None, int, str, int | None, int, int]] = []
    p2p: dict[int, iv.Intervals] = {}
    for r in chain:
        off = int(offsets_ns.get(int(r), 0))
        for phase, mb, s, e in rank_blocks(events, int(r), step):
            raw.append((stage_of.get(int(r)), int(r), phase, mb, s - off, e - off))
        ps, pe = rank_p2p(events, int(r), step)
        p2p[int(r)] = (ps - off, pe - off)
    if not raw:
        return []
    t0 = min(b[4] for b in raw)
    t1 = max(b[5] for b in raw)
    for r in chain:
        mine = [b for b in raw if b[1] == int(r) and b[2] != "wait"]
        if not mine:
            continue
        busy = iv.union(np.array([b[4] for b in mine]), np.array([b[5] for b in mine]))
        ws, we = iv.clip(iv.subtract(p2p[int(r)], busy), t0, t1)
        st = stage_of.get(int(r))
        raw += [(st, int(r), "wait", None, int(a), int(b)) for a, b in zip(ws, we)]
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
        for st, r, ph, mb, s, e in sorted(
            raw, key=lambda b: (b[0] if b[0] is not None else -1, b[2] == "wait", b[4])
        )
    ]
