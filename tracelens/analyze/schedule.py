"""Pipeline schedules: which one a run used (from the actions it annotated, or from the order of its work),
its virtual stages v and microbatches m, and the bubble the schedule itself leaves (its expectation).

What the schedules of `torch.distributed.pipelining` record (torch >= 2.4):

- `ScheduleGPipe` wraps each microbatch in `record_function("Forward i")` / `("Backward i")`;
- `Schedule1F1B` records nothing of its own;
- the multi-stage schedules (`ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`, `ScheduleInterleavedZeroBubble`,
  `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) run a list of actions and record each as
  `PP:<stage><type><microbatch>`: `F` forward, `B` full backward, `I` backward of the inputs only, `W`
  backward of the weights only (zero-bubble schedules split the backward in two), `(a;b)OVERLAP_F_B` a
  forward and a backward run together (DualPipeV), and `SEND_F`/`RECV_F`/`SEND_B`/`RECV_B`/`UNSHARD`/
  `RESHARD`/`REDUCE_GRAD` around them. `<stage>` is the *virtual* stage: with v chunks per rank, stage k
  sits on rank k mod p ("loop" placement: interleaved 1F1B, looped BFS, interleaved zero bubble) or, for the
  V-shaped schedules (ZBV, DualPipeV), rank r holds stages r and 2p-1-r.

From the actions of each rank: v = stages per rank, m = microbatches per stage and step, the placement, and
the name by what distinguishes the schedules (docs/pipeline.md, "Schedule"). Without actions the order of
each rank's forward and backward work decides between GPipe and 1F1B (`schedule_from_order`).

The expectation: each rank's actions replayed in their own order with uniform costs (a forward 1, a full
backward 2, an input or weight backward 1, per chunk) and the pipeline's dependencies (a forward needs the
previous stage's forward of the microbatch, a backward the next stage's backward and its own forward, a
weight backward its input backward). The idle share of that replay's window is the bubble the schedule
leaves with equal stages: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) for interleaved 1F1B, less for
zero-bubble schedules, all from the same replay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelens.analyze.dictcol import columns
from tracelens.analyze.layout import Grid

#: Uniform cost of each action in the replay that gives a schedule's expectation (per model chunk): the
#: backward of a layer costs about twice its forward (one matmul for the input gradient, one for the weight
#: gradient, per forward matmul), split evenly between I and W (the zero-bubble schedules' assumption).
COST = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}

_PP_ACTION = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")
_PP_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")

Action = tuple[int, str, int]  # (virtual stage, F | B | I | W, microbatch)
#: What a rank runs at once: one action, or a forward and a backward overlapped (DualPipeV).
Unit = tuple[Action, ...]


@dataclass
class ScheduleFound:
    """A schedule read from a run: its name (None when not recognised), p, v, m, where it was read from
    (`source`: annotations | order), each rank's actions in one step (rank -> list of actions; an overlapped
    pair is one entry, a tuple of actions), the placement of virtual stages, and the expectation."""

    name: str | None
    p: int
    v: int
    m: int | None
    source: str
    placement: str | None = None  # loop | v | None
    orders: dict[int, list[Unit]] = field(default_factory=dict)
    expected_bubble_fraction: float | None = None

    def evidence(self) -> dict[str, Any]:
        """What summary.json says of how the schedule was recognised."""
        return {
            "source": self.source,
            "placement": self.placement,
            "actions_per_rank": {r: len(a) for r, a in sorted(self.orders.items())},
        }


def _parse(name: str) -> list[Action] | None:
    m = _PP_ACTION.match(name)
    if m:
        return [(int(m.group(1)), m.group(2), int(m.group(3)))]
    m = _PP_OVERLAP.match(name)
    if m:
        subs = [_PP_ACTION.match("PP:" + s.strip()) for s in m.group(1).split(";")]
        if subs and all(subs):
            return [(int(s.group(1)), s.group(2), int(s.group(3))) for s in subs if s]
    return None


def _actions_by_rank(events: Any, grid: Grid) -> tuple[dict[int, list[Unit]], bool]:
    """Each rank's actions in time order, in the step whose actions are the most complete (the median step
    of the rank: the first and last profiled steps can be cut); and whether they came from GPipe's labels."""
    cols = columns(events)
    ann = cols.kinds("user_annotation")
    if not ann.any():
        return {}, False
    idx = np.flatnonzero(ann)
    sub = events.select(["rank", "name", "ts_ns", "step"]).take(idx)
    rank = sub.column("rank").to_numpy(zero_copy_only=False)
    ts = sub.column("ts_ns").to_numpy(zero_copy_only=False)
    step = sub.column("step").fill_null(-1).to_numpy(zero_copy_only=False)
    text = sub.column("name").to_pylist()
    per: dict[tuple[int, int], list[tuple[int, Unit]]] = {}
    gpipe = False
    for r, t, s, n in zip(rank.tolist(), ts.tolist(), step.tolist(), text):
        if not n or s < 0:
            continue
        if n.startswith("PP:"):
            got = _parse(n)
            if got is None:
                continue
            per.setdefault((r, s), []).append((t, tuple(got)))
            continue
        g = _GPIPE.match(n)
        if g:
            st = grid.stage_of(r)
            if st is None:
                continue
            gpipe = True
            kind = "F" if g.group(1) == "Forward" else "B"
            per.setdefault((r, s), []).append((t, ((st, kind, int(g.group(2))),)))
    if not per:
        return {}, False
    out: dict[int, list[Unit]] = {}
    for r in sorted({k[0] for k in per}):
        steps = sorted(s for rr, s in per if rr == r)
        s = steps[len(steps) // 2]
        out[r] = [a for _, a in sorted(per[(r, s)], key=lambda x: x[0])]
    return out, gpipe


def _flat(order: list[Unit]) -> list[Action]:
    return [a for unit in order for a in unit]


def _placement(stages: dict[int, set[int]], p: int) -> str | None:
    """loop (stage k on rank k mod p), v (rank r holds r and 2p-1-r) or None, from each rank's stages."""
    if not stages:
        return None
    first = {r: min(s) for r, s in stages.items()}
    loop = all(sorted(s) == list(range(first[r], first[r] + p * len(s), p)) for r, s in stages.items())
    vee = all(len(s) == 2 and sorted(s) == [min(s), 2 * p - 1 - min(s)] for s in stages.values())
    if loop and not (vee and all(len(s) == 2 for s in stages.values())):
        return "loop"
    if vee:
        return "v" if not loop else "loop"
    return None


def schedule_from_actions(events: Any, grid: Grid) -> ScheduleFound | None:
    """The schedule from `torch.distributed.pipelining`'s own annotations (module docstring), or None when
    the run annotates none."""
    p = grid.pp or 1
    if p < 2 or events is None or events.num_rows == 0:
        return None
    orders, gpipe = _actions_by_rank(events, grid)
    if not orders:
        return None
    flat = {r: _flat(o) for r, o in orders.items()}
    stages = {r: {a[0] for a in f} for r, f in flat.items() if f}
    v = int(np.median([len(s) for s in stages.values()])) if stages else 1
    mbs = [
        len({a[2] for a in f if a[0] == st and a[1] == "F"})
        for r, f in flat.items()
        for st in stages.get(r, ())
    ]
    mbs = [x for x in mbs if x]
    m = int(np.median(mbs)) if mbs else None
    kinds = {a[1] for f in flat.values() for a in f}
    overlap = any(len(unit) > 1 for o in orders.values() for unit in o)
    place = "loop" if v == 1 else _placement(stages, p)
    name: str | None
    if gpipe:
        name = "gpipe"
    elif overlap:
        name = "dualpipe_v" if place == "v" else None
    elif kinds & {"I", "W"}:
        name = "zbv_zero_bubble" if place == "v" else "interleaved_zero_bubble" if place == "loop" else None
    elif v > 1:
        if place != "loop":
            name = None
        elif all(_breadth_first(f) for f in flat.values()):
            name = "looped_bfs"
        else:
            name = "interleaved_1f1b"
    else:
        name = "gpipe" if m and m > p and all(_forwards_first(f) for f in flat.values()) else "1f1b"
    found = ScheduleFound(name, p, v, m, "annotations", place, orders)
    if name is not None:
        found.expected_bubble_fraction = replay_bubble(orders, p * v)
    return found


def _forwards_first(actions: list[Action]) -> bool:
    """Every forward of the step before any backward (GPipe's fill-drain)."""
    kinds = [a[1] for a in actions]
    return "F" in kinds and kinds.index("F") == 0 and all(k == "F" for k in kinds[: kinds.count("F")])


def _breadth_first(actions: list[Action]) -> bool:
    """Looped BFS: each chunk runs every microbatch's forward before the next chunk starts, and every
    backward comes after the last forward."""
    fwd = [a[0] for a in actions if a[1] == "F"]
    return fwd == sorted(fwd) and _forwards_first(actions)


def schedule_from_order(forwards_before_first_backward: dict[int, int], p: int, m: int | None) -> str | None:
    """GPipe or 1F1B (one chunk per rank, no annotations) from the forwards stage 0 runs before its first
    backward: all m of them with m > p is GPipe's fill-drain; fewer is 1F1B (PyTorch's 1F1B warms up
    min(m, p - s) forwards on stage s). With m <= p the two run the same order (and leave the same bubble):
    1F1B. None when stage 0's count is unknown."""
    n = forwards_before_first_backward.get(0)
    if n is None or not m:
        return None
    return "gpipe" if n >= m and m > p else "1f1b"


def canonical_orders(name: str, p: int, m: int) -> dict[int, list[Unit]] | None:
    """Each rank's actions for the one-chunk schedules PyTorch runs without annotating them (1F1B) or with
    one label per microbatch (GPipe): rank s holds stage s."""
    out: dict[int, list[Unit]] = {}
    for s in range(p):
        acts: list[Unit] = []
        if name == "gpipe":
            acts.extend(((s, "F", i),) for i in range(m))
            acts.extend(((s, "B", i),) for i in range(m))
        elif name == "1f1b":
            warm = min(m, p - s)
            f = b = 0
            for _ in range(warm):
                acts.append(((s, "F", f),))
                f += 1
            while b < m:
                acts.append(((s, "B", b),))
                b += 1
                if f < m:
                    acts.append(((s, "F", f),))
                    f += 1
        else:
            return None
        out[s] = acts
    return out


def replay_bubble(orders: dict[int, list[Unit]], n_stages: int) -> float | None:
    """Idle share of the pipeline window when each rank runs its actions in their order with COST and the
    pipeline's dependencies (module docstring); None when the actions cannot all run (a dependency never
    met: actions of the step missing from the trace)."""
    done: dict[tuple[str, int, int], float] = {}
    pos = {r: 0 for r in orders}
    free = {r: 0.0 for r in orders}
    busy = {r: 0.0 for r in orders}
    last_stage = n_stages - 1
    total = sum(len(o) for o in orders.values())
    finished = 0

    def deps(a: Action) -> list[tuple[str, int, int]]:
        st, k, mb = a
        if k == "F":
            return [("F", st - 1, mb)] if st > 0 else []
        if k in ("B", "I"):
            need = [("F", st, mb)]
            if st < last_stage:
                need.append(("I", st + 1, mb))
            return need
        return [("I", st, mb)]  # W

    while finished < total:
        progressed = False
        for r, order in orders.items():
            while pos[r] < len(order):
                acts = order[pos[r]]
                need = [d for a in acts for d in deps(a)]
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] for d in need])
                cost = sum(COST[a[1]] for a in acts)
                end = start + cost
                free[r] = end
                busy[r] += cost
                for a in acts:
                    st, k, mb = a
                    done[(k, st, mb)] = end
                    if k == "B":  # a full backward also stands for the input backward
                        done[("I", st, mb)] = end
                pos[r] += 1
                finished += 1
                progressed = True
        if not progressed:
            return None
    if not busy:
        return None
    window = max(free.values())
    if window <= 0:
        return None
    return float(np.mean([1.0 - b / window for b in busy.values()]))
