"""Report details (issue 20, item 9): heatmap colour scale, units, per-step top operations, op names that
do not break mid-word, compare naming the bubble once, the --engine help text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracelens.report import figures as F
from tracelens.report import html as H
from tracelens.run_analysis import Options, analyze_run
from tracelens.summaries.compare import compare
from tracelens.views import ReportViews

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
TP4PP4 = SAMPLES / "qwen35-27b-seq4k-tp4pp4"
SPLIT = SAMPLES / "qwen35-27b-seq4k-tp2pp3-split22-21-21"
GLOO = SAMPLES / "cpu-gloo-4rank"


@pytest.fixture(scope="module")
def tp4pp4():
    if not TP4PP4.is_dir():
        pytest.skip(f"sample traces absent: {TP4PP4}")
    a = analyze_run(TP4PP4, Options())
    return a, a.summary()


def test_heatmap_scale_spans_at_least_a_tenth_of_the_median(tp4pp4):
    _, s = tp4pp4
    fig = F.step_heatmap(s)
    z = np.array(fig.data[0].z, dtype=float)
    med = float(np.median(z))
    assert (z.max() - z.min()) / med < 0.01  # the sample's noise: under 1%
    lo, hi = fig.data[0].zmin, fig.data[0].zmax
    assert hi - lo == pytest.approx(0.10 * med, rel=1e-3) and lo <= z.min() and hi >= z.max()
    for button in fig.layout.updatemenus[0].buttons:  # every metric carries its own anchored range
        restyle = button.args[0]
        vals = [v for row in restyle["z"][0] for v in row if v is not None]
        if vals and np.median(vals) > 0:
            assert restyle["zmax"][0] - restyle["zmin"][0] >= 0.1 * np.median(vals) - 1e-3
    assert F.heatmap_range([[0.0, 130.0]]) == (0.0, 130.0)  # a real spread keeps the data's range


def test_straggler_table_says_what_last_to_arrive_counts():
    page = H.stragglers_html(
        {"stragglers": [{"rank": 1, "cause": "compute", "evidence": {"last_arrivals": 7}}]}
    )
    assert "last to arrive (collectives)" in page


def test_top_operations_are_per_step():
    if not GLOO.is_dir():
        pytest.skip(f"sample traces absent: {GLOO}")
    a = analyze_run(GLOO, Options())
    s = a.summary()
    n = len(s["run"]["steps"])
    assert n >= 2
    _, totals = F.top_operations(a.events)
    page = H._top_ops_section(ReportViews(a), s)
    assert "ms per step (all ranks)" in page and f"divided by the {n} analyzed step(s)" in page
    first = totals[0]
    cells = re.findall(r"<td>([^<]*)</td>", page.split(first["name"].split("::")[-1], 1)[1])[:3]
    assert float(cells[1].replace(",", "")) == pytest.approx(first["total_ms"] / n, rel=1e-3)  # shown rounded


def test_op_names_wrap_at_separators_not_mid_word():
    page = H.table_html([{"op": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"}], [("op", "op")], ("op",))
    assert "ncclDevKernel_<wbr>AllReduce_<wbr>Sum_<wbr>bf16_<wbr>RING_<wbr>LL" in page
    assert "overflow-wrap:anywhere" not in H.CSS and "word-break:break-all" not in H.CSS


def test_compare_names_the_bubble_once(tp4pp4):
    if not SPLIT.is_dir():
        pytest.skip(f"sample traces absent: {SPLIT}")
    other = analyze_run(SPLIT, Options()).summary()
    res = compare(tp4pp4[1], other, ("a", "b"))
    keys = {m["key"] for m in res["metrics"] if m["delta"] is not None and abs(m["delta"]) >= 0.01}
    assert {"bubble_fraction", "share.bubble"} <= keys  # both moved by more than a point ...
    assert " ".join(res["text"]).count("pipeline bubble") == 1  # ... and the text names the bubble once


def test_engine_help_names_the_extra():
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    out = subprocess.run([sys.executable, "-m", "tracelens", "analyze", "--help"], capture_output=True,
                         text=True, env=env, timeout=120).stdout  # fmt: skip
    assert "dask (needs the dask extra, tracelens-train[dask])" in out
    assert "(default: a local cluster)" in out


STRAGGLER = SAMPLES / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"
HANG = SAMPLES / "cpu-gloo-4rank-hang"


def test_pipeline_timeline_draws_the_ranks_the_critical_path_runs_on():
    """The straggler run's critical path runs mostly on rank 6 (stage 1, the planted straggler): the timeline
    draws rank 6's row, and each path segment on its own rank's row; beside it, the schedule what-ifs."""
    if not STRAGGLER.is_dir():
        pytest.skip(f"sample traces absent: {STRAGGLER}")
    a = analyze_run(STRAGGLER, Options())
    s = a.summary()
    by_rank = s["critical_path"]["by_rank_ms"]
    assert max(by_rank, key=by_rank.get) == "6"
    out = H._pipeline_section(ReportViews(a), s)
    fig = out[0]
    rows = list(fig.layout.yaxis.ticktext)
    assert any(r.startswith("stage 1 (r6)") for r in rows), rows
    assert any(r.startswith("stage 0 (r2)") for r in rows), rows  # stage 0's rank with the most path time
    crit = [t for t in fig.data if t.name == "critical path"][0]
    labels = {t.split(" ")[0] for t in crit.text if t}
    assert labels <= {"r2", "r6"}
    assert "critical path on its own rank" in fig.layout.title.text
    table = next(x for x in out if isinstance(x, str) and "What changing the schedule" in x)
    assert "interleaved 1F1B" in table and "activations GiB after" in table


def test_hang_report_leads_with_the_hang():
    """The gloo hang sample (Flight Recorder dumps only): the report opens with the hang, per rank the last
    collective enqueued / started / completed, who waits for whom and the culprit; no empty sections and
    no 'No collectives matched' although records were read."""
    if not HANG.is_dir():
        pytest.skip(f"sample traces absent: {HANG}")
    truth = __import__("json").loads((HANG / "truth.json").read_text())["hang"]
    a = analyze_run(HANG, Options())
    s = a.summary()
    sections = H.build_sections(ReportViews(a), s)
    assert sections[0][0] == "Hang"
    page = H.render(s, sections)
    titles = re.findall(r"<h2>(.*?)</h2>", page)
    assert titles[:2] == ["Hang", "Findings"] and "Pipeline" not in titles and "Memory" not in titles
    hang = sections[0][1]
    culprit = truth["rank"]
    assert f"Culprit: rank {culprit} never reached allreduce #{truth['seq']}" in hang
    cells = {}
    for row in re.findall(r"<tr>(.*?)</tr>", hang, re.S):
        c = [re.sub(r"<[^>]+>", "", x) for x in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        if c:
            cells[int(c[0])] = c
    for r in truth["waiting_ranks"]:
        assert cells[r][1] == f"allreduce #{truth['seq']}" and cells[r][3] == f"allreduce #{truth['seq'] - 1}"
        assert cells[r][4] == f"waiting in allreduce #{truth['seq']} for rank {culprit}"
    assert cells[culprit][1] == f"allreduce #{truth['seq'] - 1}"
    assert cells[culprit][4] == f"never enqueued allreduce #{truth['seq']}"
    assert "No collectives matched" not in page and "19 Flight Recorder record(s) of 4 rank(s)" in page
