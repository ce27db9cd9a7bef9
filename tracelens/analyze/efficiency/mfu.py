"""MFU and HFU from model FLOPs, tokens per step, measured step time and the GPUs' peak.

MFU = model FLOPs per step / (step time x peak FLOP/s per GPU x GPUs), with model FLOPs per step =
training FLOPs per token (Megatron or PaLM convention, tracelens.models.flops) x tokens per step.
HFU counts the recomputed forward work as well. Any unknown input gives null (None) outputs, never a
guess. See docs/mfu.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tracelens.errors import BadInputError
from tracelens.models.flops import (
    CONVENTIONS,
    RECOMPUTE,
    check_split,
    hardware_flops_per_token,
    stage_flops_per_token,
    training_flops_per_token,
)
from tracelens.models.spec import ModelSpec


def _positive(value: float | None) -> float | None:
    """The value as float when it is a usable positive number, else None."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _ratio(
    flops_per_step: float | None, step_time_s: float | None, n_gpus: int | None, peak: float | None
) -> float | None:
    if flops_per_step is None or step_time_s is None or n_gpus is None or peak is None:
        return None
    return flops_per_step / (step_time_s * n_gpus * peak)


def _steps(step_times_s: Mapping[int, float] | Sequence[float] | None) -> list[tuple[int, float | None]]:
    if step_times_s is None:
        return []
    if isinstance(step_times_s, Mapping):
        return [(int(k), _positive(v)) for k, v in sorted(step_times_s.items())]
    return [(i, _positive(v)) for i, v in enumerate(step_times_s)]


def compute_mfu(
    model: ModelSpec | None,
    seq_len: int | None,
    tokens_per_step: int | None,
    step_time_s: float | None,
    n_gpus: int | None,
    peak_flops_per_gpu: float | None,
    convention: str = "megatron",
    recompute: str | None = None,
    step_times_s: Mapping[int, float] | Sequence[float] | None = None,
    lost_time_s: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The summary.json "mfu" object.

    step_time_s: mean step time in seconds; step_times_s: per-step times (a list, or {step: seconds})
    for the per-step MFU; lost_time_s: per-step mean seconds of the step spent in pipeline bubbles and
    exposed communication on the critical path (e.g. {"bubble": 0.12, "exposed_comm": 0.08}); the MFU
    with that time removed is what is at stake. Keys of the result: value, hfu, flops_per_token,
    hardware_flops_per_token, tokens_per_step, flops_per_step, peak_flops_per_gpu, n_gpus, convention,
    recompute, seq_len, step_time_ms, achieved_tflops_per_gpu, per_step,
    without_bubbles_and_exposed_comm, lost_time_ms.
    """
    if convention not in CONVENTIONS:
        raise BadInputError(f"unknown FLOPs convention '{convention}' (known: {', '.join(CONVENTIONS)})")
    if recompute not in RECOMPUTE:
        raise BadInputError(f"unknown recompute mode '{recompute}' (known: selective, full)")
    seq = int(seq_len) if seq_len is not None and _positive(seq_len) else None
    tokens = _positive(tokens_per_step)
    step = _positive(step_time_s)
    gpus = int(n_gpus) if n_gpus is not None and _positive(n_gpus) else None
    peak = _positive(peak_flops_per_gpu)

    fpt = hfpt = None
    if model is not None and seq is not None:
        fpt = training_flops_per_token(model, seq, convention)
        hfpt = hardware_flops_per_token(model, seq, recompute, convention)
    flops_step = fpt * tokens if fpt is not None and tokens is not None else None
    hflops_step = hfpt * tokens if hfpt is not None and tokens is not None else None

    achieved = None
    if flops_step is not None and step is not None and gpus is not None:
        achieved = flops_step / step / gpus / 1e12

    per_step = []
    for idx, t in _steps(step_times_s):
        per_step.append(
            {
                "step": idx,
                "step_time_ms": None if t is None else t * 1e3,
                "mfu": _ratio(flops_step, t, gpus, peak),
                "achieved_tflops_per_gpu": (
                    None if flops_step is None or t is None or gpus is None else flops_step / t / gpus / 1e12
                ),
            }
        )

    ideal = None
    lost_ms = None
    if lost_time_s is not None:
        lost = {str(k): float(v) for k, v in lost_time_s.items() if v is not None}
        lost_ms = {k: v * 1e3 for k, v in lost.items()}
        if step is not None and all(v >= 0 for v in lost.values()):
            remaining = step - sum(lost.values())
            if remaining > 0:
                ideal = _ratio(flops_step, remaining, gpus, peak)

    return {
        "value": _ratio(flops_step, step, gpus, peak),
        "hfu": _ratio(hflops_step, step, gpus, peak),
        "flops_per_token": fpt,
        "hardware_flops_per_token": hfpt,
        "tokens_per_step": None if tokens is None else int(tokens),
        "flops_per_step": flops_step,
        "peak_flops_per_gpu": peak,
        "n_gpus": gpus,
        "convention": convention,
        "recompute": recompute,
        "seq_len": seq,
        "step_time_ms": None if step is None else step * 1e3,
        "achieved_tflops_per_gpu": achieved,
        "per_step": per_step,
        "without_bubbles_and_exposed_comm": ideal,
        "lost_time_ms": lost_ms,
    }


def stage_tflops(
    model: ModelSpec | None,
    seq_len: int | None,
    layer_split: Sequence[int] | None,
    tokens_per_step: int | None,
    compute_time_s: Sequence[float | None],
    dp: int = 1,
    tp: int = 1,
    cp: int = 1,
    peak_flops_per_gpu: float | None = None,
) -> list[dict[str, Any]]:
    """Achieved TFLOP/s per GPU of each pipeline stage from its compute time per step.

    Each pipeline replica (one of `dp`) processes tokens_per_step / dp tokens per step; a stage's
    FLOPs (Megatron convention, LM head on the last stage) are shared by its tp * cp GPUs.
    compute_time_s[i] is stage i's mean per-GPU compute (busy kernel) time per step in seconds.
    Returns [{"stage", "flops_per_token", "compute_ms", "achieved_tflops_per_gpu", "mfu_of_compute"}];
    mfu_of_compute is achieved / peak over compute time only (how well the kernels use the GPU).
    """
    n_stages = len(compute_time_s)
    stage_fpt: list[float | None] = [None] * n_stages
    seq = int(seq_len) if seq_len is not None and _positive(seq_len) else None
    if model is not None and seq is not None and layer_split is not None:
        split = check_split(model, layer_split)
        if len(split) != n_stages:
            raise BadInputError(
                f"layer split has {len(split)} stages but {n_stages} compute times were given"
            )
        stage_fpt = list(stage_flops_per_token(model, seq, split))
    tokens = _positive(tokens_per_step)
    peak = _positive(peak_flops_per_gpu)
    share = max(1, int(dp)) * max(1, int(tp)) * max(1, int(cp))
    out = []
    for i, (fpt, t) in enumerate(zip(stage_fpt, compute_time_s)):
        t = _positive(t)
        achieved = None
        if fpt is not None and tokens is not None and t is not None:
            achieved = fpt * tokens / share / t / 1e12
        out.append(
            {
                "stage": i,
                "flops_per_token": fpt,
                "compute_ms": None if t is None else t * 1e3,
                "achieved_tflops_per_gpu": achieved,
                "mfu_of_compute": None if achieved is None or peak is None else achieved * 1e12 / peak,
            }
        )
    return out
