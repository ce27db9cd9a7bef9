"""The report's op table sorts when a header is clicked, in real headless Chromium (issue 21: "in the report
(sortable table)"): ascending on the first click, descending on the second, unknown values last, and the
rows are summary.json's `ops` rows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tracelens
from tracelens.report.html import build_sections, render
from tracelens.views import ReportViews

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "cpu-gloo-4rank"
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian's chromium)"
)

# Clicks the op table's headers after load and writes the column's cell values, in row order, to <html>.
PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var t = document.querySelector('table.sortable'), d = document.documentElement;
  var heads = Array.from(t.querySelectorAll('th')).map(function (h) { return h.textContent; });
  function col(name) {
    var i = heads.indexOf(name);
    return Array.from(t.tBodies[0].rows).map(function (r) { return r.cells[i].dataset.v; });
  }
  function click(name) { t.querySelectorAll('th')[heads.indexOf(name)].click(); }
  click('ms/step'); d.setAttribute('data-ms-asc', JSON.stringify(col('ms/step')));
  click('ms/step'); d.setAttribute('data-ms-desc', JSON.stringify(col('ms/step')));
  click('op'); d.setAttribute('data-op-asc', JSON.stringify(col('op')));
  click('TFLOP/s'); d.setAttribute('data-tf-asc', JSON.stringify(col('TFLOP/s')));
  d.setAttribute('data-done', '1');
}, 200); });
</script>"""


def test_op_table_sorts_on_click(tmp_path):
    if not SAMPLE.is_dir():
        pytest.skip("sample_traces/cpu-gloo-4rank is absent")
    run = tracelens.load(SAMPLE, no_cache=True)
    summary = run.summary()
    rows = summary["ops"]
    assert len(rows) > 3
    page = render(summary, build_sections(ReportViews(run.analysis), summary))
    probed = tmp_path / "probed.html"
    probed.write_text(
        page.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + PROBE, 1), encoding="utf-8"
    )
    p = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'prof'}",
         "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    root = re.search(r"<html[^>]*>", p.stdout).group(0)
    assert 'data-done="1"' in root, "the probe never ran"

    def attr(name):
        return json.loads(re.search(rf'{name}="([^"]*)"', root).group(1).replace("&quot;", '"'))

    ms = sorted(r["ms_per_step"] for r in rows)
    assert [float(v) for v in attr("data-ms-asc")] == ms
    assert [float(v) for v in attr("data-ms-desc")] == ms[::-1]
    ops = attr("data-op-asc")  # strings by the browser's collation: the same rows, A before z
    assert sorted(ops) == sorted(r["op"] or "" for r in rows) and ops[0].lower() <= ops[-1].lower()
    tf = attr("data-tf-asc")  # unknown TFLOP/s ('') after every known one
    known = [float(v) for v in tf if v != ""]
    assert known == sorted(known) and tf[len(known) :] == [""] * (len(tf) - len(known))
    assert len(known) == sum(r["tflops"] is not None for r in rows) > 0
