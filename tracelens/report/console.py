"""The console's tables of `tracelens analyze` (rich): read from summary.json alone, as every renderer."""

from __future__ import annotations


def _fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _count(v) -> str:
    """A count (calls per step: a mean over steps): an integer when whole, else one decimal."""
    if v is None:
        return "-"
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def print_nccl_only(summary: dict, nccl_ranks: list[int], console) -> None:
    """Header of a run with NCCL inputs but no profiler traces (a hang dump): what was read, no empty table."""
    sources = (summary.get("collectives") or {}).get("sources") or {}
    what = ", ".join(f"{n:,} {src.replace('_', ' ')} records" for src, n in sources.items())
    ranks = f"{len(nccl_ranks)} rank(s) ({_ranges(nccl_ranks)})" if nccl_ranks else "unknown ranks"
    console.print(
        f"{summary['run']['name']}: no profiler traces; NCCL inputs only: {what} from {ranks}", markup=False
    )


def _ranges(ranks: list[int]) -> str:
    out: list[str] = []
    start: int | None = None
    prev: int = -2
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)


def _shown_ranks(summary: dict, limit: int = 64, head: int = 8) -> tuple[list[dict], set[int]]:
    """All rank rows up to `limit`, else the first and last `head` plus every rank a finding names."""
    from tracelens.report.figures import flagged_ranks

    ranks = summary["ranks"]
    if len(ranks) <= limit:
        return ranks, set()
    flagged = set(flagged_ranks(summary))
    keep = {r["rank"] for r in ranks[:head] + ranks[-head:]} | flagged
    return [r for r in ranks if r["rank"] in keep], flagged & {r["rank"] for r in ranks}


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


def print_rank_table(summary: dict, nccl_ranks: list[int] | None = None) -> None:
    """Per-rank table (Rich), aggregated by stage beyond 64 ranks so it stays readable."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:  # logs and pipes: no terminal width to respect, keep columns whole
        console.width = max(console.width, 120)
    ranks = summary["ranks"]
    run = summary["run"]
    if not ranks and not (summary.get("collectives") or {}).get("processes"):
        print_nccl_only(summary, nccl_ranks or [], console)  # e.g. Flight Recorder dumps of a hang
        for f in summary["findings"]:
            if f["severity"] in ("warning", "error"):
                console.print(f"[{f['severity']}] {f['code']}: {f['message']}", markup=False)
        for w in run.get("warnings") or []:
            console.print(f"[note] {w}", markup=False)
        return
    steps = run["steps"]
    inference = summary.get("inference")
    title = f"{run['name']}: {len(run['ranks'])} rank(s), " + (
        f"{len(steps)} step(s)" if steps else "no ProfilerStep (whole trace)"
    )
    if inference and not any(i.get("step") is None for i in inference.get("iterations") or []):
        title += f", {inference.get('iterations_total', 0)} inference iteration(s)"
    table = Table(title=title + " (ms per step, mean over steps)", title_justify="left")
    if not ranks and (summary.get("collectives") or {}).get("processes"):
        table = nccl_only_table(summary)  # logs / plugin dumps without Kineto traces: per process
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
    if ranks or not (summary.get("collectives") or {}).get("processes"):
        for head, _ in present:
            table.add_column(head, justify="right", no_wrap=True)
    shown, flagged = _shown_ranks(summary)
    for r in shown:
        cells = [str(r[k]) if k in ("rank", "stage") else _fmt(r.get(k), 1) for _, k in present]
        if r["rank"] in flagged:
            cells[0] += "*"
        table.add_row(*cells)
    if ranks or (summary.get("collectives") or {}).get("processes"):
        console.print(table)
    else:  # nothing per rank or per process: say so rather than print an empty table
        console.print(f"{run['name']}: no per-rank trace and no NCCL collective calls to analyze")
    if not ranks and (summary.get("collectives") or {}).get("by_op"):
        console.print(nccl_op_table(summary))
    if len(shown) < len(ranks):
        console.print(
            f"({len(ranks) - len(shown)} ranks not shown; see summary.json or the report)"
            + (" * rank named by a finding" if flagged else "")
        )
    if inference and inference.get("phases"):
        console.print(inference_table(inference))
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


def nccl_only_table(summary: dict):
    """Per-process table of a run read from NCCL logs / profiler-plugin dumps only (no Kineto trace)."""
    from rich.table import Table

    coll = summary["collectives"]
    procs = coll["processes"]
    comms = coll.get("communicators") or []
    sources = ", ".join(sorted({p["source"] for p in procs}))
    title = (
        f"{summary['run']['name']}: {sources} only: {len(procs)} process(es), {len(comms)} communicator(s), "
        f"{sum(p['calls'] for p in procs):,} calls"
    )
    t = Table(title=title, title_justify="left")
    for head in ("process", "rank", "calls", "p2p", "MiB", "comms", "ops"):
        t.add_column(head, justify="left" if head in ("process", "ops") else "right", no_wrap=head != "ops")
    shown = procs if len(procs) <= 64 else procs[:8] + procs[-8:]
    for p in shown:
        ops = ", ".join(f"{k} {v}" for k, v in p["ops"].items())
        rank = "?" if p["rank"] is None else str(p["rank"])
        t.add_row(p["process"], rank, f"{p['calls']:,}", f"{p['p2p_calls']:,}", _fmt(p["bytes"] / 2**20, 1),
                  str(p["communicators"]), ops)  # fmt: skip
    return t


def nccl_op_table(summary: dict):
    """Per-op table (calls, instances, bytes, median bus bandwidth) from the summary's collectives.by_op."""
    from rich.table import Table

    t = Table(title="collectives by op", title_justify="left")
    for head in ("source", "op", "calls", "instances", "MiB", "busbw GB/s"):
        t.add_column(head, justify="left" if head in ("source", "op") else "right", no_wrap=True)
    for r in summary["collectives"]["by_op"]:
        inst = r.get("instances")
        t.add_row(r.get("source", "kineto"), r["op"], f"{r['calls']:,}", "-" if inst is None else f"{inst:,}",
                  _fmt(r["bytes"] / 2**20, 1), _fmt(r.get("busbw_gbps_median"), 1))  # fmt: skip
    return t


