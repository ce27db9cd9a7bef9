"""`tracelens analyze`: the main job."""

from __future__ import annotations

from pathlib import Path

import typer

from tracelens.cli import app
from tracelens.outputs import guard_overwrite


def _fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def print_progress_table(console, summary: dict) -> None:
    """Per-rank progress of a hung step (P2P_HANG): last call enqueued / started / completed."""
    from rich.table import Table

    for f in summary["findings"]:
        if f["code"] != "P2P_HANG" or not f.get("progress"):
            continue
        t = Table(title=f"progress in hung step {f['step']}", title_justify="left")
        for head in ("rank", "last enqueued", "last started", "last completed", "blocked in", "for s"):
            t.add_column(head, justify="right")
        chain = {b["rank"]: b for b in f.get("blocked_chain", [])}
        for p in f["progress"]:
            b = chain.get(p["rank"], {})
            t.add_row(
                str(p["rank"]),
                str(p["last_enqueued"]),
                str(p["last_started"]),
                str(p["last_completed"] or "-"),
                str(b.get("op", "-")),
                _fmt(b["blocked_ms"] / 1e3, 1) if b.get("blocked_ms") is not None else "-",
            )
        console.print(t)


def print_rank_table(summary: dict) -> None:
    """Per-rank table (Rich), aggregated by stage beyond 64 ranks so it stays readable."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # logs and pipes: no terminal width to respect, keep columns whole
        console.width = max(console.width, 120)
    ranks = summary["ranks"]
    run = summary["run"]
    steps = run["steps"]
    title = f"{run['name']}: {len(run['ranks'])} rank(s), " + (
        f"{len(steps)} step(s)" if steps else "no ProfilerStep (whole trace)"
    )
    table = Table(title=title + " (ms per step, mean over steps)", title_justify="left")
    cols = [
        ("rank", "rank"),
        ("stage", "stage"),
        ("step", "step_time_ms"),
        ("compute", "compute_ms"),
        ("exposed", "exposed_comm_ms"),
        ("wait", "exposed_wait_ms"),
        ("xfer", "exposed_transfer_ms"),
        ("overlap", "overlapped_comm_ms"),
        ("memcpy", "memcpy_ms"),
        ("idle", "idle_ms"),
        ("bubble", "bubble_ms"),
    ]
    present = [
        c for c in cols if any(r.get(c[1]) not in (None, 0) for r in ranks) or c[0] in ("rank", "step")
    ]
    for head, _ in present:
        table.add_column(head, justify="right", no_wrap=True)
    shown = ranks if len(ranks) <= 64 else ranks[:8] + ranks[-8:]
    for r in shown:
        table.add_row(*[str(r[k]) if k in ("rank", "stage") else _fmt(r.get(k), 1) for _, k in present])
    console.print(table)
    if len(ranks) > 64:
        console.print(f"({len(ranks) - 16} ranks not shown; see summary.json or the report)")
    mfu = summary.get("mfu") or {}
    if mfu.get("value") is not None:
        console.print(f"MFU {100 * mfu['value']:.1f}% ({mfu.get('convention')} convention)")
    printed = set()
    for f in summary["findings"]:
        if f["severity"] in ("warning", "error"):
            console.print(f"[{f['severity']}] {f['code']}: {f['message']}", markup=False)
            printed.add(f["message"])
    print_progress_table(console, summary)
    compat = summary.get("compat")
    if compat:
        t = Table(title=f"HTA {compat['hta_version']} definitions (--compat hta)", title_justify="left")
        for head in ("rank", "idle %", "compute %", "non-compute %", "comm/comp overlap %"):
            t.add_column(head, justify="right")
        for r in compat["ranks"]:
            t.add_row(
                str(r["rank"]),
                *(
                    _fmt(r.get(k), 2)
                    for k in (
                        "idle_time_pctg",
                        "compute_time_pctg",
                        "non_compute_time_pctg",
                        "comp_comm_overlap_pctg",
                    )
                ),
            )
        console.print(t)
    for line in summary.get("headlines", []):
        if line not in printed:
            console.print(line, markup=False)
    for w in summary["run"].get("warnings") or []:
        console.print(f"[note] {w}", markup=False)


@app.command("analyze")
def analyze(
    run_dir: Path = typer.Argument(
        ..., help="Run folder of per-rank traces (searched recursively), or one trace."
    ),
    out_dir: Path | None = typer.Option(
        None, "-o", "--out", help="Output folder (default: reports/<run name>)."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Also write summary.json to this path."),
    layout: str | None = typer.Option(None, "--layout", help="Parallel layout, e.g. tp=4,pp=4,dp=2,cp=1."),
    order: str | None = typer.Option(
        None, "--order", help="Rank order of the layout (default: tp-cp-dp-pp)."
    ),
    model: str | None = typer.Option(None, "--model", help="Model preset (qwen3.5-27b) or HF config.json."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence."),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Sequences per optimizer step."),
    microbatches: int | None = typer.Option(None, "--microbatches", help="Pipeline microbatches per step."),
    peak_tflops: float | None = typer.Option(None, "--peak-tflops", help="Peak dense TFLOP/s per GPU."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name when the traces do not say (e.g. H100)."),
    compat: str | None = typer.Option(None, "--compat", help="'hta': HolisticTraceAnalysis 0.5 definitions."),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Parse the traces again; do not read or write the cache."
    ),
    no_report: bool = typer.Option(False, "--no-report", help="Skip report.html."),
    rank_filter: str | None = typer.Option(
        None, "--rank-filter", help="Analyze only these ranks, e.g. 0-7,12 (one run of a mixed folder)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite files that tracelens did not write."),
    engine: str = typer.Option(
        "local",
        "--engine",
        help="Where per-rank work runs: local (worker processes), dask (needs tracelens[dask]), "
        "memory (all events in one table).",
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="Dask scheduler address for --engine dask [default: a local cluster]."
    ),
) -> None:
    """Analyze a run: per-rank breakdown, stragglers, pipeline bubbles, MFU; writes report.html and summary.json."""
    from rich.progress import Progress

    from tracelens.errors import BadInputError
    from tracelens.run_analysis import Options, analyze_run, run_name
    from tracelens.summary import write_summary

    if compat not in (None, "hta"):
        raise BadInputError(f"--compat {compat}: only 'hta' is supported")
    out_dir = out_dir or Path("reports") / run_name(run_dir)
    summary_path = out_dir / "summary.json"
    report_path = out_dir / "report.html"
    for p in [summary_path, report_path] + ([json_path] if json_path else []):
        guard_overwrite(p, force)

    with Progress(transient=True) as progress:
        task = progress.add_task("reading traces", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        opts = Options(
            layout=layout,
            order=order,
            model=model,
            seq_len=seq_len,
            global_batch=global_batch,
            microbatches=microbatches,
            peak_tflops=peak_tflops,
            gpu=gpu,
            compat=compat,
            no_cache=no_cache,
            rank_filter=rank_filter,
            engine=engine,
            scheduler=scheduler,
            progress=tick,
        )
        analysis = analyze_run(run_dir, opts)
        progress.update(task, description="analyzing")
        summary = analysis.summary()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_summary(summary, summary_path)
    if json_path:
        write_summary(summary, json_path)
    if not no_report:
        from tracelens.report.html import write_report

        write_report(analysis, summary, report_path)
    print_rank_table(summary)
    typer.echo(f"wrote {summary_path}" + ("" if no_report else f" and {report_path}"))
