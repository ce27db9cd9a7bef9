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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelens.analyze.core.dictcol import columns
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


def canonical_orders(name: str, p: int, m: int, v: int = 1) -> dict[int, list[Unit]] | None:
    """Each rank's actions in one step for a schedule by name (the orders `torch.distributed.pipelining`
    and Megatron run): `gpipe` and `1f1b` (v = 1, rank s holds stage s), `interleaved_1f1b`, `looped_bfs`
    and `interleaved_zero_bubble` with v chunks per rank (stage k on rank k mod p; v = 1 gives ZB-H1),
    `zbv_zero_bubble` (v = 2, rank r holds r and 2p-1-r). None for another name, or a combination the
    schedule does not run (interleaved 1F1B and interleaved zero bubble need m to be a multiple of
    max(1, m // p), as PyTorch requires)."""
    if p < 1 or m < 1 or v < 1:
        return None
    if name in ("gpipe", "1f1b"):
        return _one_chunk_orders(name, p, m) if v == 1 else None
    if name == "interleaved_1f1b":
        return _interleaved_orders(p, v, m, zero_bubble=False)
    if name == "interleaved_zero_bubble":
        return _interleaved_orders(p, v, m, zero_bubble=True)
    if name == "looped_bfs":
        return _looped_bfs_orders(p, v, m)
    if name == "zbv_zero_bubble":
        return _zbv_orders(p, m) if v == 2 else None
    return None


def _one_chunk_orders(name: str, p: int, m: int) -> dict[int, list[Unit]]:
    out: dict[int, list[Unit]] = {}
    for s in range(p):
        acts: list[Unit] = []
        if name == "gpipe":
            acts.extend(((s, "F", i),) for i in range(m))
            acts.extend(((s, "B", i),) for i in range(m))
        else:  # 1f1b: PyTorch warms up min(m, p - s) forwards, then one backward and one forward in turn
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
        out[s] = acts
    return out


