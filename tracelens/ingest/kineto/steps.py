"""Step assignment (ProfilerStep#N windows, device work by its launch) and the incomplete steps of a
salvaged trace.

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelens.ingest import salvage as _salv
from tracelens.ingest.kineto.columns import _IS_GPU, _IS_LAUNCH, _IS_STEP, GPU_KINDS


def step_of_name(names: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """For a dictionary `name` column: (is ProfilerStep#N, N) per row (N = -1 when not a step)."""
    d = names.dictionary.to_pylist()
    nums = np.full(len(d) + 1, -1, dtype=np.int64)
    for i, s in enumerate(d):
        if isinstance(s, str) and s.startswith("ProfilerStep#"):
            tail = s[len("ProfilerStep#") :]
            if tail.isascii() and tail.isdigit() and len(tail) <= 9:  # as classify.STEP: fits int32
                nums[i] = int(tail)
    idx = names.indices.fill_null(len(d)).to_numpy(zero_copy_only=False)
    num = nums[idx]
    return num >= 0, num


def has_step_markers(kind: np.ndarray, names: pa.Array) -> bool:
    """Whether any event is a `ProfilerStep#N` of a kind that marks a step."""
    is_step, _ = step_of_name(names)
    return bool((is_step & _IS_STEP[kind]).any())


def assign_steps(
    kind: np.ndarray,
    names: pa.Array,
    ts: np.ndarray,
    dur: np.ndarray,
    corr: pa.Array,
    windows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Step of each event (-1 = none): CPU events by the enclosing ProfilerStep#N window, device events by
    the step of the cuda_runtime/cuda_driver launch with the same correlation id (else by their own start).
    `windows` (start, end, N): the steps of a trace without ProfilerStep#N markers (inference iterations,
    tracelens.ingest.iterations), used when it has none."""
    n = len(kind)
    is_step, num = step_of_name(names)
    is_step &= _IS_STEP[kind]
    if is_step.any():
        s_num = num[is_step]
        s_start = ts[is_step]
        s_end = s_start + np.maximum(dur[is_step], 0)
    elif windows is not None and len(windows[0]):
        s_start, s_end, s_num = windows
    else:
        return np.full(n, -1, dtype=np.int64)
    # one window per step number (a step may appear as both user_annotation and cpu_op)
    uniq, inv = np.unique(s_num, return_inverse=True)
    w_start = np.full(uniq.size, np.iinfo(np.int64).max, dtype=np.int64)
    w_end = np.full(uniq.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(w_start, inv, s_start)
    np.maximum.at(w_end, inv, s_end)
    order = np.argsort(w_start, kind="stable")
    w_start, w_end, uniq = w_start[order], w_end[order], uniq[order]
    # every event by its own start (device events keep it when no launch matches)
    # (in place where possible: each new full-length array is ~1 MB of fresh pages to fault in)
    j = np.searchsorted(w_start, ts, side="right")
    j -= 1
    np.maximum(j, 0, out=j)
    inside = ts < w_end[j]
    inside &= ts >= w_start[0]
    step = uniq[j]
    step[~inside] = -1
    is_gpu = _IS_GPU[kind]
    if is_gpu.any():
        corr_np = corr.fill_null(-1).to_numpy(zero_copy_only=False)
        launch = _IS_LAUNCH[kind] & (corr_np >= 0)
        if launch.any():
            l_corr = corr_np[launch]
            l_step = step[launch]
            o = np.argsort(l_corr, kind="stable")
            l_corr, l_step = l_corr[o], l_step[o]
            g_corr = corr_np[is_gpu]
            j = np.searchsorted(l_corr, g_corr)
            jc = np.minimum(j, l_corr.size - 1)
            hit = (j < l_corr.size) & (l_corr[jc] == g_corr) & (g_corr >= 0)
            step[is_gpu] = np.where(hit, l_step[jc], step[is_gpu])
    return step


#: In a salvaged trace, a step holding less than this share of the rank's fullest step's events of one
#: family (CPU ops, launches, device work) lost events after the cut.
INCOMPLETE_STEP_SHARE = 0.5
_FAMILIES = (
    ("cpu_op", "user_annotation", "python_function"),
    ("cuda_runtime", "cuda_driver"),
    GPU_KINDS,
)


def incomplete_steps(
    events: pa.Table, share: float = INCOMPLETE_STEP_SHARE, gpu_expected: bool = False
) -> list[int]:
    """Steps of one rank's salvaged trace whose analysis would be wrong because events were lost at the cut.

    Kineto does not write events in time order (CPU ops first, device activities after, in buffer order), so
    the cut does not fall at one instant. A step lost events when, for one family of events (CPU ops, runtime
    launches, device work), it holds fewer than `share` of the count of the rank's fullest step. The device
    work of a step runs late (into the next steps' windows, by up to the largest spill seen in the complete
    steps), so a step whose window such lost work may reach is incomplete as well. `gpu_expected`: the
    trace's header names a GPU (salvage.uncovered_steps).
    """
    step = events.column("step")
    if events.num_rows == 0 or step.null_count == events.num_rows:
        return []
    kinds = events.column("kind").cast(pa.string())
    steps_all = sorted(set(pc.unique(step.drop_null()).to_pylist()))
    # a step with a launch whose device work is missing is not covered by the trace (salvage.py)
    bad: set[int] = set(_salv.uncovered_steps(events, gpu_expected)[0]) & set(steps_all)
    if len(steps_all) < 2:
        return sorted(bad)
    for fam in _FAMILIES:
        sub = step.filter(pc.is_in(kinds, pa.array(fam)))
        if len(sub) == 0:
            continue
        vc = pc.value_counts(sub.drop_null())
        counts = dict(zip(vc.field(0).to_pylist(), vc.field(1).to_pylist()))
        top = max(counts.values(), default=0)
        if top == 0:
            continue
        bad.update(s for s in steps_all if counts.get(s, 0) < share * top)
    if not bad:
        return []
    # step windows (ProfilerStep#N markers) and how far each step's events run past its window's end
    is_step, num = step_of_name(events.column("name").combine_chunks())
    ts = events.column("ts_ns").fill_null(0).to_numpy()
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(), 0)
    win: dict[int, tuple[int, int]] = {}
    for n, a, b in zip(num[is_step].tolist(), ts[is_step].tolist(), end[is_step].tolist()):
        lo, hi = win.get(n, (a, b))
        win[n] = (min(lo, a), max(hi, b))
    g = pa.table({"step": step, "end": pa.array(end)}).group_by("step").aggregate([("end", "max")])
    last_end = dict(zip(g.column("step").to_pylist(), g.column("end_max").to_pylist()))
    spill = max(
        (max(0, last_end[s] - win[s][1]) for s in steps_all if s not in bad and s in win and s in last_end),
        default=0,
    )
    lost = [(win[b][0], win[b][1] + spill) for b in bad if b in win]  # (window start, reach of its work)
    late = {s for s in steps_all if s in win and any(a < win[s][0] < r for a, r in lost)}
    return sorted(bad | late)


def drop_incomplete_steps(events: pa.Table, gpu_expected: bool = False) -> pa.Table:
    """Leave the incomplete steps of a salvaged trace out of the step analysis (salvage.leave_out_steps:
    their events get step null, their CPU `ProfilerStep#N` markers stay as kind `other`, so that they still
    bound the kept steps' windows)."""
    return _salv.leave_out_steps(events, incomplete_steps(events, gpu_expected=gpu_expected))
