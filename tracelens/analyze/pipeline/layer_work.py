"""Layers and work per layer from the ops a rank ran, where module annotations are missing or partial.

*Layers.* A dense decoder layer is a token mixer followed by an MLP, and the MLP applies its activation
(SiLU for SwiGLU, GELU for GeGLU) once per forward of the layer: a rank's forward activations per step,
divided by the microbatches, are the layers it holds. A full-attention layer calls one attention op per
forward (`aten::scaled_dot_product_attention`, or a flash / memory-efficient attention forward when
called directly): the full-attention layers. The rest are layers of another mixer (linear attention,
Mamba...), named by the annotations when they name one. Only forward ops count: those outside the
autograd engine's backward ops (`autograd::engine::evaluate_function`), which also leaves out the forward
that activation checkpointing recomputes during the backward. A census whose counts are not a whole number
per microbatch is not used (a model this does not describe: MoE experts each apply the activation).

*Work per layer.* The matmul FLOPs a rank runs per step (2*M*K*N of every leaf `aten::mm` / `aten::addmm` /
`aten::bmm`, from their recorded shapes; forward and backward), over its layers and microbatches. Matmuls
whose weight shape occurs once per microbatch (the LM head, a final projection: one per stage, not one per
layer) are left out so that the first and last stages' own jobs do not count as work per layer. Layers of
one model cost about the same whichever stage holds them; a rank whose layers cost materially more than
the other stages' does work its peers do not (a compute straggler, where a pipeline stage has no
data-parallel replica to be compared with); a stage that holds more layers at the same cost per layer is
a heavy stage, not a straggler.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracelens.thresholds import DEFAULT

#: MLP activations applied once per forward of a dense decoder layer.
ACTIVATIONS = ("aten::silu", "aten::gelu", "aten::silu_", "aten::gelu_")
#: Attention ops called once per forward of a full-attention layer (the outermost one a model calls).
ATTENTION = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
)
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
#: A rank whose matmul FLOPs per layer exceed the other stages' median by more than this share does work its
#: peers do not (tracelens.thresholds: layer_work_excess, with its reason).
LAYER_WORK_EXCESS = DEFAULT.layer_work_excess


@dataclass
class RankWork:
    """One rank's layers (per microbatch) and work per layer, from its ops in one step."""

    rank: int
    layers: int | None
    full_attention: int | None
    flops_per_layer: float | None
    flops_per_step: float | None


def _forward_rows(df: pd.DataFrame) -> np.ndarray:
    """Rows of one rank's cpu ops outside the autograd engine's backward ops (on any thread)."""
    bwd = df["name"].str.startswith("autograd::engine::evaluate_function").to_numpy()
    out = np.ones(len(df), bool)
    if not bwd.any():
        return out
    s = df["ts_ns"].to_numpy(np.int64)[bwd]
    e = s + df["dur_ns"].to_numpy(np.int64)[bwd]
    o = np.argsort(s)
    s, e = s[o], np.maximum.accumulate(e[o])
    t = df["ts_ns"].to_numpy(np.int64)
    i = np.searchsorted(s, t, side="right") - 1
    inside = (i >= 0) & (e[np.maximum(i, 0)] > t)
    out &= ~inside & ~bwd
    return out


def _leaf_mm_flops(
    mm: pd.DataFrame, dims: dict[int, str | None]
) -> tuple[dict[tuple[int, int], float], Counter[tuple[int, int]]]:
    """FLOPs and calls of leaf matmuls per weight shape (K, N). A matmul with a matmul inside it (a DTensor's
    global op around the local one) is not a leaf."""
    flops: dict[tuple[int, int], float] = {}
    calls: Counter[tuple[int, int]] = Counter()
    s = mm["ts_ns"].to_numpy(np.int64)
    e = s + mm["dur_ns"].to_numpy(np.int64)
    o = np.lexsort((-e, s))
    names = mm["name"].to_numpy()
    ext = mm["external_id"].to_numpy()
    for k, j in enumerate(o):
        if k + 1 < len(o) and s[o[k + 1]] < e[j]:
            continue  # the next matmul starts inside this one
        try:
            d = json.loads(dims.get(int(ext[j])) or "null")
            a, b = (d[1], d[2]) if names[j] == "aten::addmm" else (d[0], d[1])
            rows, kk, nn = int(np.prod(a[:-1])), int(a[-1]), int(b[-1])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        flops[(kk, nn)] = flops.get((kk, nn), 0.0) + 2.0 * rows * kk * nn
        calls[(kk, nn)] += 1
    return flops, calls


