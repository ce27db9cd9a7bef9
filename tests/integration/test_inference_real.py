"""Inference iterations on the real vLLM and SGLang traces of ../shared/traces/more (AMD TraceLens test data,
MI300X), against the engines' own annotations read from the trace files here; and the op models' coverage of
the SGLang Qwen3-8B prefill.

- tracelens-sglang-qwen3-prefilldecode: one engine step, `execute_15360_context_15(...)_generation_0(...)`
  with `step[EXTEND bs=15 toks=15360]` nested in it: a 15-request prefill of 15,360 tokens, no ProfilerStep;
- tracelens-vllm-decode-full-graphcapture / -prefilldecode-piecewise: vLLM's CUDA-graph captures
  `capture_32_FULL` (a decode graph of 32 tokens) and `capture_8192_PIECEWISE` (8,192 tokens, the graphs of
  prefill and mixed batches), no ProfilerStep;
- tracelens-sglang-decode-capture: `capture_32_DECODE` inside `ProfilerStep#134` (the step is kept).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import tracelens

REPO = Path(__file__).resolve().parents[2]
MORE = REPO.parent / "shared" / "traces" / "more"


def _run(name: str):
    d = MORE / name
    if not d.is_dir():
        pytest.skip(f"../shared/traces/more/{name} is absent")
    return d, tracelens.load(d, no_cache=True)


def _annotations(d: Path) -> list[dict]:
    """The trace's CPU-side user annotations, as the file has them."""
    (f,) = sorted(d.glob("*.json.gz"))
    with gzip.open(f) as fh:
        ev = json.loads(fh.read())["traceEvents"]
    return [e for e in ev if e.get("cat") == "user_annotation"]


@pytest.mark.parametrize(
    ("name", "annotation", "step", "phase", "tokens", "kind"),
    [
        (
            "tracelens-sglang-qwen3-prefilldecode",
            "execute_15360_context_15",
            0,
            "prefill",
            15360,
            "iteration",
        ),
        ("tracelens-vllm-decode-full-graphcapture", "capture_32_FULL", 0, "decode", 32, "capture"),
        ("tracelens-vllm-prefilldecode-piecewise", "capture_8192_PIECEWISE", 0, "mixed", 8192, "capture"),
        ("tracelens-sglang-decode-capture", "capture_32_DECODE", 134, "decode", 32, "capture"),
    ],
)
def test_engine_iterations_are_steps_with_phase_and_tokens(name, annotation, step, phase, tokens, kind):
    d, run = _run(name)
    ann = [a for a in _annotations(d) if a["name"].startswith(annotation)]
    assert len(ann) == 1  # the trace's one engine iteration
    s = run.summary()
    inf = s["inference"]
    assert s["run"]["steps"] == [step]
    (it,) = inf["iterations"]
    assert it["name"] == ann[0]["name"]
    assert (it["step"], it["phase"], it["tokens"], it["kind"]) == (step, phase, tokens, kind)
    assert set(inf["phases"]) == {phase} and inf["phases"][phase]["steps"] == 1
    st = s["ranks"][0]["step_time_ms"]
    assert it["step_time_ms"] == pytest.approx(st) and it["ms_per_token"] == pytest.approx(
        st / tokens, rel=1e-5
    )
    assert not any(f["code"] == "NO_STEPS" for f in s["findings"])
    # the step holds the iteration: its time is at least the annotation's CPU span (the GPU may run later)
    assert st >= ann[0]["dur"] / 1e3 - 1e-3
    if step == 0:  # the marker made for the iteration spans its annotation exactly
        ev = run.events
        mark = ev[(ev["name"] == "ProfilerStep#0") & (ev["kind"] == "user_annotation")]
        assert len(mark) == 1 and mark["dur_ns"].iloc[0] == round(ann[0]["dur"] * 1000)


def test_sglang_prefill_states_its_requests_and_attention_sums():
    d, run = _run("tracelens-sglang-qwen3-prefilldecode")
    it = run.summary()["inference"]["iterations"][0]
    # execute_15360_context_15(sq15360 sk15360 sqsq15728640 sqsk15728640)_generation_0(...): 15 x 1,024 tokens
    assert (it["requests"], it["prefill_tokens"], it["decode_tokens"]) == (15, 15360, 0)
    assert 15 * 1024 * 1024 == 15728640
    phase = run.summary()["inference"]["phases"]["prefill"]
    # the step: 492.8 ms of kernels, the rest idle (the CPU blocked in a copy before the forward's launches)
    assert phase["compute_ms"] == pytest.approx(run.summary()["ranks"][0]["compute_ms"])
    assert phase["idle_ms"] + phase["compute_ms"] <= phase["step_time_ms"] + 1e-6


def test_ops_with_a_model_cover_95_percent_of_the_sglang_prefill():
    """Every op of the SGLang Qwen3-8B prefill's GPU time has a FLOPs model but a few tiny ones (AMD
    TraceLens rates 96%): the GEMMs, aiter's batch-prefill attention, fused RMSNorm, silu_and_mul, rotary
    embedding and the KV-cache store."""
    _, run = _run("tracelens-sglang-qwen3-prefilldecode")
    ops = run.op_table()
    total = ops["ms_per_step"].sum()
    rated = ops.loc[ops["flops"].notna(), "ms_per_step"].sum()
    assert rated / total >= 0.95
    models = set(ops.loc[ops["flops"].notna(), "model"])
    assert {"gemm", "attention", "norm", "activation", "rotary", "kv_cache"} <= models
    # attention: 36 layers x 2*32 heads*(128+128)*15*(1024^2 - 1024^2/2) pairs, as the annotation's sums say
    att = ops[ops["op"] == "aiter::mha_batch_prefill"]
    assert att["flops"].sum() == pytest.approx(36 * 2 * 32 * 256 * (15728640 - 15728640 / 2))
