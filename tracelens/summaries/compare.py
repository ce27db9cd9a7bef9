"""Compare two runs' summaries: side by side, as deltas, per token where that is the fair comparison.

Pure: two summary dicts (schema tracelens.summary/1) in, one comparison dict out. Shares of step time
(breakdown parts, layer types), MFU and the bubble fraction are fractions, so their changes are compared in
percentage points and the largest one is "what changed most". Absolute times are also given per 1,000
tokens when both runs say their tokens per step (summary mfu.tokens_per_step): a 262,144-token step is
expected to take longer than a 4,096-token one, the time per token is what tells whether it got worse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    opc = op_changes(a, b)
    moved = [r for r in opc["ops"] if r["delta_ms"]][:OP_TEXT_ROWS]  # (null deltas are last: none of these)
    if moved:
        text.append(
            "Ops that changed most (matched on the op and its shapes, per step): "
            + "; ".join(op_sentence(r, la, lb) for r in moved)
            + "."
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
        "ops": opc,
        "stragglers": {"a": a.get("stragglers") or [], "b": b.get("stragglers") or []},
        "findings": {"a": a.get("findings") or [], "b": b.get("findings") or []},
    }


# ------------------------------------------------------------------------------------------- per op
#: How many op / kernel rows compare.json keeps (largest contribution first) and the text names.
OP_ROWS = 50
OP_TEXT_ROWS = 3
NO_OP = "(no CPU op)"


def op_rows(s: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The summary's per-op rows and which list they come from: `op_totals` (every op of the ranks measured),
    else `ops` (the top rows of each stage only: a summary written before op_totals existed)."""
    for key in ("op_totals", "ops"):
        rows = s.get(key)
        if isinstance(rows, list) and rows:
            return [r for r in rows if isinstance(r, dict)], key
    return [], "none"


