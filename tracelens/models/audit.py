"""Layout audit: does a TP x PP x CP x DP layout divide the model cleanly, before anything is launched?

For every partitioned dimension it checks whether the degree divides it, reports K/V head replication
when TP exceeds the KV heads (with the replicated weight bytes, duplicated FLOPs and the extra gradient
all-reduce), lists the clean degrees per axis, shows the layer-type composition and FLOPs of each
pipeline stage, and suggests a split on block boundaries that balances FLOPs with the LM head counted on
the last stage. docs/layout-audit.md explains each check and its assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracelens.errors import BadInputError
from tracelens.findings import finding
from tracelens.models.flops import (
    check_split,
    default_split,
    layer_training_flops,
    logits_flops_per_token,
    stage_flops_per_token,
    training_flops_per_token,
)
from tracelens.models.spec import FULL, LINEAR, ModelSpec

# Assumptions stated in the KV replication numbers (also in docs/layout-audit.md).
WEIGHT_BYTES = 2  # bf16 weights
GRAD_BYTES = 2  # bf16 gradients reduced in bf16 (Megatron's default without fp32 grad reduction)
TRAIN_STATE_BYTES = 16  # bf16 weight + fp32 main grad + fp32 master weight + two fp32 Adam moments
MAX_DEGREE = 64  # largest degree listed among the clean degrees
DEFAULT_SEQ_LENS = (4096,)


@dataclass
class AuditResult:
    """Everything the audit found; `to_dict()` is the JSON the CLI prints with --json."""

    model: str
    tp: int
    pp: int
    cp: int
    dp: int
    seq_len: int | None
    dimensions: list[dict]
    limits: dict[str, list[dict]]
    clean_degrees: dict[str, list[int] | None]
    kv_replication: dict | None
    layer_split: list[int]
    split_source: str
    stages: list[dict]
    seq_lens_evaluated: list[int]
    balanced_split: dict[int, list[int]]
    findings: list[dict] = field(default_factory=list)
    deltanet: dict | None = None
    model_summary: dict = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """True when no check raised a warning or error."""
        return not any(f["severity"] in ("warning", "error") for f in self.findings)

    def to_dict(self) -> dict:
        """JSON-ready view (balanced_split keys are strings of the sequence length)."""
        return {
            "model": self.model,
            "model_summary": self.model_summary,
            "layout": {
                "tp": self.tp,
                "pp": self.pp,
                "cp": self.cp,
                "dp": self.dp,
                "world_size": self.tp * self.pp * self.cp * self.dp,
            },
            "seq_len": self.seq_len,
            "clean": self.clean,
            "dimensions": self.dimensions,
            "limits": self.limits,
            "clean_degrees": self.clean_degrees,
            "kv_replication": self.kv_replication,
            "deltanet": self.deltanet,
            "layer_split": self.layer_split,
            "split_source": self.split_source,
            "stages": self.stages,
            "seq_lens_evaluated": self.seq_lens_evaluated,
            "balanced_split": {str(k): v for k, v in self.balanced_split.items()},
            "findings": self.findings,
        }


def _dim(axis: str, name: str, size: int, degree: int, note: str = "") -> dict:
    ok = size % degree == 0
    return {
        "axis": axis,
        "dimension": name,
        "size": size,
        "degree": degree,
        "divides": ok,
        "per_rank": size // degree if ok else size / degree,
        "note": note,
    }


def _tp_dimensions(model: ModelSpec) -> list[tuple[str, int, str]]:
    """(name, size, what it is) of every dimension tensor parallelism splits."""
    dims = [("vocab", model.vocab_size, "embedding / LM head rows")]
    if any(not model.is_moe_layer(i) for i in range(model.num_layers)):
        dims.append(("ffn", model.intermediate_size, "MLP intermediate size"))
    if model.num_experts:
        dims.append(("moe_ffn", model.moe_intermediate_size, "expert intermediate size"))
        if model.shared_expert_intermediate_size:
            dims.append(
                (
                    "shared_expert_ffn",
                    model.shared_expert_intermediate_size,
                    "shared expert intermediate size",
                )
            )
    if FULL in model.layer_types:
        dims.append(("q_heads", model.num_attention_heads, "attention query heads"))
        dims.append(("kv_heads", model.num_key_value_heads, "attention key/value heads"))
    if LINEAR in model.layer_types:
        dims.append(("deltanet_qk_heads", model.linear_num_key_heads, "Gated DeltaNet query/key heads"))
        dims.append(("deltanet_v_heads", model.linear_num_value_heads, "Gated DeltaNet value heads"))
    return dims


def clean_tp_degrees(model: ModelSpec) -> list[int]:
    """Tensor-parallel degrees (up to MAX_DEGREE) that divide every dimension tensor parallelism splits: the KV
    heads included, so none of them replicates K/V heads."""
    sizes = [size for _, size, _ in _tp_dimensions(model)]
    return [d for d in range(1, MAX_DEGREE + 1) if all(s % d == 0 for s in sizes)]


def kv_replication_numbers(model: ModelSpec, tp: int, split: list[int], seq_len: int) -> dict | None:
    """The numbers behind KV_HEAD_REPLICATION for tp above the KV heads (a multiple of them), else None."""
    nkv = model.num_key_value_heads
    if FULL not in model.layer_types or tp <= nkv or tp % nkv:
        return None
    return _kv_replication(model, tp, split, seq_len)


def _divisors(n: int, cap: int = MAX_DEGREE) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def balanced_split(model: ModelSpec, pp: int, seq_len: int) -> list[int]:
    """Layers per stage, cut on block boundaries (4-layer super-blocks for the hybrid), that minimise the
    heaviest stage's training FLOPs per token, the LM head counted on the last stage.

    Falls back to single-layer units when there are fewer blocks than stages. Among equally heavy
    splits the one with the smallest sum of squared stage FLOPs wins (dynamic programming, exact for the
    max, greedy for the tie-break).
    """
    if pp <= 0 or pp > model.num_layers:
        raise BadInputError(f"pipeline size must be in 1..{model.num_layers}, got {pp}")
    per_layer = layer_training_flops(model, seq_len)
    unit = model.block_size if model.num_blocks >= pp else 1
    units = [sum(per_layer[i : i + unit]) for i in range(0, model.num_layers, unit)]
    n = len(units)
    prefix = [0.0]
    for u in units:
        prefix.append(prefix[-1] + u)
    logits = logits_flops_per_token(model)
    inf = (math.inf, math.inf)
    # best[k][j]: (max, sumsq) for the first j units in k stages; cut[k][j]: start of the k-th stage.
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, pp + 1):
        for j in range(k, n - (pp - k) + 1):
            for i in range(k - 1, j):
                prev = best[k - 1][i]
                if prev[0] == math.inf:
                    continue
                cost = prefix[j] - prefix[i] + (logits if k == pp else 0.0)
                cand = (max(prev[0], cost), prev[1] + cost * cost)
                if cand < best[k][j]:
                    best[k][j], cut[k][j] = cand, i
    bounds, j = [], n
    for k in range(pp, 0, -1):
        i = cut[k][j]
        bounds.append((j - i) * unit)
        j = i
    return bounds[::-1]


def _stage_table(model: ModelSpec, split: list[int], seq_lens: list[int]) -> list[dict]:
    bs = model.block_size
    flops = {s: stage_flops_per_token(model, s, split) for s in seq_lens}
    out, start = [], 0
    for i, n in enumerate(split):
        layers = range(start, start + n)
        whole_blocks = (
            sum(1 for b in range(0, model.num_layers, bs) if b >= start and b + bs <= start + n) if n else 0
        )
        out.append(
            {
                "stage": i,
                "first_layer": start if n else None,
                "last_layer": start + n - 1 if n else None,
                "num_layers": n,
                "layers": model.layer_type_counts(layers),
                "whole_blocks": whole_blocks,
                "block_aligned": start % bs == 0 and (start + n) % bs == 0,
                "has_embedding": i == 0,
                "has_lm_head": i == len(split) - 1,
                "flops_per_token": {str(s): flops[s][i] for s in seq_lens},
            }
        )
        start += n
    return out


def _kv_replication(model: ModelSpec, tp: int, split: list[int], seq_len: int, assumed: bool = False) -> dict:
    """Numbers behind KV_HEAD_REPLICATION (tp is a multiple of the KV heads and larger); `assumed`: no
    sequence length was given and `seq_len` is the model's context length."""
    h, hd, nkv = model.hidden_size, model.head_dim, model.num_key_value_heads
    factor = tp // nkv
    kv_params_per_head = 2 * h * hd  # K and V projection weights of one head
    n_full = model.layer_type_counts().get(FULL, 0)
    extra_params = (tp - nkv) * kv_params_per_head * n_full
    full_per_stage, start = [], 0
    for n in split:
        full_per_stage.append(model.layer_type_counts(range(start, start + n)).get(FULL, 0))
        start += n
    worst = max(full_per_stage)
    grad_buffer = kv_params_per_head * worst * GRAD_BYTES  # per GPU, K/V grads of its heaviest stage
    allreduce_bytes = 2 * (factor - 1) / factor * grad_buffer
    extra_fwd = 2.0 * (tp - nkv) * kv_params_per_head  # duplicated K/V projection per token and layer
    extra_train = 3 * extra_fwd * n_full
    model_flops = training_flops_per_token(model, seq_len)
    return {
        "factor": factor,
        "kv_heads": nkv,
        "tp": tp,
        "full_attention_layers": n_full,
        "replicated_kv_params": extra_params,
        "replicated_kv_weight_bytes": extra_params * WEIGHT_BYTES,
        "replicated_kv_training_state_bytes": extra_params * TRAIN_STATE_BYTES,
        "extra_grad_allreduce_bytes_per_gpu_per_step": allreduce_bytes,
        "extra_grad_allreduce_group_size": factor,
        "duplicated_flops_per_token": extra_train,
        "duplicated_flops_fraction": extra_train / model_flops,
        "assumptions": [
            (
                f"weights bf16 ({WEIGHT_BYTES} B/param); training state {TRAIN_STATE_BYTES} B/param "
                "(bf16 weight, fp32 main grad, fp32 master weight, two fp32 Adam moments)"
            ),
            (
                "each TP rank holds one whole KV head; the K/V weight copies of one head are kept in sync by an "
                f"all-reduce of their {GRAD_BYTES}-byte (bf16) gradients among the {factor} ranks sharing it, "
                "ring algorithm: 2*(r-1)/r x buffer sent per GPU, once per optimizer step"
            ),
            (
                "duplicated FLOPs: the K/V projections of a replicated head run on every rank that holds it "
                + (
                    f"(measured against the Megatron-convention model FLOPs at {seq_len:,} tokens: the "
                    "model's context length, assumed because no --seq-len was given)"
                    if assumed
                    else f"(measured against the Megatron-convention model FLOPs at {seq_len} tokens)"
                )
            ),
            "per-GPU numbers are for the stage holding the most full-attention layers",
        ],
    }


