"""The report and the compare report in real headless Chromium: plots drawn, no console error, no script from
trace names, a screenshot that is not blank.

Chromium is driven from the command line (no extra Python package): `--dump-dom` after a virtual-time budget,
and `--screenshot` in the same launch. A test-only copy of each page carries a probe script that records
errors (window.onerror, console.error) and the XSS flag into attributes of <html>, which the dumped DOM shows.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.cli import tracelens as _cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "cpu-gloo-4rank"
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (.ci/run installs Debian's chromium)"
)

PAYLOAD = "<script>window.__xss=1</script>"
PAYLOAD_IMG = '<img src=x onerror="window.__xss=1">'
IMG_ESCAPED = "&lt;img src=x onerror=&quot;window.__xss=1&quot;&gt;"
PROBE = """<script>
window.__tlErrors = [];
function __tlMark() {
  var d = document.documentElement;
  d.setAttribute('data-tl-errors', JSON.stringify(window.__tlErrors));
  d.setAttribute('data-tl-xss', String(window.__xss === 1));
}
window.addEventListener('error', function (e) {
  window.__tlErrors.push(String(e.message)); __tlMark();
}, true);
window.addEventListener('unhandledrejection', function (e) {
  window.__tlErrors.push(String(e.reason)); __tlMark();
});
var __tlCE = console.error;
console.error = function () {
  window.__tlErrors.push(Array.prototype.join.call(arguments, ' ')); __tlMark();
  __tlCE.apply(console, arguments);
};
window.addEventListener('load', function () {
  setTimeout(function () { __tlMark(); document.documentElement.setAttribute('data-tl-done', '1'); }, 300);
});
</script>"""


def tracelens(*args: str) -> subprocess.CompletedProcess:
    p = _cli(*args, cwd=REPO)  # the CLI's entry point, in this process (tests/cli.py)
    assert p.returncode == 0, p.stderr
    return p


def decode_png(data: bytes) -> np.ndarray:
    """8-bit RGB/RGBA non-interlaced PNG -> (h, w, channels) array (all five row filters)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, []
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif typ == b"IDAT":
            idat.append(body)
        pos += 12 + n
    assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.int64)
    prev = np.zeros(w * bpp, np.int64)
    for y in range(h):
        f, x = raw[y, 0], raw[y, 1:].astype(np.int64)
        if f == 0:
            cur = x
        elif f == 1:
            cur = np.cumsum(x.reshape(w, bpp), axis=0).reshape(-1) & 255
        elif f == 2:
            cur = (x + prev) & 255
        else:  # average / Paeth: sequential along the row
            cur = x.tolist()
            up = prev.tolist()
            for i in range(w * bpp):
                a = cur[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    cur[i] = (cur[i] + ((a + b) >> 1)) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.array(cur, np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)


def open_in_chromium(page: Path, tmp: Path) -> tuple[str, str, np.ndarray]:
    """(dumped DOM, Chromium's stderr, screenshot pixels) of a probed copy of `page`."""
    text = page.read_text(encoding="utf-8")
    probed = tmp / ("probed-" + page.name)
    probed.write_text(
        text.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + PROBE, 1), encoding="utf-8"
    )
    shot = tmp / (page.stem + ".png")
    p = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--window-size=1000,800",
            f"--screenshot={shot}",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr, decode_png(shot.read_bytes())


def check_page(dom: str, stderr: str, pixels: np.ndarray, page: Path) -> None:
    root = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-tl-done="1"' in root, "the page never finished loading"
    errors = json.loads(re.search(r'data-tl-errors="([^"]*)"', root).group(1).replace("&quot;", '"'))
    assert errors == []
    assert re.findall(r":CONSOLE\(\d+\)].*(?:Uncaught|Error)", stderr) == []
    assert 'data-tl-xss="false"' in root
    # every plot was drawn: each plotly div holds an SVG
    divs = page.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert divs > 0 and dom.count('class="main-svg"') >= divs
    # the screenshot shows text and a plot: many colours, large variance, the breakdown/first bar colour
    colours = np.unique(pixels[..., :3].reshape(-1, 3), axis=0)
    assert len(colours) > 50 and pixels[..., :3].std() > 10


