"""From diagnosis to prescription: what a pipeline's schedule and layout cost, and what changing them buys.

The schedule what-if (docs/whatif.md, "Schedule and layout what-ifs") measures, per pipeline and stage, the
work of one microbatch (the time the stage's GPU is busy between its first forward and its last backward,
split into forward and backward by the module annotations), the P2P receive time between stages and the
activation memory of one microbatch, and replays hypothetical schedules (`analyze.pipeline.schedule.canonical_orders`)
with those costs (`analyze.pipeline.schedule.replay`): more microbatches, interleaving, zero-bubble schedules, one block
of layers moved across a stage boundary, the tensor-parallel degree the architecture allows. The replay of the
schedule as run calibrates the others: a prediction is the measured step with the pipeline window scaled by
replayed-after / replayed-as-run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracelens.analyze.core import intervals as iv
from tracelens.analyze.pipeline.schedule import canonical_orders, replay

#: Share of a stage's backward that computes the input gradient (I) when a zero-bubble schedule splits it
#: from the weight gradient (W): one matmul each per forward matmul (the zero-bubble paper's assumption).
INPUT_GRAD_SHARE = 0.5

#: Forward share of a microbatch's work when the traces annotate no backward module (a backward costs about
#: twice its forward: one matmul for the input gradient and one for the weight gradient per forward matmul).
DEFAULT_FWD_SHARE = 1.0 / 3.0

#: Interleaving degrees tried (chunks per rank), when the stage's layers divide into them.
VIRTUAL_STAGES = (2, 4)

#: Pipelines replayed at most (those with the most measured work): every data-parallel replica of a large run
#: replays alike, and the step ends with the slowest.
MAX_CHAINS = 8

MIXERS = ("full_attention", "linear_attention", "sliding_attention", "mamba", "mixer")
EXTRAS = ("lm_head", "embedding")


@dataclass
class StageWork:
    """Measured work of one pipeline stage (one rank of one pipeline), per microbatch, in ns of busy GPU
    time: the forward and backward of every layer the stage holds (all its chunks), of which `extra_ns`
    is the LM head's and the embedding's, and `compute_ns` compute kernels (the rest is collectives and
    copies that nothing overlapped)."""

    stage: int
    rank: int
    work_ns: float
    fwd_share: float
    extra_ns: dict[str, float] = field(default_factory=dict)
    compute_ns: float | None = None

    @property
    def layer_ns(self) -> float:
        return max(self.work_ns - sum(self.extra_ns.values()), 0.0)


@dataclass
class PipelineModel:
    """What the schedule what-if replays: the run's schedule and the measured work of each pipeline."""

    schedule: str
    p: int
    v: int
    m: int
    chains: list[list[StageWork]]
    hop_ns: dict[tuple[int, int], float]
    step_ns: float  # measured: mean over steps of the longest rank's step
    window_ns: float  # measured: mean over steps of the longest pipeline window
    bubble_ns: float  # measured: mean bubble over the pipeline's ranks
    replayed_window_ns: float  # the schedule as run, replayed with the measured work
    layers: dict[int, dict[str, int]]  # stage -> mixer type -> layers
    type_ms: dict[int, dict[str, float]]  # stage -> type -> compute ms per microbatch (fwd + bwd)
    act_bytes: dict[int, float] | None = None  # stage -> activation bytes of one microbatch (all chunks)
    act_peak_bytes: float | None = None  # measured peak of activations in flight (largest rank)
    in_flight: dict[int, int] = field(default_factory=dict)  # stage -> chunk-microbatches held, as run
    notes: list[str] = field(default_factory=list)

    @property
    def default_hop_ns(self) -> float:
        """A hop between stages the run never connected (the interleaved wrap-around, a new layout): the
        slowest hop measured (stages far apart are the likeliest to cross hosts)."""
        return max(self.hop_ns.values()) if self.hop_ns else 0.0

    def evidence(self) -> dict[str, Any]:
        """What summary.json says of the measurement (`pipeline.what_if_model`)."""
        return {
            "work_ms_per_microbatch": {
                str(w.stage): round(float(np.mean([c[w.stage].work_ns for c in self.chains])) / 1e6, 6)
                for w in self.chains[0]
            },
            "forward_share": round(float(np.mean([w.fwd_share for c in self.chains for w in c])), 4),
            "p2p_ms": {f"{a}->{b}": round(v / 1e6, 6) for (a, b), v in sorted(self.hop_ns.items())},
            "measured_window_ms": round(self.window_ns / 1e6, 6),
            "replayed_window_ms": round(self.replayed_window_ns / 1e6, 6),
            "activation_bytes_per_microbatch": (
                {str(s): int(b) for s, b in sorted(self.act_bytes.items())} if self.act_bytes else None
            ),
            "notes": self.notes,
        }


# ------------------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------------------
def _fwd_shares(spans: pd.DataFrame | None, ranks: Iterable[int]) -> dict[int, float]:
    """Per rank: forward compute / (forward + backward compute) of its module annotations (null where no
    backward annotation is seen: the rank keeps DEFAULT_FWD_SHARE)."""
    out: dict[int, float] = {}
    if spans is None or not len(spans):
        return out
    sp = spans[spans["rank"].isin(list(ranks))]
    if not len(sp):
        return out
    g = sp.groupby(["rank", "backward"])["compute_ns"].sum().unstack(fill_value=0)
    if True not in g.columns or False not in g.columns:
        return out
    for r, row in g.iterrows():
        f, b = float(row[False]), float(row[True])
        if f > 0 and b > 0:
            out[int(str(r))] = f / (f + b)
    return out


def _hops(
    collectives: pd.DataFrame | None, stage_of: Mapping[int, int | None]
) -> dict[tuple[int, int], float]:
    """Median transfer of the P2P calls between two stages (sender's stage, receiver's stage), in ns: the
    time a receive takes once both sides are there."""
    if collectives is None or not len(collectives) or "is_p2p" not in collectives:
        return {}
    df = collectives[collectives["is_p2p"].fillna(False).astype(bool)]
    df = df[df["transfer_ns"].notna() & df["peer"].notna()]
    if not len(df):
        return {}
    me = df["rank"].map(stage_of)
    peer = df["peer"].astype(np.int64).map(stage_of)
    op = df["op"].astype(str).str.lower()
    send = op.str.contains("send")
    src = np.where(send, me, peer)
    dst = np.where(send, peer, me)
    frame = pd.DataFrame({"src": src, "dst": dst, "t": df["transfer_ns"].astype(np.float64)}).dropna()
    out: dict[tuple[int, int], float] = {}
    for (a, b), g in frame.groupby(["src", "dst"]):
        if a != b:
            out[(int(a), int(b))] = float(g["t"].median())
    return out


