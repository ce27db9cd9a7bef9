"""Step windows: one disjoint, ordered window per (rank, `ProfilerStep#N`), inside the rank's trace.

Rule (docs/breakdown.md, "Step windows"), per rank:

1. The step's CPU window: its `ProfilerStep#N` cpu_op / user_annotation (merged when both exist). A rank
   with none of those uses its GPU-side `ProfilerStep#N` annotations instead.
2. A step whose annotation encloses none of the rank's other events, or lies outside the rank's extent
   (first event start .. last event end, step annotations excluded), is dropped; a window that ends more
   than CLIP_REPORT_NS and CLIP_REPORT_SHARE of its length after the rank's last event (e.g. a
   `ProfilerStep` written by a foreign process, ending seconds later) is cut there. Both are reported
   (`notes`) and become a STEP_WINDOW_CLIPPED finding.
3. Device-side boundaries: device events belong to the step whose CPU window launched them (the `step`
   column). Step N starts at  max(CPU start of N, min(first start of N's device events, last end of
   N-1's device events)),  i.e. at its CPU start unless the GPU still runs the previous step's work then;
   the first step starts at its CPU start, and so does a step whose predecessor launched no device work. Step N ends at the later of its CPU end and its device events'
   last end, but never after step N+1 starts. Starts are made non-decreasing.

So windows never overlap and every instant (and so every device interval, clipped) belongs to at most one
step. When the GPU does not lag the CPU the windows are the CPU windows.

Left-out steps (a salvaged trace's incomplete steps, `salvage.leave_out_steps`): their `ProfilerStep#N`
markers stay as kind `other` with `step` null, and their other events have `step` null. They get no window,
but they still bound their neighbours: their events are given back to them the way the reader assigned
steps (CPU events by the enclosing window, device events by the window of their launch, else by their own
start), the windows are computed with them present, and only theirs are left out of the result. So a kept
step's window is the one it had with its neighbours present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.core.intset import distinct, member
from tracelens.analyze.rank.classify import STEP, _dict_lookup, is_step_name

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_KINDS = ("cuda_runtime", "cuda_driver")
#: A window clipped at the trace's end is reported when the cut is longer than this and than this share of
#: the window (a ProfilerStep normally ends a few µs after its last event: clipped silently).
CLIP_REPORT_NS = 1_000_000
CLIP_REPORT_SHARE = 0.1


def _empty() -> pa.Table:
    return pa.table(
        {
            "rank": pa.array([], pa.int32()),
            "step": pa.array([], pa.int32()),
            "start_ns": pa.array([], pa.int64()),
            "end_ns": pa.array([], pa.int64()),
        }
    )


@dataclass
class StepWindows:
    windows: pa.Table  # rank, step, start_ns, end_ns
    notes: list[dict[str, Any]] = field(default_factory=list)  # rank, step, raw_start_ns, raw_end_ns, action


def step_windows_noted(events: pa.Table) -> StepWindows:
    """Windows by the rule of the module docstring, plus what was dropped or clipped."""
    if events.num_rows == 0:
        return StepWindows(_empty())
    cols = columns(events)
    is_step = cols.flag("name", is_step_name)
    if not is_step.any():
        return StepWindows(_empty())
    gpu_ann = cols.kinds("gpu_user_annotation")
    cpu_kind = cols.kinds("cpu_op", "user_annotation")
    device = cols.kinds(*DEVICE)
    rank = cols.int64("rank")
    ts = cols.int64("ts_ns")
    end = cols.end()
    ev_step = cols.int64("step", -1)
    # markers of left-out steps (module docstring): kind other, step null
    left_out = is_step & cols.kinds("other") & (ev_step < 0)
    launch = np.zeros(events.num_rows, dtype=bool)
    corr = np.full(events.num_rows, -1, dtype=np.int64)
    if left_out.any():
        launch = cols.kinds(*LAUNCH_KINDS)
        corr = cols.int64("correlation", -1)
    step_rows = np.flatnonzero(is_step)
    values, name_idx = cols.codes("name")
    nums = np.full(events.num_rows, -1, dtype=np.int64)
    step_names = [values[i] for i in name_idx[step_rows]]
    nums[step_rows] = [int(STEP.match(v).group(1)) for v in step_names]  # type: ignore[union-attr]  # is_step: all match
    out: dict[str, list[int]] = {"rank": [], "step": [], "start_ns": [], "end_ns": []}
    notes: list[dict[str, Any]] = []
    one = int(rank.min()) == int(rank.max())  # one rank's table (the per-rank stage): its rows as they are
    order = np.zeros(0, np.int64) if one else np.argsort(rank, kind="stable")
    rs = rank[order]
    for r in distinct(rank[step_rows]):
        sl: slice | np.ndarray = (
            slice(None)
            if one
            else order[np.searchsorted(rs, r, side="left") : np.searchsorted(rs, r, side="right")]
        )
        got = _rank_windows(
            int(r), ts[sl], end[sl], is_step[sl], cpu_kind[sl], gpu_ann[sl], device[sl],
            ev_step[sl], nums[sl], notes, left_out[sl], launch[sl], corr[sl],
        )  # fmt: skip
        if got is None:
            continue
        uniq, c_lo, c_hi = got
        out["rank"] += [int(r)] * uniq.size
        out["step"] += uniq.tolist()
        out["start_ns"] += c_lo.tolist()
        out["end_ns"] += c_hi.tolist()
    return StepWindows(
        pa.table(
            {
                "rank": pa.array(out["rank"], pa.int32()),
                "step": pa.array(out["step"], pa.int32()),
                "start_ns": pa.array(out["start_ns"], pa.int64()),
                "end_ns": pa.array(out["end_ns"], pa.int64()),
            }
        ),
        notes,
    )


def _rank_windows(
    r: int,
    ts: np.ndarray,
    end: np.ndarray,
    is_step: np.ndarray,
    cpu_kind: np.ndarray,
    gpu_ann: np.ndarray,
    device: np.ndarray,
    ev_step: np.ndarray,
    nums: np.ndarray,
    notes: list[dict[str, Any]],
    left_out: np.ndarray,
    launch: np.ndarray,
    corr: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """One rank's windows (its rows only): step numbers, starts, ends; None when it has none."""
    src = is_step & (cpu_kind | left_out)
    gpu_source = not src.any()
    if gpu_source:
        src = is_step & gpu_ann
    if not src.any():
        return None
    others = ~is_step
    if not others.any():
        return None
    lo_ext = int(np.min(ts, where=others, initial=np.iinfo(np.int64).max))  # (no copy of the rows)
    hi_ext = int(np.max(end, where=others, initial=np.iinfo(np.int64).min))
    s_num = nums[src]
    uniq, inv = np.unique(s_num, return_inverse=True)
    c_start = np.full(uniq.size, np.iinfo(np.int64).max)
    c_end = np.full(uniq.size, np.iinfo(np.int64).min)
    np.minimum.at(c_start, inv, ts[src])
    np.maximum.at(c_end, inv, end[src])
    order = np.argsort(c_start, kind="stable")
    uniq, c_start, c_end = uniq[order], c_start[order], c_end[order]
    gone = member(uniq, nums[left_out])  # left-out steps: neighbours only
    # the step of each event: the step column (CPU events by their enclosing window, device events by
    # their launch), else (tables built without it) the CPU window holding the event's start
    if gone.any():
        o_rows = np.flatnonzero(others)
        o_step = ev_step[o_rows].copy()
        j = np.clip(np.searchsorted(c_start, ts[o_rows], side="right") - 1, 0, None)
        by_time = np.where((ts[o_rows] >= c_start[j]) & (ts[o_rows] < c_end[j]), uniq[j], -1)
        o_step = np.where(o_step >= 0, o_step, by_time)
        _give_back_device_work(o_rows, o_step, ev_step, device | gpu_ann, launch, corr, uniq[gone])
        ev_step = ev_step.copy()
        ev_step[o_rows] = o_step
        members = member(uniq, o_step[o_step >= 0])
    else:  # the same, with the by-time lookup for the rows without a step only (few): no row-sized gathers
        need = np.flatnonzero(others & (ev_step < 0))
        ev_step = ev_step.copy()
        if need.size:
            t = ts[need]
            j = np.clip(np.searchsorted(c_start, t, side="right") - 1, 0, None)
            ev_step[need] = np.where((t >= c_start[j]) & (t < c_end[j]), uniq[j], -1)
        members = member(uniq, ev_step[others & (ev_step >= 0)])
    keep = np.ones(uniq.size, dtype=bool)
    for i, n in enumerate(uniq):
        outside = c_start[i] >= hi_ext or c_end[i] <= lo_ext
        empty = not gpu_source and not members[i] and c_end[i] > c_start[i]  # (zero-length: kept, 0 ms)
        if outside or empty:
            keep[i] = False
            if gone[i]:
                continue
            notes.append(
                {"rank": int(r), "step": int(n), "raw_start_ns": int(c_start[i]), "raw_end_ns": int(c_end[i]),
                 "action": "dropped", "reason": "outside the trace" if outside else "encloses no event"}
            )  # fmt: skip
    uniq, c_start, c_end, gone = uniq[keep], c_start[keep], c_end[keep], gone[keep]
    if not uniq.size or gone.all():
        return None
    # device work of each step
    d_first = np.full(uniq.size, np.iinfo(np.int64).max)
    d_last = np.full(uniq.size, np.iinfo(np.int64).min)
    dev = device & (ev_step >= 0)
    if dev.any() and not gpu_source:
        pos = np.searchsorted(uniq, ev_step[dev]) if np.all(np.diff(uniq) > 0) else None
        if pos is None:  # step numbers not increasing in time: map through a sorted copy
            srt = np.argsort(uniq)
            p = np.searchsorted(uniq[srt], ev_step[dev])
            pc_ = np.minimum(p, uniq.size - 1)
            hit = uniq[srt][pc_] == ev_step[dev]
            pos = np.where(hit, srt[pc_], -1)
        else:
            pc_ = np.minimum(pos, uniq.size - 1)
            pos = np.where(uniq[pc_] == ev_step[dev], pc_, -1)
        ok = pos >= 0
        np.minimum.at(d_first, pos[ok], ts[dev][ok])
        np.maximum.at(d_last, pos[ok], end[dev][ok])
    has_dev = d_last > np.iinfo(np.int64).min
    start = c_start.copy()
    for i in range(1, uniq.size):
        if has_dev[i - 1]:  # the GPU may still run step N-1's work when the CPU starts step N
            t = min(d_last[i - 1], d_first[i]) if has_dev[i] else d_last[i - 1]
            start[i] = max(c_start[i], t)
    start = np.maximum.accumulate(start)
    stop = np.where(has_dev, np.maximum(c_end, d_last), c_end)
    stop[:-1] = np.minimum(stop[:-1], start[1:])
    # a window reaching far past the rank's last event is cut there (and reported); the few µs a
    # ProfilerStep normally outlasts its last event are kept
    over = stop - hi_ext
    absurd = (over > CLIP_REPORT_NS) & (over > CLIP_REPORT_SHARE * (stop - start))
    for flat in np.flatnonzero(absurd & ~gone):
        i = int(flat)
        notes.append(
            {"rank": int(r), "step": int(uniq[i]), "raw_start_ns": int(c_start[i]),
             "raw_end_ns": int(c_end[i]), "action": "clipped", "clipped_ns": int(over[i]),
             "reason": "ends after the trace's last event"}
        )  # fmt: skip
    c_lo, c_hi = start, np.where(absurd, hi_ext, stop)
    c_hi = np.maximum(c_hi, c_lo)
    return uniq[~gone], c_lo[~gone], c_hi[~gone]