def _group(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, dict[str, Any]]:
    """Rows summed by key(row) (None: left out): calls, ms per step, FLOPs (null when a row's are unknown),
    and the kernel that takes most of the group's time."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        k = key(r)
        if k is None:
            continue
        ms = _num(r.get("ms_per_step")) or 0.0
        g = out.setdefault(k, {"calls": 0.0, "ms": 0.0, "flops": 0.0, "flops_known": True, "kernels": {}})
        g["calls"] += _num(r.get("calls")) or 0.0
        g["ms"] += ms
        f = _num(r.get("flops"))
        if f is None:
            g["flops_known"] = False
        else:
            g["flops"] += f
        kern = r.get("kernel")
        if kern:
            g["kernels"][kern] = g["kernels"].get(kern, 0.0) + ms
        if "model" in r and r.get("model"):
            g["model"] = r["model"]
    return out


def _tflops(g: dict[str, Any] | None) -> float | None:
    if g is None or not g["flops_known"] or g["ms"] <= 0:
        return None
    return float(g["flops"]) / (float(g["ms"]) / 1e3) / 1e12


def _change_rows(
    ga: dict[Any, dict[str, Any]],
    gb: dict[Any, dict[str, Any]],
    step_delta: float | None,
    label: Callable[[Any], dict[str, Any]],
    complete: tuple[bool, bool] = (True, True),
) -> list[dict[str, Any]]:
    """One row per key of either side: calls, ms per step and TFLOP/s of each, the delta (B - A, ms) and its
    share of the step time's change; largest |delta| first. A key on one side only has 0 ms on the other
    when that side lists all its ops (the op does not run there), else null there (`complete`: a summary's
    `ops` holds only the top rows; the op may be below them)."""
    rows = []
    for k in set(ga) | set(gb):
        a, b = ga.get(k), gb.get(k)
        ams = a["ms"] if a else (0.0 if complete[0] else None)
        bms = b["ms"] if b else (0.0 if complete[1] else None)
        d = bms - ams if ams is not None and bms is not None else None
        rec = {
            **label(k),
            "a_calls": a["calls"] if a else (0.0 if complete[0] else None),
            "b_calls": b["calls"] if b else (0.0 if complete[1] else None),
            "a_ms": None if ams is None else round(ams, 6),
            "b_ms": None if bms is None else round(bms, 6),
            "a_tflops": _r4(_tflops(a)),
            "b_tflops": _r4(_tflops(b)),
            "delta_ms": None if d is None else round(d, 6),
            "ratio": round(bms / ams, 4) if ams and bms is not None and b else None,
            "share_of_step_change": round(d / step_delta, 4) if step_delta and d is not None else None,
        }
        if a is not None or b is not None:
            ka = max(a["kernels"], key=a["kernels"].get) if a and a["kernels"] else None
            kb = max(b["kernels"], key=b["kernels"].get) if b and b["kernels"] else None
            rec["a_kernel"], rec["b_kernel"] = ka, kb
            rec["model"] = (a or {}).get("model") or (b or {}).get("model")
        rows.append(rec)
    rows.sort(
        key=lambda r: (
            r["delta_ms"] is None,
            -abs(r["delta_ms"] or 0.0),
            -max(r["a_ms"] or 0.0, r["b_ms"] or 0.0),
            str(r.get("op") or r.get("kernel") or r.get("layer_type") or r.get("stage")),
        )
    )
    return rows


def _r4(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def op_changes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per op, kernel, layer type and stage: what each run spends and how that changed (compare.json `ops`,
    `kernels`, `op_layer_types`, `op_stages`).

    Ops are matched on the CPU operator and its recorded input shapes, never on kernel names: the same
    `aten::mm` runs a cuBLAS kernel on one GPU and a hipBLASLt one on another. They are matched per pipeline
    stage when both runs have the same stages, else over the run. Kernels without a CPU op (their launch is
    not in the trace) have no op to match: they are in the kernel rows only, matched by name."""
    ra, src_a = op_rows(a)
    rb, src_b = op_rows(b)
    complete = (src_a == "op_totals", src_b == "op_totals")
    stages_a = {r.get("stage") for r in ra}
    stages_b = {r.get("stage") for r in rb}
    by_stage = stages_a == stages_b and stages_a != {None}

    def stage(r: dict[str, Any]) -> Any:
        return r.get("stage") if by_stage else None

    sa, sb = step_time_ms(a), step_time_ms(b)
    step_delta = sb - sa if sa is not None and sb is not None and abs(sb - sa) > 1e-9 else None

    def op_key(r: dict[str, Any]) -> Any:
        return None if not r.get("op") else (stage(r), r["op"], r.get("shapes"))

    def kernel_key(r: dict[str, Any]) -> Any:
        return None if not r.get("kernel") else (stage(r), r["kernel"])

    def layer_key(r: dict[str, Any]) -> Any:
        return None if not r.get("layer_type") else (stage(r), r["layer_type"])

    def stage_key(r: dict[str, Any]) -> Any:
        return stage(r) if by_stage else "all"

    ops = _change_rows(
        _group(ra, op_key),
        _group(rb, op_key),
        step_delta,
        lambda k: {"stage": k[0], "op": k[1], "shapes": k[2]},
        complete,
    )
    kernels = _change_rows(
        _group(ra, kernel_key),
        _group(rb, kernel_key),
        step_delta,
        lambda k: {"stage": k[0], "kernel": k[1]},
        complete,
    )
    for r in kernels:
        for side in ("a_kernel", "b_kernel"):
            r.pop(side, None)
    layers = _change_rows(
        _group(ra, layer_key),
        _group(rb, layer_key),
        step_delta,
        lambda k: {"stage": k[0], "layer_type": k[1]},
        complete,
    )
    stages = _change_rows(
        _group(ra, stage_key),
        _group(rb, stage_key),
        step_delta,
        lambda k: {"stage": None if k == "all" else k},
    )
    if not all(complete):  # sums of the top rows only: not the layer types' or stages' op time
        layers, stages = [], []
    for rows in (layers, stages):
        for r in rows:
            for side in ("a_kernel", "b_kernel", "model"):
                r.pop(side, None)
    unlinked = {
        side: round(
            sum(_num(r.get("ms_per_step")) or 0.0 for r in rows if not r.get("op") and r.get("kernel")), 6
        )
        for side, rows in (("a", ra), ("b", rb))
    }
    return {
        "source": {"a": src_a, "b": src_b},
        "by_stage": by_stage,
        "step_delta_ms": None if step_delta is None else round(step_delta, 6),
        "unlinked_kernel_ms": unlinked,
        "ops": ops[:OP_ROWS],
        "ops_total": len(ops),
        "kernels": kernels[:OP_ROWS],
        "layer_types": layers,
        "stages": stages,
    }


def op_sentence(r: dict[str, Any], la: str, lb: str) -> str:
    """'aten::mm [[8944,1024],[1024,2816]]: 4.016 ms (A) -> 5.308 ms (B), +1.292 ms (1.32x)'."""
    what = str(r["op"]) + (f" {r['shapes']}" if r.get("shapes") else "")
    if len(what) > 90:
        what = what[:89] + "…"
    ratio = f" ({r['ratio']:.2f}x)" if r.get("ratio") else ""
    return f"{what}: {r['a_ms']:.3f} ms ({la}) -> {r['b_ms']:.3f} ms ({lb}), {r['delta_ms']:+.3f} ms{ratio}"
