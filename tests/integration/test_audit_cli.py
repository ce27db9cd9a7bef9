"""`tracelens audit-layout` end to end: the issue's acceptance commands, JSON output and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

pytest.importorskip("typer")


def _run(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, through its real entry point (exit codes included; tests/cli.py)."""
    return _cli("audit-layout", *args, cwd=Path(__file__).resolve().parents[2])


def test_tp8_pp4_human():
    res = _run("--model", "qwen3.5-27b", "--tp", "8", "--pp", "4")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "REPLICATED 2x" in out
    assert "K/V head replication: 2x" in out
    assert "KV_HEAD_REPLICATION" in out
    assert "DeltaNet limit: 16 QK heads / 48 V heads: TP must divide 16" in out


def test_tp4_pp2_clean_json():
    res = _run("--model", "Qwen3.5-27B", "--tp", "4", "--pp", "2", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["clean"] is True and d["findings"] == []
    assert d["layout"] == {"tp": 4, "pp": 2, "cp": 1, "dp": 1, "world_size": 8}
    assert d["clean_degrees"]["tp"] == [1, 2, 4]
    human = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "2")
    assert "Findings: none, the layout is clean" in human.stdout


def test_tp4_pp4_is_not_clean_stage_3_holds_the_lm_head():
    """Its own stage table shows stage 3 at 45.0 vs 37.4 GFLOP/token (4,096 tokens): STAGE_IMBALANCE,
    as `tracelens analyze` finds on the simulated tp4 pp4 run; a warning, so exit 0."""
    res = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "4", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["clean"] is False
    (imb,) = [f for f in d["findings"] if f["code"] == "STAGE_IMBALANCE"]
    fl = [st["flops_per_token"]["4096"] for st in d["stages"]]
    assert imb["stages"] == [3] and imb["seq_len"] == 4096 and imb["severity"] == "warning"
    assert imb["imbalance"] == pytest.approx(fl[3] / (sum(fl) / 4), abs=1e-4)
    assert round(fl[3] / 1e9, 1) == 45.0 and round(fl[0] / 1e9, 1) == 37.4
    human = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "4").stdout
    assert "clean" not in human.split("Findings")[-1].replace("Not clean", "")
    assert "stage 3 does 45.0 GFLOP/token" in human and "Not clean: 0 error(s), 1 warning(s)" in human


def test_error_findings_exit_1():
    res = _run("--model", "qwen3.5-27b", "--tp", "3", "--pp", "5")
    assert res.returncode == 1, res.stderr
    assert "[error] INDIVISIBLE_DIMENSION" in res.stdout and "(exit 1)" in res.stdout
    assert _run("--model", "qwen3.5-27b", "--tp", "3", "--pp", "5", "--json").returncode == 1


def test_pp3_names_the_attention_heavy_stage():
    res = _run("--model", "qwen35-27b", "--tp", "4", "--pp", "3", "--json")
    d = json.loads(res.stdout)
    unequal = [f for f in d["findings"] if f["code"] == "UNEQUAL_STAGE_COMPOSITION"]
    assert unequal and unequal[0]["stages"] == [2]
    human = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "3")
    assert "stage 2 holds 6 full-attention layers" in human.stdout


def test_config_file_and_split(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 1000,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    res = _run(
        "--model", str(path), "--tp", "4", "--pp", "2", "--split", "5,3", "--seq-len", "1024", "--json"
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["layer_split"] == [5, 3] and d["split_source"] == "given"
    assert d["kv_replication"]["factor"] == 2


@pytest.mark.parametrize(
    "args",
    [
        ("--model", "no-such-model", "--tp", "2"),
        ("--model", "qwen3.5-27b", "--tp", "0"),
        ("--model", "qwen3.5-27b", "--pp", "3", "--split", "1,2"),
        ("--model", "qwen3.5-27b", "--split", "a,b"),
    ],
)
def test_bad_input_exits_2(args):
    res = _run(*args)
    assert res.returncode == 2
    assert res.stderr.startswith("tracelens: error:") and len(res.stderr.strip().splitlines()) == 1