def activation_peaks(memory: Any, ranks: Iterable[int]) -> dict[int, float]:
    """Per rank: the largest swing of allocated memory its `[memory]` events show (the highest level less the
    lowest, the level before each allocation counted): the activations a step holds at its peak. Ranks
    without memory events are left out."""
    if memory is None or not getattr(memory, "num_rows", 0):
        return {}
    import pyarrow as pa
    import pyarrow.compute as pc

    t = memory.select(["rank", "bytes", "total_allocated"])
    t = t.filter(
        pc.is_in(t.column("rank"), value_set=pa.array(sorted(set(ranks)), t.schema.field("rank").type))
    )
    df = t.to_pandas()
    df = df[df["total_allocated"].notna()]
    if not len(df):
        return {}
    before = df["total_allocated"] - df["bytes"].fillna(0).clip(lower=0)
    low = pd.concat([before, df["total_allocated"]], axis=1).min(axis=1)
    g = pd.DataFrame({"rank": df["rank"], "low": low, "high": df["total_allocated"]}).groupby("rank")
    out = {
        int(str(r)): float(h - lo) for r, h, lo in zip(g["high"].max().index, g["high"].max(), g["low"].min())
    }
    return {r: v for r, v in out.items() if v > 0}


def _extras_ns(type_ms: Mapping[str, float], work_ns: float) -> dict[str, float]:
    """The LM head's and the embedding's share of a stage's busy work (their compute share of the stage's
    module compute)."""
    total = sum(v for v in type_ms.values() if v == v)
    if total <= 0:
        return {}
    return {k: work_ns * type_ms[k] / total for k in EXTRAS if type_ms.get(k)}


def measure(
    *,
    schedule: str | None,
    p: int,
    v: int,
    m: int | None,
    chains: list[list[int]],
    stage_of: Mapping[int, int],
    per_rank_step: pd.DataFrame,
    rank_windows: pd.DataFrame | None,
    spans: pd.DataFrame | None,
    collectives: pd.DataFrame | None,
    compute_sets: Mapping[int, Any] | None,
    layers: Mapping[int, Mapping[str, int]] | None,
    type_ms: Mapping[int, Mapping[str, float]] | None,
    step_ns: float,
    orders: dict[int, list[Any]] | None = None,
    memory: Any = None,
) -> PipelineModel | None:
    """The measured pipeline (PipelineModel), or None when it cannot be measured: no schedule or microbatch
    count, a pipeline without every stage, or a schedule whose order cannot be replayed."""
    if not schedule or not m or p < 2 or not chains or per_rank_step is None or not len(per_rank_step):
        return None
    orders_run = _orders_as_run(schedule, p, v, m, orders, chains[0])
    if orders_run is None:
        return None
    prs = per_rank_step.copy()
    prs["busy"] = (prs["window_ns"] - prs["bubble_ns"]).clip(lower=0)
    busy = prs.groupby("rank")["busy"].mean()
    ranks = [r for c in chains for r in c]
    shares = _fwd_shares(spans, ranks)
    comp = _compute_in_windows(rank_windows, compute_sets, ranks)
    types: dict[int, dict[str, float]] = {int(s): dict(t) for s, t in (type_ms or {}).items()}
    out_chains: list[list[StageWork]] = []
    for chain in chains:
        if len(chain) != p or any(r not in busy.index for r in chain):
            continue
        works_of: list[StageWork] = []
        for s, r in enumerate(chain):
            w = float(busy[r]) / m
            works_of.append(
                StageWork(
                    stage=s,
                    rank=int(r),
                    work_ns=w,
                    fwd_share=shares.get(int(r), DEFAULT_FWD_SHARE),
                    extra_ns=_extras_ns(types.get(s, {}), w),
                    compute_ns=None if comp.get(int(r)) is None else float(comp[int(r)]) / m,
                )
            )
        out_chains.append(works_of)
    if not out_chains:
        return None
    if len(out_chains) > MAX_CHAINS:  # (the pipelines with the most work: the others finish first)
        out_chains = sorted(out_chains, key=lambda c: -sum(w.work_ns for w in c))[:MAX_CHAINS]
    win = prs.groupby("step")["window_ns"].max().mean()
    pm = PipelineModel(
        schedule=schedule,
        p=p,
        v=v,
        m=m,
        chains=out_chains,
        hop_ns=_hops(collectives, stage_of),
        step_ns=float(step_ns),
        window_ns=float(win),
        bubble_ns=float(prs["bubble_ns"].mean()),
        replayed_window_ns=0.0,
        layers={int(s): dict(c) for s, c in (layers or {}).items()},
        type_ms=types,
    )
    if not shares:
        pm.notes.append(
            f"no backward module annotations: a microbatch's forward is taken as {DEFAULT_FWD_SHARE:.2f} of its work"
        )
    place = placement_of(schedule)
    got = _replay_chains(pm, orders_run, p * v, lambda c, k: _chunk_costs(c, p, v, place), placement=place)
    if got is None:
        return None
    pm.replayed_window_ns = got[0]
    # activation memory: the measured peak per rank over the chunk-microbatches its order holds at once
    peaks = activation_peaks(memory, ranks)
    held = got[2]
    pm.in_flight = held
    if peaks and held:
        per_stage: dict[int, list[float]] = {}
        for works in out_chains:
            for sw in works:
                if sw.rank in peaks and held.get(sw.stage):
                    per_stage.setdefault(sw.stage, []).append(peaks[sw.rank] / held[sw.stage] * v)
        if len(per_stage) == p:
            pm.act_bytes = {s: float(np.median(x)) for s, x in per_stage.items()}
            pm.act_peak_bytes = max(peaks.values())
    return pm


def placement_of(schedule: str) -> str:
    """Where a schedule puts virtual stage k: rank k mod p (loop), or rank r holds r and 2p-1-r (v)."""
    return "v" if schedule in ("zbv_zero_bubble", "dualpipe_v") else "loop"


def _orders_as_run(
    schedule: str, p: int, v: int, m: int, orders: dict[int, list[Any]] | None, chain: list[int]
) -> dict[int, list[Any]] | None:
    """Each stage's actions in one step of the run: the annotated ones of the first pipeline's ranks, else
    the schedule's own order (canonical_orders), keyed by stage."""
    if orders and all(r in orders for r in chain):
        return {s: orders[r] for s, r in enumerate(chain)}
    return canonical_orders(schedule, p, m, v)


def _compute_in_windows(
    windows: pd.DataFrame | None, sets: Mapping[int, Any] | None, ranks: list[int]
) -> dict[int, float]:
    """Per rank: compute-kernel time between its first forward and last backward, mean over steps."""
    out: dict[int, float] = {}
    if windows is None or not len(windows) or not sets:
        return out
    for r in ranks:
        rs = sets.get(r)
        w = windows[windows["rank"] == r]
        if rs is None or not len(w):
            continue
        got = iv.measure_in_windows(rs.compute, w["first_ns"].to_numpy(), w["last_ns"].to_numpy())
        out[r] = float(np.mean(got))
    return out