def audit_layout(
    model: ModelSpec,
    tp: int,
    pp: int,
    cp: int = 1,
    dp: int = 1,
    seq_len: int | None = None,
    layer_split: Sequence[int] | None = None,
) -> AuditResult:
    """Check a TP x PP x CP x DP layout against the model's partitioned dimensions.

    layer_split: layers per stage; default as even as possible (the first num_layers % pp stages get one
    more layer). seq_len: checked against CP and used for stage FLOPs; when None the stage FLOPs are
    shown at 4,096 tokens and at the model's context length and the CP sequence check is skipped.
    """
    for name, val in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)):
        if not isinstance(val, int) or val <= 0:
            raise BadInputError(f"--{name} must be a positive integer, got {val!r}")
    if pp > model.num_layers:
        raise BadInputError(f"--pp {pp} exceeds the model's {model.num_layers} layers")
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len <= 0):
        raise BadInputError(f"--seq-len must be a positive integer, got {seq_len!r}")
    findings: list[dict] = []
    dims: list[dict] = []

    # ----- tensor parallel ------------------------------------------------------------------------
    tp_dims = _tp_dimensions(model)
    kv_rep = None
    split_given = layer_split is not None
    split = (
        check_split(model, layer_split) if layer_split is not None else default_split(model.num_layers, pp)
    )
    if len(split) != pp:
        raise BadInputError(f"layer split {split} has {len(split)} stages but --pp is {pp}")
    seq_lens = [seq_len] if seq_len else sorted({*DEFAULT_SEQ_LENS, model.max_position_embeddings or 4096})
    for name, size, what in tp_dims:
        row = _dim("tp", name, size, tp, what)
        if name == "kv_heads" and not row["divides"] and tp % size == 0:
            row["note"] = f"{what}; replicated {tp // size}x (TP {tp} > {size} KV heads)"
            row["replicated"] = tp // size
            kv_rep = _kv_replication(model, tp, split, seq_lens[-1], assumed=seq_len is None)
            findings.append(
                finding(
                    "KV_HEAD_REPLICATION",
                    "warning",
                    f"TP={tp} exceeds the {size} KV heads: each K/V head is replicated {tp // size}x, "
                    f"{_size(kv_rep['replicated_kv_weight_bytes'], 2**20, '.0f')} of duplicated K/V weights "
                    f"({_size(kv_rep['replicated_kv_training_state_bytes'], 2**30, '.2f')} with optimizer state), "
                    f"{_size(kv_rep['extra_grad_allreduce_bytes_per_gpu_per_step'], 2**20, '.1f')} extra gradient "
                    f"all-reduce per GPU per step and {100 * kv_rep['duplicated_flops_fraction']:.2f}% duplicated "
                    "FLOPs"
                    + (
                        f" (at {seq_lens[-1]:,} tokens, the model's context length: no --seq-len given)"
                        if seq_len is None
                        else ""
                    )
                    + f"; TP <= {size} avoids it",
                    **{
                        k: kv_rep[k]
                        for k in (
                            "factor",
                            "replicated_kv_weight_bytes",
                            "extra_grad_allreduce_bytes_per_gpu_per_step",
                        )
                    },
                )
            )
        elif name == "vocab" and not row["divides"]:
            padded = math.ceil(size / tp) * tp
            row["note"] = f"{what}; padded to {padded} ({padded - size} dead rows)"
            findings.append(
                finding(
                    "INDIVISIBLE_DIMENSION",
                    "warning",
                    f"vocab {size} is not divisible by TP={tp}: frameworks pad it to {padded} rows",
                    axis="tp",
                    dimension=name,
                    size=size,
                    degree=tp,
                )
            )
        elif not row["divides"]:
            findings.append(
                finding(
                    "INDIVISIBLE_DIMENSION",
                    "error",
                    f"{what} ({name} = {size}) is not divisible by TP={tp}: {size / tp:g} per rank",
                    axis="tp",
                    dimension=name,
                    size=size,
                    degree=tp,
                )
            )
        dims.append(row)

    # ----- pipeline parallel ----------------------------------------------------------------------
    nb, bs = model.num_blocks, model.block_size
    dims.append(_dim("pp", "layers", model.num_layers, pp, "decoder layers"))
    if bs > 1:
        dims.append(_dim("pp", "blocks", nb, pp, f"{bs}-layer super-blocks ({_pattern(model)})"))
    stages = _stage_table(model, split, seq_lens)
    if model.num_layers % pp and not split_given:
        findings.append(
            finding(
                "INDIVISIBLE_DIMENSION",
                "warning",
                f"{model.num_layers} layers are not divisible by PP={pp}: stages get {_fmt_split(split)} layers",
                axis="pp",
                dimension="layers",
                size=model.num_layers,
                degree=pp,
            )
        )
    balanced = {s: balanced_split(model, pp, s) for s in seq_lens}
    _composition_finding(model, stages, split, seq_lens, balanced[seq_lens[-1]], findings)
    _stage_flops_finding(stages, split, seq_lens, balanced, findings)

    # ----- context parallel -----------------------------------------------------------------------
    if seq_len:
        chunks = 2 * cp if cp > 1 else 1
        row = _dim(
            "cp",
            "sequence",
            seq_len,
            chunks,
            "sequence length; causal load-balanced CP cuts it into 2 x CP chunks"
            if cp > 1
            else "sequence length (no context parallelism)",
        )
        row["per_rank"] = seq_len / cp
        dims.append(row)
        if not row["divides"]:
            findings.append(
                finding(
                    "INDIVISIBLE_DIMENSION",
                    "error",
                    f"sequence length {seq_len} is not divisible into 2 x CP = {chunks} chunks",
                    axis="cp",
                    dimension="sequence",
                    size=seq_len,
                    degree=chunks,
                )
            )

    # ----- clean degrees and limits -----------------------------------------------------------------
    clean_tp = clean_tp_degrees(model)
    head_dims = [(n, s) for n, s, _ in tp_dims if n.endswith("heads")]
    with_rep = [
        d
        for d in range(1, MAX_DEGREE + 1)
        if all(s % d == 0 or (n == "kv_heads" and d % s == 0) for n, s in head_dims)
        and all(s % d == 0 for n, s, _ in tp_dims if not n.endswith("heads"))
    ]
    binding = min((s for _, s in head_dims), default=None)
    limits: dict[str, list[dict[str, Any]]] = {
        "tp": [
            {
                "dimension": n,
                "size": s,
                "max_degree": s,
                "binding": s == binding,
                "rule": (
                    "TP must divide it; above it K/V heads are replicated"
                    if n == "kv_heads"
                    else "TP must divide it"
                ),
            }
            for n, s in head_dims
        ],
        "pp": [
            {
                "dimension": "blocks",
                "size": nb,
                "max_degree": nb,
                "rule": f"PP dividing the {nb} blocks gives every stage the same layer-type mix",
            }
        ],
    }
    clean_degrees: dict[str, list[int] | None] = {
        "tp": clean_tp,
        "tp_with_kv_replication": [d for d in with_rep if d not in clean_tp],
        "pp": _divisors(nb),
        "cp": (
            [d for d in range(1, MAX_DEGREE + 1) if seq_len % (2 * d if d > 1 else 1) == 0]
            if seq_len
            else None
        ),
    }
    deltanet = None
    if LINEAR in model.layer_types:
        hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
        deltanet = {
            "qk_heads": hk,
            "v_heads": hv,
            "v_heads_per_qk_head": hv // hk,
            "max_tp": hk,
            "tp_ok": hk % tp == 0,
            "qk_heads_per_rank": hk / tp if hk % tp else hk // tp,
            "v_heads_per_rank": hv / tp if hv % tp else hv // tp,
            "rule": f"TP must divide the {hk} QK heads (then each rank also holds whole groups of "
            f"{hv // hk} V heads); TP above {hk} cannot split the DeltaNet layers",
        }
    return AuditResult(
        model=model.name,
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        seq_len=seq_len,
        dimensions=dims,
        limits=limits,
        clean_degrees=clean_degrees,
        kv_replication=kv_rep,
        layer_split=split,
        split_source="given" if split_given else "default",
        stages=stages,
        seq_lens_evaluated=seq_lens,
        balanced_split=balanced,
        findings=findings,
        deltanet=deltanet,
        model_summary={
            "num_layers": model.num_layers,
            "block_size": bs,
            "num_blocks": nb,
            "pattern": _pattern(model),
            "num_params": model.num_params,
            "layer_type_counts": model.layer_type_counts(),
        },
    )


