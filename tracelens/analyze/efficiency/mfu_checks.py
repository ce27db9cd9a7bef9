"""Guards around MFU: flags that contradict the run's metadata or its trace, and impossible values.

MFU scales with tokens per step (seq_len x global_batch), so a wrong `--global-batch` silently doubles
or halves it. These checks never change the inputs the user chose; they say which values disagree
(naming both) and refuse an MFU above 100%, which no input set that matches the run can produce.
Pure functions: values in, warning strings and findings out (docs/mfu.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tracelens.findings import finding

#: option name -> (command-line flag, tracelens.toml key) of the values MFU depends on
_FLAGS = {
    "seq_len": ("--seq-len", "[training] seq_len"),
    "global_batch": ("--global-batch", "[training] global_batch"),
    "microbatches": ("--microbatches", "[training] microbatches"),
    "peak_tflops": ("--peak-tflops", "[hardware] peak_tflops"),
    "gpu": ("--gpu", "[hardware] gpu"),
    "model": ("--model", "[model] config"),
}


def flag_conflicts(flags: Mapping[str, object], file_config: Mapping[str, object]) -> list[str]:
    """A warning per command-line flag whose value differs from the run's tracelens.toml (both named)."""
    out = []
    for key, (flag, toml_key) in _FLAGS.items():
        given, recorded = flags.get(key), file_config.get(key)
        if given is None or recorded is None or _same(given, recorded):
            continue
        out.append(
            f"{flag} {given} contradicts the run's tracelens.toml ({toml_key} = {recorded!r}); the flag wins: "
            f"the analysis uses {given}"
        )
    return out


def gpu_conflicts(
    given: str | None, trace_gpus: Sequence[str | None], from_config: bool = False
) -> list[str]:
    """A warning when the GPU the user names (--gpu, or `[hardware] gpu` of tracelens.toml: `from_config`)
    is not the one the traces' deviceProperties name: the user's wins (peaks and roofline use it), and both
    are named.

    The same GPU by family (models/hardware.canonical_gpu: "H200" and "NVIDIA H200" agree); a name of no
    known family matches when one name contains the other (case ignored)."""
    from tracelens.models.hardware import canonical_gpu

    names = sorted({str(n).strip() for n in trace_gpus if n and str(n).strip()})
    if not given or not str(given).strip() or not names:
        return []
    g = str(given).strip()
    want = canonical_gpu(g)

    def same(name: str) -> bool:
        have = canonical_gpu(name)
        if want is not None and have is not None:
            return want == have
        a, b = g.lower(), name.lower()
        return a in b or b in a

    other = [n for n in names if not same(n)]
    if not other:
        return []
    what, who = (
        (f"[hardware] gpu = {g!r} in tracelens.toml", "the file")
        if from_config
        else (f"--gpu {g}", "the flag")
    )
    return [
        f"{what} contradicts the traces, which name {', '.join(other)}; {who} wins: peak FLOP/s, MFU and the "
        f"roofline use {g}"
    ]


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return str(a).strip().lower() == str(b).strip().lower()


def trace_conflicts(
    global_batch: int | None,
    microbatches: int | None,
    observed_microbatches: int | None,
    dp: int | None,
) -> list[str]:
    """Warnings when the batch options disagree with what the trace shows (microbatches x dp).

    `observed_microbatches` is the count the pipeline analysis read from the trace (forward spans or
    activation sends per step); `dp` the data-parallel degree of the layout the findings use.
    """
    out = []
    if microbatches and observed_microbatches and microbatches != observed_microbatches:
        out.append(
            f"microbatches {microbatches} (given) but the trace shows {observed_microbatches} microbatches per "
            f"step; the expected bubble uses {microbatches}"
        )
    m = observed_microbatches or microbatches
    if global_batch and m and dp:
        seen = m * dp
        if global_batch != seen:
            per = global_batch / seen
            mbs = (
                f"right only if each microbatch holds {per:g} sequences"
                if per == int(per) and per > 1
                else "which no whole number of sequences per microbatch gives"
            )
            out.append(
                f"global batch {global_batch} (given) but the trace shows {m} microbatches x dp {dp} = {seen} "
                f"sequences per step at one sequence per microbatch ({mbs}); MFU scales with the global "
                f"batch: with {seen} it would be {seen / global_batch:.2g}x the value reported"
            )
    return out


def impossible_mfu(
    mfu: dict[str, Any] | None, global_batch: int | None = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(mfu with impossible values nulled, [an MFU_IMPOSSIBLE error finding]) when any MFU exceeds 100%.

    Checked: `value`, `hfu`, `without_bubbles_and_exposed_comm` and every per-step MFU. A GPU cannot do
    more than its peak, so an MFU above 1 means the inputs are wrong (tokens per step, the peak, the
    model); the numbers are withheld rather than reported.
    """
    if not mfu:
        return mfu, []
    named = {
        "MFU": mfu.get("value"),
        "HFU": mfu.get("hfu"),
        "MFU without bubbles and exposed communication": mfu.get("without_bubbles_and_exposed_comm"),
    }
    named["per-step MFU (max)"] = max(
        (s["mfu"] for s in mfu.get("per_step") or [] if s.get("mfu") is not None), default=None
    )
    over = {k: v for k, v in named.items() if v is not None and v > 1.0}
    if not over:
        return mfu, []
    fixed = copy.deepcopy(mfu)
    for key in ("value", "hfu", "without_bubbles_and_exposed_comm"):
        fixed[key] = None
    for s in fixed.get("per_step") or []:
        s["mfu"] = None
    tokens = mfu.get("tokens_per_step")
    seq = mfu.get("seq_len")
    peak = mfu.get("peak_flops_per_gpu")
    inputs = (
        f"tokens per step {tokens:,}"
        + (f" = seq_len {seq:,} x global batch {global_batch}" if seq and global_batch else "")
        if tokens
        else "tokens per step unknown"
    )
    peak_s = f"peak {peak / 1e12:g} TFLOP/s per GPU" if peak else "peak unknown"
    worst = ", ".join(f"{k} {100 * v:.1f}%" for k, v in over.items())
    message = (
        f"impossible MFU: {worst} (above 100% of peak); the inputs are wrong ({inputs}, {peak_s}, "
        f"{mfu.get('n_gpus')} GPUs): check --global-batch, --seq-len and --peak-tflops; MFU is reported as null"
    )
    fixed["invalid"] = message
    return fixed, [finding("MFU_IMPOSSIBLE", "error", message, values={k: v for k, v in over.items()})]