def rank_work(
    rank: int, events: pa.Table, shapes: pa.Table | None, m: int, step: int | None
) -> RankWork | None:
    """Layers and work per layer of one rank in one step (`step`: None, the rank's median step)."""
    if events.num_rows == 0 or not m:
        return None
    df = events.select(["kind", "name", "ts_ns", "dur_ns", "step", "external_id"]).to_pandas()
    df = df[df["kind"].astype(str) == "cpu_op"]
    df = df.assign(name=df["name"].astype(str))
    steps = sorted(int(x) for x in df["step"].dropna().unique())
    if not steps:
        return None
    st = step if step is not None else steps[len(steps) // 2]
    df = df[df["step"] == st]
    if df.empty:
        return None
    fwd = df[_forward_rows(df)]
    act = int(fwd["name"].isin(ACTIVATIONS).sum())
    attn = int(fwd["name"].isin(ATTENTION).sum())
    layers = act // m if act and act % m == 0 else None
    full = attn // m if attn % m == 0 else None
    per_layer = per_step = None
    if shapes is not None and shapes.num_rows and layers:
        dims = dict(zip(shapes.column("external_id").to_pylist(), shapes.column("input_dims").to_pylist()))
        mm = df[df["name"].isin(MATMULS) & df["external_id"].notna()].reset_index(drop=True)
        if len(mm):
            by_sig, count = _leaf_mm_flops(mm, dims)
            if by_sig:
                per_step = float(sum(by_sig.values()))
                # one use per microbatch: the stage's own job (LM head), not a layer's
                kept = sum(f for k, f in by_sig.items() if count[k] >= 2 * m or layers < 2)
                per_layer = kept / (layers * m)
    return RankWork(rank, layers, full, per_layer, per_step)


def stage_layers(work: dict[int, RankWork], stage_of: dict[int, int]) -> dict[int, dict[str, int]] | None:
    """Per stage: {"full_attention": n, "other": n} layers per microbatch (the median over its ranks), or
    None when some stage's census is missing."""
    per: dict[int, list[tuple[int, int]]] = {}
    for r, w in work.items():
        s = stage_of.get(r)
        if s is None or w.layers is None or w.full_attention is None:
            continue
        per.setdefault(s, []).append((w.layers, w.full_attention))
    stages = set(stage_of.values())
    if not per or set(per) != stages:
        return None
    out = {}
    for s, vals in sorted(per.items()):
        layers = int(np.median([v[0] for v in vals]))
        full = int(np.median([v[1] for v in vals]))
        out[s] = {"full_attention": full, "other": max(layers - full, 0)}
    return out


def heavy_layer_ranks(
    work: dict[int, RankWork], stage_of: dict[int, int], excess: float = LAYER_WORK_EXCESS
) -> list[dict[str, Any]]:
    """Ranks whose matmul work per layer exceeds the other stages' median by more than LAYER_WORK_EXCESS
    (module docstring): {"rank", "ratio", "flops_per_layer", "peer_flops_per_layer", "peers"}."""
    known = {r: w for r, w in work.items() if w.flops_per_layer and r in stage_of}
    out = []
    for r, w in known.items():
        others = [
            x.flops_per_layer for q, x in known.items() if stage_of[q] != stage_of[r] and x.flops_per_layer
        ]
        if len(others) < 1:
            continue
        ref = float(np.median(others))
        ratio = (w.flops_per_layer or 0.0) / ref if ref > 0 else None
        if ratio is not None and ratio > 1.0 + excess:
            out.append(
                {
                    "rank": r,
                    "ratio": ratio,
                    "flops_per_layer": w.flops_per_layer,
                    "peer_flops_per_layer": ref,
                    "peers": sorted(q for q in known if stage_of[q] != stage_of[r]),
                }
            )
    return out