@pytest.fixture(scope="module")
def run_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    tracelens("analyze", str(SAMPLE), "-o", str(out))
    return out / "report.html"


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_run_report_in_chromium(run_report, tmp_path):
    dom, err, px = open_in_chromium(run_report, tmp_path)
    check_page(dom, err, px, run_report)
    assert "Per-rank breakdown" in dom and "Findings" in dom


def test_trace_names_are_text_not_markup(tmp_path):
    """A kernel named <script>..., an op named <img onerror>: the report shows them and runs nothing."""
    run = tmp_path / "run"
    run.mkdir()
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 1000,
        },
        {"ph": "X", "cat": "cpu_op", "name": PAYLOAD_IMG, "pid": 1, "tid": 1, "ts": 10, "dur": 100},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 20,
            "dur": 5,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": PAYLOAD,
            "pid": 0,
            "tid": 7,
            "ts": 30,
            "dur": 500,
            "args": {"device": 0, "stream": 7, "correlation": 7},
        },
    ]
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "baseTimeNanoseconds": 1790000000000000000,
        "traceEvents": events,
    }
    (run / "rank0.pt.trace.json").write_text(json.dumps(doc))
    tracelens("analyze", str(run), "-o", str(tmp_path / "out"))
    page = tmp_path / "out" / "report.html"
    text = page.read_text(encoding="utf-8")
    assert PAYLOAD not in text and "<img src=x" not in text
    # the op name is shown whole, escaped; the kernel name's <...> parts are template arguments to the
    # kernel-name shortener, so it shows as "<…>window.__xss=1<…>", escaped too
    assert IMG_ESCAPED in text
    assert "&lt;…&gt;window.__xss=1&lt;…&gt;" in text
    # the compare report of two summaries whose names and layer types carry the payloads
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    s["run"]["name"] = PAYLOAD
    s["composition"] = {"time_share": {PAYLOAD_IMG: 0.5, "full_attention": 0.1}, "stages": {}}
    s["findings"] = [
        {"code": "STRAGGLER", "severity": "warning", "message": PAYLOAD_IMG, "ranks": [], "stages": []}
    ]
    a = tmp_path / "a-summary.json"
    a.write_text(json.dumps(s))
    tracelens(
        "compare",
        str(a),
        str(tmp_path / "out" / "summary.json"),
        "--labels",
        f"{PAYLOAD},b",
        "-o",
        str(tmp_path / "cmp"),
    )
    cmp_page = tmp_path / "cmp" / "compare.html"
    ctext = cmp_page.read_text(encoding="utf-8")
    assert PAYLOAD not in ctext and "<img src=x" not in ctext
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in ctext
    for p, shown in (
        (page, "&lt;img src=x onerror="),
        (cmp_page, "&lt;script&gt;window.__xss=1&lt;/script&gt;"),
    ):
        dom, err, px = open_in_chromium(p, tmp_path)
        check_page(dom, err, px, p)
        # shown as text in the rendered page (the DOM serialiser escapes text nodes again)
        assert shown in dom


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample_traces/cpu-gloo-4rank is absent")
def test_compare_report_in_chromium(run_report, tmp_path):
    summary = run_report.parent / "summary.json"
    tracelens("compare", str(summary), str(SAMPLE), "--labels", "stored,rerun", "-o", str(tmp_path / "c"))
    page = tmp_path / "c" / "compare.html"
    dom, err, px = open_in_chromium(page, tmp_path)
    check_page(dom, err, px, page)
    assert "What changed most" in dom and "Side by side" in dom


@pytest.mark.scale
def test_1024_rank_report_under_10_mb_opens_in_chromium(tmp_path):
    """Acceptance: the report of a simulated 1,024-rank run stays under 10 MB and opens in Chromium."""
    from tracelens.simulate import TINY_MODEL, SimConfig, simulate

    run = tmp_path / "run1024"
    cfg = SimConfig(
        model=TINY_MODEL, seq_len=2048, tp=8, pp=4, dp=32, microbatches=4, steps=2, seed=0, compress_level=1
    )
    simulate(cfg, run)
    out = tmp_path / "out"
    r = tracelens("analyze", str(run), "-o", str(out), "--no-cache")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["ranks"]) == 1024
    page = out / "report.html"
    assert page.stat().st_size < 10 * 1024 * 1024
    shutil.rmtree(run)  # the traces are no longer needed; keep the disk free for Chromium
    dom, stderr, pixels = open_in_chromium(page, tmp_path)
    check_page(dom, stderr, pixels, page)
