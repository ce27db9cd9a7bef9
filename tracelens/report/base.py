"""The renderers of an analysis' result: each turns one `tracelens.result.Result` into one output, and reads
nothing else (the HTML report also reads what `tracelens.views.ReportViews` hands it of the run's tables).
`tracelens analyze` writes summary.json and report.html through them; `check`'s formats are in
`check_renderers.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tracelens.result import Result
from tracelens.store.atomic import write_bytes


class Renderer(Protocol):
    """One output of a result."""

    #: The file name it is written to by default.
    name: str

    def render(self, result: Result) -> bytes:
        """The output's bytes."""
        ...


class SummaryJson:
    """summary.json: the result's serialisation (`Result.to_bytes`)."""

    name = "summary.json"

    def render(self, result: Result) -> bytes:
        return result.to_bytes()


class HtmlReport:
    """report.html: one self-contained page (`report.html`), with what `views` reads of the run's tables."""

    name = "report.html"

    def __init__(self, views: Any):
        self.views = views

    def render(self, result: Result) -> bytes:
        from tracelens.report.html import build_sections, render

        doc = result.to_json()
        return render(doc, build_sections(self.views, doc)).encode("utf-8")


def write(renderer: Renderer, result: Result, path: Path) -> None:
    """Write `renderer`'s output of `result` to `path` atomically (a reader never sees half a file)."""
    write_bytes(path, renderer.render(result))


__all__ = ["HtmlReport", "Renderer", "SummaryJson", "write"]
