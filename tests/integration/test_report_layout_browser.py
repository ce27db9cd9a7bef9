"""What a reader sees: every bundled run's report and a compare report, in one headless Chromium, at 1400 and
1000 px wide. For every Plotly chart the positions Plotly computed (read from the rendered SVG) must not
collide: no legend over an axis title, a tick label, the chart's title or a button, no legend that needs
scrolling, no button over the title, no line (the critical path) across the numbers written in bars; no
table wider than the page and no page wider than the window. A full-page screenshot of each is taken (its
width is the window's: nothing sticks out) and kept in $TRACELENS_SCREENSHOTS when that is set.

Chromium is Debian's `chromium` (`.ci/run` installs it), driven over the DevTools protocol on a pipe
(tests/chromium.py); without it the tests skip and say why.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.chromium import CHROMIUM, SKIP_REASON, Browser
from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLES = (
    sorted(p for p in (REPO / "sample_traces").iterdir() if p.is_dir())
    if (REPO / "sample_traces").is_dir()
    else []
)
COMPARED = ("qwen35-27b-seq4k-tp4pp4", "qwen35-27b-seq256k-tp2pp4cp2")  # docs/report.md's example
WIDTHS = (1400, 1000)
PAGES = [s.name for s in SAMPLES] + ["compare"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.skipif(not SAMPLES, reason="sample_traces/ is absent"),
]

# Waits for every plot, then reports what collides. Boxes are client rectangles; two boxes collide when
# they share more than 1 px both ways. Bar texts are the microbatch numbers of the pipeline timeline.
LAYOUT_JS = r"""
(async function () {
  function ready() {
    return Array.from(document.querySelectorAll('.plotly-graph-div')).every(function (d) {
      return d._fullLayout && d.querySelector('.main-svg');
    });
  }
  for (var i = 0; i < 200 && !ready(); i++) await new Promise(function (r) { setTimeout(r, 50); });
  await new Promise(function (r) { requestAnimationFrame(function () { requestAnimationFrame(r); }); });
  function box(e) { var r = e.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; }
  function hit(a, b) {
    return Math.min(a.r, b.r) - Math.max(a.l, b.l) > 1 && Math.min(a.b, b.b) - Math.max(a.t, b.t) > 1;
  }
  function inside(p, b) { return p.x > b.l - 2 && p.x < b.r + 2 && p.y > b.t - 2 && p.y < b.b + 2; }
  var out = {ready: ready(), plots: 0, legends: 0, checked: 0, lines: 0, problems: []};
  document.querySelectorAll('.plotly-graph-div').forEach(function (d) {
    out.plots += 1;
    var t = d.querySelector('.gtitle');
    var name = t ? t.textContent : '(untitled chart)';
    var things = [];
    d.querySelectorAll('.xtitle, .ytitle').forEach(function (e) { things.push(['axis title', e]); });
    d.querySelectorAll('.xtick text, .ytick text').forEach(function (e) { things.push(['tick label', e]); });
    if (t) things.push(['title', t]);
    d.querySelectorAll('.updatemenu-button').forEach(function (e) { things.push(['button', e]); });
    var legend = d.querySelector('.legend .bg');
    if (legend) {
      out.legends += 1;
      var lb = box(legend);
      things.forEach(function (th) {
        if (th[1].textContent === '' && th[0] !== 'button') return;
        out.checked += 1;
        if (hit(lb, box(th[1]))) {
          out.problems.push(name + ': the legend overlaps the ' + th[0] + ' "' + th[1].textContent + '"');
        }
      });
      var sb = d.querySelector('.legend .scrollbar');
      if (sb && parseFloat(sb.getAttribute('height') || '0') > 0) {
        out.problems.push(name + ': the legend needs scrolling');
      }
    }
    d.querySelectorAll('.updatemenu-button').forEach(function (e) {
      if (t && hit(box(e), box(t))) out.problems.push(name + ': a button overlaps the title');
    });
    var texts = Array.from(d.querySelectorAll('.barlayer text'))
      .filter(function (e) { return e.textContent !== ''; }).map(box);
    d.querySelectorAll('.scatterlayer .js-line').forEach(function (path) {
      out.lines += 1;
      var n = path.getTotalLength(), m = path.getScreenCTM();
      for (var s = 0; s <= n; s += 2) {
        var p = path.getPointAtLength(s).matrixTransform(m);
        var pc = {x: p.x - window.scrollX, y: p.y - window.scrollY};
        if (texts.some(function (b) { return inside(pc, b); })) {
          out.problems.push(name + ': a line crosses the text inside a bar');
          break;
        }
      }
    });
  });
  var body = document.body, cs = getComputedStyle(body);
  var right = body.getBoundingClientRect().right - parseFloat(cs.paddingRight);
  out.tables = document.querySelectorAll('table').length;
  document.querySelectorAll('table').forEach(function (tb) {
    var r = tb.getBoundingClientRect();
    if (r.right > right + 0.5) {
      out.problems.push('a table is ' + Math.round(r.width) + ' px wide, past the page: ' +
                        (tb.rows[0] ? tb.rows[0].textContent.slice(0, 60) : ''));
    }
  });
  var de = document.documentElement;
  if (de.scrollWidth > de.clientWidth) {
    out.problems.push('the page is ' + de.scrollWidth + ' px wide in a ' + de.clientWidth + ' px window');
  }
  return out;
})()
"""


def tracelens(*args: str) -> None:
    p = _cli(*args, cwd=REPO)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """report.html of every bundled run, and compare.html of the two runs docs/report.md compares."""
    out = tmp_path_factory.mktemp("layout")
    found = {}
    for s in SAMPLES:
        tracelens("analyze", str(s), "-o", str(out / s.name))
        found[s.name] = out / s.name / "report.html"
    a, b = (REPO / "sample_traces" / n for n in COMPARED)
    if a.is_dir() and b.is_dir():
        tracelens("compare", str(a), str(b), "--labels", "seq 4,096,seq 262,144", "-o", str(out / "compare"))
        found["compare"] = out / "compare" / "compare.html"
    return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", PAGES)
def test_nothing_collides_and_nothing_sticks_out(pages, browser, name, width, tmp_path):
    if name not in pages:
        pytest.skip(f"sample_traces/{' and '.join(COMPARED)} are absent: no compare report")
    page = pages[name]
    browser.console_errors()  # (what an earlier page left)
    browser.open(page.as_uri(), width)
    got = browser.evaluate(LAYOUT_JS)
    assert got["ready"], "the charts were never drawn"
    assert got["problems"] == [], f"{name} at {width} px"
    assert browser.console_errors() == []
    # the checks saw what the page holds: each chart drawn, each legend checked against its axes
    assert got["plots"] == page.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert got["legends"] == 0 or got["checked"] > got["legends"]
    shot = browser.screenshot()
    w, h = png_size(shot)
    assert w == width and h >= 600  # the whole page, no wider than the window
    keep = os.environ.get("TRACELENS_SCREENSHOTS")
    (Path(keep) if keep else tmp_path).mkdir(parents=True, exist_ok=True)
    ((Path(keep) if keep else tmp_path) / f"{name}-{width}.png").write_bytes(shot)


def test_the_checks_see_collisions(browser, tmp_path):
    """The layout checks fail where a reader would see a collision: a horizontal legend under the plot (as
    Plotly places it by default) on an x axis with a title, a line through a bar's text, a table wider than
    the page."""
    import plotly.graph_objects as go

    from tracelens.report.html import render

    x = [f"r{i} s0" for i in range(8)]
    fig = go.Figure()
    fig.add_bar(name="compute", x=x, y=[3, 1, 4, 1, 5, 9, 2, 6], text=["7"] * 8)
    fig.add_scatter(name="line", x=x, y=[1.5] * 8, mode="lines")
    fig.update_layout(title="ticks", xaxis_title="rank", legend_orientation="h", height=300)
    # the breakdown's old layout: eight entries in a horizontal legend below the plot
    old = go.Figure()
    for i in range(8):
        old.add_bar(name=f"part {i} of the step, a long name", x=x, y=[1] * 8)
    old.update_layout(
        title="axis title", barmode="stack", xaxis_title="rank", legend_orientation="h", height=420
    )
    wide = "<table><tr>" + "".join(f"<td>{'x' * 40}</td>" for _ in range(40)) + "</tr></table>"
    page = tmp_path / "bad.html"
    page.write_text(render({}, [("bad", [fig, old, wide])], title="bad"), encoding="utf-8")
    browser.open(page.as_uri(), 1000)
    problems = " | ".join(browser.evaluate(LAYOUT_JS)["problems"])
    assert 'ticks: the legend overlaps the tick label "r0 s0"' in problems
    assert 'axis title: the legend overlaps the axis title "rank"' in problems
    assert "ticks: a line crosses the text inside a bar" in problems
    assert "a table is" in problems and "the page is" in problems
