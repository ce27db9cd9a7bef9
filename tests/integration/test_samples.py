"""Committed simulated samples: byte-for-byte reproducible from command.txt, truth consistent with the traces,
analyzable with the CLI, and the 4,096 vs 262,144-token physics visible from module annotations alone."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracelens.cli import app

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
SIMULATED = sorted(p.parent for p in SAMPLES.glob("*/command.txt") if (p.parent / "truth.json").is_file())
SMALLEST = min(SIMULATED, key=lambda d: sum(f.stat().st_size for f in d.iterdir())) if SIMULATED else None
NCCL = re.compile(r"^nccl(Dev)?Kernel_")
ATTN = re.compile(r"^layers\.\d+\.self_attn(\.backward)?$")

pytestmark = pytest.mark.skipif(not SIMULATED, reason="no simulated samples in sample_traces/")


def regenerate(sample: Path, out: Path) -> None:
    args = shlex.split((sample / "command.txt").read_text().strip())
    assert args[:2] == ["tracelens", "simulate"]
    i = args.index("-o")
    args[i + 1] = str(out)
    res = CliRunner().invoke(app, args[1:])
    assert res.exit_code == 0, res.output


#: zlib that wrote the committed .gz files (another zlib build may compress the same bytes differently)
SAMPLE_ZLIB = "1.2.13"


def assert_identical(sample: Path, out: Path) -> None:
    # ignore command.txt and hidden folders (the analyzer's .tracelens/ cache)
    want = sorted(f.name for f in sample.iterdir() if f.name != "command.txt" and f.name[0] != ".")
    got = sorted(f.name for f in out.iterdir())
    assert got == want
    same_zlib = zlib.ZLIB_RUNTIME_VERSION == SAMPLE_ZLIB
    for name in want:
        a, b = (out / name).read_bytes(), (sample / name).read_bytes()
        if name.endswith(".gz"):
            assert gzip.decompress(a) == gzip.decompress(b), name
            if not same_zlib:
                continue
        assert a == b, name


def test_smallest_sample_reproduces_byte_for_byte(tmp_path):
    regenerate(SMALLEST, tmp_path / "regen")
    assert_identical(SMALLEST, tmp_path / "regen")


@pytest.mark.slow
@pytest.mark.parametrize("sample", SIMULATED, ids=lambda p: p.name)
def test_every_sample_reproduces_byte_for_byte(sample, tmp_path):
    regenerate(sample, tmp_path / "regen")
    assert_identical(sample, tmp_path / "regen")


def _ns(x: float) -> int:
    return round(x * 1000)


def _union(iv, lo, hi) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _traces(sample: Path):
    for f in sorted(sample.glob("*.pt.trace.json.gz")):
        with gzip.open(f, "rt") as fh:
            yield json.load(fh)


@pytest.mark.slow
@pytest.mark.parametrize("sample", SIMULATED, ids=lambda p: p.name)
def test_truth_compute_matches_trace(sample):
    truth = json.loads((sample / "truth.json").read_text())
    n = 0
    for t in _traces(sample):
        rank = t["distributedInfo"]["rank"]
        ev = t["traceEvents"]
        steps = [
            (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in ev
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        ]
        comp = [
            (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in ev
            if e.get("cat") == "kernel" and not NCCL.match(e["name"])
        ]
        rows = truth["ranks"][rank]["steps"]
        assert len(steps) == len(rows)
        for (lo, hi), row in zip(steps, rows, strict=True):
            assert abs(_union(comp, lo, hi) - row["compute_ns"]) <= 0.01 * row["compute_ns"]
        n += 1
    assert n == truth["layout"]["world_size"]


def _attention_share(sample: Path) -> float:
    """Mean over ranks and steps of (self_attn gpu_user_annotation time) / (ProfilerStep time)."""
    shares = []
    for t in _traces(sample):
        ev = t["traceEvents"]
        steps = [
            (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in ev
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        ]
        attn = [
            (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in ev
            if e.get("cat") == "gpu_user_annotation" and ATTN.match(e["name"])
        ]
        for lo, hi in steps:
            shares.append(_union(attn, lo, hi) / (hi - lo))
    return sum(shares) / len(shares)


@pytest.mark.slow
def test_long_context_attention_share_from_annotations():
    short, long_ = SAMPLES / "qwen35-27b-seq4k-tp4pp4", SAMPLES / "qwen35-27b-seq256k-tp2pp4cp2"
    if not (short.is_dir() and long_.is_dir()):
        pytest.skip("4k / 256k samples absent")
    s4k, s256k = _attention_share(short), _attention_share(long_)
    assert s256k >= 4 * s4k
    truth = json.loads((short / "truth.json").read_text())
    assert s4k == pytest.approx(truth["attention_share"], rel=0.01)


@pytest.mark.slow
def test_analyzer_matches_truth_on_smallest_sample(tmp_path):
    """The foundation's CLI ingests the sample; per-rank compute and MFU match truth.json within 1%."""
    res = CliRunner().invoke(app, ["analyze", str(SMALLEST), "-o", str(tmp_path / "rep"), "--no-cache"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    truth = json.loads((SMALLEST / "truth.json").read_text())
    assert len(summary["ranks"]) == truth["layout"]["world_size"]
    for row in summary["ranks"]:
        steps = truth["ranks"][row["rank"]]["steps"]
        want_ms = sum(s["compute_ns"] for s in steps) / len(steps) / 1e6
        assert row["compute_ms"] == pytest.approx(want_ms, rel=0.01)
    if summary.get("mfu") and summary["mfu"].get("value") is not None:
        assert summary["mfu"]["value"] == pytest.approx(truth["mfu"]["value"], rel=0.01)


def test_committed_samples_stay_under_20_mb():
    """Issue 3's budget for everything in sample_traces/ (caches and reports written by runs excluded)."""
    files = [
        f
        for f in SAMPLES.rglob("*")
        if f.is_file() and not any(p.startswith(".") for p in f.relative_to(SAMPLES).parts)
    ]
    assert sum(f.stat().st_size for f in files) <= 20_000_000