# ------------------------------------------------------------------------------------------------------
# replay of a configuration
# ------------------------------------------------------------------------------------------------------
Costs = dict[tuple[int, str], float]


def _rank_of(k: int, p: int, v: int, placement: str) -> int:
    if placement == "v":
        return k if k < p else 2 * p - 1 - k
    return k % p


def _chunk_costs(chain: list[StageWork], p: int, v: int, placement: str) -> Costs:
    """(virtual stage, F|B|I|W) -> ns: each rank's layer work cut evenly over its v chunks, the embedding on
    virtual stage 0, the LM head on the last one, split into forward and backward by the rank's share."""
    n = p * v
    emb = sum(w.extra_ns.get("embedding", 0.0) for w in chain)
    head = sum(w.extra_ns.get("lm_head", 0.0) for w in chain)
    out: Costs = {}
    for k in range(n):
        w = chain[_rank_of(k, p, v, placement)]
        c = w.layer_ns / v + (emb if k == 0 else 0.0) + (head if k == n - 1 else 0.0)
        f = c * w.fwd_share
        b = c - f
        out[(k, "F")] = f
        out[(k, "B")] = b
        out[(k, "I")] = b * INPUT_GRAD_SHARE
        out[(k, "W")] = b - b * INPUT_GRAD_SHARE
    return out


def _cost_fn(costs: Costs) -> Callable[[int, str], float]:
    return lambda st, k: costs[(st, k)]


