"""The per-op view on real GPU traces.

- sample_traces/h200-qwen35-block-seq4k (H200, recorded without `record_shapes`): the op table's measured
  GPU time of the block's GEMMs and cuDNN attention, with the FLOPs those ops do at the shapes the
  recording script ran (truth.json `dims`), gives achieved TFLOP/s below the H200 peak and above 10% of it.
- ../shared/traces/more/tracelens-{h100,mi300}-qwen15 (Qwen1.5-0.5B prefill, 16 x 559 tokens, recorded
  with shapes): tracelens's own per-op FLOPs; the GEMMs' TFLOP/s are plausible against the peaks and the
  per-op FLOPs of one decoder block sum to the model's forward FLOPs per token (docs/mfu.md) within 5%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracelens
from tracelens.models import get_model, model_from_config
from tracelens.models.flops import layer_forward_flops
from tracelens.models.op_flops import op_cost

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "sample_traces" / "h200-qwen35-block-seq4k"
MORE = REPO.parent / "shared" / "traces" / "more"
PEAK_H200 = 989e12


@pytest.fixture(scope="module")
def h200():
    if not H200.is_dir():
        pytest.skip("sample_traces/h200-qwen35-block-seq4k is absent")
    return tracelens.load(H200, no_cache=True), json.loads((H200 / "truth.json").read_text())


def test_h200_sample_has_no_shapes_so_flops_are_null(h200):
    run, _ = h200
    ops = run.op_table()
    assert len(ops) > 20 and ops["ms_per_step"].gt(0).all()
    assert ops["flops"].isna().all() and ops["tflops"].isna().all() and ops["bound"].isna().all()
    assert set(run.summary()["ops"][0]) >= {
        "op",
        "kernel",
        "stage",
        "layer_type",
        "calls",
        "ms_per_step",
        "flops",
        "bytes",
        "tflops",
        "tbps",
        "bound",
        "roofline_pct",
    }


def test_h200_mlp_gemms_and_attention_are_plausible_against_the_peak(h200):
    run, truth = h200
    d, s = truth["dims"], truth["run"]["seq"]
    ops = run.op_table()
    # the MLP of each layer: gate_up [S, H] x [H, 2F] and down [S, F] x [F, H]; forward, dgrad, wgrad
    mm = ops[(ops["op"] == "aten::mm") & (ops["layer_type"] == "mlp")]
    assert mm["calls"].sum() == 4 * 2 * 3
    flops = 3 * 4 * 2.0 * s * d["hidden"] * (2 * d["ffn"] + d["ffn"])
    tflops = flops / (mm["ms_per_step"].sum() / 1e3)
    assert 0.10 * PEAK_H200 < tflops < PEAK_H200
    # cuDNN flash attention: q, k, v [1, 6, S, 256] (K/V repeated for GQA), causal
    q = [1, d["q_heads"], s, d["head_dim"]]
    bf = "c10::BFloat16"
    fwd = op_cost(
        "aten::_cudnn_attention_forward",
        [q, q, q] + [[]] * 10,
        [bf] * 3 + ["Scalar"] * 10,
        [""] * 10 + ["True"],
    )
    bwd = op_cost(
        "aten::_cudnn_attention_backward",
        [q] * 6 + [[]] * 10,
        [bf] * 6 + ["Scalar"] * 10,
        [""] * 14 + ["True"],
    )
    assert fwd is not None and bwd is not None
    for name, cost in (("aten::_cudnn_attention_forward", fwd), ("aten::_cudnn_attention_backward", bwd)):
        row = ops[ops["op"] == name]
        assert len(row) == 1 and row["calls"].iloc[0] == 1 and row["layer_type"].iloc[0] == "full_attention"
        achieved = cost.flops / (row["ms_per_step"].iloc[0] / 1e3)
        assert 0.10 * PEAK_H200 < achieved < PEAK_H200, (name, achieved / 1e12)


QWEN15 = dict(
    model_type="qwen2",
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    intermediate_size=2816,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)


@pytest.mark.parametrize(
    "name,peak", [("tracelens-h100-qwen15", 989e12), ("tracelens-mi300-qwen15", 1307e12)]
)
def test_qwen15_prefill_gemms_and_block_flops(name, peak):
    path = MORE / name
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    run = tracelens.load(path, no_cache=True)
    ops = run.op_table()
    assert ops["flops"].notna().sum() > 20
    gemm = ops[(ops["model"] == "gemm") & (ops["ms_per_step"] > 0.5)]
    assert len(gemm) >= 3
    for tf in gemm["tflops"]:
        assert 0.10 * peak < tf * 1e12 < peak
    attn = ops[ops["model"] == "attention"]
    assert len(attn) and (attn["tflops"] * 1e12 < peak).all() and (attn["tflops"] > 0).all()
    assert (gemm["bound"] == "compute").all() and gemm["roofline_pct"].between(10, 100).all()
    # one decoder block: every modelled op except those on the vocabulary (embedding), over 24 layers
    vocab = ops["shapes"].fillna("").str.contains(str(QWEN15["vocab_size"]))
    per_block = ops.loc[~vocab, "flops"].sum() / QWEN15["num_hidden_layers"]
    model = model_from_config(QWEN15, "qwen1.5-0.5b")
    tokens, seq = 16 * 559, 559
    want = sum(layer_forward_flops(model, "full_attention", seq).values()) * tokens
    assert per_block == pytest.approx(want, rel=0.05)


def test_analyze_ops_prints_the_top_of_the_table(tmp_path):
    import os
    import subprocess
    import sys

    sample = REPO / "sample_traces" / "cpu-gloo-4rank"
    if not sample.is_dir():
        pytest.skip("sample_traces/cpu-gloo-4rank is absent")
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracelens",
            "analyze",
            str(sample),
            "-o",
            str(tmp_path / "o"),
            "--no-cache",
            "--no-report",
            "--ops",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "Top ops" in r.stdout
    top = max(
        json.loads((tmp_path / "o" / "summary.json").read_text())["ops"], key=lambda x: x["ms_per_step"]
    )
    assert top["op"] in r.stdout and f"{top['ms_per_step']:,.3f}" in r.stdout


BLOCK_CPU = REPO / "tests" / "data" / "qwen35-block-seq256-cpu"


def test_block_flops_match_the_model_on_a_recording_with_shapes():
    """The H200 sample's block (scripts/record_cuda_block.py, one TP=4 rank's shard of Qwen3.5-27B layers
    12-15: 3 Gated DeltaNet + 1 gated attention, each with its MLP), recorded on a CPU with shapes at 256
    tokens, forward + backward: the per-op FLOPs of the step equal the model's Megatron training FLOPs per
    token of those four layers, over the TP shard, x tokens (docs/mfu.md) within 5%."""
    if not BLOCK_CPU.is_dir():
        pytest.skip("tests/data/qwen35-block-seq256-cpu is absent")
    truth = json.loads((BLOCK_CPU / "truth.json").read_text())
    run = tracelens.load(BLOCK_CPU, no_cache=True)
    ops = run.op_table()
    seq, tp = truth["runs"][0]["seq"], truth["tp_shard_of"]
    model = get_model("qwen3.5-27b")
    per_token = sum(
        3 * sum(layer_forward_flops(model, kind, seq).values())
        for kind in ("linear_attention", "linear_attention", "linear_attention", "full_attention")
    )
    want = per_token / tp * seq * truth["microbatch"]
    got = ops["flops"].sum()
    assert got == pytest.approx(want, rel=0.05)
    # where the FLOPs are: GEMMs (the eager chunked DeltaNet's bmm included), then the attention core
    by_model = ops.groupby("model")["flops"].sum() / want
    assert by_model["gemm"] > 0.95 and 0 < by_model["attention"] < 0.01
    by_layer = ops.groupby("layer_type")["flops"].sum() / want
    assert set(by_layer.index) >= {"mlp", "linear_attention", "full_attention"}
