"""Inference iterations as steps, per phase: what each prefill, decode or mixed iteration costs per token and
where its GPU time goes (docs/inference.md).

Pure: the metadata's iterations (tracelens.ingest.iterations, per rank), the breakdown (per rank and step) and
the idle breakdown (per rank and step, tracelens.analyze.rank.idle) in; the summary's `inference` object out.
A decode iteration is short and launch-bound by design (a CUDA graph replays a few hundred small kernels
per token; its gaps are launch overhead), a prefill one compute-bound: the per-phase figures say which
applies, and `ms_per_token` is the fair comparison across batch sizes.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa

from tracelens.ingest.iterations import PHASES
from tracelens.models.op_flops import OpContext

#: At most this many iterations are listed one by one in summary.json (all of them count in the phases).
MAX_LISTED = 200
_NS_PER_MS = 1e6


def iterations_frame(metadata: pa.Table | None) -> pd.DataFrame:
    """One row per (rank, iteration) from the metadata's `iterations_json` (empty when none has any)."""
    cols = ["rank", "step", "name", "format", "kind", "phase", "tokens", "prefill_tokens", "decode_tokens",
            "requests", "prefill_requests", "decode_requests"]  # fmt: skip
    if metadata is None or "iterations_json" not in metadata.column_names:
        return pd.DataFrame(columns=cols)
    rows = []
    for rank, text in zip(
        metadata.column("rank").to_pylist(), metadata.column("iterations_json").to_pylist()
    ):
        if not text:
            continue
        try:
            recs = json.loads(text)
        except ValueError:
            continue
        for r in recs if isinstance(recs, list) else []:
            if isinstance(r, dict):
                rows.append({"rank": rank, **{c: r.get(c) for c in cols[1:]}})
    return pd.DataFrame(rows, columns=cols)


def _total(vals: pd.Series) -> int | None:
    """Sum of a step's iterations' counts; null when any is unknown."""
    if vals.isna().any():
        return None
    return int(vals.sum())


def per_step(iters: pd.DataFrame) -> pd.DataFrame:
    """The iterations of each (rank, step): phase (the one phase of all, else mixed; null when unknown),
    kind, tokens and requests summed (null when one is unknown), names joined."""
    if iters.empty:
        return iters
    out = []
    for (rank, step), g in iters.dropna(subset=["step"]).groupby(["rank", "step"], sort=True):
        phases = set(g["phase"].dropna())
        phase = None if g["phase"].isna().any() else phases.pop() if len(phases) == 1 else "mixed"
        out.append(
            {
                "rank": int(rank),
                "step": int(step),
                "iterations": len(g),
                "name": g["name"].iloc[0] if len(g) == 1 else f"{len(g)} iterations",
                "format": g["format"].iloc[0],
                "kind": g["kind"].iloc[0] if g["kind"].nunique() == 1 else "mixed",
                "phase": phase,
                **{c: _total(g[c]) for c in ("tokens", "prefill_tokens", "decode_tokens", "requests")},
            }
        )
    return pd.DataFrame(out)


def inference_summary(
    metadata: pa.Table | None, breakdown: pa.Table | None, idle: pd.DataFrame | None = None
) -> dict[str, Any] | None:
    """summary.json's `inference`: the iterations (step by step, on the lowest rank) and per phase their
    count, tokens, time per step and per token, compute, idle, launch overhead and host-bound time per step.
    None when no rank has iterations."""
    iters = iterations_frame(metadata)
    if iters.empty:
        return None
    steps = per_step(iters)
    if breakdown is None or breakdown.num_rows == 0 or steps.empty:
        bd = pd.DataFrame(columns=["rank", "step", "step_time_ns", "compute_ns", "idle_ns"])
    else:
        bd = breakdown.select(["rank", "step", "step_time_ns", "compute_ns", "idle_ns"]).to_pandas()
    bd = bd.dropna(subset=["step"]).astype({"rank": "int64", "step": "int64"})
    rows = steps.merge(bd, on=["rank", "step"], how="left") if not steps.empty else steps
    if idle is not None and not idle.empty:
        ic = idle[["rank", "step", "launch_overhead_ns", "host_bound_ns"]].dropna(subset=["step"])
        rows = rows.merge(ic.astype({"rank": "int64", "step": "int64"}), on=["rank", "step"], how="left")
    else:
        rows["launch_overhead_ns"] = rows["host_bound_ns"] = None
    first = int(rows["rank"].min()) if not rows.empty else None
    listed = []
    for r in rows[rows["rank"] == first].sort_values("step").head(MAX_LISTED).to_dict("records"):
        st = _ms(r.get("step_time_ns"))
        tok = r.get("tokens")
        listed.append(
            {
                "step": int(r["step"]),
                "name": r["name"],
                "format": r["format"],
                "kind": r["kind"],
                "phase": r["phase"],
                "tokens": _int(tok),
                "prefill_tokens": _int(r.get("prefill_tokens")),
                "decode_tokens": _int(r.get("decode_tokens")),
                "requests": _int(r.get("requests")),
                "step_time_ms": st,
                "ms_per_token": round(st / tok, 6) if st is not None and _int(tok) else None,
            }
        )
    phases = {}
    for ph in PHASES:
        g = rows[rows["phase"] == ph]
        if not g.empty:
            phases[ph] = _phase_stats(g)
    return {
        "iterations": listed,
        "iterations_total": int(len(rows[rows["rank"] == first])) if first is not None else 0,
        "rank": first,
        "kinds": sorted(str(k) for k in rows["kind"].dropna().unique()),
        "phases": phases,
        "unassigned": int(iters["step"].isna().sum()),
    }