def inference_table(inference: dict):
    """Per phase of the inference iterations (summary.json `inference.phases`, docs/inference.md)."""
    from rich.table import Table

    kinds = ", ".join(inference.get("kinds") or [])
    t = Table(title=f"inference iterations by phase ({kinds}; ms per step, mean)", title_justify="left")
    heads = [("phase", None), ("steps", "steps"), ("tokens", "tokens_per_step"), ("step", "step_time_ms"),
             ("ms/token", "ms_per_token"), ("compute", "compute_ms"), ("idle", "idle_ms"),
             ("launch ovh", "launch_overhead_ms"), ("host-bound", "host_bound_ms")]  # fmt: skip
    for head, _ in heads:
        t.add_column(head, justify="left" if head == "phase" else "right", no_wrap=True)
    for phase, rec in inference["phases"].items():
        cells = [phase, str(rec["steps"])]
        cells += [_fmt(rec.get(k), 4 if k == "ms_per_token" else 1) for _, k in heads[2:]]
        t.add_row(*cells)
    return t


def print_ops_table(summary: dict, top: int = 20) -> None:
    """The top of summary.json's `ops` (docs/ops.md), longest first."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)
    rows = sorted(summary.get("ops") or [], key=lambda r: -(r.get("ms_per_step") or 0))[:top]
    if not rows:
        console.print("no ops in the analyzed steps")
        return
    table = Table(title="Top ops (GPU time per step; one rank per stage)")
    for col in (
        "stage",
        "op",
        "kernel",
        "layer",
        "calls",
        "ms/step",
        "TFLOP/s",
        "TB/s",
        "bound",
        "% roofline",
    ):
        table.add_column(col, justify="left" if col in ("op", "kernel", "layer", "bound") else "right")
    for r in rows:
        table.add_row(
            _fmt(r.get("stage"), 0),
            escape(r.get("op") or "(no CPU op)"),
            escape(r.get("kernel") or "-"),
            escape(r.get("layer_type") or "-"),
            _count(r.get("calls")),
            _fmt(r.get("ms_per_step"), 3),
            _fmt(r.get("tflops"), 1),
            _fmt(r.get("tbps"), 2),
            r.get("bound") or "-",
            _fmt(r.get("roofline_pct"), 1),
        )
    console.print(table)