def _give_back_device_work(
    o_rows: np.ndarray,
    o_step: np.ndarray,
    ev_step: np.ndarray,
    gpu: np.ndarray,
    launch: np.ndarray,
    corr: np.ndarray,
    gone: np.ndarray,
) -> None:
    """Device events (step null) launched inside a left-out step's window get that step in `o_step` (in
    place), as the reader assigned them before the step was left out: by the first runtime/driver call with
    their correlation id. The others keep the step of their own start already in `o_step`."""
    pos = np.full(ev_step.size, -1, dtype=np.int64)
    pos[o_rows] = np.arange(o_rows.size)
    lr = np.flatnonzero(launch & (corr >= 0))
    lr = lr[pos[lr] >= 0]
    if not lr.size:
        return
    o = np.argsort(corr[lr], kind="stable")
    l_corr, l_step = corr[lr][o], o_step[pos[lr][o]]
    g = np.flatnonzero(gpu & (ev_step < 0) & (corr >= 0) & (pos >= 0))
    if not g.size:
        return
    j = np.minimum(np.searchsorted(l_corr, corr[g]), l_corr.size - 1)
    hit = (l_corr[j] == corr[g]) & np.isin(l_step[j], gone)
    o_step[pos[g[hit]]] = l_step[j[hit]]


