"""The command line's small print: help without `<bool>` on flags, a mistyped flag in one line (exit 2), --gpu
against the GPU the traces name, audit-layout's assumed sequence length, a step annotation never named as
the CPU op behind idle time, and docs/summary.md naming each finding code once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli import tracelens
from tracelens.analyze.efficiency.mfu_checks import gpu_conflicts

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "sample_traces" / "h200-qwen35-block-seq4k"
GLOO = REPO / "sample_traces" / "cpu-gloo-4rank"
RESNET = REPO.parent / "shared" / "traces" / "more" / "kineto-tbplugin-resnet50-nw0"
COMMANDS = [[], ["analyze"], ["compare"], ["check"], ["audit-layout"], ["ingest"], ["simulate"],
            ["report", "export-trace"]]  # fmt: skip


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "tracelens")
def test_help_shows_no_type_after_on_off_flags(cmd):
    r = tracelens(*cmd, "-h", env={"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    assert "<bool>" not in r.stdout
    assert "--help" in r.stdout and "Show this message and exit." in r.stdout
    if cmd == ["analyze"]:
        # the flags are still listed (and options with values keep their type)
        for flag in ("--force", "--no-cache", "--no-report", "--force-layout", "--ops"):
            assert re.search(rf"{flag}\s", r.stdout), flag
        assert re.search(r"--seq-len\s+<int>", r.stdout)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["analyze", str(GLOO), "--forse"], ["No such option: --forse", "--force", "tracelens analyze -h"]),
        (["analyze"], ["Missing argument", "run_dir"]),
        (["audit-layout", "--model", "qwen3.5-27b", "--tp", "x"], ["--tp", "integer"]),
        (["anlyze", str(GLOO)], ["No such command", "analyze"]),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args, needles):
    r = tracelens(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracelens: error: "), r.stderr
    for n in needles:
        assert n in lines[0]
    assert "╭" not in r.stderr and r.stdout == ""


def test_a_usage_error_is_one_line_from_the_installed_command_too():
    """The same through a fresh `python -m tracelens` (the console script's entry point, tracelens._app.main)."""
    r = tracelens("analyze", str(GLOO), "--forse", fresh=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "No such option: --forse" in r.stderr


def test_gpu_conflicts():
    assert gpu_conflicts("B200", ["NVIDIA H200"]) == [
        "--gpu B200 contradicts the traces, which name NVIDIA H200; the flag wins: peak FLOP/s, MFU and the "
        "roofline use B200"
    ]
    assert gpu_conflicts("H200", ["NVIDIA H200", "NVIDIA H200"]) == []  # the same family
    assert gpu_conflicts("h100", ["NVIDIA H100 80GB HBM3"]) == []
    assert gpu_conflicts("H100 PCIe", ["NVIDIA H100 80GB HBM3"]) != []  # another H100 (its peak differs)
    assert gpu_conflicts("T4", ["Tesla T4"]) == []  # no known family: one name inside the other
    assert gpu_conflicts("B200", []) == [] and gpu_conflicts(None, ["NVIDIA H200"]) == []
    msg = gpu_conflicts("B200", ["NVIDIA H200"], from_config=True)[0]
    assert msg.startswith("[hardware] gpu = 'B200' in tracelens.toml contradicts") and "the file wins" in msg


@pytest.mark.skipif(not H200.is_dir(), reason=f"{H200} is absent")
def test_gpu_flag_against_the_traces_is_a_warning(tmp_path):
    meta = tracelens("ingest", str(H200), "-o", str(tmp_path / "pq"))
    assert meta.returncode == 0
    import pyarrow.parquet as pq

    traced = set(pq.read_table(tmp_path / "pq" / "metadata.parquet").column("gpu_name").to_pylist())
    assert traced == {"NVIDIA H200"}  # what the trace's deviceProperties say
    r = tracelens("analyze", str(H200), "--gpu", "B200", "-o", str(tmp_path / "b200"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "b200" / "summary.json").read_text())
    warn = [w for w in s["run"]["warnings"] if w.startswith("--gpu B200")]
    assert warn and "NVIDIA H200" in warn[0] and s["run"]["gpu"] == "B200"
    assert "[note] --gpu B200 contradicts the traces" in r.stdout
    same = tracelens("analyze", str(H200), "--gpu", "H200", "-o", str(tmp_path / "h200"))
    s2 = json.loads((tmp_path / "h200" / "summary.json").read_text())
    assert same.returncode == 0 and not any("--gpu" in w for w in s2["run"]["warnings"])


def test_audit_layout_says_which_sequence_length_it_assumed():
    from tracelens.models import get_model

    ctx = get_model("qwen3.5-27b").max_position_embeddings  # the model's context length: 262,144
    r = tracelens("audit-layout", "--model", "qwen3.5-27b", "--tp", "8", "--pp", "4")
    assert r.returncode == 0, r.stderr
    assert f"Sequence length: not given (--seq-len); stage FLOPs at 4,096 and {ctx:,} tokens" in r.stdout
    kv = next(line for line in r.stdout.splitlines() if "KV_HEAD_REPLICATION" in line)
    assert f"(at {ctx:,} tokens, the model's context length: no --seq-len given)" in kv
    assert f"of model FLOPs at {ctx:,} tokens" in r.stdout
    assert f"at {ctx} tokens" not in r.stdout  # (no unformatted length left)
    given = tracelens("audit-layout", "--model", "qwen3.5-27b", "--tp", "8", "--pp", "4", "--seq-len", "8192")
    assert given.returncode == 0 and "not given" not in given.stdout and "no --seq-len" not in given.stdout
    assert "seq_len 8,192" in given.stdout.splitlines()[0]


@pytest.mark.skipif(not RESNET.is_dir(), reason=f"{RESNET} is absent")
def test_idle_finding_on_resnet50_names_the_data_loader_not_the_step():
    """The Kineto ResNet-50 trace records ProfilerStep#N as an Operator (a cpu_op): the host-bound idle is
    the DataLoader's __next__ inside it (about 70 ms of the 176 ms ProfilerStep#9 in the trace)."""
    from tracelens.run_analysis import analyze_run

    s = analyze_run(RESNET).summary()
    idle = [f for f in s["findings"] if f["code"] == "GPU_IDLE"]
    assert idle and idle[0]["cause"] == "host_bound"
    ops = idle[0]["host_ops_ms"]
    assert not any(n.startswith("ProfilerStep#") for n in ops) and "ProfilerStep" not in idle[0]["message"]
    assert max(ops, key=ops.get) == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def test_summary_docs_list_each_finding_code_once():
    text = (REPO / "docs" / "summary.md").read_text(encoding="utf-8")
    table = text[text.index("## Finding codes") :].split("\n\n", 1)[0]
    codes = re.findall(r"^\| ([A-Z][A-Z0-9_]+) \|", table, re.M)
    assert "LAYOUT_INCONSISTENT" in codes and len(codes) == len(set(codes)), codes