def _pattern(model: ModelSpec) -> str:
    bs = model.block_size
    runs: list[tuple[str, int]] = []
    for p in model.layer_types[:bs]:
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return " + ".join(f"{n} {t}" for t, n in runs)


def _fmt_split(split: Sequence[int]) -> str:
    return "/".join(str(x) for x in split)


def _composition_finding(
    model: ModelSpec,
    stages: list[dict],
    split: list[int],
    seq_lens: list[int],
    balanced: list[int],
    findings: list[dict],
) -> None:
    """UNEQUAL_STAGE_COMPOSITION when stages differ in layer-type counts (naming the attention-heavy one)."""
    if len(model.layer_type_counts()) < 2 or len(stages) < 2:
        return
    comps = [tuple(sorted(st["layers"].items())) for st in stages]
    if len(set(comps)) == 1:
        return
    full = [st["layers"].get(FULL, 0) for st in stages]
    most = max(full)
    heavy = [st["stage"] for st in stages if st["layers"].get(FULL, 0) == most]
    fewer = sorted(set(full) - {most})
    s_last = seq_lens[-1]
    fl = [st["flops_per_token"][str(s_last)] for st in stages]
    spread = max(fl) / min(fl) - 1 if min(fl) > 0 else math.inf
    per_stage = ", ".join(
        f"stage {st['stage']}: {st['layers'].get(LINEAR, 0)} {LINEAR} + {st['layers'].get(FULL, 0)} {FULL}"
        for st in stages
    )
    findings.append(
        finding(
            "UNEQUAL_STAGE_COMPOSITION",
            "warning",
            f"PP={len(split)} with split {_fmt_split(split)} cuts the {model.block_size}-layer blocks unevenly: "
            f"stage{'s' if len(heavy) > 1 else ''} {', '.join(map(str, heavy))} hold{'' if len(heavy) > 1 else 's'} "
            f"{most} full-attention layers vs {', '.join(map(str, fewer))} elsewhere ({per_stage}); "
            f"at {s_last:,} tokens the heaviest stage does {100 * spread:.1f}% more FLOPs than the lightest "
            f"(LM head on the last stage); balanced split on block boundaries: {_fmt_split(balanced)}",
            stages=heavy,
            layer_split=list(split),
            full_attention_per_stage=full,
            balanced_split=balanced,
            flops_spread=spread,
            seq_len=s_last,
        )
    )


