"""`tracelens analyze`: the main job."""

from __future__ import annotations

from pathlib import Path

import typer

from tracelens._app import app
from tracelens.gc_pause import frozen_heap, refreeze
from tracelens.outputs import default_out_dir, guard_outputs, write_outputs
from tracelens.report.console import print_ops_table, print_rank_table

#: Findings and notes that say nothing about why the traces there gave nothing to analyze (the ranks that
#: are absent, the layout assumed): never the reason of a "no usable input" error.
_NOT_A_REASON = ("MISSING_RANKS",)
_NOTES_NOT_A_REASON = ("no rank in distributedInfo", "no process groups name", "coordinates of ")


def usable_input_or_error(summary: dict, run_dir: Path, analysis=None) -> None:
    """No profiler data and no NCCL data: one-line error (exit 2) naming why, instead of an empty table. The
    reason is about the traces that are there (cut, damaged, no event tracelens can use), never the ranks
    that are not."""
    from tracelens.errors import BadInputError

    sources = (summary.get("collectives") or {}).get("sources") or {}
    # collectives read from Kineto traces without any analyzed step (cut traces whose steps were all left
    # out) are not usable on their own
    if summary["ranks"] or set(sources) - {"kineto"}:
        return
    reasons = [
        f["message"]
        for f in summary["findings"]
        if f["severity"] in ("warning", "error") and f["code"] not in _NOT_A_REASON
    ]
    reasons += _unusable_events(analysis)
    reasons += [
        w for w in summary["run"].get("warnings") or [] if not any(n in w for n in _NOTES_NOT_A_REASON)
    ]
    why = "; ".join(" ".join(r.split()) for r in reasons[:2]) or "no events in any trace"
    raise BadInputError(f"{run_dir}: no usable input: {why}")


def _unusable_events(analysis) -> list[str]:
    """Per trace whose events are all of kinds tracelens does not analyze: how many and of which kinds."""
    if analysis is None:
        return []
    import pyarrow.compute as pc

    try:
        md = analysis.metadata.select(["rank", "path", "events"]).to_pylist()
        kinds = analysis.events.select(["rank", "kind"])
    except Exception:  # noqa: BLE001 (only the wording of an error: never a second error)
        return []
    out = []
    for row in md:
        if not row["events"]:
            out.append(f"{Path(row['path']).name}: no events")
            continue
        k = kinds.filter(pc.equal(kinds.column("rank"), row["rank"])).column("kind").cast("string")
        counts = {d["values"]: d["counts"] for d in pc.value_counts(k).to_pylist()}
        if set(counts) <= {"other"}:
            out.append(
                f"{Path(row['path']).name}: {row['events']:,} events, none of a kind tracelens analyzes (no "
                "known `cat`: kernel, cpu_op, user_annotation, gpu_memcpy ...)"
            )
    return out


