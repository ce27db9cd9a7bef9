"""GPU_IDLE on real traces: the H200 sample and idle-heavy traces from HTA and vLLM (tracelens.analyze.rank.idle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelens.run_analysis import analyze_run

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"

CASES = [
    (REPO / "sample_traces" / "h200-qwen35-block-seq4k", "host_bound", 0.75),
    (SHARED / "hta" / "df_index_resolver", "host_bound", 0.35),
    (SHARED / "hta" / "negative_queue_length_values_check", "other_stream", 0.55),
    # vLLM's capture of its piecewise graphs for 8,192 tokens, one step (docs/inference.md): the iteration's
    # annotation opens with a 115 ms hipDeviceSynchronize before the capture's first launch
    (SHARED / "more" / "tracelens-vllm-prefilldecode-piecewise", "synchronization", 0.8),
]


@pytest.mark.parametrize("path,cause,min_idle", CASES, ids=[c[0].name for c in CASES])
def test_idle_finding_with_dominant_cause(path, cause, min_idle):
    if not path.exists():
        pytest.skip(f"{path} is absent")
    a = analyze_run(path)
    s = a.summary()
    idle = [f for f in s["findings"] if f["code"] == "GPU_IDLE"]
    assert idle, [f["code"] for f in s["findings"]]
    f = max(idle, key=lambda f: f["idle_fraction"])
    assert f["cause"] == cause
    assert f["idle_fraction"] >= min_idle
    # the parts add up to the idle time, which equals the breakdown's idle of that rank
    assert sum(f["causes_ms"].values()) == pytest.approx(f["idle_ms"], rel=1e-6)
    rows = [r for r in s["ranks"] if r["rank"] == f["ranks"][0]]
    assert rows[0]["idle_ms"] == pytest.approx(f["idle_ms"], rel=0.02)
    if cause == "host_bound":
        assert f["host_ops_ms"], "the CPU ops behind host-bound idle are named"
