"""`tracelens audit-layout` end to end: the issue's acceptance commands, JSON output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("typer")


def _run(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter, as a user would (exit codes come from the real entry point)."""
    code = "import sys; from tracelens.cli import app; sys.argv = ['tracelens', *sys.argv[1:]]; app()"
    return subprocess.run([sys.executable, "-c", code, "audit-layout", *args],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[2])


def test_tp8_pp4_human():
    res = _run("--model", "qwen3.5-27b", "--tp", "8", "--pp", "4")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "REPLICATED 2x" in out
    assert "K/V head replication: 2x" in out
    assert "KV_HEAD_REPLICATION" in out
    assert "DeltaNet limit: 16 QK heads / 48 V heads: TP must divide 16" in out


def test_tp4_pp4_clean_json():
    res = _run("--model", "Qwen3.5-27B", "--tp", "4", "--pp", "4", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["clean"] is True and d["findings"] == []
    assert d["layout"] == {"tp": 4, "pp": 4, "cp": 1, "dp": 1, "world_size": 16}
    assert d["clean_degrees"]["tp"] == [1, 2, 4]
    human = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "4")
    assert "Findings: none, the layout is clean" in human.stdout


def test_pp3_names_the_attention_heavy_stage():
    res = _run("--model", "qwen35-27b", "--tp", "4", "--pp", "3", "--json")
    d = json.loads(res.stdout)
    unequal = [f for f in d["findings"] if f["code"] == "UNEQUAL_STAGE_COMPOSITION"]
    assert unequal and unequal[0]["stages"] == [2]
    human = _run("--model", "qwen3.5-27b", "--tp", "4", "--pp", "3")
    assert "stage 2 holds 6 full-attention layers" in human.stdout


def test_config_file_and_split(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    res = _run("--model", str(path), "--tp", "4", "--pp", "2", "--split", "5,3", "--seq-len", "1024", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["layer_split"] == [5, 3] and d["split_source"] == "given"
    assert d["kv_replication"]["factor"] == 2


@pytest.mark.parametrize("args", [
    ("--model", "no-such-model", "--tp", "2"),
    ("--model", "qwen3.5-27b", "--tp", "0"),
    ("--model", "qwen3.5-27b", "--pp", "3", "--split", "1,2"),
    ("--model", "qwen3.5-27b", "--split", "a,b"),
])
def test_bad_input_exits_2(args):
    res = _run(*args)
    assert res.returncode == 2
    assert res.stderr.startswith("tracelens: error:") and len(res.stderr.strip().splitlines()) == 1