#: heaviest stage's FLOPs per token over the stages' mean above this -> STAGE_IMBALANCE (the same
#: threshold `tracelens analyze` applies to measured stage compute, analyze/pipeline/composition.py)
STAGE_FLOPS_IMBALANCE = 1.10


def _stage_flops_finding(
    stages: list[dict],
    split: list[int],
    seq_lens: list[int],
    balanced: dict[int, list[int]],
    findings: list[dict],
) -> None:
    """STAGE_IMBALANCE when the heaviest stage's FLOPs per token exceed the stages' mean by > 10%.

    Evaluated at every sequence length of the audit; the worst one is reported. The LM head on the last
    stage is what makes an even split of a large-vocabulary model imbalanced at short sequences.
    """
    if len(stages) < 2:
        return
    worst = None
    for s in seq_lens:
        fl = [st["flops_per_token"][str(s)] for st in stages]
        mean = sum(fl) / len(fl)
        if mean <= 0:
            continue
        heavy = max(range(len(fl)), key=fl.__getitem__)
        ratio = fl[heavy] / mean
        if worst is None or ratio > worst[0]:
            lightest = min(fl)
            worst = (ratio, s, heavy, fl[heavy], mean, lightest)
    if worst is None or worst[0] <= STAGE_FLOPS_IMBALANCE:
        return
    ratio, s, heavy, top, mean, lightest = worst
    extra = " (it holds the LM head)" if stages[heavy]["has_lm_head"] else ""
    bal = balanced.get(s)
    if bal and bal != list(split):
        hint = f"balanced split on block boundaries at {s:,} tokens: {_fmt_split(bal)}"
    else:
        hint = (
            "no split on block boundaries does better; give the last stage fewer layers with --split "
            "(e.g. an uneven split) or accept the imbalance"
        )
    findings.append(
        finding(
            "STAGE_IMBALANCE",
            "warning",
            f"stage {heavy} does {top / 1e9:.1f} GFLOP/token vs {mean / 1e9:.1f} mean and {lightest / 1e9:.1f} on "
            f"the lightest stage at {s:,} tokens ({ratio:.2f}x the mean, threshold "
            f"{STAGE_FLOPS_IMBALANCE:.2f}x){extra}: every other stage waits for it; {hint}",
            stages=[heavy],
            imbalance=round(ratio, 4),
            seq_len=s,
            stage_flops_per_token=[st["flops_per_token"][str(s)] for st in stages],
        )
    )


_UNITS = {2**30: "GiB", 2**20: "MiB", 2**10: "KiB", 1: "B"}


def _size(nbytes: float, unit: int, fmt: str) -> str:
    """`nbytes` in `unit` (2**30 or 2**20) written with `fmt`, or in the largest smaller unit when that would
    print as zero (a tiny model's K/V weights are KiB, not "0 MiB")."""
    for u in (unit, *(v for v in _UNITS if v < unit)):
        text = f"{nbytes / u:{fmt}}"
        if u == 1 or float(text.replace(",", "")) > 0 or nbytes == 0:
            return f"{text} {_UNITS[u]}"
    return f"{nbytes:.0f} B"
