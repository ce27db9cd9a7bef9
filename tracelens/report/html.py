"""Assemble one self-contained, offline HTML report (plotly.js embedded once; every trace string escaped).

`write_report(summary, path, views)` is the run report (`views`: what it reads of the analysis beyond
summary.json, `tracelens.views.ReportViews`; nothing here reads events or imports an analyzer); `write_compare_report(comparison, path)` the
comparison of two runs. Sections whose analysis could not run (no layout, no model, no memory events)
show a one-line note instead of a figure.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

import plotly.io as pio

from tracelens._version import __version__
from tracelens.outputs import GENERATOR_MARK
from tracelens.policy import contained
from tracelens.report import figures
from tracelens.store.atomic import write_text

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
padding:0 16px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.finding{padding:6px 10px;margin:4px 0;border-left:4px solid #999;background:#fafafa}
.finding.warning{border-color:#f58518} .finding.error{border-color:#e45756}
.finding.info{border-color:#4c78a8}
.note{color:#666;font-style:italic} .headline{font-size:1.05em;margin:4px 0}
table{border-collapse:collapse;font-size:0.9em;max-width:100%}
td,th{padding:3px 6px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom}
td:first-child,th:first-child{text-align:left} code{background:#f3f3f3;padding:1px 4px}
td.name{text-align:left;font-family:monospace;white-space:normal;overflow-wrap:normal;word-break:normal}
td.name.nw{white-space:nowrap} td.text{white-space:normal;text-align:left} th.name{text-align:left} table.meta td{text-align:left}
table.sortable{font-size:0.85em} table.sortable td,table.sortable th{padding:3px 4px}
"""
#: Plain-words titles of finding codes (the code itself is shown beside it).
FINDING_TITLES = {
    "STRAGGLER": "Straggler",
    "CLOCK_SKEW": "Clocks differ between hosts",
    "EXPOSED_COMM_HIGH": "Exposed communication",
    "PIPELINE_BUBBLE_EXCESS": "Pipeline bubbles above the schedule's",
    "STAGE_IMBALANCE": "Pipeline stages are imbalanced",
    "UNEQUAL_STAGE_COMPOSITION": "Stages hold different layer types",
    "KV_HEAD_REPLICATION": "Layout: K/V heads replicated",
    "INDIVISIBLE_DIMENSION": "Layout: a degree does not divide a dimension",
    "MISSING_RANKS": "Ranks without traces",
    "PARTIAL_TRACE": "Truncated trace",
    "COLLECTIVE_HANG": "Collective hang",
    "COLLECTIVE_MISMATCH": "Ranks disagree on a collective",
    "NO_STEPS": "No step annotations",
    "LAYOUT_INCONSISTENT": "Layout inconsistent",
    "MFU_IMPOSSIBLE": "MFU above 100%: wrong inputs",
    "GPU_IDLE": "GPU idle",
    "SLOW_GROUP": "A whole group is slow",
    "P2P_HANG": "Hang through point-to-point",
    "PIPELINE_BUBBLE": "Pipeline bubble of the schedule",
}
#: Plain-words names of the losses of a step (summary `losses`).
LOSS_TITLES = {
    "pipeline_bubble": "pipeline bubble (the schedule's own)",
    "pipeline_bubble_excess": "pipeline bubble beyond the schedule's",
    "exposed_wait": "exposed communication: waiting",
    "exposed_transfer": "exposed communication: transfer",
    "exposed_communication": "exposed communication",
    "host_idle": "GPU idle (host-bound)",
    "straggler": "straggler",
    "stage_imbalance": "heavier stage",
    "unequal_stages": "stages of unequal layers",
    "kv_replication": "replicated K/V heads",
}
#: The report's table of losses shows those from this share of the step (summary.json keeps every one).
LOSS_SHOWN = 0.005
#: Embedded copy of the summary drops per_step beyond this many rows (summary.json keeps them all).
EMBED_PER_STEP_MAX = 2000


def esc(x) -> str:
    """Escape any value for HTML text or attribute context."""
    return html.escape("" if x is None else str(x), quote=True)


def note(text: str) -> str:
    """A one-line note in place of a section that could not be drawn."""
    return f'<p class="note">{esc(text)}</p>'


def _breakable(text: str) -> str:
    """Escaped op names may wrap at `_ : , / . (` (not mid-word): `<wbr>` after each separator."""
    for sep in ("_", ":", ",", "/", ".", "("):
        text = text.replace(sep, sep + "<wbr>")
    return text


#: Table columns (row keys) that hold counts: a whole number shows as an integer ("128", not "128.0"), a
#: mean count (calls per step over several steps) with one decimal.
COUNT_KEYS = frozenset(
    {"calls", "rows", "kernels", "group_size", "bytes", "rank", "stage", "last_arrivals", "world_size"}
)
#: Names (kernels, ops, paths) longer than this are cut with "…" in tables; the whole name is the cell's
#: tooltip (`title`). About 60 monospace characters wrap onto two lines of a name column.
NAME_MAX = 60
#: Name cells of at most this many characters never wrap ("(no CPU op)", "no model" on one line).
NOWRAP_MAX = 12
_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si_text(v: float | int | None, unit: str = "", digits: int = 4) -> str:
    """A large quantity with an SI prefix and `digits` significant digits: 157065412608 FLOP ->
    "157.1 GFLOP"; below 1,000 the number itself (integers without decimals)."""
    if v is None or (isinstance(v, float) and v != v):
        return "\u2014"
    x = float(v)
    for scale, prefix in _SI:
        if abs(x) >= scale:
            q = x / scale
            nd = max(digits - len(str(int(abs(q)))), 0)
            return f"{q:,.{nd}f} {prefix}{unit}".rstrip()
    text = f"{int(x):,}" if x == int(x) else f"{x:,.{digits - 1}g}"
    return f"{text} {unit}".rstrip()


def number_text(v, key: str | None = None) -> str:
    """A table cell's text: a dash (U+2014) for unknown, never 0; integers with thousands separators, counts
    (`COUNT_KEYS`) as integers when whole, other numbers with 3 decimals below 100 and 1 above (two
    significant digits below 0.001)."""
    if v is None:
        return "\u2014"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "\u2014"
        if key in COUNT_KEYS:
            return f"{int(v):,}" if v.is_integer() else f"{v:,.1f}"
        if 0 < abs(v) < 0.001:  # (not "0.000": a small known number)
            return f"{v:.2g}"
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
    return str(v)