@app.command("analyze")
def analyze(
    run_dir: Path = typer.Argument(
        ..., help="Run folder of per-rank traces (searched recursively), or one trace."
    ),
    out_dir: Path | None = typer.Option(
        None,
        "-o",
        "--out",
        help="Output folder (default: reports/<run name>; beside the run folder when run from inside it).",
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Also write summary.json to this path."),
    layout: str | None = typer.Option(None, "--layout", help="Parallel layout, e.g. tp=4,pp=4,dp=2,cp=1."),
    force_layout: bool = typer.Option(
        False, "--force-layout", help="Use --layout even where the traces' process groups contradict it."
    ),
    order: str | None = typer.Option(
        None, "--order", help="Rank order of the layout (default: tp-cp-dp-pp)."
    ),
    model: str | None = typer.Option(None, "--model", help="Model preset (qwen3.5-27b) or HF config.json."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence."),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Sequences per optimizer step."),
    microbatches: int | None = typer.Option(None, "--microbatches", help="Pipeline microbatches per step."),
    peak_tflops: float | None = typer.Option(None, "--peak-tflops", help="Peak dense TFLOP/s per GPU."),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU name (e.g. H100): wins over the traces' (a warning when they differ)."
    ),
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
        help="Where per-rank work runs: local (worker processes) or dask (needs the dask extra, "
        "tracelens-train\\[dask]).",
    ),
    cache_dir: str | None = typer.Option(
        None,
        "--cache-dir",
        help="Cache folder [default: $TRACELENS_CACHE_DIR, else the user cache folder]; shared storage "
        "for a Dask cluster.",
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="Dask scheduler address for --engine dask (default: a local cluster)."
    ),
    ops: bool = typer.Option(
        False, "--ops", help="Also print the top ops per stage (FLOPs, TFLOP/s, roofline)."
    ),
) -> None:
    """Analyze a run: per-rank breakdown, stragglers, pipeline bubbles, MFU; writes report.html and summary.json."""
    from rich.console import Console

    from tracelens.errors import BadInputError
    from tracelens.run_analysis import Options, analyze_run
    from tracelens.summary import run_name

    if compat not in (None, "hta"):
        raise BadInputError(f"--compat {compat}: only 'hta' is supported")
    inputs = [run_dir] + ([Path(model)] if model and Path(model).is_file() else [])
    out_dir = out_dir or default_out_dir(run_name(run_dir), inputs)
    summary_path = out_dir / "summary.json"
    report_path = out_dir / "report.html"
    guard_outputs([summary_path, report_path] + ([json_path] if json_path else []), inputs, force)

    from contextlib import nullcontext

    from tracelens.progress import PlainProgress

    plain = PlainProgress() if PlainProgress.wanted() else None  # CI logs: periodic plain lines
    # the live bar only on a terminal: elsewhere it shows nothing, yet its refresh thread redraws the
    # task table ten times a second for the whole run
    progress = None
    if Console().is_terminal:
        from rich.progress import Progress

        progress = Progress(transient=True)
    from tracelens.store.pages import cap_mmap_threshold

    cap_mmap_threshold()  # (large arrays handed back when freed: a lower peak RSS on big runs)
    with progress or nullcontext(), plain or nullcontext(), frozen_heap():
        task = progress.add_task("reading traces", total=None) if progress is not None else None

        def tick(done: int, total: int) -> None:
            if progress is not None and task is not None:
                progress.update(task, completed=done, total=total)
            if plain is not None:
                plain.update(done, total)

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
            cache_dir=cache_dir,
            rank_filter=rank_filter,
            engine=engine,
            scheduler=scheduler,
            progress=tick,
            force_layout=force_layout,
        )
        analysis = analyze_run(run_dir, opts)
        refreeze()  # (and the modules the loading imported, the run's tables: all live until exit)
        if progress is not None and task is not None:
            progress.update(task, description="analyzing")
        if plain is not None:
            plain.set_phase("analyzing")
        # (the critical path let go once its part of summary.json is built: the report and the communication
        # and op tables do not use it, and these tables would otherwise add to its memory)
        result = analysis.result(release=True)
    summary = result.to_json()
    usable_input_or_error(summary, run_dir, analysis)
    from tracelens.report.base import HtmlReport, SummaryJson, write

    writes = [(summary_path, lambda p: write(SummaryJson(), result, p))]
    if json_path:
        writes.append((json_path, lambda p: write(SummaryJson(), result, p)))
    if not no_report:
        from tracelens.views import ReportViews

        def report(p: Path) -> None:
            with frozen_heap():
                write(HtmlReport(ReportViews(analysis)), result, p)

        writes.append((report_path, report))
    write_outputs(writes)  # all or none (a full output folder: one line, exit 2)
    nccl_ranks = (
        sorted({r for t in analysis.nccl.values() for r in t.column("rank").to_pylist() if r is not None})
        if not summary["ranks"]
        else None
    )
    print_rank_table(summary, nccl_ranks)
    if ops:
        print_ops_table(summary)
    typer.echo(f"wrote {summary_path}" + ("" if no_report else f" and {report_path}"))
