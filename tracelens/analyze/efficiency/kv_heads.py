"""K/V heads as the trace shows them: the width of each tensor-parallel rank's K and V projections, read from
the shapes of the matmuls it ran, against the exact split of the model's KV heads.

A column-parallel projection computes `width / tp` output features on each rank. With more TP ranks than KV
heads (tp > n_kv) the exact share of K (and of V) is less than one head (`n_kv * head_dim / tp`), which no
attention kernel can use: implementations give each rank one whole head instead (Megatron, vLLM and
hand-written DTensor plans replicate the K/V projection), so `tp / n_kv` ranks compute the same head, hold
the same K/V weights and activations, and must sum that head's gradients. The matmul inside a rank's K
projection (`Input Dims` of its `aten::mm` / `aten::addmm` / `aten::linear`, recorded with `record_shapes`)
shows the width it really computes: `head_dim` instead of the exact share is the replication, seen.

The projections are found by their module annotations (`...k_proj`, `...v_proj`, `...wk`, `...wv`, fused
`...qkv_proj` / `query_key_value` / `Wqkv`): names locate the matmul; its shape is the evidence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

#: Module names of K, V and fused QKV projections (Hugging Face, Llama reference, GPT-NeoX, MPT / Falcon).
_K = re.compile(r"(?:^|\.)(?:k_proj|wk|key)$")
_V = re.compile(r"(?:^|\.)(?:v_proj|wv|value)$")
_QKV = re.compile(r"(?:^|\.)(?:qkv_proj|query_key_value|wqkv|c_attn|qkv)$", re.IGNORECASE)
_MATMULS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")


@dataclass
class KVWidths:
    """Local output widths (features) of one rank's K and V projections (None when not seen), the fused QKV
    width, and where they were read."""

    rank: int
    k: int | None
    v: int | None
    qkv: int | None
    source: str


def _out_width(name: str, dims_json: str | None) -> int | None:
    """Output features of a matmul from its `Input Dims`: mm [[M, K], [K, N]], addmm [[N], [M, K], [K, N]],
    linear [[..., K], [N, K], bias] (N)."""
    if not dims_json:
        return None
    try:
        d = json.loads(dims_json)
    except ValueError:
        return None
    if not isinstance(d, list):
        return None
    try:
        if name == "aten::linear" and len(d) >= 2 and len(d[1]) == 2:
            return int(d[1][0])
        if name == "aten::addmm" and len(d) >= 3 and len(d[2]) == 2:
            return int(d[2][1])
        if name in ("aten::mm", "aten::matmul", "aten::bmm") and len(d) >= 2 and len(d[1]) >= 2:
            return int(d[1][-1])
    except (TypeError, ValueError, IndexError):
        return None
    return None


def projection_widths(rank: int, events: pa.Table, shapes: pa.Table) -> KVWidths | None:
    """K / V / fused-QKV widths of one rank: in each annotated projection span, the narrowest matmul output
    (a DTensor records the global op around the local one: the local, narrower one is what the rank computes);
    the median over the rank's spans. None when the rank annotates no such projection or records no shapes."""
    if events.num_rows == 0 or shapes.num_rows == 0:
        return None
    df = events.select(["kind", "name", "tid", "ts_ns", "dur_ns", "external_id"]).to_pandas()
    df["name"] = df["name"].astype(str)
    df["kind"] = df["kind"].astype(str)
    ann = df[df["kind"] == "user_annotation"]
    which = {
        "k": ann[ann["name"].str.contains(_K)],
        "v": ann[ann["name"].str.contains(_V)],
        "qkv": ann[ann["name"].str.contains(_QKV)],
    }
    if all(w.empty for w in which.values()):
        return None
    mm = df[(df["kind"] == "cpu_op") & df["name"].isin(_MATMULS) & df["external_id"].notna()]
    dims = dict(zip(shapes.column("external_id").to_pylist(), shapes.column("input_dims").to_pylist()))
    mm = mm.assign(width=[_out_width(n, dims.get(int(e))) for n, e in zip(mm["name"], mm["external_id"])])
    mm = mm[mm["width"].notna()]
    if mm.empty:
        return None
    ts = mm["ts_ns"].to_numpy(np.int64)
    order = np.argsort(ts, kind="stable")
    ts_sorted = ts[order]
    widths = mm["width"].to_numpy(np.int64)[order]
    tids = mm["tid"].to_numpy()[order]
    out: dict[str, int | None] = {}
    for key, spans in which.items():
        got = []
        for t0, d, tid in zip(spans["ts_ns"], spans["dur_ns"], spans["tid"]):
            lo, hi = np.searchsorted(ts_sorted, [t0, t0 + d], side="left")
            sel = widths[lo:hi][tids[lo:hi] == tid] if pd.notna(tid) else widths[lo:hi]
            if sel.size:
                got.append(int(sel.min()))
        out[key] = int(np.median(got)) if got else None
    if all(v is None for v in out.values()):
        return None
    return KVWidths(rank, out["k"], out["v"], out["qkv"], "module annotations and matmul shapes")


def kv_evidence(
    w: KVWidths, n_heads: int, n_kv: int, head_dim: int, tp: int, hidden: int
) -> dict[str, Any] | None:
    """What the widths say against the exact split over `tp` ranks: `exact_width` (n_kv*head_dim/tp, may be
    a fraction of a head), `kv_width` (K's, else V's, else the fused projection's K/V part), `factor`
    (kv_width / exact_width: > 1 when ranks compute more K/V than their share), and what the excess costs
    each rank per attention layer: K and V weight elements (2 x excess x hidden) and K and V activation
    elements per token (2 x excess). None without a width."""
    exact = n_kv * head_dim / tp
    kv = w.k if w.k is not None else w.v
    if kv is None and w.qkv is not None:
        q_local = n_heads * head_dim / tp
        rest = w.qkv - q_local
        kv = int(rest // 2) if rest > 0 else None
    if kv is None or exact <= 0:
        return None
    return {
        "rank": w.rank,
        "k_width": w.k,
        "v_width": w.v,
        "qkv_width": w.qkv,
        "kv_width": int(kv),
        "exact_width": exact,
        "factor": kv / exact,
        "extra_kv_weight_elements_per_layer": max(0.0, 2 * (kv - exact) * hidden),
        "extra_kv_activation_elements_per_token_per_layer": max(0.0, 2 * (kv - exact)),
        "source": w.source,
    }
