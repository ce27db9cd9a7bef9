"""Compare two runs' summaries: side by side, as deltas, per token where that is the fair comparison.

Pure: two summary dicts (schema tracelens.summary/1) in, one comparison dict out. Shares of step time
(breakdown parts, layer types), MFU and the bubble fraction are fractions, so their changes are compared in
percentage points and the largest one is "what changed most". Absolute times are also given per 1,000
tokens when both runs say their tokens per step (summary mfu.tokens_per_step): a 262,144-token step is
expected to take longer than a 4,096-token one, the time per token is what tells whether it got worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SCHEMA = "tracelens.compare/1"

#: Readable names of layer types (composition.time_share keys).
TYPE_NAMES = {
    "full_attention": "full attention",
    "linear_attention": "linear attention (DeltaNet)",
    "mixer": "mixer",
    "mlp": "MLP",
    "lm_head": "LM head",
    "embedding": "embedding",
}
#: Breakdown parts as shares of step time: (key, name, summary rank field).
BREAKDOWN_SHARES = (
    ("compute", "compute", "compute_ms"),
    ("exposed_comm", "exposed communication", "exposed_comm_ms"),
    ("exposed_wait", "exposed comm: waiting for other ranks", "exposed_wait_ms"),
    ("exposed_transfer", "exposed comm: transfer", "exposed_transfer_ms"),
    ("overlapped_comm", "overlapped communication", "overlapped_comm_ms"),
    ("memcpy", "memcpy", "memcpy_ms"),
    ("idle", "idle", "idle_ms"),
    ("bubble", "pipeline bubble", "bubble_ms"),
)
#: Changes smaller than this (percentage points) are not worth a sentence.
MIN_POINTS = 1.0


def _num(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def _mean(vals: Sequence[Any]) -> float | None:
    v = [x for x in (_num(y) for y in vals) if x is not None]
    return sum(v) / len(v) if v else None


def step_time_ms(s: dict[str, Any]) -> float | None:
    """The run's step time: mean over ranks of their mean step time."""
    return _mean([r.get("step_time_ms") for r in s.get("ranks") or []])


def tokens_per_step(s: dict[str, Any]) -> float | None:
    t = _num((s.get("mfu") or {}).get("tokens_per_step"))
    return t if t and t > 0 else None


def shares(s: dict[str, Any]) -> dict[str, float | None]:
    """Breakdown parts as fractions of step time, over all ranks (None when no rank reports the part)."""
    ranks = [r for r in s.get("ranks") or [] if _num(r.get("step_time_ms"))]
    total = sum(_num(r["step_time_ms"]) or 0.0 for r in ranks)  # every one a number (the filter above)
    out: dict[str, float | None] = {}
    for key, _, field in BREAKDOWN_SHARES:
        vals = [_num(r.get(field)) for r in ranks]
        out[key] = None if not total or all(v is None for v in vals) else sum(v or 0.0 for v in vals) / total
    return out


def layer_time_share(s: dict[str, Any]) -> dict[str, float]:
    """composition.time_share of the summary ({} when the run had no module annotations)."""
    comp = s.get("composition") or {}
    ts = comp.get("time_share") if isinstance(comp, dict) else None
    return {str(k): float(v) for k, v in (ts or {}).items() if _num(v) is not None}