def step_windows(events: pa.Table) -> pa.Table:
    """rank, step, start_ns, end_ns: one disjoint window per rank and step (module docstring)."""
    return step_windows_noted(events).windows


def window_findings(events: pa.Table, breakdown: pa.Table) -> list[dict[str, Any]]:
    """STEP_WINDOW_CLIPPED: `ProfilerStep#N` annotations (in `events`) whose window the breakdown dropped or
    cut at the end of the trace (rule 2 of the module docstring). Needs only the step rows of `events`."""
    from tracelens.findings import finding

    if events.num_rows == 0:
        return []
    is_step = _dict_lookup(events.column("name"), lambda v: int(bool(STEP.match(v)))).astype(bool)
    kind = events.column("kind")
    is_step &= _dict_lookup(kind, lambda v: int(v in ("cpu_op", "user_annotation"))).astype(bool)
    if not is_step.any():
        return []
    sub = events.filter(pa.array(is_step))
    rows: dict[tuple[int, int], tuple[int, int]] = {}
    for r, nm, t, d in zip(
        sub.column("rank").to_pylist(),
        sub.column("name").cast(pa.string()).to_pylist(),
        sub.column("ts_ns").to_pylist(),
        sub.column("dur_ns").fill_null(0).to_pylist(),
    ):
        m = STEP.match(nm)
        if m is None:
            continue
        key = (r, int(m.group(1)))
        lo, hi = rows.get(key, (t, t + max(d, 0)))
        rows[key] = (min(lo, t), max(hi, t + max(d, 0)))
    win = {
        (r, s): (lo, hi)
        for r, s, lo, hi in zip(
            breakdown.column("rank").to_pylist(),
            breakdown.column("step").to_pylist(),
            breakdown.column("window_start_ns").to_pylist(),
            breakdown.column("window_end_ns").to_pylist(),
        )
    }
    analysed = {r for r, s in win if s is not None}
    dropped, clipped = [], []
    for (r, s), (lo, hi) in sorted(rows.items()):
        w = win.get((r, s))
        if w is None:
            if r in analysed or not any(k[0] == r for k in win):
                dropped.append((r, s, hi - lo))
            continue
        cut = hi - w[1]
        if cut > CLIP_REPORT_NS and cut > CLIP_REPORT_SHARE * (hi - lo):
            clipped.append((r, s, cut))
    out = []
    if clipped:
        r, s, cut = max(clipped, key=lambda c: c[2])
        out.append(
            finding(
                "STEP_WINDOW_CLIPPED",
                "warning",
                f"{len(clipped)} ProfilerStep window(s) end after the trace's last event and were cut at it "
                f"(worst: rank {r} step {s}, {cut / 1e6:,.1f} ms past the end; often a ProfilerStep written by "
                "another process)",
                ranks=sorted({c[0] for c in clipped}),
                steps=sorted({c[1] for c in clipped}),
            )
        )
    if dropped:
        r, s, _ = dropped[0]
        out.append(
            finding(
                "STEP_WINDOW_CLIPPED",
                "warning",
                f"{len(dropped)} ProfilerStep annotation(s) enclose none of their rank's events or lie outside "
                f"its trace and were left out (first: rank {r} step {s})",
                ranks=sorted({d[0] for d in dropped}),
                steps=sorted({d[1] for d in dropped}),
            )
        )
    return out
