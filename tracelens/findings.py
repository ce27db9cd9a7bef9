"""Finding records shared by every analyzer (codes are a public contract, see docs/summary.md)."""

from __future__ import annotations

from collections.abc import Iterable

CODES = (
    "STRAGGLER",
    "CLOCK_SKEW",
    "EXPOSED_COMM_HIGH",
    "PIPELINE_BUBBLE_EXCESS",
    "STAGE_IMBALANCE",
    "UNEQUAL_STAGE_COMPOSITION",
    "KV_HEAD_REPLICATION",
    "INDIVISIBLE_DIMENSION",
    "MISSING_RANKS",
    "PARTIAL_TRACE",
    "COLLECTIVE_HANG",
    "COLLECTIVE_MISMATCH",
    "NO_STEPS",
    "LAYOUT_INCONSISTENT",
    "MFU_IMPOSSIBLE",
    "STEP_WINDOW_CLIPPED",
    # idle GPU, slow groups, hangs through point-to-point
    "GPU_IDLE",
    "SLOW_GROUP",
    "P2P_HANG",
    # the schedule's own bubble (PIPELINE_BUBBLE_EXCESS is the bubble beyond it)
    "PIPELINE_BUBBLE",
)
SEVERITIES = ("info", "warning", "error")


def finding(
    code: str,
    severity: str,
    message: str,
    ranks: Iterable[int] = (),
    stages: Iterable[int] = (),
    **extra,
) -> dict:
    """Build one finding dict; `extra` keys (numbers backing the message) are kept beside the contract keys."""
    if code not in CODES:
        raise ValueError(f"unknown finding code {code}")
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity}")
    out = {
        "code": code,
        "severity": severity,
        "message": message,
        "ranks": sorted(int(r) for r in ranks),
        "stages": sorted(int(s) for s in stages),
    }
    out.update(extra)
    return out