def _phase_stats(g: pd.DataFrame) -> dict[str, Any]:
    """Per (rank, step) means of one phase's iterations; ms_per_token = their time over their tokens."""
    st = pd.to_numeric(g["step_time_ns"], errors="coerce")
    tok = pd.to_numeric(g["tokens"], errors="coerce")
    both = st.notna() & tok.notna() & (tok > 0)
    out: dict[str, Any] = {
        "steps": int(len(g)),
        "tokens_per_step": _mean(tok),
        "step_time_ms": _mean_ms(st),
        "ms_per_token": round(float(st[both].sum()) / float(tok[both].sum()) / _NS_PER_MS, 6)
        if both.any()
        else None,
        "tokens_per_s": round(float(tok[both].sum()) / (float(st[both].sum()) / 1e9), 3)
        if both.any()
        else None,
        "compute_ms": _mean_ms(g.get("compute_ns")),
        "idle_ms": _mean_ms(g.get("idle_ns")),
        "launch_overhead_ms": _mean_ms(g.get("launch_overhead_ns")),
        "host_bound_ms": _mean_ms(g.get("host_bound_ns")),
    }
    idle, step = out["idle_ms"], out["step_time_ms"]
    out["idle_share"] = round(idle / step, 6) if idle is not None and step else None
    return out


def _ms(v: Any) -> float | None:
    if v is None or pd.isna(v):
        return None
    return round(float(v) / _NS_PER_MS, 6)


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _mean(s: pd.Series | None) -> float | None:
    if s is None:
        return None
    s = pd.to_numeric(s, errors="coerce").dropna()
    return round(float(s.mean()), 6) if len(s) else None


def _mean_ms(s: pd.Series | None) -> float | None:
    m = _mean(s)
    return None if m is None else round(m / _NS_PER_MS, 6)


def op_contexts(metadata: pa.Table | None) -> dict[tuple[int, int], OpContext]:
    """(rank, step) -> what its one engine iteration's annotation says about attention (the sq / sk sums of
    OpContext), for the op models that need it; steps with several iterations or no sums get none."""
    iters = iterations_frame(metadata)
    if iters.empty or metadata is None:
        return {}
    full = pd.DataFrame(
        [
            {"rank": rk, **r}
            for rk, text in zip(
                metadata.column("rank").to_pylist(), metadata.column("iterations_json").to_pylist()
            )
            if text
            for r in (json.loads(text) or [])
            if isinstance(r, dict) and r.get("step") is not None
        ]
    )
    out: dict[tuple[int, int], OpContext] = {}
    if full.empty:
        return out
    fields = ("c_sq", "c_sk", "c_sqsq", "c_sqsk", "g_sq", "g_sk", "g_sqsk")
    for (rank, step), g in full.groupby(["rank", "step"]):
        if len(g) != 1:
            continue
        r = g.iloc[0]
        v = {f: _int(r.get(f)) for f in fields}
        if v["c_sqsk"] is None or v["g_sqsk"] is None:
            continue
        out[(int(rank), int(step))] = OpContext(
            c_sq=v["c_sq"], c_sk=v["c_sk"], c_sqsq=v["c_sqsq"], c_sqsk=v["c_sqsk"],
            g_sq=v["g_sq"], g_sk=v["g_sk"], g_sqsk=v["g_sqsk"],
        )  # fmt: skip
    return out
