"""Output formats of `tracelens check`: text, Markdown, JUnit XML, GitHub Actions commands and JSON.

Each format is a `CheckRenderer`: one method, `render(report) -> str`, from a
`tracelens.summaries.regress.CheckReport` to the text to print or write (the CLI does either; nothing
here prints). `RENDERERS` maps the `--format` names to them; `render(report, fmt)` picks one.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from abc import ABC, abstractmethod
from typing import Any

from tracelens.summaries.regress import CheckReport, RuleResult

_COLUMNS = (
    ("rule", "Rule"),
    ("status", "Status"),
    ("baseline", "Baseline"),
    ("current", "Current"),
    ("delta", "Delta"),
    ("threshold", "Fails when"),
    ("p", "p-value"),
)


class CheckRenderer(ABC):
    """One output format of `tracelens check`."""

    #: the `--format` name
    name = ""

    @abstractmethod
    def render(self, report: CheckReport) -> str:
        """The whole output for `report`, ending with a newline."""


def _fmt_value(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]" if value else "none"
    if unit == "%":
        return f"{value:.2f}%"
    if unit == "ms":
        return f"{value:.3f} ms" if abs(value) < 100 else f"{value:.1f} ms"
    return f"{value:g}"


def _fmt_delta(delta: Any, unit: str) -> str:
    if delta is None:
        return "-"
    if isinstance(delta, (list, tuple)):
        return ", ".join(str(v) for v in delta) if delta else "none"
    if unit == "%":
        return f"{delta:+.1f}%"
    if unit == "pts":
        return f"{delta:+.2f} pts"
    return f"{delta:+g}"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def cells(r: RuleResult) -> dict[str, str]:
    """Display strings of one rule result for the tables (text, Markdown, JUnit details)."""
    return {
        "rule": r.rule,
        "status": r.status.upper(),
        "baseline": _fmt_value(r.baseline, r.unit),
        "current": _fmt_value(r.current, r.unit),
        "delta": _fmt_delta(r.delta, r.delta_unit),
        "threshold": r.threshold or "-",
        "p": _fmt_p(r.p_value),
    }


class TextRenderer(CheckRenderer):
    """Plain aligned table plus one line per failed or skipped rule (for terminals and CI logs)."""

    name = "text"

    def render(self, report: CheckReport) -> str:
        header = [title for _, title in _COLUMNS]
        rows = [[cells(r)[key] for key, _ in _COLUMNS] for r in report.results]
        widths = [max(len(x) for x in col) for col in zip(header, *rows)]
        lines = [f"tracelens check: baseline {report.baseline_label} vs current {report.current_label}", ""]
        for row in [header, ["-" * w for w in widths], *rows]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        notes = [r for r in report.results if r.status != "pass" or r.threshold_only]
        if notes:
            lines.append("")
            lines.extend(
                f"{r.status.upper()}{' (threshold only)' if r.threshold_only else ''} {r.rule}: {r.message}"
                for r in notes
            )
        if report.notes:
            lines.append("")
            lines.extend(f"NOTE {n}" for n in report.notes)
        lines += ["", report.headline()]
        return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


_MD_STATUS = {"pass": "✅ pass", "fail": "❌ **FAIL**", "skip": "⚪ skip"}


class MarkdownRenderer(CheckRenderer):
    """GitHub-flavoured Markdown (a PR comment or $GITHUB_STEP_SUMMARY): heading, table, details."""

    name = "markdown"

    def render(self, report: CheckReport) -> str:
        icon = "❌" if report.exit_code else "✅"
        lines = [
            f"### {icon} tracelens check: {_md_cell(report.headline())}",
            "",
            f"Baseline `{_md_cell(report.baseline_label)}` vs current `{_md_cell(report.current_label)}`.",
            "",
            "| " + " | ".join(title for _, title in _COLUMNS) + " | Details |",
            "|" + "|".join(["---"] * (len(_COLUMNS) + 1)) + "|",
        ]
        for r in report.results:
            row_cells = cells(r)
            row_cells["status"] = _MD_STATUS[r.status]
            row_cells["rule"] = f"`{r.rule}`"
            row = [_md_cell(row_cells[key]) for key, _ in _COLUMNS] + [_md_cell(r.message)]
            lines.append("| " + " | ".join(row) + " |")
        if report.notes:
            lines.append("")
            lines.extend(f"> **Note:** {_md_cell(n)}" for n in report.notes)
        return "\n".join(lines) + "\n"


class JUnitRenderer(CheckRenderer):
    """JUnit XML: one <testsuite> with one <testcase> per rule; failures as <failure>, skips as <skipped>."""

    name = "junit"

    def render(self, report: CheckReport) -> str:
        total = len(report.results)
        failures = len(report.failed)
        skipped = len(report.skipped)
        seconds = sum(r.seconds for r in report.results)
        counts = {
            "tests": str(total),
            "failures": str(failures if report.comparable else 0),
            "errors": "0" if report.comparable else "1",
            "skipped": str(skipped),
            "time": f"{seconds:.6f}",
        }
        root = ET.Element("testsuites", {"name": "tracelens check", **counts})
        suite = ET.SubElement(root, "testsuite", {"name": "tracelens.check", **counts})
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", {"name": "baseline", "value": report.baseline_label})
        ET.SubElement(props, "property", {"name": "current", "value": report.current_label})
        for note in report.notes:
            ET.SubElement(props, "property", {"name": "note", "value": note})
        if not report.comparable:  # no verdict: one error, not a failure per rule
            case = ET.SubElement(suite, "testcase", {"name": "comparable", "classname": "tracelens.check"})
            ET.SubElement(case, "error", {"message": report.headline(), "type": "not-comparable"})
        for r in report.results:
            case = ET.SubElement(
                suite,
                "testcase",
                {"name": r.rule, "classname": "tracelens.check", "time": f"{r.seconds:.6f}"},
            )
            c = cells(r)
            detail = (
                f"{r.title}\nbaseline: {c['baseline']}\ncurrent: {c['current']}\n"
                f"delta: {c['delta']}\nfails when: {c['threshold']}\np-value: {c['p']}\n{r.message}"
            )
            if r.status == "fail" and report.comparable:
                node = ET.SubElement(case, "failure", {"message": r.message, "type": "regression"})
                node.text = detail
            elif r.status == "skip":
                ET.SubElement(case, "skipped", {"message": r.message})
            else:
                ET.SubElement(case, "system-out").text = detail
        ET.indent(root)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


class GitHubRenderer(CheckRenderer):
    """GitHub Actions workflow commands: `::error` per failed rule, `::notice` for passed/skipped ones."""

    name = "github"

    def render(self, report: CheckReport) -> str:
        lines = []
        for r in report.results:
            level = "error" if r.status == "fail" and report.comparable else "notice"
            title = _gh_property(f"tracelens check {r.status}: {r.rule}")
            lines.append(f"::{level} title={title}::{_gh_data(r.message)}")
        lines.extend(
            f"::warning title={_gh_property('tracelens check')}::{_gh_data(n)}" for n in report.notes
        )
        level = "error" if report.exit_code else "notice"
        lines.append(f"::{level} title={_gh_property('tracelens check')}::{_gh_data(report.headline())}")
        return "\n".join(lines) + "\n"


class JSONRenderer(CheckRenderer):
    """The report as JSON (numbers, not display strings)."""

    name = "json"

    def render(self, report: CheckReport) -> str:
        return json.dumps(report.to_dict(), indent=2, allow_nan=False, default=float) + "\n"


#: `--format` name -> renderer, in the order the CLI help lists them
RENDERERS: dict[str, CheckRenderer] = {
    r.name: r for r in (TextRenderer(), MarkdownRenderer(), JUnitRenderer(), GitHubRenderer(), JSONRenderer())
}
FORMATS = tuple(RENDERERS)


def render(report: CheckReport, fmt: str = "text") -> str:
    """`report` in the format named `fmt` (one of `FORMATS`)."""
    return RENDERERS[fmt].render(report)


__all__ = [
    "FORMATS",
    "RENDERERS",
    "CheckRenderer",
    "GitHubRenderer",
    "JSONRenderer",
    "JUnitRenderer",
    "MarkdownRenderer",
    "TextRenderer",
    "cells",
    "render",
]