def _replay_chains(
    pm: PipelineModel,
    orders: dict[int, list[Any]],
    n_stages: int,
    costs_of: Callable[[list[StageWork], int], Costs],
    p: int | None = None,
    v: int | None = None,
    placement: str = "loop",
    hops: Mapping[tuple[int, int], float] | None = None,
    chains: list[list[StageWork]] | None = None,
) -> tuple[float, float, dict[int, int]] | None:
    """Replay `orders` on every pipeline with its own costs: (the longest window, the mean idle time of a
    rank in it, chunk-microbatches held at once per physical stage); None when the order cannot run."""
    p = p or pm.p
    v = v or (n_stages // p)
    hop = dict(pm.hop_ns if hops is None else hops)
    default = pm.default_hop_ns

    def recv(src: int, dst: int) -> float:
        a, b = _rank_of(src, p, v, placement), _rank_of(dst, p, v, placement)
        return hop.get((a, b), default)

    windows, idle = [], []
    held: dict[int, int] = {}
    for i, chain in enumerate(chains if chains is not None else pm.chains):
        got = replay(orders, n_stages, _cost_fn(costs_of(chain, i)), recv)
        if got is None:
            return None
        windows.append(got.window)
        idle.append(float(np.mean([got.window - b for b in got.busy.values()])))
        for r, h in got.in_flight.items():
            held[int(r)] = max(held.get(int(r), 0), h)
    j = int(np.argmax(windows))
    return windows[j], idle[j], held


# ------------------------------------------------------------------------------------------------------
# the what-if entries
# ------------------------------------------------------------------------------------------------------
def _p2p_per_step(p: int, v: int, m: int) -> int:
    """Activation and gradient sends of the busiest rank per step: one per microbatch across each boundary
    of its chunks that has a neighbour on another rank (2v per middle rank, minus the two ends of the
    model)."""
    n = p * v
    per_rank = [0] * p
    for k in range(n):
        r = k % p
        per_rank[r] += (k < n - 1) + (k > 0)
    return max(per_rank) * m


def _held_text(held: Mapping[int, int], v: int) -> str:
    if not held:
        return "unknown"
    worst = max(held, key=lambda s: held[s])
    return f"{held[worst] / v:g} microbatches' activations on stage {worst}"


def what_ifs(
    pm: PipelineModel,
    *,
    layer_types: list[str] | None = None,
    block_size: int = 1,
    layer_split: list[int] | None = None,
    tp: int | None = None,
    tp_option: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Schedule and layout what-if entries (summary `what_if`, kind schedule | layout), each replayed with
    the measured work; entries whose order cannot run are left out."""
    out: list[dict[str, Any]] = []
    scale = pm.window_ns / pm.replayed_window_ns if pm.replayed_window_ns > 0 else 1.0
    base_act = _act_after(pm, pm.in_flight, pm.v, None)
    base_fraction = pm.bubble_ns / pm.step_ns if pm.step_ns > 0 else None
    stage_ranks = sorted({w.rank for c in pm.chains for w in c})

    def entry(
        kind: str,
        text: str,
        params: dict[str, Any],
        before: dict[str, Any],
        got: tuple[float, float, dict[int, int]],
        v_after: int,
        m_after: int,
        buys: list[str],
        costs: list[str],
        act_after: float | None,
    ) -> dict[str, Any]:
        window, idle, _held = got
        step_after = pm.step_ns - pm.window_ns + window * scale
        gain = (m_after / step_after) / (pm.m / pm.step_ns) - 1.0 if step_after > 0 else None
        bub_after = idle * scale
        return {
            "change": text,
            "kind": kind,
            **params,
            "from": before,
            "ranks": stage_ranks,
            "stages": list(range(pm.p)),
            "step_time_ms": round(pm.step_ns / 1e6, 6),
            "step_time_ms_after": round(step_after / 1e6, 6),
            "saving_ms": round((pm.step_ns - step_after) / 1e6, 6),
            "throughput_gain": None if gain is None else round(gain, 4),
            "bubble_fraction": None if base_fraction is None else round(base_fraction, 4),
            "bubble_fraction_after": round(bub_after / step_after, 4) if step_after > 0 else None,
            "activation_bytes": None if base_act is None else int(round(base_act)),
            "activation_bytes_after": None if act_after is None else int(round(act_after)),
            "buys": buys,
            "costs": costs,
            "model": "replay",
        }

    def run(
        name: str, v2: int, m2: int, placement: str = "loop"
    ) -> tuple[float, float, dict[int, int]] | None:
        orders = canonical_orders(name, pm.p, m2, v2)
        if orders is None:
            return None
        return _replay_chains(
            pm,
            orders,
            pm.p * v2,
            lambda c, i: _chunk_costs(c, pm.p, v2, placement),
            v=v2,
            placement=placement,
        )

    sched, p, v, m = pm.schedule, pm.p, pm.v, pm.m
    sends = _p2p_per_step(p, v, m)
    # 1. more microbatches of the same size (the global batch grows with them)
    m2 = 2 * m
    got = run(sched, v, m2, placement_of(sched))
    if got is not None:
        act = _act_after(pm, got[2], v, None)
        out.append(
            entry(
                "schedule",
                f"{m2} microbatches instead of {m} (same microbatch size: the global batch doubles)",
                {"microbatches": m2},
                {"microbatches": m},
                got,
                v,
                m2,
                [f"the fill and drain are shared by {m2} microbatches instead of {m}"],
                [
                    "twice the samples per step (a larger global batch, or half the microbatch size to keep it: "
                    "then each microbatch runs less efficiently)",
                    f"activations held at once: {_held_text(got[2], v)}"
                    + ("" if act is None else f" ({act / 2**30:.2f} GiB)"),
                    f"P2P sends per step on the busiest rank: {sends} -> {_p2p_per_step(p, v, m2)}",
                ],
                act,
            )
        )
    # 1b. GPipe's fill-drain holds every microbatch's activations; 1F1B the same bubble with at most p
    if sched == "gpipe":
        got = run("1f1b", 1, m)
        if got is not None:
            act = _act_after(pm, got[2], 1, None)
            out.append(
                entry(
                    "schedule",
                    "1F1B instead of GPipe (the same microbatches)",
                    {"schedule": "1f1b"},
                    {"schedule": sched},
                    got,
                    1,
                    m,
                    [
                        f"activations held at once: {_held_text(got[2], 1)}"
                        + ("" if act is None else f" ({act / 2**30:.2f} GiB)")
                        + f" instead of all {m}"
                    ],
                    ["the same bubble: (p-1)/(m+p-1) with equal stages"],
                    act,
                )
            )
    # 2. interleaving (v model chunks per rank), the work of a stage cut evenly over its chunks
    if sched in ("1f1b", "gpipe", "interleaved_1f1b"):
        for v2 in VIRTUAL_STAGES:
            if v2 == v or not _chunks_divide(pm, v2):
                continue
            got = run("interleaved_1f1b", v2, m)
            if got is None:
                continue
            act = _act_after(pm, got[2], v2, None)
            out.append(
                entry(
                    "schedule",
                    f"interleaved 1F1B with {v2} model chunks per rank",
                    {"schedule": "interleaved_1f1b", "virtual_stages": v2},
                    {"schedule": sched, "virtual_stages": v},
                    got,
                    v2,
                    m,
                    [f"the fill and drain shrink about {v2}x: each chunk is 1/{v2} of a stage"],
                    [
                        f"P2P sends per step on the busiest rank: {sends} -> {_p2p_per_step(p, v2, m)}",
                        f"activations held at once: {_held_text(got[2], v2)}"
                        + ("" if act is None else f" ({act / 2**30:.2f} GiB)"),
                        "the stage's layers must split into whole chunks (and the microbatches into rounds "
                        "of p)",
                        *_block_note(pm, v2, block_size),
                    ],
                    act,
                )
            )
    # 3. zero-bubble schedules: the backward split into input and weight gradients, the weight gradients
    #    filling the bubble
    zb = [("interleaved_zero_bubble", v, "loop")]
    if _chunks_divide(pm, 2):
        zb.append(("zbv_zero_bubble", 2, "v"))
    for name, v2, place in zb:
        if name == sched and v2 == v:
            continue
        got = run(name, v2, m, place)
        if got is None:
            continue
        act = _act_after(pm, got[2], v2, None)
        label = (
            "zero-bubble ZB-H1 (backward split into input and weight gradients)"
            if name == "interleaved_zero_bubble" and v2 == 1
            else "interleaved zero bubble"
            if name == "interleaved_zero_bubble"
            else "zero-bubble ZB-V (2 chunks per rank, V placement)"
        )
        out.append(
            entry(
                "schedule",
                label,
                {"schedule": name, "virtual_stages": v2},
                {"schedule": sched, "virtual_stages": v},
                got,
                v2,
                m,
                ["weight-gradient work fills the idle time of the fill and drain"],
                [
                    f"assumes the input and weight gradients each take {INPUT_GRAD_SHARE:.0%} of a backward "
                    "(not measured: the run does not split them)",
                    f"activations held until each weight gradient: {_held_text(got[2], v2)}"
                    + ("" if act is None else f" ({act / 2**30:.2f} GiB)"),
                    f"P2P sends per step on the busiest rank: {sends} -> {_p2p_per_step(p, v2, m)}",
                    "the backward must be split (PyTorch's pipelining stages do it; torch.compile'd stages "
                    "cannot)",
                ],
                act,
            )
        )
    # 4. one block of layers moved across a stage boundary
    move = _best_move(pm, layer_types, block_size, layer_split)
    if move is not None:
        split2, got, act, text = move
        out.append(
            entry(
                "layout",
                text,
                {"layer_split": split2},
                {"layer_split": layer_split},
                got,
                v,
                m,
                ["the heaviest stage sheds work: every other stage waits less for it"],
                [
                    "moves the block's weights, gradients and optimizer state to the neighbouring stage",
                    f"activations held at once: {_held_text(got[2], v)}"
                    + ("" if act is None else f" ({act / 2**30:.2f} GiB)"),
                ],
                act,
            )
        )
    # 5. the tensor-parallel degree the architecture allows
    if tp_option is not None:
        got_tp = _tp_replay(pm, tp_option)
        if got_tp is not None:
            got, act = got_tp
            e = entry(
                "layout",
                tp_option["change"],
                tp_option["params"],
                tp_option["from"],
                got,
                v,
                m,
                list(tp_option["buys"]),
                list(tp_option["costs"])
                + [
                    f"activations held at once: {_held_text(got[2], v)}"
                    + ("" if act is None else f" ({act / 2**30:.2f} GiB)")
                ],
                act,
            )
            e["stages"] = list(range(tp_option["params"]["pp"]))
            out.append(e)
    return out


def _chunks_divide(pm: PipelineModel, v2: int) -> bool:
    """Every stage's layers cut into v2 chunks of whole layers (true when the layers are unknown)."""
    if not pm.layers:
        return True
    return all((n := sum(pm.layers.get(s, {}).values())) > 0 and n % v2 == 0 for s in range(pm.p))


def _block_note(pm: PipelineModel, v2: int, block: int) -> list[str]:
    """A cost line when v2 chunks of a stage do not hold whole blocks of a hybrid model."""
    if block <= 1 or not pm.layers:
        return []
    n = min(sum(pm.layers.get(s, {}).values()) for s in range(pm.p))
    if n % v2 == 0 and (n // v2) % block:
        return [
            f"chunks of {n // v2} layers do not hold whole {block}-layer blocks: their layer types differ "
            "(the replay cuts each stage's work evenly)"
        ]
    return []


def _act_after(
    pm: PipelineModel, held: Mapping[int, int], v2: int, layers_after: Mapping[int, int] | None
) -> float | None:
    """Activation bytes in flight on the rank that holds the most: chunk-microbatches held at once x one
    chunk's activations (a stage's per-microbatch bytes / v2, scaled by its layers after / before)."""
    if not pm.act_bytes or not held:
        return None
    best = 0.0
    for s, h in held.items():
        a = pm.act_bytes.get(s)
        if a is None:
            return None
        if layers_after is not None:
            before = sum(pm.layers.get(s, {}).values())
            a = a * layers_after.get(s, before) / before if before else a
        best = max(best, a / v2 * h)
    return best


# ---- layer moves ----------------------------------------------------------------------------------------
def _layer_ns(pm: PipelineModel, s: int, kind: str) -> float | None:
    """Busy ns per microbatch of one layer of mixer type `kind` on stage s: its mixer's and one MLP's share of
    the stage's module compute, scaled to the stage's measured work."""
    t = pm.type_ms.get(s) or {}
    counts = pm.layers.get(s) or {}
    n = sum(counts.values())
    total = sum(x for x in t.values() if x == x)
    if not n or total <= 0 or not counts.get(kind):
        return None
    w = float(np.mean([c[s].work_ns for c in pm.chains]))
    mix = t.get(kind, 0.0) / counts[kind]
    mlp = sum(x for k, x in t.items() if k not in MIXERS and k not in EXTRAS) / n
    return (mix + mlp) / total * w


def _best_move(
    pm: PipelineModel,
    layer_types: list[str] | None,
    block: int,
    layer_split: list[int] | None,
) -> tuple[list[int], tuple[float, float, dict[int, int]], float | None, str] | None:
    """The best single move of one boundary between two stages to the next block boundary (4-layer
    super-blocks for the Qwen3.5 hybrid; single layers otherwise), replayed; None when the stages hold equal
    work or no move shortens the replayed window."""
    if not layer_split or len(layer_split) != pm.p or not pm.type_ms or not pm.layers:
        return None
    n_layers = sum(layer_split)
    unit = block if block > 1 and n_layers % block == 0 else 1
    orders = canonical_orders(pm.schedule, pm.p, pm.m, pm.v)
    if orders is None:
        return None
    place = placement_of(pm.schedule)
    bounds = [int(x) for x in np.cumsum(layer_split)[:-1]]
    base_window = pm.replayed_window_ns
    best = None
    for i, b in enumerate(bounds):
        lo = bounds[i - 1] if i > 0 else 0
        hi = bounds[i + 1] if i + 1 < len(bounds) else n_layers
        cands = {((b - 1) // unit) * unit, ((b // unit) + 1) * unit}
        for nb in sorted(cands):
            if nb <= lo or nb >= hi or nb == b:
                continue
            moved = range(min(b, nb), max(b, nb))
            src, dst = (
                (i + 1, i) if nb > b else (i, i + 1)
            )  # the stage that gives the layers, the one that takes them
            kinds = [_kind_of(layer_types, li, pm.layers.get(src) or {}) for li in moved]
            add_src = [_layer_ns(pm, src, k) for k in kinds]
            add_dst = [_layer_ns(pm, dst, k) or _layer_ns(pm, src, k) for k in kinds]
            if any(x is None for x in add_src) or any(x is None for x in add_dst):
                continue
            d_src = -sum(float(x) for x in add_src if x is not None)
            d_dst = sum(float(x) for x in add_dst if x is not None)
            split2 = list(layer_split)
            split2[src] -= len(moved)
            split2[dst] += len(moved)

            def costs_of(
                chain: list[StageWork],
                _i: int,
                src: int = src,
                dst: int = dst,
                d_src: float = d_src,
                d_dst: float = d_dst,
            ) -> Costs:
                c2 = []
                for w in chain:
                    d = d_src if w.stage == src else d_dst if w.stage == dst else 0.0
                    c2.append(
                        StageWork(
                            w.stage,
                            w.rank,
                            max(w.work_ns + d, 0.0),
                            w.fwd_share,
                            dict(w.extra_ns),
                            w.compute_ns,
                        )
                    )
                return _chunk_costs(c2, pm.p, pm.v, place)

            got = _replay_chains(pm, orders, pm.p * pm.v, costs_of, placement=place)
            if got is None or got[0] >= base_window * (1 - 1e-9):
                continue
            if best is None or got[0] < best[1][0]:
                n = len(moved)
                span = f"layer {moved.start}" if n == 1 else f"layers {moved.start}-{moved.stop - 1}"
                if unit > 1 and n % unit == 0:
                    how = f" ({n // unit} block{'s' if n // unit > 1 else ''} of {unit} layers)"
                else:
                    how = f" (the boundary onto the block boundary at layer {nb})" if unit > 1 else ""
                text = f"{span} moved from stage {src} to stage {dst}{how}: split " + ",".join(
                    map(str, split2)
                )
                layers_after = {s: split2[s] for s in range(pm.p)}
                best = (split2, got, _act_after(pm, got[2], pm.v, layers_after), text)
    return best


def _kind_of(layer_types: list[str] | None, li: int, counts: Mapping[str, int]) -> str:
    """The mixer type of layer li (the model's), else the type the giving stage holds most of."""
    if layer_types is not None and 0 <= li < len(layer_types):
        return layer_types[li]
    return max(counts, key=lambda k: counts[k]) if counts else "full_attention"


# ---- tensor parallelism ----------------------------------------------------------------------------------
def tp_option(
    pm: PipelineModel,
    *,
    tp: int,
    allowed: int,
    num_layers: int,
    layer_types: list[str],
    new_split: list[int],
    dup_fraction: float,
) -> dict[str, Any] | None:
    """The layout with the largest tensor-parallel degree below `tp` that divides every partitioned dimension
    (`allowed`), on the same GPUs: tp/allowed times as many pipeline stages (`new_split` layers each), the same
    microbatches and schedule. Each rank's compute per layer grows tp/allowed times (less the work replicated
    K/V heads duplicated, `dup_fraction`); collectives and copies per layer keep their measured time, scaled
    by the ring all-reduce's 2(n-1)/n; the LM head and embedding follow the last and first stage."""
    k = tp // allowed
    if k < 2 or tp % allowed:
        return None
    p2 = pm.p * k
    if len(new_split) != p2 or sum(new_split) != num_layers:
        return None
    ring = ((allowed - 1) / allowed) / ((tp - 1) / tp)
    # per-layer busy ns of each mixer type, compute and the rest apart, averaged over stages
    comp_of: dict[str, list[float]] = {}
    rest_of: list[float] = []
    extra_comp = {"lm_head": 0.0, "embedding": 0.0}
    fwd = float(np.mean([w.fwd_share for c in pm.chains for w in c]))
    for s in range(pm.p):
        ws = [c[s] for c in pm.chains]
        work = float(np.mean([w.work_ns for w in ws]))
        cvals = [w.compute_ns for w in ws if w.compute_ns is not None]
        if not cvals:
            return None
        compute = min(float(np.mean(cvals)), work)
        t = pm.type_ms.get(s) or {}
        counts = pm.layers.get(s) or {}
        n = sum(counts.values())
        total = sum(x for x in t.values() if x == x)
        if not n or total <= 0:
            return None
        mlp = sum(x for kk, x in t.items() if kk not in MIXERS and kk not in EXTRAS) / n
        for kind, cnt in counts.items():
            if cnt:
                comp_of.setdefault(kind, []).append((t.get(kind, 0.0) / cnt + mlp) / total * compute)
        for kk in EXTRAS:
            if t.get(kk):
                extra_comp[kk] = max(extra_comp[kk], t[kk] / total * compute)
        rest_of.append((work - compute) / n)
    per_comp = {kind: float(np.mean(x)) * k / (1.0 + dup_fraction) for kind, x in comp_of.items()}
    per_rest = float(np.mean(rest_of)) * ring
    works: list[StageWork] = []
    start = 0
    for s, n in enumerate(new_split):
        kinds = layer_types[start : start + n]
        start += n
        if any(kk not in per_comp for kk in kinds):
            return None
        w = sum(per_comp[kk] + per_rest for kk in kinds)
        extra = {}
        if s == 0 and extra_comp["embedding"]:
            extra["embedding"] = extra_comp["embedding"]
        if s == p2 - 1 and extra_comp["lm_head"]:
            extra["lm_head"] = extra_comp["lm_head"] * k
        works.append(StageWork(s, s, w + sum(extra.values()), fwd, extra))
    return {"works": works, "p": p2, "k": k, "tp": allowed, "split": new_split}


def _tp_replay(
    pm: PipelineModel, opt: dict[str, Any]
) -> tuple[tuple[float, float, dict[int, int]], float | None] | None:
    p2 = opt["p"]
    orders = canonical_orders(pm.schedule, p2, pm.m, pm.v)
    if orders is None:
        return None
    works: list[StageWork] = opt["works"]
    hops = {(a, a + 1): pm.default_hop_ns for a in range(p2 - 1)}
    hops.update({(a + 1, a): pm.default_hop_ns for a in range(p2 - 1)})
    place = placement_of(pm.schedule)
    got = _replay_chains(
        pm,
        orders,
        p2 * pm.v,
        lambda c, i: _chunk_costs(c, p2, pm.v, place),
        p=p2,
        v=pm.v,
        placement=place,
        hops=hops,
        chains=[works],
    )
    if got is None:
        return None
    act = None
    if pm.act_bytes:
        # activations per layer grow as tp shrinks (Korthikanti et al. 2022: s*b*h*(10 + 24/t) per layer)
        per_layer = float(
            np.mean([pm.act_bytes[s] / max(sum(pm.layers.get(s, {}).values()), 1) for s in pm.act_bytes])
        )
        per_layer *= (10 + 24 / opt["tp"]) / (10 + 24 / (opt["tp"] * opt["k"]))
        act = max(per_layer * n / pm.v * got[2].get(s, 0) for s, n in enumerate(opt["split"]))
    return got, act


# ------------------------------------------------------------------------------------------------------
# losses of the step, ranked
# ------------------------------------------------------------------------------------------------------
def losses(
    ranks: list[dict[str, Any]],
    stages: list[dict[str, Any]],
    findings: list[dict[str, Any]],
    what_if: list[dict[str, Any]],
    stragglers: list[dict[str, Any]],
    kv_duplicated_fraction: float | None = None,
) -> list[dict[str, Any]]:
    """summary.json `losses`: what the step loses, in ms per step (means over ranks), largest first, each with
    the lever that recovers most of it (`lever`, what the replay says it saves: `saving_ms`). The measured
    parts (`basis` "measured": the schedule's own pipeline bubble, the bubble beyond it, exposed wait,
    exposed transfer, host idle) do not overlap; the causes (`basis` "replayed" or "model": stragglers, a
    heavy stage, K/V replication) are what fixing them saves and lie inside the measured parts."""
    rows = [r for r in ranks if r.get("step_time_ms")]
    if not rows:
        return []
    step = float(np.mean([r["step_time_ms"] for r in rows]))
    if step <= 0:
        return []

    def mean(key: str) -> float | None:
        vals = [r.get(key) for r in rows]
        if all(v is None for v in vals):
            return None
        return float(np.mean([v or 0.0 for v in vals]))

    bubble = mean("bubble_ms") if stages else None
    exposed = mean("exposed_comm_ms") or 0.0
    wait = mean("exposed_wait_ms")
    idle = mean("idle_ms") or 0.0
    out: list[dict[str, Any]] = []

    def lever_of(codes: tuple[str, ...]) -> tuple[str | None, float | None]:
        """The change that saves most among the what-if entries of these findings."""
        fs = [f for f in findings if f.get("code") in codes and f.get("saving_ms") is not None]
        if not fs:
            return None, None
        f = max(fs, key=lambda x: x["saving_ms"])
        if f.get("best_change"):
            return str(f["best_change"]), float(f["saving_ms"])
        ent = next(
            (e for e in what_if if e.get("saving_ms") == f["saving_ms"] and e.get("kind") != "all"), None
        )
        return (str(ent["change"]) if ent else str(f.get("code"))), float(f["saving_ms"])

    def add(
        name: str,
        ms: float | None,
        text: str,
        code: str | None,
        codes: tuple[str, ...],
        basis: str,
        **extra: Any,
    ) -> None:
        if ms is None or ms <= 0:
            return
        lever, saving = lever_of(codes)
        out.append(
            {
                "loss": name,
                "ms_per_step": round(ms, 6),
                "share_of_step": round(ms / step, 4),
                "what": text,
                "basis": basis,
                "finding": code,
                "lever": lever,
                "saving_ms": None if saving is None else round(saving, 6),
                **extra,
            }
        )

    causes = ("STRAGGLER", "STAGE_IMBALANCE", "UNEQUAL_STAGE_COMPOSITION", "PIPELINE_BUBBLE_EXCESS")
    if bubble is not None:
        inherent, known = inherent_bubble_ms(stages)
        if inherent is not None:
            add(
                "pipeline_bubble",
                inherent,
                "the schedule's own pipeline bubble (its fill, drain and waits with equal stages)"
                if known
                else "pipeline bubble (the schedule has no expectation: all of it)",
                "PIPELINE_BUBBLE",
                ("PIPELINE_BUBBLE",),
                "measured",
            )
            add(
                "pipeline_bubble_excess",
                max(bubble - inherent, 0.0) if known else None,
                "pipeline bubble beyond the schedule's own (a slower stage or rank the others wait for)",
                "PIPELINE_BUBBLE_EXCESS",
                causes,
                "measured",
            )
    b = bubble or 0.0
    beyond = max(exposed - min(b, exposed), 0.0)
    comm = ("STRAGGLER", "EXPOSED_COMM_HIGH", "SLOW_GROUP")
    if wait is not None:
        w_beyond = max(wait - b, 0.0)
        add("exposed_wait", w_beyond, "exposed communication waiting for the last participant (beyond pipeline "
            "waits)", "EXPOSED_COMM_HIGH", comm, "measured")  # fmt: skip
        add("exposed_transfer", max(beyond - w_beyond, 0.0), "exposed communication moving data",
            "EXPOSED_COMM_HIGH", ("EXPOSED_COMM_HIGH", "SLOW_GROUP"), "measured")  # fmt: skip
    else:
        add("exposed_communication", beyond, "exposed communication beyond pipeline waits (not split into wait "
            "and transfer)", "EXPOSED_COMM_HIGH", comm, "measured")  # fmt: skip
    idle_in_bubble = max(b - exposed, 0.0)
    add("host_idle", max(idle - idle_in_bubble, 0.0), "GPU idle with nothing queued (host-bound, launch gaps)",
        "GPU_IDLE", ("GPU_IDLE",), "measured")  # fmt: skip
    for s in stragglers:
        f = next(
            (f for f in findings if f.get("code") == "STRAGGLER" and s.get("rank") in (f.get("ranks") or [])),
            None,
        )
        saving = f.get("saving_ms") if f else None
        cost = s.get("cost_ms") if s.get("cost_ms") is not None else saving
        if cost is None or cost <= 0:
            continue
        out.append(
            {
                "loss": "straggler",
                "ms_per_step": round(float(cost), 6),
                "share_of_step": round(float(cost) / step, 4),
                "what": f"rank {s.get('rank')} ({s.get('cause')}) holds its peers up",
                "basis": "replayed" if saving is not None else "measured",
                "finding": "STRAGGLER",
                "lever": f"rank {s.get('rank')}'s {s.get('cause')} brought to its peers'",
                "saving_ms": None if saving is None else round(float(saving), 6),
                "rank": s.get("rank"),
            }
        )
    for code, name in (
        ("STAGE_IMBALANCE", "stage_imbalance"),
        ("UNEQUAL_STAGE_COMPOSITION", "unequal_stages"),
    ):
        f = next((f for f in findings if f.get("code") == code and f.get("saving_ms") is not None), None)
        if f is not None:
            add(name, float(f["saving_ms"]), f"a heavier stage ({code}): what balancing it saves, replayed", code,
                (code,), "replayed", stages=f.get("stages"))  # fmt: skip
    if kv_duplicated_fraction:
        comp = mean("compute_ms") or 0.0
        tp_entry = next((e for e in what_if if e.get("kind") == "layout" and "tp" in e), None)
        add(
            "kv_replication",
            comp * kv_duplicated_fraction / (1.0 + kv_duplicated_fraction),
            "compute duplicated by replicated K/V heads (tensor parallelism above the KV heads)",
            "KV_HEAD_REPLICATION",
            (),
            "model",
        )
        if tp_entry is not None and out and out[-1]["loss"] == "kv_replication":
            out[-1]["lever"] = tp_entry["change"]
            out[-1]["saving_ms"] = tp_entry["saving_ms"]
    out.sort(key=lambda x: -x["ms_per_step"])
    return out


def _equal_work_saving(e: dict[str, Any] | None) -> float:
    """ms per step an entry saves at the run's amount of work (a change that adds microbatches is compared per
    microbatch): step before x gain / (1 + gain)."""
    if not e or e.get("throughput_gain") is None or not e.get("step_time_ms"):
        return float("-inf")
    g = float(e["throughput_gain"])
    return float(e["step_time_ms"]) * g / (1.0 + g)


def tp_layout(pm: PipelineModel, model: Any, tp: int | None, seq_len: int | None) -> dict[str, Any] | None:
    """The tensor-parallel what-if's option for a run with a model description: the largest degree below the
    run's that divides the KV heads and every other dimension tensor parallelism splits (models/audit.py),
    with what it buys (no replicated K/V heads, smaller all-reduce rings) and costs (more work and weights
    per rank and layer, a deeper pipeline on the GPUs it frees); None when the run's degree is already one
    the architecture allows, or the pipeline cannot be regrouped."""
    if model is None or not tp or tp < 2 or not pm.layers:
        return None
    from tracelens.models.audit import balanced_split, clean_tp_degrees, kv_replication_numbers
    from tracelens.models.flops import default_split

    clean = clean_tp_degrees(model)
    if tp in clean:
        return None
    below = [d for d in clean if d < tp and tp % d == 0]
    if not below:
        return None
    allowed = max(below)
    k = tp // allowed
    p2 = pm.p * k
    if p2 > model.num_layers:
        return None
    split2 = balanced_split(model, p2, seq_len) if seq_len else default_split(model.num_layers, p2)
    kv = kv_replication_numbers(model, tp, default_split(model.num_layers, pm.p), seq_len or 4096)
    dup = float(kv["duplicated_flops_fraction"]) if kv else 0.0
    opt = tp_option(
        pm,
        tp=tp,
        allowed=allowed,
        num_layers=model.num_layers,
        layer_types=list(model.layer_types),
        new_split=split2,
        dup_fraction=dup,
    )
    if opt is None:
        return None
    ring = ((allowed - 1) / allowed) / ((tp - 1) / tp)
    buys = []
    if kv:
        buys.append(
            f"no replicated K/V heads: {_bytes(kv['replicated_kv_weight_bytes'])} of duplicated K/V weights "
            f"({_bytes(kv['replicated_kv_training_state_bytes'])} with optimizer state), "
            f"{100 * dup:.2f}% duplicated FLOPs and the extra K/V gradient all-reduce go"
        )
    buys.append(
        f"tensor-parallel all-reduces over {allowed} ranks instead of {tp}: ring traffic per byte x{ring:.2f}"
    )
    costs = [
        f"each rank computes {k}x the work and holds {k}x the weights of every layer it keeps",
        f"the GPUs that frees become pipeline stages: pp {pm.p} -> {p2} (split {','.join(map(str, split2))}), "
        "a longer fill and drain",
        "giving them to data parallelism instead halves the microbatches per replica and adds a gradient "
        "all-reduce the traces cannot time (not replayed)",
    ]
    opt.update(
        {
            "change": f"tp={allowed} (the largest degree the architecture allows) on the same GPUs: tp={allowed}, "
            f"pp={p2}",
            "params": {"tp": allowed, "pp": p2, "layer_split": split2},
            "from": {"tp": tp, "pp": pm.p},
            "buys": buys,
            "costs": costs,
        }
    )
    return opt


# ------------------------------------------------------------------------------------------------------
# findings: the schedule's own bubble, severities by what fixing saves
# ------------------------------------------------------------------------------------------------------
#: Findings whose fix the critical-path what-if replays (their `saving_ms`): their severity follows it.
SAVING_CODES = (
    "STRAGGLER",
    "EXPOSED_COMM_HIGH",
    "STAGE_IMBALANCE",
    "PIPELINE_BUBBLE_EXCESS",
    "UNEQUAL_STAGE_COMPOSITION",
    "SLOW_GROUP",
    "GPU_IDLE",
)


def inherent_bubble_ms(stages: list[dict[str, Any]]) -> tuple[float | None, bool]:
    """Mean over stages of the bubble the schedule itself implies: the measured bubble up to the expected
    share of the pipeline window (the whole bubble when the schedule has no expectation: the flag says so)."""
    vals, known = [], True
    for s in stages:
        b, w, e = s.get("bubble_ms"), s.get("window_ms"), s.get("expected_bubble_fraction")
        if b is None:
            continue
        if e is None or w is None:
            known = False
            vals.append(float(b))
        else:
            vals.append(min(float(b), float(e) * float(w)))
    return (float(np.mean(vals)) if vals else None), known


def bubble_findings(
    stages: list[dict[str, Any]],
    pipeline: dict[str, Any] | None,
    what_if: list[dict[str, Any]],
    step_ms: float | None,
    threshold: float,
    warning: float,
    min_saving: float,
) -> list[dict[str, Any]]:
    """PIPELINE_BUBBLE: the schedule's own bubble when it takes at least `threshold` of the step; a warning
    from `warning` of the step when a schedule or layout what-if saves at least `min_saving` of it; its
    `saving_ms` is the best entry's saving at the run's amount of work."""
    from tracelens.findings import finding

    ms, known = inherent_bubble_ms(stages)
    if ms is None or not step_ms or step_ms <= 0 or ms / step_ms < threshold:
        return []
    share = ms / step_ms
    sched = [e for e in what_if if e.get("kind") in ("schedule", "layout")]
    best = max(sched, key=_equal_work_saving, default=None)
    saving = _equal_work_saving(best) if best is not None else None
    if saving is not None and saving == float("-inf"):
        saving = None
    pipe = pipeline or {}
    p = len(stages)
    desc = (
        f"{pipe.get('schedule') or 'an unrecognised schedule'} with p={p}, m={pipe.get('microbatches')}"
        + (f", v={pipe['virtual_stages']}" if (pipe.get("virtual_stages") or 1) > 1 else "")
    )
    msg = (
        f"the pipeline schedule's own bubble takes {share:.0%} of the step ({ms:,.1f} ms of {step_ms:,.1f} ms per "
        f"step: {desc})"
        if known
        else f"pipeline bubbles take {share:.0%} of the step ({ms:,.1f} ms of {step_ms:,.1f} ms; {desc}: no "
        "expectation, the whole bubble is counted)"
    )
    if best is not None and saving is not None and saving > 0:
        msg += (
            f"; best change replayed: {best['change']} -> {best['step_time_ms_after']:,.1f} ms per step"
            + (f" for {best['microbatches']} microbatches" if "microbatches" in best else "")
            + f" ({saving:,.1f} ms per step saved at equal work)"
        )
    severe = share >= warning and saving is not None and saving >= min_saving * step_ms
    out = finding(
        "PIPELINE_BUBBLE",
        "warning" if severe else "info",
        msg,
        ranks=[],
        stages=[int(s["stage"]) for s in stages if s.get("stage") is not None],
        bubble_ms=round(ms, 3),
        share_of_step=round(share, 4),
        expected_fraction=pipe.get("expected_bubble_fraction"),
    )
    if saving is not None:
        out["saving_ms"] = round(saving, 6)
        out["best_change"] = best["change"] if best else None
    return [out]


def severity_by_saving(findings: list[dict[str, Any]], step_ms: float | None, min_saving: float) -> None:
    """A warning whose replayed fix saves under `min_saving` of the step becomes info (in place), with
    `severity_reason` saying why."""
    if not step_ms or step_ms <= 0:
        return
    for f in findings:
        s = f.get("saving_ms")
        if f.get("code") not in SAVING_CODES or f.get("severity") != "warning" or s is None:
            continue
        if s < min_saving * step_ms:
            f["severity"] = "info"
            f["severity_reason"] = (
                f"fixing it saves {s:,.2f} ms per step ({s / step_ms:.2%} of {step_ms:,.1f} ms): under the "
                f"{min_saving:.0%} of the step a warning needs"
            )


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def tp_entry_unreplayed(
    model: Any, tp: int | None, pp: int | None, seq_len: int | None
) -> dict[str, Any] | None:
    """The tensor-parallel layout entry of a run without a measured pipeline (pp = 1, or a schedule the
    what-if cannot replay): the degree the architecture allows, what it buys and costs, and null step time,
    bubble and activations (not replayed)."""
    if model is None or not tp or tp < 2:
        return None
    from tracelens.models.audit import clean_tp_degrees, kv_replication_numbers
    from tracelens.models.flops import default_split

    clean = clean_tp_degrees(model)
    below = [d for d in clean if d < tp and tp % d == 0]
    if tp in clean or not below:
        return None
    allowed = max(below)
    kv = kv_replication_numbers(model, tp, default_split(model.num_layers, pp or 1), seq_len or 4096)
    buys = []
    if kv:
        buys.append(
            f"no replicated K/V heads: {_bytes(kv['replicated_kv_weight_bytes'])} of duplicated K/V weights "
            f"({_bytes(kv['replicated_kv_training_state_bytes'])} with optimizer state) and "
            f"{100 * kv['duplicated_flops_fraction']:.2f}% duplicated FLOPs go"
        )
    ring = ((allowed - 1) / allowed) / ((tp - 1) / tp)
    buys.append(
        f"tensor-parallel all-reduces over {allowed} ranks instead of {tp}: ring traffic per byte x{ring:.2f}"
    )
    return {
        "change": f"tp={allowed} (the largest degree the architecture allows) instead of tp={tp}",
        "kind": "layout",
        "tp": allowed,
        "from": {"tp": tp},
        "ranks": [],
        "stages": [],
        "step_time_ms": None,
        "step_time_ms_after": None,
        "saving_ms": None,
        "throughput_gain": None,
        "bubble_fraction": None,
        "bubble_fraction_after": None,
        "activation_bytes": None,
        "activation_bytes_after": None,
        "buys": buys,
        "costs": [
            f"each rank computes {tp // allowed}x the work and holds {tp // allowed}x the weights of every layer",
            f"the GPUs that frees go to pipeline or data parallelism (pp or dp x{tp // allowed}): not replayed "
            "(no measured pipeline in this run)",
        ],
        "model": "audit",
    }
