"""`tracelens report ...`: report utilities; `export-trace` writes one merged Chrome trace of a run."""

from __future__ import annotations

from pathlib import Path

import typer

from tracelens.cli import app

report_app = typer.Typer(
    help="Report utilities: merged Chrome trace of all ranks for Perfetto.", no_args_is_help=True
)
app.add_typer(report_app, name="report")


@report_app.command("export-trace")
def export_trace_cmd(
    run_dir: Path = typer.Argument(
        ..., help="Run folder of per-rank traces (searched recursively), or one trace."
    ),
    out: Path = typer.Option(
        ..., "-o", "--out", help="Merged Chrome trace JSON to write (opens in ui.perfetto.dev)."
    ),
    layout: str | None = typer.Option(None, "--layout", help="Parallel layout, e.g. tp=4,pp=4,dp=2,cp=1."),
    no_align: bool = typer.Option(
        False, "--no-align", help="Keep each rank's own clock (no offset correction)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a file that tracelens did not write."),
) -> None:
    """One Chrome trace with every rank (one process per rank, clocks aligned from collective end times) and
    the findings as instant-event markers; open it in Perfetto UI or chrome://tracing."""
    from tracelens.outputs import guard_overwrite
    from tracelens.report.export import export_trace
    from tracelens.run_analysis import Options, analyze_run

    guard_overwrite(out, force)
    analysis = analyze_run(run_dir, Options(layout=layout))
    summary = analysis.summary()
    offsets = None
    if not no_align:
        try:
            cross = getattr(analysis, "cross", None)
        except Exception:  # noqa: BLE001 - no alignment is better than no trace
            cross = None
        offsets = getattr(cross, "offsets_ns", None) or None
    stage_of = {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}
    n = export_trace(
        analysis.events,
        out,
        stage_of,
        offsets,
        summary.get("findings") or [],
        run_name=summary["run"]["name"],
    )
    aligned = "clock-aligned" if offsets else "not clock-aligned (no cross-rank offsets)"
    typer.echo(f"wrote {out}: {n:,} events, {len(analysis.ranks)} rank(s), {aligned}")
