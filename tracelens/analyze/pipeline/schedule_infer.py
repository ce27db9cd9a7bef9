"""Pipeline schedule from point-to-point traffic per rank: virtual chunks v, microbatches m, warm-up.

Per step, a rank of a p-stage pipeline (p >= 3) sends one activation per forward and one gradient per
backward that has a neighbour on that side. With v model chunks per rank (Megatron's interleaved 1F1B;
v = 1 is plain 1F1B / GPipe) a middle stage sends 2*v*m, an end stage (2*v - 1)*m: so

    m = sends(middle) - sends(stage 0),   v = sends(middle) / (2*m).

The warm-up (forwards before the steady state) is read from the order on stages 0..p-2: each forward ends
with a send, so the sends before the first backward op of the step (autograd's `evaluate_function`, or a
`backward` annotation) are the warm-up forwards plus the steady state's first forward. Megatron's
interleaved schedule warms up (p-s-1)*2 + (v-1)*p forwards on stage s (10/8/6/4 for p=4, v=2, m=8);
1F1B warms up p-s-1. Both are reported beside the counts seen (docs/pipeline.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.analyze.core.dictcol import columns
from tracelens.analyze.layout import Grid


def expected_warmup(p: int, s: int, v: int, m: int) -> int:
    """Forward passes stage s runs before its first backward pass starts the steady state."""
    total = v * m
    if v <= 1:
        return min(p - s - 1, total)
    return min((p - s - 1) * 2 + (v - 1) * p, total)


def _is_send_name(v: str) -> int:
    return int("send" in v.lower() and "recv" not in v.lower())


def _is_send_collective(v: str) -> int:
    return int(v.lower() in ("send", "isend"))


def _is_backward_name(v: str) -> int:
    return int(v.startswith("autograd::engine::evaluate_function") or "backward" in v.lower())


def send_mask(events: pa.Table) -> np.ndarray:
    """Rows whose name says send (not recv) or whose collective is a send / isend."""
    cols = columns(events)
    out: np.ndarray = cols.flag("name", _is_send_name) | cols.flag("collective", _is_send_collective)
    return out


def pair_reduce(rank: np.ndarray, step: np.ndarray, **cols: tuple[np.ndarray, np.ufunc]) -> pd.DataFrame:
    """`df.groupby(["rank", "step"]).agg(...)` of min / max reductions (`name=(values, np.minimum)`), the
    same frame (index sorted, levels and values of the arrays' dtypes) from one sort and `reduceat`."""
    if not rank.size:
        df = pd.DataFrame({"rank": rank, "step": step, **{k: v for k, (v, _) in cols.items()}})
        fn: dict[np.ufunc, str] = {np.minimum: "min", np.maximum: "max"}
        return df.groupby(["rank", "step"]).agg(**{k: (k, fn[u]) for k, (_, u) in cols.items()})
    o = np.lexsort((step, rank))
    r, st = rank[o], step[o]
    new = np.ones(o.size, bool)
    new[1:] = (r[1:] != r[:-1]) | (st[1:] != st[:-1])
    starts = np.flatnonzero(new)
    idx = pd.MultiIndex.from_arrays([r[starts], st[starts]], names=["rank", "step"])
    return pd.DataFrame({k: u.reduceat(v[o], starts) for k, (v, u) in cols.items()}, index=idx)


def _stage_sends(events: pa.Table, grid: Grid, p2p: np.ndarray) -> tuple[pd.DataFrame, str | None]:
    """The P2P sends of the steps (rank, step, stage, ts), one record of each (kernels, else cpu ops, else
    annotations), and which kind that was."""
    cols = columns(events)
    is_send = send_mask(events)
    rank = cols.int64("rank")
    step = cols.int64("step", -1)
    ts = cols.int64("ts_ns")
    sel = p2p & is_send & (step >= 0)
    chosen = None
    for kind in ("kernel", "cpu_op", "user_annotation"):  # count each send once
        k = cols.kinds(kind)
        if (sel & k).any():
            sel &= k
            chosen = kind
            break
    s_rank = rank[sel]
    sends = pd.DataFrame(
        {"rank": s_rank, "step": step[sel], "stage": grid.stage_lookup(s_rank), "ts": ts[sel]}
    )
    return sends, chosen


def _sends_before_first_backward(
    events: pa.Table, grid: Grid, sends: pd.DataFrame, chosen: str | None
) -> dict[int, int]:
    """Per stage 0..p-2: the sends before the step's first backward op (median over ranks and steps), on the
    sends' own timeline (GPU kernels with GPU marks, CPU ops with CPU marks): every forward ends with a send,
    so these are the forwards run before the first backward."""
    p = grid.pp or 1
    cols = columns(events)
    rank = cols.int64("rank")
    step = cols.int64("step", -1)
    ts = cols.int64("ts_ns")
    is_bwd = cols.flag("name", _is_backward_name)
    tl = ("kernel", "gpu_user_annotation") if chosen == "kernel" else ("cpu_op", "user_annotation")
    bsel = np.flatnonzero(is_bwd & (step >= 0) & cols.kinds(*tl))
    first_b = pair_reduce(rank[bsel], step[bsel], ts=(ts[bsel], np.minimum))["ts"]
    if not len(first_b) or sends.empty:
        return {}
    j = sends.join(first_b.rename("fb"), on=["rank", "step"])
    j = j[j["fb"].notna() & (j["stage"] <= p - 2) & (j["stage"] >= 0)]
    before = (j["ts"] < j["fb"]).groupby([j["stage"], j["rank"], j["step"]]).sum()
    return {int(s): int(n) for s, n in before.groupby("stage").median().items()}


def forwards_before_first_backward(events: pa.Table, grid: Grid, p2p: np.ndarray) -> dict[int, int]:
    """`_sends_before_first_backward` for any pipeline (the order GPipe and 1F1B differ in)."""
    if (grid.pp or 1) < 2 or events.num_rows == 0:
        return {}
    sends, chosen = _stage_sends(events, grid, p2p)
    return _sends_before_first_backward(events, grid, sends, chosen)


def schedule_from_p2p(events: pa.Table, grid: Grid, p2p: np.ndarray) -> dict[str, Any] | None:
    """{"virtual_stages", "microbatches", "sends_per_step": {stage: n}, "warmup_forwards": {stage: n},
    "warmup_expected": {stage: n}, "warmup_matches"} from the sends of each stage; None when p < 3 or the
    counts do not fit the pattern above."""
    p = grid.pp or 1
    if p < 3 or events.num_rows == 0:
        return None
    sends, chosen = _stage_sends(events, grid, p2p)
    if sends.empty:
        return None
    per = sends.groupby(["stage", "rank", "step"]).size().groupby("stage").median()
    if 0 not in per.index or not any(1 <= s <= p - 2 for s in per.index):
        return None
    end = int(per.loc[0])
    middle = int(np.median([per.loc[s] for s in per.index if 1 <= s <= p - 2]))
    m = middle - end
    if m <= 0 or middle % (2 * m):
        return None
    v = middle // (2 * m)
    if end != (2 * v - 1) * m:
        return None
    total = v * m
    before_b = _sends_before_first_backward(events, grid, sends, chosen)
    # the steady state's first forward precedes the first backward: warm-up = that count - 1, unless every
    # forward ran first (then the warm-up is ambiguous between total - 1 and total: null)
    warm = {s: (n - 1 if n < total else None) for s, n in before_b.items()}
    expected = {s: expected_warmup(p, s, v, m) for s in range(p - 1)}
    want = {s: min(e + 1, total) for s, e in expected.items()}
    return {
        "virtual_stages": v,
        "microbatches": m,
        "sends_per_step": {int(s): int(n) for s, n in per.items() if s >= 0},
        "forwards_before_first_backward": before_b,
        "warmup_forwards": warm,
        "warmup_expected": expected,
        "warmup_matches": (all(before_b.get(s) == w for s, w in want.items()) if before_b else None),
    }
