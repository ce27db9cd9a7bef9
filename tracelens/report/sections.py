"""Report sections -> their Plotly figures (for `Run.figures()`, the notebook twin of report.html)."""

from __future__ import annotations

from collections.abc import Sequence


def figures_of(sections: Sequence[tuple[str, object]]) -> dict[str, object]:
    """{section title: go.Figure} for every figure of `sections` (html.build_sections' output)."""
    import plotly.graph_objects as go

    out: dict[str, object] = {}
    for title, body in sections:
        items = body if isinstance(body, (list, tuple)) else [body]
        figs = [x for x in items if isinstance(x, go.Figure)]
        for i, fig in enumerate(figs):
            out[title if i == 0 else f"{title} ({i + 1})"] = fig
    return out