def layer_comm(s: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """composition.comm_by_type of the summary as {(layer type, op): record} ({} when absent)."""
    comp = s.get("composition") or {}
    cbt = comp.get("comm_by_type") if isinstance(comp, dict) else None
    return {(str(t), str(op)): rec for t, ops in (cbt or {}).items() for op, rec in (ops or {}).items()}


def layer_comm_metrics(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Communication per layer type (ms and bytes per step), e.g. the all-to-alls of full attention."""
    ca, cb = layer_comm(a), layer_comm(b)
    out = []
    for t, op in sorted(set(ca) | set(cb)):
        ra, rb = ca.get((t, op), {}), cb.get((t, op), {})
        name = f"{TYPE_NAMES.get(t, t)} {op}"
        out.append(
            _metric(
                "layer_comm",
                f"comm.{t}.{op}.ms",
                name,
                "ms",
                ra.get("ms_per_step"),
                rb.get("ms_per_step"),
                "per step, calls inside the layer type",
            )
        )
        out.append(
            _metric(
                "layer_comm",
                f"comm.{t}.{op}.bytes",
                f"{name} bytes",
                "count",
                ra.get("bytes_per_step"),
                rb.get("bytes_per_step"),
                "bytes per step",
            )
        )
    return out


def bubble_fraction(s: dict[str, Any]) -> float | None:
    """Mean bubble fraction of the pipeline window over stages (None without pipeline results)."""
    return _mean([st.get("bubble_fraction") for st in s.get("stages") or []])


def stage_imbalance(s: dict[str, Any]) -> float | None:
    """max / mean stage compute (1.0 = balanced)."""
    vals = [v for v in (_num(st.get("compute_ms")) for st in s.get("stages") or []) if v is not None]
    if len(vals) < 2 or not sum(vals):
        return None
    return max(vals) / (sum(vals) / len(vals))


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "%":
        return f"{100 * v:.1f}%"
    if unit == "x":
        return f"{v:.3f}"
    if unit == "count":
        return f"{int(v):,}"
    if unit == "tokens":
        return f"{v:,.0f}"
    return f"{v:,.3f} {unit}" if abs(v) < 100 else f"{v:,.1f} {unit}"


def _metric(group: str, key: str, name: str, unit: str, a: Any, b: Any, note: str = "") -> dict[str, Any]:
    a, b = _num(a), _num(b)
    delta = b - a if a is not None and b is not None else None
    ratio = b / a if delta is not None and a else None
    if delta is None:
        dt = "-"
    elif unit == "%":
        dt = f"{100 * delta:+.1f} points"
    elif ratio is not None:
        dt = f"{ratio:.2f}x ({'+' if delta >= 0 else ''}{_fmt(delta, unit)})"
    else:
        dt = f"{'+' if delta >= 0 else ''}{_fmt(delta, unit)}"
    return {
        "group": group,
        "key": key,
        "name": name,
        "unit": unit,
        "a": a,
        "b": b,
        "delta": delta,
        "ratio": ratio,
        "a_text": _fmt(a, unit),
        "b_text": _fmt(b, unit),
        "delta_text": dt,
        "note": note,
    }


def layout_text(s: dict[str, Any]) -> str:
    """'tp=4, pp=4, dp=1, cp=1' from run.layout ('' when unknown)."""
    lay = (s.get("run") or {}).get("layout") or {}
    return ", ".join(f"{k}={lay[k]}" for k in ("tp", "pp", "dp", "cp") if lay.get(k) is not None)


def run_info(s: dict[str, Any]) -> dict[str, Any]:
    """What identifies a run beside its numbers: name, path, layout, sequence length, world size, GPU."""
    run = s.get("run") or {}
    mfu = s.get("mfu") or {}
    return {
        "name": run.get("name"),
        "path": run.get("path"),
        "layout": layout_text(s) or None,
        "seq_len": run.get("seq_len") or mfu.get("seq_len"),
        "world_size": run.get("world_size"),
        "gpu": run.get("gpu"),
        "steps": len(run.get("steps") or []) or None,
    }


#: metrics that measure the same thing: only the largest change of each concept is named in the text
_CONCEPT = {"bubble_fraction": "bubble", "share.bubble": "bubble"}


def _distinct(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`changes` (largest first) without a second metric of an already named concept (the bubble twice)."""
    seen: set[str] = set()
    out = []
    for m in changes:
        concept = _CONCEPT.get(m["key"], m["key"])
        if concept not in seen:
            seen.add(concept)
            out.append(m)
    return out


def compare(a: dict[str, Any], b: dict[str, Any], labels: Sequence[str] = ("A", "B")) -> dict[str, Any]:
    """Side-by-side metrics of two summaries, their deltas, the biggest change and a plain-words text."""
    la, lb = (str(labels[0]), str(labels[1])) if len(labels) == 2 else ("A", "B")
    ta, tb = tokens_per_step(a), tokens_per_step(b)
    per_tok = ta is not None and tb is not None
    sa, sb = step_time_ms(a), step_time_ms(b)
    sha, shb = shares(a), shares(b)
    metrics = [
        _metric(
            "run",
            "step_time_ms",
            "step time",
            "ms",
            sa,
            sb,
            ""
            if per_tok and ta == tb
            else "runs process different tokens per step: see per 1k tokens"
            if per_tok
            else "tokens per step unknown: raw step time only",
        ),
        _metric("run", "tokens_per_step", "tokens per step", "tokens", ta, tb),
    ]
    if per_tok:
        metrics.append(
            _metric(
                "run",
                "step_time_per_1k_tokens_ms",
                "step time per 1,000 tokens",
                "ms",
                sa / ta * 1000 if sa is not None and ta is not None else None,
                sb / tb * 1000 if sb is not None and tb is not None else None,
                "the fair comparison when tokens per step differ",
            )
        )
    ea = _mean([r.get("exposed_comm_ms") for r in a.get("ranks") or []])
    eb = _mean([r.get("exposed_comm_ms") for r in b.get("ranks") or []])
    metrics.append(_metric("run", "exposed_comm_ms", "exposed communication per step", "ms", ea, eb))
    if per_tok:
        metrics.append(
            _metric(
                "run",
                "exposed_comm_per_1k_tokens_ms",
                "exposed communication per 1,000 tokens",
                "ms",
                ea / ta * 1000 if ea is not None and ta is not None else None,
                eb / tb * 1000 if eb is not None and tb is not None else None,
            )
        )
    metrics += [
        _metric(
            "run",
            "mfu",
            "MFU",
            "%",
            (a.get("mfu") or {}).get("value"),
            (b.get("mfu") or {}).get("value"),
            "model FLOPs per second over peak: already per token",
        ),
        _metric(
            "run",
            "bubble_fraction",
            "pipeline bubble (share of the pipeline window)",
            "%",
            bubble_fraction(a),
            bubble_fraction(b),
        ),
        _metric(
            "run",
            "stage_imbalance",
            "stage imbalance (max / mean stage compute)",
            "x",
            stage_imbalance(a),
            stage_imbalance(b),
        ),
        _metric(
            "run",
            "stragglers",
            "stragglers",
            "count",
            len(a.get("stragglers") or []),
            len(b.get("stragglers") or []),
        ),
    ]
    for key, name, _ in BREAKDOWN_SHARES:
        metrics.append(
            _metric("breakdown", f"share.{key}", name, "%", sha.get(key), shb.get(key), "share of step time")
        )
    lta, ltb = layer_time_share(a), layer_time_share(b)
    for t in sorted(set(lta) | set(ltb), key=lambda t: -max(lta.get(t, 0.0), ltb.get(t, 0.0))):
        metrics.append(
            _metric(
                "layer_types",
                f"share.{t}",
                TYPE_NAMES.get(t, t),
                "%",
                lta.get(t) if lta else None,
                ltb.get(t) if ltb else None,
                "share of step time",
            )
        )

    metrics += layer_comm_metrics(a, b)

    # what changed most: fractions compared in percentage points (parts that overlap others excluded from
    # the ranking: idle holds the bubble, exposed comm holds its wait and transfer)
    rankable = [
        m
        for m in metrics
        if m["unit"] == "%"
        and m["delta"] is not None
        and m["key"] not in ("share.idle", "share.exposed_wait", "share.exposed_transfer")
    ]
    changes = sorted(rankable, key=lambda m: -abs(m["delta"]))
    biggest = changes[0] if changes and abs(changes[0]["delta"]) * 100 >= MIN_POINTS else None

    def sentence(m: dict[str, Any]) -> str:
        what = m["name"] + ("'s share of step time" if m["key"].startswith("share.") else "")
        verb = "rose" if m["delta"] > 0 else "fell"
        return (
            f"{what} {verb} from {m['a_text']} ({la}) to {m['b_text']} ({lb}), {100 * m['delta']:+.1f} points"
        )

    text = []
    if biggest is not None:
        s = sentence(biggest)
        text.append("Biggest change: " + s[0].upper() + s[1:] + ".")
    else:
        text.append(f"No share of step time, MFU or bubble changed by {MIN_POINTS:.0f} point or more.")
    byk = {m["key"]: m for m in metrics}
    st = byk["step_time_ms"]
    if st["delta"] is not None:
        line = (
            f"Step time {st['a_text']} ({la}) vs {st['b_text']} ({lb}), {st['ratio']:.2f}x"
            if st["ratio"]
            else f"Step time {st['a_text']} ({la}) vs {st['b_text']} ({lb})"
        )
        pt = byk.get("step_time_per_1k_tokens_ms")
        if pt and pt["ratio"] is not None:
            line += f"; per 1,000 tokens {pt['a_text']} vs {pt['b_text']} ({pt['ratio']:.2f}x)"
        elif not per_tok:
            line += " (tokens per step unknown: not normalised per token)"
        text.append(line + ".")
    others = _distinct([m for m in changes if abs(m["delta"]) * 100 >= MIN_POINTS])
    others = [m for m in others if m is not biggest][:4]
    if others:
        text.append("Also: " + "; ".join(sentence(m) for m in others) + ".")
    lay_a, lay_b = layout_text(a), layout_text(b)
    if lay_a and lay_b and lay_a != lay_b:
        text.append(
            f"The layouts differ ({la}: {lay_a}; {lb}: {lay_b}): part of any change comes from the layout."
        )
    ca = {f.get("code") for f in a.get("findings") or []}
    cb = {f.get("code") for f in b.get("findings") or []}
    if cb - ca:
        text.append(f"New in {lb}: " + ", ".join(sorted(str(c) for c in cb - ca)) + ".")
    if ca - cb:
        text.append(f"Gone in {lb}: " + ", ".join(sorted(str(c) for c in ca - cb)) + ".")
    return {
        "schema": SCHEMA,
        "labels": [la, lb],
        "runs": {k: run_info(s) for k, s in (("a", a), ("b", b))},
        "per_token": per_tok,
        "metrics": metrics,
        "biggest": None if biggest is None else {k: biggest[k] for k in ("key", "name", "a", "b", "delta")},
        "changes": [{"key": m["key"], "name": m["name"], "delta": m["delta"]} for m in changes],
        "text": text,
        "stragglers": {"a": a.get("stragglers") or [], "b": b.get("stragglers") or []},
        "findings": {"a": a.get("findings") or [], "b": b.get("findings") or []},
    }
