"""`tracelens audit-layout`: check a TP/PP/CP/DP layout against the model before launching."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tracelens._app import app


def _parse_split(text: str | None) -> list[int] | None:
    from tracelens.errors import BadInputError

    if text is None:
        return None
    try:
        return [int(x) for x in text.replace("/", ",").split(",") if x.strip()]
    except ValueError:
        raise BadInputError(f"--split {text}: expected comma-separated layer counts, e.g. 24,20,20") from None


def _gflops(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def render(result) -> str:
    """Human-readable audit report (plain text, one section per check)."""
    d = result.to_dict()
    ms = d["model_summary"]
    lay = d["layout"]
    lines = [
        f"Layout audit: {d['model']}  TP={lay['tp']} PP={lay['pp']} CP={lay['cp']} DP={lay['dp']} "
        f"({lay['world_size']} GPUs)" + (f", seq_len {d['seq_len']:,}" if d["seq_len"] else ""),
        (
            f"Model: {ms['num_layers']} layers = {ms['num_blocks']} x [{ms['pattern']}], "
            f"{ms['num_params'] / 1e9:.2f} B parameters"
        ),
    ]
    if d["seq_len"] is None:
        assumed = d["seq_lens_evaluated"][-1]  # (models/audit.py: single-length figures use the longest)
        lines.append(
            "Sequence length: not given (--seq-len); stage FLOPs at "
            + " and ".join(f"{s:,}" for s in d["seq_lens_evaluated"])
            + " tokens"
            + (f" ({assumed:,}: the model's context length)" if len(d["seq_lens_evaluated"]) > 1 else "")
            + "; each figure below names the length it uses"
        )
    lines += [
        "",
        "Partitioned dimensions",
        f"  {'axis':<5}{'dimension':<20}{'size':>9}{'degree':>8}{'per rank':>10}  status",
    ]
    for row in d["dimensions"]:
        per = row["per_rank"]
        per_s = f"{per:g}" if isinstance(per, float) else str(per)
        if row.get("replicated"):
            status = f"REPLICATED {row['replicated']}x"
        else:
            status = "ok" if row["divides"] else "NOT DIVISIBLE"
        lines.append(
            f"  {row['axis']:<5}{row['dimension']:<20}{row['size']:>9}{row['degree']:>8}"
            f"{per_s:>10}  {status}  ({row['note']})"
        )
    lines += ["", "Limits"]
    for lim in d["limits"]["tp"]:
        mark = "  <- binding" if lim["binding"] else ""
        lines.append(
            f"  tp <= {lim['max_degree']:<4} {lim['dimension']} ({lim['size']}): {lim['rule']}{mark}"
        )
    dn = d["deltanet"]
    if dn:
        per = (
            f"{dn['qk_heads_per_rank']:g} QK + {dn['v_heads_per_rank']:g} V heads per rank"
            if dn["tp_ok"]
            else "does not divide"
        )
        lines.append(
            f"  DeltaNet limit: {dn['qk_heads']} QK heads / {dn['v_heads']} V heads: TP must divide "
            f"{dn['qk_heads']} (TP <= {dn['max_tp']}); at TP={lay['tp']}: {per}"
        )
    for lim in d["limits"]["pp"]:
        lines.append(f"  pp <= {lim['max_degree']:<4} {lim['dimension']} ({lim['size']}): {lim['rule']}")
    cd = d["clean_degrees"]
    lines += [
        "",
        "Clean degrees",
        f"  tp: {', '.join(map(str, cd['tp']))}"
        + (
            f"  (with K/V replication: {', '.join(map(str, cd['tp_with_kv_replication']))})"
            if cd["tp_with_kv_replication"]
            else ""
        ),
        f"  pp: {', '.join(map(str, cd['pp']))}  (divisors of the {ms['num_blocks']} blocks)",
        "  cp: " + (", ".join(map(str, cd["cp"])) if cd["cp"] is not None else "give --seq-len to check"),
    ]
    kv = d["kv_replication"]
    if kv:
        lines += [
            "",
            f"K/V head replication: {kv['factor']}x (TP {kv['tp']} > {kv['kv_heads']} KV heads)",
            (
                f"  duplicated K/V weights: {kv['replicated_kv_weight_bytes'] / 2**20:,.0f} MiB "
                f"({kv['replicated_kv_training_state_bytes'] / 2**30:.2f} GiB with optimizer state)"
            ),
            (
                f"  extra gradient all-reduce: {kv['extra_grad_allreduce_bytes_per_gpu_per_step'] / 2**20:.1f} MiB"
                f" per GPU per step in groups of {kv['extra_grad_allreduce_group_size']}"
            ),
            f"  duplicated K/V projection FLOPs: {100 * kv['duplicated_flops_fraction']:.2f}% of model FLOPs"
            + ("" if d["seq_len"] else f" at {d['seq_lens_evaluated'][-1]:,} tokens"),
        ]
        lines += [f"  assumption: {a}" for a in kv["assumptions"]]
    seqs = d["seq_lens_evaluated"]
    lines += [
        "",
        (
            f"Pipeline stages (split {'/'.join(map(str, d['layer_split']))}, "
            f"{'given' if d['split_source'] == 'given' else 'default: as even as possible, extra layers first'})"
        ),
        f"  {'stage':<6}{'layers':<10}{'linear':>7}{'full':>6}{'blocks':>7}"
        + "".join(f"{'GFLOP/tok@' + format(s, ','):>20}" for s in seqs),
    ]
    for st in d["stages"]:
        span = f"{st['first_layer']}-{st['last_layer']}" if st["num_layers"] else "-"
        extra = " +LM head" if st["has_lm_head"] else ""
        lines.append(
            f"  {st['stage']:<6}{span:<10}{st['layers'].get('linear_attention', 0):>7}"
            f"{st['layers'].get('full_attention', 0):>6}{st['whole_blocks']:>7}"
            + "".join(f"{_gflops(st['flops_per_token'][str(s)]):>20}" for s in seqs)
            + extra
        )
    for s, split in d["balanced_split"].items():
        same = split == d["layer_split"]
        lines.append(
            f"  balanced split on block boundaries at {int(s):,} tokens: {'/'.join(map(str, split))}"
            + (" (the current split)" if same else "")
        )
    lines += ["", "Findings" if d["findings"] else "Findings: none, the layout is clean"]
    n_err = sum(f["severity"] == "error" for f in d["findings"])
    n_warn = sum(f["severity"] == "warning" for f in d["findings"])
    for f in d["findings"]:
        lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
    if d["findings"]:
        lines += ["", f"Not clean: {n_err} error(s), {n_warn} warning(s)" + (" (exit 1)" if n_err else "")]
    return "\n".join(lines)


@app.command("audit-layout")
def audit_layout_cmd(
    model: Annotated[str, typer.Option("--model", help="Model preset (qwen3.5-27b) or HF config.json.")],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel size.")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel size.")] = 1,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence.")] = None,
    split: Annotated[
        str | None,
        typer.Option("--split", help="Layers per stage, e.g. 24,20,20 (default: as even as possible)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the audit as JSON.")] = False,
) -> None:
    """Check a parallel layout against the model: divisibility of every partitioned dimension, K/V head
    replication, clean degrees per axis, and layer-type composition and FLOPs per pipeline stage.

    Exit 0 when clean or only warnings/info, 1 when a finding is an error (like a linter), 2 on bad input.
    """
    from tracelens.models import get_model
    from tracelens.models.audit import audit_layout

    spec = get_model(model)
    result = audit_layout(spec, tp=tp, pp=pp, cp=cp, dp=dp, seq_len=seq_len, layer_split=_parse_split(split))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render(result))
    if any(f["severity"] == "error" for f in result.findings):
        raise typer.Exit(code=1)
