"""The op table is in the report of every bundled run, and its numbers are the API's (Run.op_table)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

import tracelens
from tracelens.report.html import build_sections, render
from tracelens.views import ReportViews

REPO = Path(__file__).resolve().parents[2]
SAMPLES = (
    sorted(p for p in (REPO / "sample_traces").iterdir() if p.is_dir())
    if (REPO / "sample_traces").is_dir()
    else []
)
SECTION = "Operations: FLOPs and roofline"


def _table_rows(page: str) -> list[dict[str, str]]:
    """The op table's rows: header -> the cell's raw value (data-v)."""
    m = re.search(r'<table class="sortable">.*?</table>', page, re.S)
    if not m:
        return []
    heads = [
        html.unescape(re.sub(r"<[^>]+>", "", h)) for h in re.findall(r"<th[^>]*>(.*?)</th>", m.group(0), re.S)
    ]
    return [
        dict(zip(heads, (html.unescape(v) for v in re.findall(r'<td[^>]*data-v="(.*?)"', tr)), strict=True))
        for tr in re.findall(r"<tr>(.*?)</tr>", m.group(0), re.S)
        if "<td" in tr
    ]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_op_table_in_report_equals_api(sample):
    run = tracelens.load(sample, no_cache=True)
    summary = run.summary()
    page = render(summary, build_sections(ReportViews(run.analysis), summary))
    rows = summary["ops"]
    if not list(sample.rglob("*.pt.trace.json*")):  # Flight Recorder only: no op section, a note instead
        assert rows == [] and '<table class="sortable">' not in page and f"<h2>{SECTION}</h2>" not in page
        assert "No profiler (Kineto) traces in the run folder" in page
        return
    assert f"<h2>{SECTION}</h2>" in page
    assert rows, sample.name
    shown = _table_rows(page)
    assert len(shown) == len(rows)
    api = run.op_table()
    # a column unknown on every row is left out (and named above the table)
    for head, key in (("TFLOP/s", "tflops"), ("model", "model"), ("shapes", "shapes")):
        assert (head in shown[0]) == any(r[key] is not None for r in rows) or key == "model", head
    for r, cells in zip(rows, shown, strict=True):
        assert cells["rank"] == str(r["rank"]) and float(cells["ms/step"]) == r["ms_per_step"]
        assert cells.get("TFLOP/s", "") == ("" if r["tflops"] is None else repr(r["tflops"]))
        same = api[
            (api["rank"] == r["rank"])
            & (api["op"].fillna("") == (r["op"] or ""))
            & (api["kernel"].fillna("") == (r["kernel"] or ""))
            & (api["shapes"].fillna("").str.startswith((r["shapes"] or "").rstrip("…")))
            & (api["layer_type"].fillna("") == (r["layer_type"] or ""))
        ]
        assert len(same) == 1
        a = same.iloc[0]
        assert round(float(a["ms_per_step"]), 4) == r["ms_per_step"]
        assert round(float(a["calls"]), 4) == r["calls"]
        # an op without a FLOPs model is listed as such: null in the summary, "no model" in the report
        assert r["model"] == (None if a["model"] is None or a["model"] != a["model"] else a["model"])
        assert cells.get("model", "") == (r["model"] or ("no model" if r["op"] else ""))
        if r["tflops"] is not None:
            assert round(float(a["tflops"]), 4) == r["tflops"]
            assert float(cells["TFLOP/s"]) == r["tflops"]
