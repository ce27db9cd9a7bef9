"""Ground truth of a simulated run, computed from the exact integer-ns intervals the writer emits."""

from __future__ import annotations

import numpy as np

from tracelens.simulate.engine import StageTiming
from tracelens.simulate.program import ASYNC, COLL, COMPUTE, RECV, SEND, WAIT, WORLD, Program

COMM_KINDS = (COLL, ASYNC, SEND, RECV, WORLD)


def union_ns(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals clipped to [lo, hi): returns merged (starts, ends)."""
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ms = s[idx]
    me = np.maximum.reduceat(run_end, idx)  # run_end is monotone: its max in a group is the group's end
    return ms, me


def total(s: np.ndarray, e: np.ndarray) -> int:
    return int((e - s).sum())


class StageTruthStatic:
    """Masks and indices of one stage's program used by the truth computation."""

    def __init__(self, prog: Program):
        kinds = np.array([op.kind for op in prog.ops])
        self.compute = kinds == COMPUTE
        self.comm = np.isin(kinds, COMM_KINDS)
        self.recv = kinds == RECV
        self.world = kinds == WORLD
        phases = np.array([op.phase for op in prog.ops])
        fwd_compute = np.flatnonzero(self.compute & (phases == "F"))
        bwd_compute = np.flatnonzero(self.compute & (phases == "B"))
        self.first_fwd = int(fwd_compute[0])
        self.last_bwd = int(bwd_compute[-1])
        # receives after the first forward compute are in-flight waits (the first one is part of the fill)
        self.inflight_recv = self.recv & (np.arange(len(kinds)) > self.first_fwd)
        self.spans = []
        for m, mod in enumerate(prog.modules):
            idx = [i for i, op in enumerate(prog.ops) if op.module == m and op.kind != WAIT]
            self.spans.append((mod.layer_type, np.array(idx, dtype=np.int64)))


def rank_step_truth(st: StageTruthStatic, tim: StageTiming, col: int) -> dict:
    """Per-rank per-step numbers (ns) for truth.json."""
    ws, we = int(tim.step_start[col]), int(tim.step_end[col])
    S, E = tim.start[:, col], tim.end[:, col]
    cs, ce = union_ns(S[st.compute], E[st.compute], ws, we)
    ms, me = union_ns(S[st.comm], E[st.comm], ws, we)
    kern = st.compute | st.comm
    as_, ae = union_ns(S[kern], E[kern], ws, we)
    compute = total(cs, ce)
    comm = total(ms, me)
    busy = total(as_, ae)
    exposed = busy - compute
    fill = int(S[st.first_fwd]) - ws
    inflight = int(tim.wait[st.inflight_recv, col].sum())
    drain = int(tim.wait[st.world, col].sum())
    ann = {"full_attention": 0, "linear_attention": 0, "mlp": 0}
    for lt, idx in st.spans:
        if lt in ann and idx.size:
            ann[lt] += int(E[idx].max() - S[idx].min()) + 2  # gpu_user_annotation: ts-1ns, dur+2ns
    step = we - ws
    return {
        "step_time_ns": step,
        "compute_ns": compute,
        "comm_ns": comm,
        "exposed_comm_ns": exposed,
        "overlapped_comm_ns": comm - exposed,
        "idle_ns": step - busy,
        "bubble_ns": fill + inflight + drain,
        "bubble_fill_ns": fill,
        "bubble_inflight_ns": inflight,
        "bubble_drain_ns": drain,
        "attention_ns": ann["full_attention"],
        "linear_attention_ns": ann["linear_attention"],
        "mlp_ns": ann["mlp"],
        "attention_share": ann["full_attention"] / step if step else 0.0,
        "step_start_ns": ws,
        "step_end_ns": we,
    }
