"""The report's tables as a reader sees them: counts as integers, large numbers with SI prefixes or thousands
separators, units in headers, long names cut with the whole name on hover, short names on one line."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from tracelens.report import html as H
from tracelens.views import ReportViews

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"


def test_numbers():
    assert H.number_text(128.0, "calls") == "128"  # a count, whole
    assert H.number_text(96.0, "calls") == "96"
    assert H.number_text(4112.0, "calls") == "4,112"
    assert H.number_text(2056.5, "calls") == "2,056.5"  # a mean count over steps
    assert H.number_text(67108864, "bytes") == "67,108,864"
    assert H.number_text(49.6967, "ms_per_step") == "49.697"
    assert H.number_text(4221.43, "total_ms") == "4,221.4"
    assert H.number_text(0.000123, "gflops") == "0.00012"  # small, not "0.000"
    assert H.number_text(0.0, "gflops") == "0.000"
    assert H.number_text(None, "calls") == H.number_text(float("nan"), "ms") == "\u2014"  # unknown: a dash
    assert H.si_text(157065412608.0, "FLOP") == "157.1 GFLOP"
    assert H.si_text(2250e12, "FLOP/s") == "2.250 PFLOP/s"
    assert H.si_text(4096, "tokens") == "4.096 ktokens"
    assert H.si_text(512, "B") == "512 B" and H.si_text(None) == "\u2014"


def test_name_cells_cut_long_names_and_keep_short_ones_on_one_line():
    long = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k"
    cell = H.name_cell(long)
    shown = html.unescape(re.sub(r"<[^>]+>", "", cell))
    assert len(shown) == H.NAME_MAX and shown.endswith("…") and long.startswith(shown[:-1])
    assert f'title="{long}"' in cell and "<wbr>" in cell  # the whole name on hover; wraps at separators
    short = H.name_cell("(no CPU op)")
    assert short == '<td class="name nw">(no CPU op)</td>'  # one line: no break opportunity, nowrap
    assert "title=" not in short
    path = H.name_cell("/very/long/" + "x" * 80 + "/run", keep_end=True)
    assert ">…" in path and path.endswith("/<wbr>run</td>") and '/run">' in path  # the end kept; all on hover
    # escaped: a name is text, also in its tooltip
    assert "<script>" not in H.name_cell("<script>" + "a" * 80)


def test_table_headers_wrap_after_slashes_and_name_columns_align_left():
    t = H.table_html([{"op": "aten::mm", "calls": 3.0}], [("op", "op"), ("calls/step", "calls")], ("op",))
    assert '<th class="name">op</th>' in t and "<th>calls/<wbr>step</th>" in t
    assert "<td>3</td>" in t


@pytest.mark.parametrize("name", ["qwen35-27b-seq4k-tp4pp4", "cpu-gloo-4rank"])
def test_report_tables_show_counts_as_integers_and_units(name):
    run_dir = SAMPLES / name
    if not run_dir.is_dir():
        pytest.skip(f"{run_dir} is absent")
    import tracelens
    from tracelens.report.html import build_sections, render

    run = tracelens.load(run_dir)
    summary = run.summary()
    page = render(summary, build_sections(ReportViews(run.analysis), summary))
    tables = re.findall(r"<table[^>]*>.*?</table>", page, re.S)
    assert tables
    for t in tables:
        heads = [
            html.unescape(re.sub(r"<[^>]+>", "", h)) for h in re.findall(r"<th[^>]*>(.*?)</th>", t, re.S)
        ]
        for row in re.findall(r"<tr>(.*?)</tr>", t, re.S):
            cells = [
                html.unescape(re.sub(r"<[^>]+>", "", c))
                for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
            ]
            for head, cell in zip(heads, cells):
                if head.startswith("calls"):  # calls per step: integers unless a mean over steps
                    assert re.fullmatch(r"[\d,]+(\.\d)?|\u2014", cell), (head, cell)
                    assert not re.fullmatch(r"[\d,]+\.0+", cell), (head, cell)
                if head in ("stage", "rank", "kernels", "group size", "world size"):
                    assert re.fullmatch(r"[\d,]+|\u2014", cell), (head, cell)
    # the ops row counts of the summary are whole numbers here: shown without decimals
    calls = [r["calls"] for r in summary["ops"]]
    assert calls and all(float(c).is_integer() for c in calls)
    # numeric headers name their unit (or are counts, ranks, stages, shares)
    unitless = {"stage", "rank", "op", "kernel", "CPU op", "layer type", "shapes", "bound", "model", "cause",
                "on rank", "op at the peak", "steps flagged", "kernels", "group size", "path",
                "bus bw n", "loss", "from", "what to change", "change", "what it costs"}  # fmt: skip
    for t in tables:
        if 'class="meta"' in t:
            continue
        for h in re.findall(r"<th[^>]*>(.*?)</th>", t, re.S):
            h = html.unescape(re.sub(r"<[^>]+>", "", h))
            assert h in unitless or re.search(
                r"ms|µs|GiB|GB/s|GFLOP|MB|TFLOP|TB|%|calls|bytes|\(x\)|last to", h
            ), h
    # metadata: FLOPs per token with an SI prefix, never a float of 12 digits
    if summary["mfu"] and summary["mfu"].get("flops_per_token"):
        assert "GFLOP</td>" in page and not re.search(r"<td>\d{9,}\.\d</td>", page)
    if name == "qwen35-27b-seq4k-tp4pp4":  # no CPU ops in the simulated traces
        assert '<td class="name nw" data-v="(no CPU op)">(no CPU op)</td>' in page
