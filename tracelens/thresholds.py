"""Every threshold that decides a verdict, in one place, with the reason for its value.

`Thresholds()` holds the defaults; a run's `tracelens.toml` may override any of them in a `[thresholds]`
section (same names; docs/stragglers.md, "Thresholds"). The analyzers take them as arguments; nothing reads
a verdict threshold from anywhere else. `REASONS` says why each default is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tracelens.errors import BadConfigError


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (defaults; REASONS gives the reason for each)."""

    # --- stragglers (analyze/comm/stragglers.py) -------------------------------------------------------------
    straggler_persistence: float = 0.5
    straggler_min_cost: float = 0.03
    straggler_min_excess: float = 0.03
    straggler_mad_k: float = 3.0
    straggler_min_blame: float = 0.25
    slow_link_ratio: float = 1.3
    slow_link_min_calls: int = 4
    clock_skew_us: float = 100.0
    ops_excess: float = 0.02
    stall_min_ms: float = 1.0
    stall_spread: float = 1.5
    layer_work_excess: float = 0.25
    # --- pipeline stages (analyze/pipeline/composition.py, analyze/pipeline/pipeline.py) ------------------------------------
    stage_imbalance: float = 1.10
    bubble_excess: float = 0.05
    pipeline_bubble: float = 0.10
    pipeline_bubble_warning: float = 0.20
    # --- severity (summary.py) ------------------------------------------------------------------------------
    min_saving: float = 0.02
    # --- idle and communication -----------------------------------------------------------------------------
    gpu_idle: float = 0.20
    exposed_comm: float = 0.20
    # --- layout (analyze/layout/roles.py) -----------------------------------------------------------------
    tp_coincidence: float = 0.5
    tp_min_activation_calls: int = 2

    def changed(self) -> dict[str, float | int]:
        """The values that differ from the defaults (what a run's summary says it was judged with)."""
        base = Thresholds()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }


REASONS: dict[str, str] = {
    "straggler_persistence": "a straggler is late in at least half the analysed steps: one noisy step never makes one",
    "straggler_min_cost": "its median cost is at least 3% of the step: below that, fixing it is not worth a verdict",
    "straggler_min_excess": "per step, an excess under 3% of the peers' step time is within run-to-run noise",
    "straggler_mad_k": "per step, the excess is beyond 3 robust standard deviations (1.4826 x MAD) of the peers",
    "straggler_min_blame": "per step, the rank delayed its peers by at least a quarter of its own excess: extra "
    "work that hurts nobody (it is absorbed by slack) is not a straggler",
    "slow_link_ratio": "transfers at least 1.3x slower per byte than the reference of the same kind in every "
    "group a rank belongs to: NCCL's run-to-run spread on one link is well under 30%",
    "slow_link_min_calls": "a group is judged on at least 4 calls: one slow call is a hiccup",
    "clock_skew_us": "hosts whose clocks differ by over 100 us get CLOCK_SKEW: NTP keeps hosts within tens of us",
    "ops_excess": "on time-shared CPUs a rank running 2% more compute ops than its stage peers per step does "
    "more work (counts are exact, descheduling cannot change them)",
    "stall_min_ms": "a host stall is at least 1 ms: shorter gaps between ops are Python and launch overhead",
    "stall_spread": "a stall the program makes repeats within 1.5x of its length each step (a sleep overruns "
    "when its process is descheduled); descheduling's gaps do not",
    "layer_work_excess": "a rank whose layers run 25% more matmul work than the other stages' does work its peers "
    "do not: layers of one model differ by mixer type by up to ~20%",
    "stage_imbalance": "the heaviest stage 10% above the mean: every other stage waits that long each microbatch",
    "bubble_excess": "pipeline bubble 5 points of the window above the schedule's own: within that, clock "
    "alignment and first/last-microbatch effects",
    "pipeline_bubble": "the schedule's own bubble gets a PIPELINE_BUBBLE finding from 10% of the step: a pipeline "
    "fed enough microbatches keeps it below (1F1B: m >= 9(p-1)); above it more microbatches, interleaving or a "
    "zero-bubble schedule pay",
    "pipeline_bubble_warning": "PIPELINE_BUBBLE is a warning from a fifth of the step (and a schedule what-if that "
    "saves at least min_saving of it): a loss that large is the first thing to change",
    "min_saving": "a finding whose fix is replayed (what_if) is a warning only when fixing it saves at least 2% of the "
    "step: less is within the step-to-step spread of a healthy run, not worth acting on first",
    "gpu_idle": "GPU idle over 20% of the step is worth a finding: below that, idle is launch and sync overhead "
    "a tuned run keeps",
    "exposed_comm": "exposed communication over 20% of the step: a well-overlapped run keeps it well below",
    "tp_coincidence": "tensor-parallel peers leave their activation all-reduces within 0.5 of the time between "
    "two (measured: 0.07-0.24 for a real group, 1.9-4.2 for data-parallel replicas on time-shared CPUs)",
    "tp_min_activation_calls": "tensor parallelism reduces activations at least twice per step (one row-parallel "
    "matmul per layer and microbatch); one such call is a loss or metric",
}

DEFAULT = Thresholds()


def from_config(values: dict[str, Any], source: str = "tracelens.toml") -> Thresholds:
    """Thresholds with `values` (a `[thresholds]` table) over the defaults; an unknown name or a value that is
    not a positive number is a BadConfigError (a typo is never ignored)."""
    known = {f.name: f for f in fields(Thresholds)}
    out: dict[str, Any] = {}
    for k, v in values.items():
        f = known.get(k)
        if f is None:
            raise BadConfigError(f"{source}: unknown threshold '{k}' (known: {', '.join(known)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise BadConfigError(f"{source}: [thresholds] {k} must be a positive number, got {v!r}")
        out[k] = int(v) if f.type in ("int", int) else float(v)
    return Thresholds(**out)
