"""`tracelens check`: fail a CI job when performance regresses beyond noise."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tracelens._app import app


@app.command("check")
def check(
    baseline: Annotated[
        Path, typer.Argument(help="Baseline: summary.json, a folder holding one, or a run folder.")
    ],
    current: Annotated[
        Path, typer.Argument(help="Current run: summary.json, a folder holding one, or a run folder.")
    ],
    rules: Annotated[Path | None, typer.Option("--rules", help="rules.toml overriding the defaults.")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="Output: text, markdown, junit, github or json.")
    ] = "text",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write the output here (the text table still goes to the terminal)."
        ),
    ] = None,
    layout: Annotated[str | None, typer.Option(help="Run folders: parallel layout, e.g. tp=4,pp=2.")] = None,
    order: Annotated[str | None, typer.Option(help="Run folders: rank order (default tp-cp-dp-pp).")] = None,
    model: Annotated[str | None, typer.Option(help="Run folders: model preset or HF config.json.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Run folders: tokens per sequence.")] = None,
    global_batch: Annotated[int | None, typer.Option(help="Run folders: sequences per step.")] = None,
    microbatches: Annotated[int | None, typer.Option(help="Run folders: pipeline microbatches.")] = None,
    peak_tflops: Annotated[float | None, typer.Option(help="Run folders: peak TFLOP/s per GPU.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Run folders: GPU name when the traces do not say.")] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Run folders: parse the traces again.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="A skipped rule fails too (exit 1): every guard must run.")
    ] = False,
    allow_setup_change: Annotated[
        bool,
        typer.Option(
            "--allow-setup-change",
            help="Judge runs whose world size, layout, GPU or sequence length differ (else: not comparable, "
            "exit 2).",
        ),
    ] = False,
) -> None:
    """Compare CURRENT with BASELINE under regression rules; exit 0 pass, 1 regression, 2 bad input
    or runs that are not comparable (world size, layout, GPU or sequence length differ: no verdict).

    Step time: fails when the median rises > 5% and a one-sided Mann-Whitney U test says p < 0.05.

    MFU: fails on a drop > 2 points. Exposed comm / bubble share: > +2 points and significant.

    Stragglers and findings: fails on a new straggler rank or a new error-severity finding code.

    Fewer than 4 steps per run (too few for the test): step time and shares fail on the threshold alone
    when every current step is beyond every baseline step; the output says so. --strict: skips fail.

    Override the thresholds with --rules rules.toml; see docs/ci.md.
    """
    from tracelens.errors import BadInputError
    from tracelens.report import check_renderers
    from tracelens.run_analysis import summary_of
    from tracelens.summaries import regress

    if fmt not in check_renderers.FORMATS:
        raise BadInputError(f"--format {fmt}: expected one of {', '.join(check_renderers.FORMATS)}")
    rule_set = regress.load_rules(rules)
    if output is not None:
        from tracelens.outputs import guard_outputs

        guard_outputs([output], [baseline, current, rules], force=True)  # (it replaces its own output)
    options: dict[str, Any] = {
        k: v
        for k, v in {
            "layout": layout,
            "order": order,
            "model": model,
            "seq_len": seq_len,
            "global_batch": global_batch,
            "microbatches": microbatches,
            "peak_tflops": peak_tflops,
            "gpu": gpu,
        }.items()
        if v is not None
    }
    if no_cache:
        options["no_cache"] = True
    base = summary_of(baseline, **options)
    cur = summary_of(current, **options)
    report = regress.check(
        base,
        cur,
        rule_set,
        baseline_label=_label(baseline, base),
        current_label=_label(current, cur),
        strict=strict,
        allow_setup_change=allow_setup_change,
    )
    rendered = check_renderers.render(report, fmt)
    if output is not None:
        from tracelens.outputs import write_outputs
        from tracelens.store.atomic import write_text

        write_outputs([(output, lambda p: write_text(p, rendered))])
        typer.echo(check_renderers.render(report) if fmt != "text" else report.headline(), nl=fmt == "text")
        typer.echo(f"wrote {output}")
    else:
        typer.echo(rendered, nl=False)
    raise typer.Exit(code=report.exit_code)


def _label(path: Path, summary: dict) -> str:
    """Run name from the summary, else the path as given."""
    name = (summary.get("run") or {}).get("name")
    return f"{name} ({path})" if name and name not in str(path) else str(path)