def _interleaved_orders(p: int, v: int, m: int, zero_bubble: bool) -> dict[int, list[Unit]] | None:
    """Interleaved 1F1B (Narayanan et al. 2021) and, with `zero_bubble`, its zero-bubble variant (ZB1P of
    Qi et al. 2024; ZB-H1 when v = 1), as `torch.distributed.pipelining` orders them: microbatches go
    through the chunks in rounds of r = m / max(1, m // p); rank k warms up (v-1)*r + 2*(p-1-k) forwards
    (zero bubble: (v-1)*r + (p-1-k)), then runs one forward and one backward in turn, depth first; the
    zero-bubble variant splits each backward into I (input gradient) and W (weight gradient) and, after k
    steady steps on rank k, runs the oldest deferred W after each I, the rest at the end."""
    rounds = max(1, m // p)
    if m % rounds:
        return None
    return {k: _interleaved_rank(k, p, v, m, m // rounds, zero_bubble) for k in range(p)}


def _interleaved_rank(k: int, p: int, v: int, m: int, per_round: int, zero_bubble: bool) -> list[Unit]:
    total = v * m
    warm = min((v - 1) * per_round + (p - 1 - k) * (1 if zero_bubble else 2), total)
    f_mb: dict[int, int] = {}
    b_mb: dict[int, int] = {}
    w_mb: dict[int, int] = {}
    pending: list[int] = []  # the stages of the backwards whose W is still to run, oldest first
    acts: list[Unit] = []

    def next_mb(counter: dict[int, int], st: int) -> int:
        counter[st] = counter.get(st, 0) + 1
        return counter[st] - 1

    def weight() -> None:
        st = pending.pop(0)
        acts.append(((st, "W", next_mb(w_mb, st)),))

    for i in range(warm + total):  # warm-up, steady state, cool-down (as many backwards as warm-up forwards)
        if i < total:
            st = ((i // per_round) % v) * p + k
            acts.append(((st, "F", next_mb(f_mb, st)),))
        if i >= warm:
            st = (v - 1 - ((i - warm) // per_round) % v) * p + k
            acts.append(((st, "I" if zero_bubble else "B", next_mb(b_mb, st)),))
            if zero_bubble:
                pending.append(st)
                if i - warm >= k:
                    weight()
    while pending:
        weight()
    return acts


def _looped_bfs_orders(p: int, v: int, m: int) -> dict[int, list[Unit]]:
    """Looped BFS (Lamy-Poirier 2023): each chunk runs every microbatch's forward before the next chunk;
    the backwards run chunk by chunk in reverse, the microbatches in reverse (PyTorch's order)."""
    out: dict[int, list[Unit]] = {}
    for k in range(p):
        stages = [c * p + k for c in range(v)]
        acts: list[Unit] = [((st, "F", i),) for st in stages for i in range(m)]
        acts += [((st, "B", i),) for st in reversed(stages) for i in reversed(range(m))]
        out[k] = acts
    return out


def _zbv_orders(p: int, m: int) -> dict[int, list[Unit]]:
    """ZB-V (Qi et al. 2024, section 6) as PyTorch's ScheduleZBVZeroBubble orders it: rank k holds stages k
    and 2p-1-k; warm-up on chunk 0, then chunk 1's forward, input and weight backward in turn, a steady
    state alternating the chunks, and a cool-down of input backwards followed by the deferred weight
    backwards. Microbatches beyond m that PyTorch pads the order with are left out."""
    return {k: _zbv_rank(k, p, m) for k in range(p)}


def _zbv_rank(k: int, p: int, m: int) -> list[Unit]:
    n = max(2 * p - 1, m)
    stage = (k, 2 * p - 1 - k)  # chunk 0, chunk 1
    f = [0, 0]  # forwards issued per chunk
    b = [0, 0]  # input backwards issued per chunk
    acts: list[Unit] = []

    def act(chunk: int, kind: str, mb: int) -> None:
        if mb < m:
            acts.append(((stage[chunk], kind, mb),))

    def forward(chunk: int) -> None:
        act(chunk, "F", f[chunk])
        f[chunk] += 1

    def backward(chunk: int, weight: bool = True) -> None:
        act(chunk, "I", b[chunk])
        if weight:
            act(chunk, "W", b[chunk])
        b[chunk] += 1

    for _ in range(2 * (p - k) - 1):
        forward(0)
    for _ in range(k):
        forward(1)
        forward(0)
    for _ in range(p - k):
        forward(1)
        backward(1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            forward(0)
        backward(0)
        forward(1)
        backward(1)
    w = list(b)  # the cool-down's weight backwards start where the full backwards stopped
    for _ in range(k):
        backward(0, weight=False)
        backward(1, weight=False)
    for _ in range(p - k):
        backward(0, weight=False)
        act(0, "W", w[0])
        w[0] += 1
    for chunk in (1, 0):
        while w[chunk] < b[chunk]:
            act(chunk, "W", w[chunk])
            w[chunk] += 1
    return acts


@dataclass
class Replayed:
    """A replay of every rank's actions: when each rank ends, how long it computed, the window (the last
    end), and the most chunk-microbatches whose activations a rank held at once (`in_flight`: a forward
    done, its backward not; with a split backward, until its weight backward)."""

    end: dict[int, float]
    busy: dict[int, float]
    in_flight: dict[int, int]

    @property
    def window(self) -> float:
        return max(self.end.values()) if self.end else 0.0

    def bubble_fraction(self) -> float | None:
        """Mean idle share of the window over ranks."""
        w = self.window
        if w <= 0:
            return None
        return float(np.mean([1.0 - b / w for b in self.busy.values()]))


def _deps(a: Action, last_stage: int) -> list[tuple[str, int, int]]:
    st, k, mb = a
    if k == "F":
        return [("F", st - 1, mb)] if st > 0 else []
    if k in ("B", "I"):
        need = [("F", st, mb)]
        if st < last_stage:
            need.append(("I", st + 1, mb))
        return need
    return [("I", st, mb)]  # W


def replay(
    orders: dict[int, list[Unit]],
    n_stages: int,
    cost: Callable[[int, str], float] | None = None,
    recv: Callable[[int, int], float] | None = None,
) -> Replayed | None:
    """Each rank runs its actions in their order, an action as soon as the rank is free and its inputs are
    done (module docstring). `cost(stage, kind)`: an action's time (default COST, uniform); `recv(src, dst)`:
    the time the rank of stage `dst` spends receiving an input from stage `src` held by another rank (a P2P
    receive runs on the consumer's stream once both sides are there; default none). None when the actions
    cannot all run (a dependency never met: actions of the step missing, or an impossible order)."""
    done: dict[tuple[str, int, int], float] = {}
    pos = {r: 0 for r in orders}
    free = {r: 0.0 for r in orders}
    busy = {r: 0.0 for r in orders}
    held = {r: 0 for r in orders}
    peak = {r: 0 for r in orders}
    split = {r: any(a[1] == "W" for u in o for a in u) for r, o in orders.items()}
    rank_of = {a[0]: r for r, o in orders.items() for u in o for a in u}
    last_stage = n_stages - 1
    total = sum(len(o) for o in orders.values())
    finished = 0
    while finished < total:
        progressed = False
        for r, order in orders.items():
            while pos[r] < len(order):
                acts = order[pos[r]]
                need = [d for a in acts for d in _deps(a, last_stage)]
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] for d in need])
                if cost is None:
                    c = sum(COST[a[1]] for a in acts)
                else:
                    c = sum(cost(a[0], a[1]) for a in acts)
                if recv is not None:
                    c += sum(
                        recv(d[1], a[0])
                        for a in acts
                        for d in _deps(a, last_stage)
                        if rank_of.get(d[1], r) != r
                    )
                end = start + c
                free[r] = end
                busy[r] += c
                for a in acts:
                    st, k, mb = a
                    done[(k, st, mb)] = end
                    if k == "B":  # a full backward also stands for the input backward
                        done[("I", st, mb)] = end
                    if k == "F":
                        held[r] += 1
                        peak[r] = max(peak[r], held[r])
                    elif k == "W" or (k == "B" or (k == "I" and not split[r])):
                        held[r] -= 1
                pos[r] += 1
                finished += 1
                progressed = True
        if not progressed:
            return None
    return Replayed(end=free, busy=busy, in_flight=peak)


def replay_bubble(orders: dict[int, list[Unit]], n_stages: int) -> float | None:
    """Idle share of the pipeline window when each rank runs its actions in their order with COST and the
    pipeline's dependencies (module docstring); None when the actions cannot all run (a dependency never
    met: actions of the step missing from the trace)."""
    got = replay(orders, n_stages)
    if got is None or not got.busy:
        return None
    return got.bubble_fraction()