def cut_name(text: str, limit: int = NAME_MAX, keep_end: bool = False) -> str:
    """`text` cut to `limit` characters with "…" (its end kept for paths, `keep_end`)."""
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def name_cell(text: str, full: str | None = None, keep_end: bool = False, attrs: str = "") -> str:
    """A name cell: escaped, cut to `NAME_MAX` with the whole name (`full`, else `text`) as its tooltip,
    wrapping only after separators, never wrapping when short."""
    full = text if full is None else full
    shown = cut_name(text, keep_end=keep_end)
    title = f' title="{esc(full)}"' if shown != full else ""
    if len(shown) <= NOWRAP_MAX:  # (a <wbr> would break even a nowrap cell)
        return f'<td class="name nw"{title}{attrs}>{esc(shown)}</td>'
    return f'<td class="name"{title}{attrs}>{_breakable(esc(shown))}</td>'


def _head(label: str, name: bool = False) -> str:
    """A header cell that may wrap after '/' as well as at spaces ("GFLOP/step"); left-aligned over a name
    column."""
    cls = ' class="name"' if name else ""
    return f"<th{cls}>{esc(label).replace('/', '/<wbr>')}</th>"


def table_html(
    rows: list[dict],
    columns: list[tuple[str, str]],
    name_cols: tuple[str, ...] = (),
    full_names: dict[str, str] | None = None,
    keep_end: tuple[str, ...] = ("path",),
    text_cols: tuple[str, ...] = (),
) -> str:
    """An HTML table of `rows` (dicts); every cell escaped; numbers by `number_text` (never wrapped); the
    `name_cols` cut and left-aligned (`name_cell`; `full_names`: key -> the row key holding the whole name
    for the tooltip, when the shown name is already shortened); the `text_cols` (words: notes, metric
    names) left-aligned and wrapped at spaces."""
    full_names = full_names or {}
    head = "".join(_head(h, k in name_cols) for h, k in columns)
    body = "".join(
        "<tr>"
        + "".join(
            name_cell(
                number_text(r.get(k), k),
                None if k not in full_names or r.get(full_names[k]) is None else str(r[full_names[k]]),
                keep_end=k in keep_end,
            )
            if k in name_cols
            else f'<td class="text">{esc(number_text(r.get(k), k))}</td>'
            if k in text_cols
            else f"<td>{esc(number_text(r.get(k), k))}</td>"
            for _, k in columns
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------------------------------
# findings and headline
# ----------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def headline(summary: dict) -> list[str]:
    """Plain sentences: mean step time, where it goes, MFU, stragglers."""
    ranks = [r for r in summary.get("ranks") or [] if r.get("step_time_ms")]
    out = []
    if ranks:
        n = len(ranks)
        step = sum(r["step_time_ms"] for r in ranks) / n

        def share(key: str) -> float | None:
            vals = [r.get(key) for r in ranks]
            if all(v is None for v in vals):
                return None
            return sum((v or 0.0) for v in vals) / n / step if step else None

        parts = [
            f"compute {_pct(share('compute_ms'))}",
            f"exposed communication {_pct(share('exposed_comm_ms'))}",
        ]
        parts.append(f"idle {_pct(share('idle_ms'))}")
        line = f"Mean step time {step:,.1f} ms over {n} rank(s): " + ", ".join(parts) + " of the step"
        if share("bubble_ms") is not None:
            line += (
                f"; pipeline bubbles (idle and waits for neighbour stages) take {_pct(share('bubble_ms'))}"
            )
        out.append(line + ".")
    mfu = summary.get("mfu") or {}
    if mfu.get("value") is not None:
        out.append(f"MFU {_pct(mfu['value'])} ({mfu.get('convention') or 'unknown'} convention).")
    st = summary.get("stragglers") or []
    if st:
        out.append(
            "Stragglers: "
            + "; ".join(
                f"rank {s['rank']} ({s.get('cause', 'unknown')}"
                + (f", costs {s['cost_ms']:.1f} ms/step" if s.get("cost_ms") is not None else "")
                + ")"
                for s in st[:8]
            )
            + ("; ..." if len(st) > 8 else "")
            + "."
        )
    return out


def stragglers_html(summary: dict) -> str:
    """Table of straggler verdicts: rank, stage, cause, cost, persistence and the main evidence."""
    rows = []
    for s in summary.get("stragglers") or []:
        ev = s.get("evidence") or {}
        rows.append(
            {
                "rank": s.get("rank"),
                "stage": s.get("stage"),
                "cause": s.get("cause"),
                "cost_ms": s.get("cost_ms"),
                "steps": f"{s.get('steps_flagged')} of {s.get('steps_total')}",
                "compute_ratio": ev.get("compute_ratio"),
                "transfer_ratio": ev.get("transfer_ratio"),
                "last_arrivals": ev.get("last_arrivals"),
            }
        )
    if not rows:
        return ""
    cols = [
        ("rank", "rank"),
        ("stage", "stage"),
        ("cause", "cause"),
        ("cost ms/step", "cost_ms"),
        ("steps flagged", "steps"),
        ("compute vs peers (x)", "compute_ratio"),
        ("transfer vs peers (x)", "transfer_ratio"),
        ("last to arrive (collectives)", "last_arrivals"),  # a count: collectives it reached last
    ]
    cols = [c for c in cols if any(r.get(c[1]) is not None for r in rows)]
    return "<h3>Stragglers</h3>" + table_html(rows, cols)


def losses_html(summary: dict) -> str:
    """Where the time goes: the losses of the step (summary `losses`), largest first, with the change that
    recovers most of each and what the replay says it saves."""
    rows = []
    for x in summary.get("losses") or []:
        if (x.get("share_of_step") or 0.0) < LOSS_SHOWN:
            continue
        who = f" (rank {x['rank']})" if x.get("rank") is not None else ""
        rows.append(
            {
                "loss": LOSS_TITLES.get(x.get("loss"), x.get("loss")) + who,
                "ms": x.get("ms_per_step"),
                "share": _pct(x.get("share_of_step")),
                "basis": x.get("basis"),
                "lever": x.get("lever") or "-",
                "saving": x.get("saving_ms"),
            }
        )
    if not rows:
        return ""
    cols = [
        ("loss", "loss"),
        ("ms/step", "ms"),
        ("% of the step", "share"),
        ("from", "basis"),
        ("what to change", "lever"),
        ("saves ms/step (replayed)", "saving"),
    ]
    return (
        "<h3>Where the time goes</h3><p>Losses of the mean step, largest first (from 0.5% of the step; all in "
        "summary.json <code>losses</code>). Measured parts do not overlap; causes (straggler, heavier stage, "
        "replicated K/V heads) lie inside them. A schedule change's saving is at the run's amount of work.</p>"
        + table_html(rows, cols, text_cols=("loss", "lever"))
    )


def findings_html(summary: dict) -> str:
    """Headline sentences, the losses of the step (where the time goes), then every finding (largest saving
    first) in plain words, then the straggler table."""
    head = "".join(f'<p class="headline">{esc(line)}</p>' for line in headline(summary))
    head += losses_html(summary)
    items = summary.get("findings") or []
    if not items:
        return head + "<p>No findings.</p>" + stragglers_html(summary)
    rows = []
    for f in sorted(items, key=_finding_order):
        title = FINDING_TITLES.get(f.get("code"), f.get("code"))
        rows.append(
            f'<div class="finding {esc(f.get("severity"))}"><b>{esc(title)}</b> '
            f"<code>{esc(f.get('code'))}</code> ({esc(f.get('severity'))}): {esc(f.get('message'))}"
            f"{_saving_text(f)}"
            + (f" <i>({esc(f['severity_reason'])})</i>" if f.get("severity_reason") else "")
            + "</div>"
        )
    return head + "\n".join(rows) + progress_html(summary) + stragglers_html(summary)


def progress_html(summary: dict) -> str:
    """Per-rank progress of a hung step (P2P_HANG): last call enqueued / started / completed, blocked in."""
    out = []
    for f in summary.get("findings") or []:
        if f.get("code") != "P2P_HANG" or not f.get("progress"):
            continue
        chain = {b["rank"]: b for b in f.get("blocked_chain", [])}
        rows = [{**p, "blocked_in": chain.get(p["rank"], {}).get("op"),
                 "blocked_s": (chain.get(p["rank"], {}).get("blocked_ms") or 0) / 1e3} for p in f["progress"]]  # fmt: skip
        cols = [("rank", "rank"), ("last enqueued", "last_enqueued"), ("last started", "last_started"),
                ("last completed", "last_completed"), ("blocked in", "blocked_in"), ("for s", "blocked_s")]  # fmt: skip
        out.append(f"<h3>Progress in hung step {esc(f.get('step'))}</h3>" + table_html(rows, cols))
    return "".join(out)


def _fr_records(views):
    """The Flight Recorder records the analysis read (a DataFrame), or None."""
    if views is None:
        return None
    fr = (getattr(views, "nccl", None) or {}).get("flight_recorder")
    if fr is None or not fr.num_rows:
        return None
    return fr.select(
        [c for c in ("rank", "pg_name", "pg_desc", "op", "seq", "state") if c in fr.column_names]
    ).to_pandas()


def _call(op, seq, pg) -> str:
    return f"{op} #{int(seq)}" + (f" (pg {pg})" if pg not in (None, "") else "")


def hang_html(views, summary: dict) -> str:
    """A hung run first: the culprit, who waits for whom, and per rank the last collective it enqueued,
    started and completed (from the COLLECTIVE_HANG finding and the Flight Recorder records it was read
    from). Empty without a COLLECTIVE_HANG finding."""
    hangs = [f for f in summary.get("findings") or [] if f.get("code") == "COLLECTIVE_HANG"]
    if not hangs:
        return ""
    out = []
    fr = _fr_records(views)
    for f in hangs:
        pg, seq, op = f.get("pg_name"), f.get("seq"), f.get("op")
        culprits = [int(r) for r in f.get("missing_ranks") or f.get("ranks") or []]
        waiting = [int(r) for r in f.get("waiting_ranks") or []]
        where = f"{op} #{seq}" + (
            f" on pg {pg}" + (f" ({f['pg_desc']})" if f.get("pg_desc") else "") if pg is not None else ""
        )
        lead = (
            f'<p class="headline"><b>Hang:</b> {esc(f.get("message"))}.</p>'
            f"<p>Culprit: rank{'s' if len(culprits) != 1 else ''} {esc(', '.join(map(str, culprits)) or 'unknown')}"
            f" never reached {esc(where)}; "
            f"rank{'s' if len(waiting) != 1 else ''} {esc(', '.join(map(str, waiting)) or '-')} wait in it for "
            f"{'them' if len(culprits) != 1 else 'it'}.</p>"
        )
        rows = []
        prog = {int(p["rank"]): p for p in f.get("progress") or [] if p.get("rank") is not None}
        ranks = sorted(set(prog) | set(culprits) | set(waiting))
        recs = fr[fr["pg_name"].astype(str) == str(pg)] if fr is not None and pg is not None else None
        for r in ranks:
            p = prog.get(r, {})
            mine = recs[recs["rank"] == r].sort_values("seq") if recs is not None else None

            def last(states: tuple[str, ...], key: str, mine=mine, p=p) -> str:
                if mine is not None and len(mine):
                    got = mine[mine["state"].isin(states)] if states else mine
                    if len(got):
                        row = got.iloc[-1]
                        return _call(row["op"], row["seq"], None)
                    return "-"
                v = p.get(key)
                return "-" if v is None else f"#{v}"

            status = (
                f"never enqueued {op} #{seq}"
                if r in culprits
                else f"waiting in {op} #{seq} for rank{'s' if len(culprits) != 1 else ''} {', '.join(map(str, culprits))}"
                if r in waiting
                else "-"
            )
            rows.append(
                {
                    "rank": r,
                    "enq": last((), "last_enqueued"),
                    "start": last(("started", "completed"), "last_started"),
                    "done": last(("completed",), "last_completed"),
                    "status": status,
                }
            )
        cols = [
            ("rank", "rank"),
            ("last enqueued", "enq"),
            ("last started", "start"),
            ("last completed", "done"),
            ("state", "status"),
        ]
        n = len(fr) if fr is not None else None
        src = (
            f"<p>From {n} Flight Recorder record(s) of {fr['rank'].nunique()} rank(s), group {esc(pg)}.</p>"
            if fr is not None
            else ""
        )
        out.append(lead + table_html(rows, cols, text_cols=("status",)) + src)
    return "".join(out)


def _fr_html(views) -> str:
    """Flight Recorder records per group and op: calls, ranks, and how many completed (the run's collectives
    when no profiler trace matched any)."""
    fr = _fr_records(views)
    if fr is None:
        return ""
    rows = []
    for (pg, desc, op), g in fr.groupby(["pg_name", "pg_desc", "op"], dropna=False, observed=True):
        rows.append(
            {
                "group": f"{pg} ({desc})" if desc == desc and desc else str(pg),
                "op": op,
                "records": int(len(g)),
                "ranks": int(g["rank"].nunique()),
                "completed": int((g["state"] == "completed").sum()),
                "pending": int((g["state"] != "completed").sum()),
                "last_seq": int(g["seq"].max()) if g["seq"].notna().any() else None,
            }
        )
    cols = [
        ("group", "group"),
        ("op", "op"),
        ("calls recorded", "records"),
        ("ranks recording", "ranks"),
        ("calls completed", "completed"),
        ("calls not completed", "pending"),
        ("highest seq", "last_seq"),
    ]
    return (
        "<p>Flight Recorder records (no profiler trace matched collectives across ranks).</p>"
        + table_html(rows, cols, ("group",))
    )


def _finding_order(f: dict) -> tuple:
    """Findings with a what-if saving first, largest saving first (summary `what_if`); then by severity."""
    order = {"error": 0, "warning": 1, "info": 2}
    saving = f.get("saving_ms")
    return (saving is None, -(saving or 0.0), order.get(str(f.get("severity")), 3))


def _saving_text(f: dict) -> str:
    saving = f.get("saving_ms")
    if saving is None:
        return ""
    if f.get("code") == "PIPELINE_BUBBLE":
        return f" <i>The best schedule or layout change saves {saving:.2f} ms per step at equal work (replayed).</i>"
    return f" <i>Fixing it saves {saving:.2f} ms per step (replayed).</i>"


def metadata_html(summary: dict) -> str:
    run = summary.get("run") or {}
    layout = run.get("layout") or {}
    mfu = summary.get("mfu") or {}

    def count(v):
        return None if v is None else number_text(v, "calls")

    rows = [
        ("world size", count(run.get("world_size"))),
        ("ranks with traces", count(len(run.get("ranks") or []))),
        ("steps analyzed", ", ".join(map(str, run.get("steps") or [])) or "whole trace"),
        ("GPU", run.get("gpu")),
        ("sequence length (tokens)", count(run.get("seq_len"))),
        (
            "layout",
            ", ".join(f"{k}={layout.get(k)}" for k in ("tp", "pp", "dp", "cp") if layout.get(k) is not None)
            + f" (source: {layout.get('source')})",
        ),
        ("tokens per step", count(mfu.get("tokens_per_step"))),
        (
            "model FLOPs per token",
            None if mfu.get("flops_per_token") is None else si_text(mfu["flops_per_token"], "FLOP"),
        ),
        ("tracelens", summary.get("tracelens_version")),
    ]
    path = run.get("path")
    body = (
        f"<tr><td>path</td>{name_cell(str(path), keep_end=True)}</tr>" if path is not None else ""
    ) + "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows if v is not None)
    warn = "".join(f"<li>{esc(w)}</li>" for w in run.get("warnings") or [])
    return f'<table class="meta">{body}</table>' + (f"<ul>{warn}</ul>" if warn else "")


# ----------------------------------------------------------------------------------------------------
# page
# ----------------------------------------------------------------------------------------------------
def _embed_json(data) -> str:
    """JSON that cannot end its <script> element or open markup: <, > and & as \\u escapes."""
    text = json.dumps(data, default=str, allow_nan=False) if data is not None else "null"
    return (
        text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
    )


def _slim(summary: dict) -> dict:
    if len(summary.get("per_step") or []) <= EMBED_PER_STEP_MAX:
        return summary
    out = dict(summary)
    out["per_step"] = f"{len(summary['per_step'])} rows: see summary.json"
    return out


def render(
    summary: dict,
    sections: list[tuple[str, object]],
    title: str | None = None,
    data_id: str = "tracelens-summary",
) -> str:
    """The whole page: `sections` are (title, go.Figure or HTML string or list of those) in order."""
    parts = []
    first_fig = True
    for sec_title, content in sections:
        parts.append(f"<h2>{esc(sec_title)}</h2>")
        for item in content if isinstance(content, list) else [content]:
            if isinstance(item, str):
                parts.append(item)
            else:
                parts.append(
                    pio.to_html(
                        item,
                        full_html=False,
                        include_plotlyjs=bool(first_fig),
                        config={"displaylogo": False, "responsive": True},
                    )
                )
                first_fig = False
    name = title or f"tracelens report: {(summary.get('run') or {}).get('name', 'run')}"
    try:
        data = _embed_json(_slim(summary))
    except ValueError:  # NaN somewhere: embed with NaN as null rather than fail the report
        data = _embed_json(json.loads(json.dumps(_slim(summary), default=str).replace("NaN", "null")))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'{GENERATOR_MARK} {esc(__version__)}">'
        f"<title>{esc(name)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(name)}</h1>"
        + "\n".join(parts)
        + f'<script type="application/json" id="{esc(data_id)}">{data}</script>'
        + "</body></html>\n"
    )


def _section(views, label: str, fn: Callable[[], object]) -> object:
    """One section builder under the error policy (`tracelens.policy`): a failure becomes a warning of the
    run and a note in its place."""
    warnings: list[str] = views.warnings if views is not None else []
    n = len(warnings)
    out = contained(f"report section {label} could not be drawn", fn, warnings)
    return out if len(warnings) == n else note(warnings[-1])


def critical_rows(chain: list[int], grid, critical: dict | None) -> list[int]:
    """The rank to draw for each stage of the pipeline timeline: the stage's rank the critical path runs on
    longest (summary `critical_path.by_rank_ms`), else the pipeline's own (`chain`)."""
    by_rank = {int(r): float(v) for r, v in ((critical or {}).get("by_rank_ms") or {}).items()}
    if not by_rank or grid is None or not getattr(grid, "pp", None):
        return list(chain)
    out = []
    for r in chain:
        st = grid.stage_of(r)
        peers = [q for q in grid.ranks_of_stage(st) if by_rank.get(q, 0.0) > 0] if st is not None else []
        out.append(max(peers, key=lambda q: (by_rank[q], -q)) if peers else r)
    return out


def schedule_what_if_html(summary: dict) -> str:
    """The schedule and layout what-ifs (summary `what_if`, kind schedule | layout) as a small table: the
    change, the replayed step, bubble and activation memory after, and what it costs."""
    rows = []
    for e in summary.get("what_if") or []:
        if e.get("kind") not in ("schedule", "layout"):
            continue
        before, after = e.get("step_time_ms"), e.get("step_time_ms_after")
        act = e.get("activation_bytes_after")
        rows.append(
            {
                "change": e.get("change"),
                "step": after,
                "delta": None if not before or after is None else f"{100 * (after / before - 1):+.1f}%",
                "gain": None if e.get("throughput_gain") is None else f"{100 * e['throughput_gain']:+.1f}%",
                "bubble": _pct(e.get("bubble_fraction_after")),
                "act": None if act is None else f"{act / 2**30:,.2f}",
                "costs": "; ".join(e.get("costs") or []),
                "buys": "; ".join(e.get("buys") or []),
            }
        )
    if not rows:
        return ""
    first = next(e for e in summary["what_if"] if e.get("kind") in ("schedule", "layout"))
    base_act = first.get("activation_bytes")
    cols = [
        ("change", "change"),
        ("step ms after", "step"),
        ("step time %", "delta"),
        ("samples/s %", "gain"),
        ("bubble after, % of step", "bubble"),
        ("activations GiB after", "act"),
        ("what it costs", "costs"),
    ]
    if first.get("step_time_ms") is None:  # (a layout entry from the model alone: nothing replayed)
        return (
            "<h3>What changing the layout buys</h3><p>From the model's dimensions alone (no measured pipeline to "
            "replay; docs/whatif.md).</p>"
            + table_html(
                rows, [cols[0], ("what it buys", "buys"), cols[-1]], text_cols=("change", "buys", "costs")
            )
        )
    return (
        "<h3>What changing the schedule or layout buys (replayed)</h3><p>Each row replays the pipeline with the "
        f"measured work of every stage and the measured P2P times: now {first.get('step_time_ms', 0):,.1f} ms per "
        f"step, bubble {_pct(first.get('bubble_fraction'))} of it"
        + (f", activations {base_act / 2**30:,.2f} GiB at the peak" if base_act is not None else "")
        + " (docs/whatif.md).</p>"
        + table_html(rows, cols, text_cols=("change", "costs"))
    )


def _pipeline_section(views, summary: dict) -> list:
    stages = summary.get("stages") or []
    out: list = []
    grid = views.grid if views is not None else None
    stage_of = {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}
    chain: list[int] = []
    if grid is not None and getattr(grid, "pp", None) == 1:
        table = schedule_what_if_html(summary)
        return [note("pp=1: no pipeline parallelism, no pipeline timeline."), *([table] if table else [])]
    if grid is not None and getattr(grid, "pp", None):
        pipes = grid.pipelines()
        chain = (
            pipes[0] if pipes else [grid.ranks_of_stage(s)[0] for s in grid.stages if grid.ranks_of_stage(s)]
        )
        chain = critical_rows(chain, grid, summary.get("critical_path"))
        stage_of.update({int(r): grid.stage_of(r) for r in chain})
    elif any(v is not None for v in stage_of.values()):
        firsts: dict[int, int] = {}
        for r, s in sorted(stage_of.items()):
            if s is not None:
                firsts.setdefault(s, r)
        chain = [firsts[s] for s in sorted(firsts)]
    if not chain or (len(chain) < 2 and not stages):
        return [note("No pipeline parallelism known (pp=1 or no layout): no pipeline timeline.")]
    step = figures.pick_step(summary.get("per_step") or [])
    blocks = views.pipeline_blocks(chain, stage_of, step) if views is not None else []
    if blocks:
        crit = (summary.get("critical_path") or {}).get("segments")
        out.append(figures.pipeline_timeline(blocks, stages, step, crit))
    else:
        out.append(note("No forward/backward or module annotations in the traces: no pipeline timeline."))
    table = schedule_what_if_html(summary)
    if table:
        out.append(table)
    if any(s.get("bubble_fraction") is not None for s in stages):
        out.append(figures.bubble_bar(stages))
    return out


def _composition_section(views, summary: dict) -> list:
    result = views.composition if views is not None else None
    comp = summary.get("composition") or result
    stages = figures._get(comp, "stages") or figures._get(result, "stages") or {}
    share = figures._get(comp, "time_share") or figures._get(result, "time_share") or {}
    out: list = []
    if stages:
        out.append(figures.composition_bar(stages))
    per_type = figures._get(comp, "per_stage_type_ms") or figures._get(result, "per_stage_type_ms") or {}
    if per_type:
        out.append(figures.stage_type_ms_bar(per_type))
    if share:
        out.append(figures.time_share_bar(share))
    if not out:
        return [note("Stage composition unknown: no module annotations in the traces and no --model given.")]
    return out


def _collectives_section(views, summary: dict) -> object:
    cross = views.cross if views is not None else None
    rows = figures.collective_rows(getattr(cross, "collectives", None)) if cross is not None else []
    if not rows:  # no cross-rank result (e.g. a stored summary): the per-op summary.json record
        by_op = (
            (summary.get("collectives") or {}).get("by_op")
            if isinstance(summary.get("collectives"), dict)
            else None
        )
        if by_op:
            cols = [
                ("op", "op"),
                ("calls", "calls"),
                ("bytes (all calls)", "bytes"),
                ("median bus bw GB/s", "busbw_gbps_median"),
                ("bus bw n", "busbw_n"),
                ("median skew ms", "skew_ms_median"),
            ]
            if not any(r.get("busbw_n") for r in by_op):  # (a summary written before busbw_n existed)
                cols = [c for c in cols if c[1] != "busbw_n"]
            return "<p>Per operation (from summary.json).</p>" + table_html(by_op, cols, ("op",))
        fr_table = _fr_html(views)
        if fr_table:
            return fr_table
        return note("No collectives matched across ranks (single rank, or no communication in the traces).")
    cols = [
        ("op", "op"),
        ("group size", "group_size"),
        ("bytes", "bytes"),
        ("calls", "calls"),
        ("total ms (all ranks)", "total_ms"),
        ("median ms", "median_ms"),
        ("bus bw GB/s", "busbw_gbps"),
        ("bus bw n", "busbw_n"),
        ("median skew ms", "median_skew_ms"),
        ("max skew ms", "max_skew_ms"),
        ("wait ms", "wait_ms"),
        ("transfer ms", "transfer_ms"),
    ]
    cols = [c for c in cols if any(r.get(c[1]) is not None for r in rows)]
    n_note = ""
    if all(_bus_n_is_group_size(r) for r in rows if r.get("busbw_n") and r.get("op") not in ("send", "recv")):
        # (the usual case: the bus-bandwidth factor's n is the group's size, said once instead of a column)
        cols = [c for c in cols if c[1] != "busbw_n"]
        n_note = " Bus bandwidth uses n = the group size (nccl-tests)."
    return (
        "<p>Grouped by operation, group size and message size; skew is the spread of the ranks' arrival; "
        f"wait is time spent waiting for the last rank, transfer the rest.{n_note}</p>"
        + table_html(rows, cols, ("op",))
    )


def _bus_n_is_group_size(row: dict) -> bool:
    """The row's bus-bandwidth n (text such as "128 (world size)") is its group size (a send or receive's
    factor is 1 whatever n: not asked)."""
    head = str(row.get("busbw_n") or "").split(" ")[0].rstrip(",")
    return head.isdigit() and row.get("group_size") is not None and int(head) == int(row["group_size"])


def _memory_section(views, summary: dict) -> object:
    peaks = views.rank_memory_peaks() if views is not None else []
    if not peaks:
        return note("No memory events in the traces (record with profile_memory=True).")
    stage_of = {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}
    return figures.memory_bar(peaks, stage_of)


def _top_ops_section(views, summary: dict) -> object:
    kind, rows = views.top_operations() if views is not None else ("", [])
    if not rows:
        return note("No kernels or CPU operators in the traces.")
    return _top_ops_per_step(kind, rows, len((summary.get("run") or {}).get("steps") or []))


def _top_ops_per_step(kind: str, rows: list[dict], n_steps: int) -> str:
    """Top operations per step, like the rest of the page (totals over the trace / analyzed steps); kernel
    names shortened (each row's `short`: `views.ReportViews.top_operations`), the whole name on hover."""

    def shown(r: dict) -> str:
        return r.get("short") or r["name"]

    if n_steps < 1:  # no step markers: the whole trace is the one window
        cols = [
            (kind, "name"),
            ("calls", "calls"),
            ("ms (all ranks)", "total_ms"),
            ("ms per rank", "per_rank_ms"),
        ]
        whole = [{**r, "name": shown(r), "full": r["name"]} for r in rows]
        return "<p>Whole trace (no step markers).</p>" + table_html(whole, cols, ("name",), {"name": "full"})
    per = [
        {
            "name": shown(r),
            "full": r["name"],
            "calls": figures._r(r["calls"] / n_steps, 1),
            "total_ms": figures._r((r.get("total_ms") or 0.0) / n_steps),
            "per_rank_ms": figures._r((r.get("per_rank_ms") or 0.0) / n_steps),
        }
        for r in rows
    ]
    cols = [
        (kind, "name"),
        ("calls per step", "calls"),
        ("ms per step (all ranks)", "total_ms"),
        ("ms per step per rank", "per_rank_ms"),
    ]
    return (
        f"<p>Per step: totals over the traces divided by the {n_steps} analyzed step(s), like the rest of "
        "the page.</p>" + table_html(per, cols, ("name",), {"name": "full"})
    )


# ---- per-op view (tracelens.ops_view, docs/ops.md): op table, memory over time, launch statistics ----------
_OPS_COLUMNS = [
    ("stage", "stage"),
    ("rank", "rank"),
    ("op", "op"),
    ("kernel", "kernel"),
    ("layer type", "layer_type"),
    ("shapes", "shapes"),
    ("calls/step", "calls"),
    ("ms/step", "ms_per_step"),
    ("GFLOP/step", "gflops"),
    ("MB/step", "mbytes"),
    ("TFLOP/s", "tflops"),
    ("TB/s", "tbps"),
    ("bound", "bound"),
    ("% roofline", "roofline_pct"),
    ("model", "model"),
]
#: The op table's text columns (left-aligned, cut with the whole text on hover).
_OPS_NAMES = ("op", "kernel", "layer_type", "shapes", "bound", "model")
_SORT_JS = (
    "<script>document.querySelectorAll('table.sortable').forEach(function(t){"
    "t.querySelectorAll('th').forEach(function(th,i){th.style.cursor='pointer';th.onclick=function(){"
    "var b=t.tBodies[0],rs=Array.from(b.rows),d=th.dataset.d==='1'?-1:1;th.dataset.d=d===1?'1':'0';"
    "rs.sort(function(x,y){var a=x.cells[i].dataset.v,c=y.cells[i].dataset.v;"
    "var na=parseFloat(a),nc=parseFloat(c);if(a===''&&c!=='')return 1;if(c===''&&a!=='')return -1;"
    "if(!isNaN(na)&&!isNaN(nc))return d*(na-nc);return d*String(a).localeCompare(String(c));});"
    "rs.forEach(function(r){b.appendChild(r);});};});});</script>"
)


def pd_isna(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def sortable_table_html(
    rows: list[dict], columns: list[tuple[str, str]], name_cols: tuple[str, ...] = ()
) -> str:
    """A table whose headers sort it (click; again to reverse); each cell keeps its raw value in data-v.
    Numbers by `number_text`; the `name_cols` cut and left-aligned (`name_cell`)."""

    def raw(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return ""
        return repr(v) if isinstance(v, float) else str(v)

    head = "".join(_head(h, k in name_cols) for h, k in columns)
    body = []
    for r in rows:
        tds = []
        for _, k in columns:
            v = r.get(k)
            attrs = f' data-v="{esc(raw(v))}"'
            if k in name_cols:
                tds.append(name_cell("-" if v is None else str(v), attrs=attrs))
            else:
                tds.append(f"<td{attrs}>{esc(number_text(v, k))}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def ops_report_rows(summary: dict) -> list[dict]:
    """The op table's rows as the report shows them: summary.json's `ops` plus GFLOP and MB per step."""
    out = []
    for r in summary.get("ops") or []:
        r = dict(r)
        r["gflops"] = None if r.get("flops") is None else r["flops"] / 1e9
        r["mbytes"] = None if r.get("bytes") is None else r["bytes"] / 1e6
        r["op"] = r.get("op") or "(no CPU op)"
        if r.get("model") is None and r["op"] != "(no CPU op)":
            r["model"] = "no model"  # docs/ops.md: "ops without a model"
        out.append(r)
    return out


def _ops_section(views, summary: dict) -> object:
    rows = ops_report_rows(summary)
    if not rows:
        return note("No kernels or CPU operators in the analyzed steps.")
    view = views.ops_view if views is not None else None
    parts = []
    if view is not None and not view.shapes_recorded:
        parts.append(
            note(
                "The traces carry no operator shapes (record with record_shapes=True): FLOPs, "
                "TFLOP/s and the roofline are unknown (-); times and kernels are measured."
            )
        )
    ranks = sorted({r["rank"] for r in rows if r.get("rank") is not None})
    # a column unknown on every row says nothing: left out, and named, so the table fits the page
    cols = [c for c in _OPS_COLUMNS if any(r.get(c[1]) is not None for r in rows)]
    unknown = [h for h, k in _OPS_COLUMNS if (h, k) not in cols]
    parts.append(
        f"<p>Top operations per stage by GPU time per step (ranks {esc(', '.join(map(str, ranks)))}; "
        "one rank per stage). Click a column to sort. docs/ops.md explains every column."
        + (f" Unknown for every row, so not shown: {esc(', '.join(unknown))}." if unknown else "")
        + "</p>"
    )
    parts.append(sortable_table_html(rows, cols, _OPS_NAMES))
    if view is not None and not view.kernels.empty:
        kt = view.kernels.assign(_s=view.kernels["stage"].fillna(-1)).groupby("_s", sort=True).head(10)
        parts.append(
            "<p>Top kernels per stage by GPU time per step, with the op that launches them most.</p>"
        )
        parts.append(
            sortable_table_html(
                [
                    {
                        k: ("(no CPU op)" if k == "op" and pd_isna(v) else None if pd_isna(v) else v)
                        for k, v in r.items()
                    }
                    for r in kt.drop(columns="_s").to_dict("records")
                ],
                [
                    ("stage", "stage"),
                    ("rank", "rank"),
                    ("kernel", "kernel"),
                    ("op", "op"),
                    ("calls/step", "calls"),
                    ("ms/step", "ms_per_step"),
                ],
                ("kernel", "op"),
            )
        )
    if view is not None and not view.launches.empty:
        lr = view.launches.to_dict("records")
        for r in lr:  # shares (0-1) shown as percentages
            for k in ("short_kernel_share", "short_kernel_time_share"):
                v = r.get(k)
                r[k + "_pct"] = None if v is None or v != v else 100.0 * float(v)
        parts.append(
            "<p>Kernel launches: delay from the CPU launch to the GPU start, and short (&lt;10 µs) "
            "kernels.</p>"
        )
        parts.append(
            table_html(
                lr,
                [
                    ("rank", "rank"),
                    ("kernels", "kernels"),
                    ("median delay µs", "launch_delay_median_us"),
                    ("p90 delay µs", "launch_delay_p90_us"),
                    ("mean delay µs", "launch_delay_mean_us"),
                    ("short kernels %", "short_kernel_share_pct"),
                    ("short kernels' time %", "short_kernel_time_share_pct"),
                ],
            )
        )
    parts.append(_SORT_JS)
    return parts


def _memory_timeline_section(views, summary: dict) -> object:
    if views is None or not views.has_memory():
        return note("No GPU memory events in the traces (record with profile_memory=True).")
    stage_of = {int(r["rank"]): r.get("stage") for r in summary.get("ranks") or []}
    peaks = views.memory_peaks(stage_of)
    shown = figures.memory_default_ranks(peaks.to_dict("records"), stage_of)
    tl, n_ranks, first_ts = views.memory_timeline(shown)
    if tl.empty:
        return note("No GPU memory events in the traces (record with profile_memory=True).")
    t0 = float(first_ts if first_ts is not None else tl["ts_ns"].min())
    fig = figures.memory_timeline_figure(tl, t0, shown, stage_of, n_ranks)
    rows = peaks.to_dict("records")
    for r in rows:
        r["peak_allocated_gib"] = r["peak_allocated"] / 2**30
        r["peak_reserved_gib"] = None if r["peak_reserved"] is None else r["peak_reserved"] / 2**30
    stage_rows = []
    if not peaks.empty and peaks["stage"].notna().any():
        for st, g in peaks.dropna(subset=["stage"]).groupby("stage"):
            top = g.sort_values("peak_allocated", ascending=False).iloc[0]
            stage_rows.append(
                {
                    "stage": int(st),
                    "peak_gib": float(top["peak_allocated"]) / 2**30,
                    "rank": int(top["rank"]),
                    "op": top["op_at_peak"],
                }
            )
    out = [fig]
    if stage_rows:
        out.append(
            table_html(
                stage_rows,
                [
                    ("stage", "stage"),
                    ("peak allocated GiB", "peak_gib"),
                    ("on rank", "rank"),
                    ("op at the peak", "op"),
                ],
                ("op",),
            )
        )
    out.append(
        table_html(
            rows[:64],
            [
                ("rank", "rank"),
                ("stage", "stage"),
                ("peak allocated GiB", "peak_allocated_gib"),
                ("peak reserved GiB", "peak_reserved_gib"),
                ("op at the peak", "op_at_peak"),
            ],
            ("op_at_peak",),
        )
    )
    return out


def _inference_section(summary: dict) -> str:
    """The inference iterations per phase, then one by one (summary.json `inference`, docs/inference.md)."""
    inf = summary["inference"]
    phases = [{"phase": k, **v} for k, v in (inf.get("phases") or {}).items()]
    cols = [
        ("phase", "phase"),
        ("steps", "steps"),
        ("tokens per step", "tokens_per_step"),
        ("step ms", "step_time_ms"),
        ("ms per token", "ms_per_token"),
        ("tokens/s", "tokens_per_s"),
        ("compute ms", "compute_ms"),
        ("idle ms", "idle_ms"),
        ("launch overhead ms", "launch_overhead_ms"),
        ("host-bound ms", "host_bound_ms"),
    ]
    parts = [
        "<p>Each engine iteration is a step (its annotation's window, or the ProfilerStep that holds it); per "
        "phase, means per step on every rank. A decode iteration of a CUDA graph is launch-bound by design; "
        "ms per token is the fair comparison across batch sizes.</p>"
    ]
    if "capture" in (inf.get("kinds") or []):
        parts.append(note("CUDA-graph captures: the work is recorded, not run; these are capture times."))
    parts.append(table_html(phases, cols, ("phase",)) if phases else note("No iteration states its phase."))
    its = inf.get("iterations") or []
    if its:
        parts.append(
            f"<h3>Iterations (rank {inf.get('rank')}, {len(its)} of {inf.get('iterations_total', len(its))})</h3>"
            + table_html(
                its,
                [
                    ("step", "step"),
                    ("annotation", "name"),
                    ("kind", "kind"),
                    ("phase", "phase"),
                    ("tokens", "tokens"),
                    ("requests", "requests"),
                    ("step ms", "step_time_ms"),
                    ("ms per token", "ms_per_token"),
                ],  # fmt: skip
                ("name",),
            )
        )
    return "".join(parts)


def build_sections(views, summary: dict) -> list[tuple[str, object]]:
    """Report sections for one run: a hang first, then findings; a run without profiler traces (Flight
    Recorder dumps or NCCL logs only) leaves out the sections drawn from them, with one note saying so.
    `views`: what the sections read of the run's tables (`tracelens.views.ReportViews`); without them the
    pipeline timeline, memory and top operations sections are notes."""
    heat = summary.get("per_step") or []
    hang = _section(views, "hang", lambda: hang_html(views, summary))
    lead: list[tuple[str, object]] = [("Hang", hang)] if hang else []
    if not (summary.get("run") or {}).get("ranks"):
        return lead + [
            ("Findings", findings_html(summary)),
            (
                "Collectives",
                _section(views, "collectives", lambda: _collectives_section(views, summary)),
            ),
            (
                "Profiler traces",
                note(
                    "No profiler (Kineto) traces in the run folder: the breakdown, step times, pipeline, stage "
                    "composition, memory and operations sections need them and are left out."
                ),
            ),
            ("Run", metadata_html(summary)),
        ]
    out = lead + _build_sections(views, summary, heat)
    if summary.get("inference"):  # an inference trace: its iterations right after the breakdown
        out.insert(
            len(lead) + 2,
            ("Inference iterations", _section(views, "inference", lambda: _inference_section(summary))),
        )
    return out


def _build_sections(views, summary: dict, heat: list) -> list[tuple[str, object]]:
    return [
        ("Findings", findings_html(summary)),
        (
            "Per-rank breakdown",
            _section(views, "breakdown", lambda: figures.breakdown_bar(summary))
            if summary.get("ranks")
            else note("No ranks analyzed."),
        ),
        (
            "Step time per rank and step",
            _section(views, "heatmap", lambda: figures.step_heatmap(summary))
            if heat
            else note("No per-step samples."),
        ),
        ("Pipeline", _section(views, "pipeline", lambda: _pipeline_section(views, summary))),
        (
            "Stage composition",
            _section(views, "composition", lambda: _composition_section(views, summary)),
        ),
        ("Collectives", _section(views, "collectives", lambda: _collectives_section(views, summary))),
        ("Memory", _section(views, "memory", lambda: _memory_section(views, summary))),
        ("Top operations", _section(views, "top operations", lambda: _top_ops_section(views, summary))),
        (
            "Operations: FLOPs and roofline",
            _section(views, "op table", lambda: _ops_section(views, summary)),
        ),
        (
            "Memory over time",
            _section(views, "memory timeline", lambda: _memory_timeline_section(views, summary)),
        ),
        ("Run", metadata_html(summary)),
    ]


def _write(text: str, path: Path) -> None:
    write_text(path, text)


def write_report(summary: dict, path: Path, views) -> None:
    """Write report.html atomically. `views`: `tracelens.views.ReportViews` of the analysis `summary` is of."""
    _write(render(summary, build_sections(views, summary)), path)


# ----------------------------------------------------------------------------------------------------
# comparison report
# ----------------------------------------------------------------------------------------------------
def compare_sections(comparison: dict) -> list[tuple[str, object]]:
    """Sections of the comparison report: what changed most, side by side, shares, stragglers."""
    la, lb = comparison["labels"]
    text = "".join(f'<p class="headline">{esc(line)}</p>' for line in comparison.get("text") or [])
    cols = [("metric", "name"), (la, "a_text"), (lb, "b_text"), ("change", "delta_text"), ("note", "note")]
    rows = [m for m in comparison["metrics"] if m["a"] is not None or m["b"] is not None]
    metrics = table_html(rows, cols, text_cols=("name", "note"))
    runs = comparison.get("runs") or {}
    run_rows = [{"label": lab, **(runs.get(k) or {})} for lab, k in ((la, "a"), (lb, "b"))]
    run_cols = [
        ("run", "label"),
        ("name", "name"),
        ("layout", "layout"),
        ("sequence length (tokens)", "seq_len"),
        ("world size", "world_size"),
        ("GPU", "gpu"),
        ("steps", "steps"),
        ("path", "path"),
    ]
    run_cols = [c for c in run_cols if any(r.get(c[1]) is not None for r in run_rows)]
    out: list[tuple[str, object]] = [
        (
            "What changed most",
            text + table_html(run_rows, run_cols, ("path",), text_cols=("label", "name", "layout", "gpu")),
        ),
        ("Side by side", metrics),
    ]
    if any(m["group"] == "breakdown" for m in rows):
        out.append(("Breakdown", figures.compare_shares_bar(comparison, "breakdown")))
    if any(m["group"] == "layer_types" for m in rows):
        out.append(("Time by layer type", figures.compare_shares_bar(comparison, "layer_types")))
    else:
        out.append(
            ("Time by layer type", note("Neither run has module annotations: no time share per layer type."))
        )
    out.append(("Per operation", _compare_ops_html(comparison)))
    st = comparison.get("stragglers") or {}
    st_html = "".join(
        f"<p>{esc(lab)}: "
        + (esc(", ".join(f"rank {s['rank']} ({s.get('cause')})" for s in st.get(k) or [])) or "none")
        + "</p>"
        for lab, k in ((la, "a"), (lb, "b"))
    )
    out.append(("Stragglers", st_html))
    for lab, k in ((la, "a"), (lb, "b")):
        f = {"findings": comparison.get("findings", {}).get(k) or [], "ranks": [], "stragglers": []}
        out.append((f"Findings: {lab}", findings_html(f)))
    return out


#: Rows of the per-op and per-kernel tables of compare.html (compare.json keeps more).
COMPARE_OP_ROWS = 30
COMPARE_KERNEL_ROWS = 20


def _compare_ops_html(comparison: dict) -> str:
    """compare.html's per-op section: ops matched on the CPU op and its shapes, their change per step and its
    share of the step time's change; then layer types, stages and kernels (summaries/compare.op_changes)."""
    la, lb = comparison["labels"]
    opc = comparison.get("ops") or {}
    rows = opc.get("ops") or []
    if not rows:
        return note("Neither run lists per-op times (no kernels or CPU ops in the ranks measured).")

    def side_cols(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(f"{name} ({lab})", f"{s}_{key}") for name, key in pairs for lab, s in ((la, "a"), (lb, "b"))]

    num = side_cols([("calls", "calls"), ("ms", "ms"), ("TFLOP/s", "tflops")])
    change = [("change ms", "delta_ms"), ("ratio", "ratio"), ("share of step change", "share_of_step_change")]
    src = opc.get("source") or {}
    parts = [
        "<p>Per step, on the ranks each run measured (one per stage); ops matched on the CPU operator and its "
        "recorded input shapes, whatever kernel runs them; largest change first. The share is the change "
        "over the step time's change"
        + (f" ({opc['step_delta_ms']:+,.3f} ms)" if opc.get("step_delta_ms") is not None else "")
        + ": above 1 or below 0 when other parts moved the other way.</p>"
    ]
    if "ops" in src.values():
        parts.append(
            note(
                "A side is a summary.json that lists only its top ops per stage: an op not listed there is "
                "unknown (-), not zero."
            )
        )
    stage_col = [("stage", "stage")] if opc.get("by_stage") else []
    parts.append(
        table_html(
            rows[:COMPARE_OP_ROWS],
            stage_col
            + [("op", "op"), ("shapes", "shapes")]
            + num
            + change
            + [(f"kernel ({la})", "a_kernel"), (f"kernel ({lb})", "b_kernel")],
            ("op", "shapes", "a_kernel", "b_kernel"),
        )
    )
    unl = opc.get("unlinked_kernel_ms") or {}
    if any(unl.values()):
        parts.append(
            f"<p>Kernels without a CPU op (not matched as ops; in the kernel table): {unl.get('a', 0):,.3f} ms "
            f"({esc(la)}), {unl.get('b', 0):,.3f} ms ({esc(lb)}) per step.</p>"
        )
    short = side_cols([("ms", "ms")]) + change
    if opc.get("layer_types"):
        parts.append(
            "<h3>Per layer type</h3>"
            + table_html(
                opc["layer_types"], stage_col + [("layer type", "layer_type")] + short, ("layer_type",)
            )
        )
    if opc.get("stages") and opc.get("by_stage"):
        parts.append("<h3>Per stage (op time)</h3>" + table_html(opc["stages"], [("stage", "stage")] + short))
    if opc.get("kernels"):
        parts.append(
            "<h3>Per kernel</h3><p>Matched by name: kernels of different vendors or library versions do not "
            "match (compare their ops above).</p>"
            + table_html(
                opc["kernels"][:COMPARE_KERNEL_ROWS],
                stage_col + [("kernel", "kernel")] + side_cols([("calls", "calls"), ("ms", "ms")]) + change,
                ("kernel",),
            )
        )
    return "".join(parts)


def write_compare_report(comparison: dict, path: Path) -> None:
    """Write compare.html atomically."""
    la, lb = comparison["labels"]
    _write(
        render(
            comparison,
            compare_sections(comparison),
            title=f"tracelens compare: {la} vs {lb}",
            data_id="tracelens-comparison",
        ),
        path,
    )
