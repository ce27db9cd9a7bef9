"""`tracelens report ...`: report utilities; `export-trace` writes one merged Chrome trace of a run."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tracelens._app import app

report_app = typer.Typer(
    help="Report utilities: merged Chrome trace of all ranks for Perfetto.", no_args_is_help=True
)
app.add_typer(report_app, name="report")


def parse_ranks(text: str) -> list[int]:
    """'0-7,12' -> [0, 1, ..., 7, 12]."""
    from tracelens.errors import BadInputError

    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise BadInputError(f"--ranks {text}: use ranks and ranges such as 0-7,12")
        out.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return sorted(out)


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
    ranks: str | None = typer.Option(
        None, "--ranks", help="Only these ranks, e.g. 0-7,12 (large runs: Perfetto handles ~1 GB of JSON)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a file that tracelens did not write."),
) -> None:
    """One Chrome trace with every rank (one process per rank, clocks aligned from collective end times) and
    the findings as instant-event markers; open it in Perfetto UI or chrome://tracing."""
    from tracelens.errors import BadInputError
    from tracelens.outputs import guard_outputs, write_outputs
    from tracelens.report.export import export_trace
    from tracelens.run_analysis import Options, analyze_run

    guard_outputs([out], [run_dir], force)
    analysis = analyze_run(run_dir, Options(layout=layout))
    summary = analysis.summary()
    offsets = None
    if not no_align:
        cross = analysis.cross  # None when the cross-rank analysis could not run (a warning)
        offsets = (cross.offsets_ns if cross is not None else None) or None
    stage_of = {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}
    events = analysis.events
    shown = len(analysis.ranks)
    if ranks:
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = parse_ranks(ranks)
        missing = sorted(set(wanted) - set(analysis.ranks))
        if missing:
            raise BadInputError(f"--ranks {ranks}: no trace for rank(s) {', '.join(map(str, missing[:16]))}")
        events = events.filter(pc.is_in(events.column("rank"), value_set=pa.array(wanted, pa.int32())))
        shown = len(wanted)
    counted: list[int] = []
    write_outputs(
        [
            (
                out,
                lambda p: counted.append(
                    export_trace(
                        events,
                        p,
                        stage_of,
                        offsets,
                        summary.get("findings") or [],
                        run_name=summary["run"]["name"],
                        compress=out.name.endswith(".gz"),
                    )
                ),
            )
        ]
    )
    n = counted[0]
    aligned = "clock-aligned" if offsets else "not clock-aligned (no cross-rank offsets)"
    typer.echo(f"wrote {out}: {n:,} events, {shown} rank(s), {aligned}")
