"""Assemble one self-contained, offline HTML report (plotly.js embedded once; every trace string escaped)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.io as pio

from tracelens import __version__
from tracelens.outputs import GENERATOR_MARK
from tracelens.report import figures

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.finding{padding:6px 10px;margin:4px 0;border-left:4px solid #999;background:#fafafa}
.finding.warning{border-color:#f58518} .finding.error{border-color:#e45756} .finding.info{border-color:#4c78a8}
table{border-collapse:collapse;font-size:0.9em} td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} code{background:#f3f3f3;padding:1px 4px}
"""


def esc(x) -> str:
    """Escape any value for HTML text or attribute context."""
    return html.escape("" if x is None else str(x), quote=True)


def findings_html(summary: dict) -> str:
    items = summary.get("findings") or []
    if not items:
        return "<p>No findings.</p>"
    order = {"error": 0, "warning": 1, "info": 2}
    rows = []
    for f in sorted(items, key=lambda f: order.get(f["severity"], 3)):
        rows.append(
            f'<div class="finding {esc(f["severity"])}"><b>{esc(f["code"])}</b> '
            f'({esc(f["severity"])}): {esc(f["message"])}</div>'
        )
    return "\n".join(rows)


def metadata_html(summary: dict) -> str:
    run = summary["run"]
    layout = run.get("layout") or {}
    rows = [
        ("path", run.get("path")),
        ("world size", run.get("world_size")),
        ("ranks with traces", len(run.get("ranks") or [])),
        ("steps analyzed", ", ".join(map(str, run.get("steps") or [])) or "whole trace"),
        ("GPU", run.get("gpu")),
        ("sequence length", run.get("seq_len")),
        (
            "layout",
            ", ".join(f"{k}={layout.get(k)}" for k in ("tp", "pp", "dp", "cp") if layout.get(k) is not None)
            + f" (source: {layout.get('source')})",
        ),
        ("tracelens", summary.get("tracelens_version")),
    ]
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
    warn = "".join(f"<li>{esc(w)}</li>" for w in run.get("warnings") or [])
    return f"<table>{body}</table>" + (f"<ul>{warn}</ul>" if warn else "")


def render(summary: dict, sections: list[tuple[str, object]]) -> str:
    """The whole page: `sections` are (title, go.Figure or HTML string) in order."""
    parts = []
    first_fig = True
    for title, content in sections:
        parts.append(f"<h2>{esc(title)}</h2>")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.append(
                pio.to_html(
                    content,
                    full_html=False,
                    include_plotlyjs=True if first_fig else False,
                    config={"displaylogo": False, "responsive": True},
                )
            )
            first_fig = False
    name = summary["run"]["name"]
    data = json.dumps(summary, default=str).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'{GENERATOR_MARK} {esc(__version__)}">'
        f"<title>tracelens: {esc(name)}</title><style>{CSS}</style></head><body>"
        f"<h1>tracelens report: {esc(name)}</h1>"
        + "\n".join(parts)
        + f'<script type="application/json" id="tracelens-summary">{data}</script>'
        + "</body></html>\n"
    )


def build_sections(analysis, summary: dict) -> list[tuple[str, object]]:
    """Report sections for one run, findings first."""
    return [
        ("Findings", findings_html(summary)),
        ("Per-rank breakdown", figures.breakdown_bar(summary)),
        ("Run", metadata_html(summary)),
    ]


def write_report(analysis, summary: dict, path: Path) -> None:
    """Write report.html atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(summary, build_sections(analysis, summary)), encoding="utf-8")
    tmp.replace(path)
