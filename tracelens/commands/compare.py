"""`tracelens compare A B`: two runs (folders or summary.json files) side by side, as deltas and per token."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tracelens._app import app

#: A comma that separates labels: not a thousands separator (a comma followed by exactly three digits).
_LABEL_SPLIT = re.compile(r",(?!\d{3}(?:\D|$))")


def parse_labels(values: list[str] | None) -> tuple[str, str] | None:
    """--labels "seq 4,096","seq 262,144" (the shell passes `seq 4,096,seq 262,144`), or the option twice."""
    from tracelens.errors import BadInputError

    if not values:
        return None
    parts = values if len(values) > 1 else [p for p in _LABEL_SPLIT.split(values[0])]
    parts = [p.strip().strip('"').strip("'").strip() for p in parts]
    if len(parts) != 2 or not all(parts):
        raise BadInputError(
            f'--labels {",".join(values)}: give two labels, e.g. --labels "seq 4,096","seq 262,144"'
        )
    return parts[0], parts[1]


def load_side(path: Path) -> dict:
    """A summary.json, or a run folder / trace analyzed now (its tracelens.toml applies); an analyzed run
    carries its layer composition from the analysis even without pipeline stages."""
    from tracelens.run_analysis import Options, analyze_run
    from tracelens.summary import load_summary, stored_summary

    stored = stored_summary(path, trace_files=True)
    if stored is not None:
        return load_summary(stored)
    analysis = analyze_run(path, Options())
    summary = analysis.summary()
    if not summary.get("composition"):
        comp = analysis.layer_composition
        if comp is not None and (comp.stages or comp.time_share):
            summary["composition"] = {
                "stages": {str(k): v for k, v in comp.stages.items()},
                "time_share": dict(comp.time_share),
            }
    return summary


@app.command("compare")
def compare_cmd(
    a: Path = typer.Argument(..., help="Run A: a run folder, a trace, or a summary.json."),
    b: Path = typer.Argument(..., help="Run B: a run folder, a trace, or a summary.json."),
    out_dir: Path | None = typer.Option(
        None, "-o", "--out", help="Output folder (default: reports/compare-A-vs-B)."
    ),
    labels: list[str] | None = typer.Option(
        None, "--labels", help='Names of A and B: --labels "seq 4,096","seq 262,144" (or the option twice).'
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite files that tracelens did not write."),
) -> None:
    """Compare two runs: step time (also per 1,000 tokens), MFU, breakdown shares, time per layer type,
    bubbles, stage imbalance, stragglers; writes compare.html and compare.json and says what changed most."""
    import json

    from tracelens.outputs import default_out_dir, guard_outputs, write_outputs
    from tracelens.report.html import write_compare_report
    from tracelens.store.atomic import write_text
    from tracelens.summaries.compare import compare
    from tracelens.summary import run_name

    names = parse_labels(labels) or (run_name(a), run_name(b))
    out_dir = out_dir or default_out_dir(f"compare-{run_name(a)}-vs-{run_name(b)}", [a, b])
    html_path, json_path = out_dir / "compare.html", out_dir / "compare.json"
    guard_outputs([html_path, json_path], [a, b], force)
    sa, sb = load_side(a), load_side(b)
    result = compare(sa, sb, names)
    write_outputs(
        [
            (json_path, lambda p: write_text(p, json.dumps(result, indent=2, default=str) + "\n")),
            (html_path, lambda p: write_compare_report(result, p)),
        ]
    )
    for line in result["text"]:
        typer.echo(line)
    typer.echo(f"wrote {html_path} and {json_path}")
