"""compare(): side-by-side metrics, deltas, per-token normalisation and the biggest change, by hand."""

from __future__ import annotations

import pytest

from tracelens.commands.compare import parse_labels
from tracelens.errors import BadInputError
from tracelens.summaries.compare import compare, shares, stage_imbalance


def summary(
    step=100.0,
    compute=60.0,
    exposed=30.0,
    idle=10.0,
    bubble=None,
    tokens=None,
    mfu=None,
    share=None,
    stages=None,
    stragglers=(),
    findings=(),
):
    ranks = [
        {
            "rank": r,
            "step_time_ms": step,
            "compute_ms": compute,
            "exposed_comm_ms": exposed,
            "overlapped_comm_ms": 0.0,
            "memcpy_ms": 0.0,
            "idle_ms": idle,
            "bubble_ms": bubble,
        }
        for r in range(2)
    ]
    s = {
        "schema": "tracelens.summary/1",
        "run": {"name": "r", "path": "/r"},
        "ranks": ranks,
        "stages": stages or [],
        "stragglers": [{"rank": r, "cause": "compute"} for r in stragglers],
        "mfu": {"value": mfu, "tokens_per_step": tokens} if (mfu is not None or tokens is not None) else None,
        "findings": [{"code": c, "severity": "warning", "message": c} for c in findings],
        "per_step": [],
    }
    if share is not None:
        s["composition"] = {"time_share": share, "stages": {}}
    return s


def metric(cmp, key):
    return next(m for m in cmp["metrics"] if m["key"] == key)


def test_full_attention_share_rising_is_the_biggest_change():
    a = summary(
        step=100.0,
        tokens=4096,
        mfu=0.40,
        share={"full_attention": 0.10, "linear_attention": 0.25, "mlp": 0.35},
    )
    b = summary(
        step=9600.0,
        compute=5800.0,
        exposed=3000.0,
        idle=800.0,
        tokens=262144,
        mfu=0.30,
        share={"full_attention": 0.50, "linear_attention": 0.12, "mlp": 0.18},
    )
    c = compare(a, b, ("seq 4,096", "seq 262,144"))
    assert c["biggest"]["key"] == "share.full_attention"
    assert c["biggest"]["delta"] == pytest.approx(0.40)
    assert c["text"][0] == (
        "Biggest change: Full attention's share of step time rose from 10.0% (seq 4,096) to "
        "50.0% (seq 262,144), +40.0 points."
    )
    # per token: 100 ms / 4,096 tokens vs 9,600 ms / 262,144 tokens, per 1,000 tokens
    pt = metric(c, "step_time_per_1k_tokens_ms")
    assert pt["a"] == pytest.approx(100 / 4096 * 1000) and pt["b"] == pytest.approx(9600 / 262144 * 1000)
    assert pt["ratio"] == pytest.approx((9600 / 262144) / (100 / 4096))
    assert metric(c, "step_time_ms")["ratio"] == pytest.approx(96.0)
    assert "per 1,000 tokens" in c["text"][1] and c["per_token"] is True
    assert metric(c, "mfu")["delta"] == pytest.approx(-0.10)
    # ranking order: full attention (+40), then mlp (-17), linear (-13), mfu (-10); compute share 60 -> 60.4
    assert [x["key"] for x in c["changes"][:4]] == [
        "share.full_attention",
        "share.mlp",
        "share.linear_attention",
        "mfu",
    ]


def test_shares_of_step_time():
    s = summary(step=100.0, compute=60.0, exposed=30.0, idle=10.0, bubble=4.0)
    sh = shares(s)
    assert sh["compute"] == pytest.approx(0.6) and sh["exposed_comm"] == pytest.approx(0.3)
    assert sh["idle"] == pytest.approx(0.1) and sh["bubble"] == pytest.approx(0.04)
    assert sh["exposed_wait"] is None  # no rank reports the split


def test_stage_imbalance_and_bubble():
    stages = [
        {"stage": 0, "compute_ms": 30.0, "bubble_fraction": 0.2},
        {"stage": 1, "compute_ms": 10.0, "bubble_fraction": 0.4},
    ]
    assert stage_imbalance({"stages": stages}) == pytest.approx(1.5)
    c = compare(summary(stages=stages), summary())
    assert (
        metric(c, "bubble_fraction")["a"] == pytest.approx(0.3) and metric(c, "bubble_fraction")["b"] is None
    )
    assert metric(c, "stage_imbalance")["a"] == pytest.approx(1.5)


def test_without_tokens_raw_times_only_and_no_layer_types():
    c = compare(summary(), summary(step=120.0, compute=72.0, exposed=36.0, idle=12.0), ("a", "b"))
    keys = {m["key"] for m in c["metrics"]}
    assert "step_time_per_1k_tokens_ms" not in keys and not any(
        m["group"] == "layer_types" for m in c["metrics"]
    )
    assert c["per_token"] is False
    assert "tokens per step unknown" in c["text"][1]
    # every share is unchanged: nothing to name
    assert c["biggest"] is None and c["text"][0].startswith("No share of step time")


def test_stragglers_and_findings_diff():
    c = compare(summary(findings=("STRAGGLER",)), summary(stragglers=(3,), findings=("EXPOSED_COMM_HIGH",)))
    assert metric(c, "stragglers")["a"] == 0 and metric(c, "stragglers")["b"] == 1
    assert "New in B: EXPOSED_COMM_HIGH." in c["text"] and "Gone in B: STRAGGLER." in c["text"]
    assert c["stragglers"]["b"] == [{"rank": 3, "cause": "compute"}]


def test_nan_and_missing_values_are_none():
    a = summary()
    a["ranks"][0]["step_time_ms"] = float("nan")
    a["ranks"][1]["step_time_ms"] = None
    c = compare(a, summary())
    assert metric(c, "step_time_ms")["a"] is None and metric(c, "step_time_ms")["delta"] is None


@pytest.mark.parametrize(
    ("given", "want"),
    [
        (["seq 4,096,seq 262,144"], ("seq 4,096", "seq 262,144")),
        (['"seq 4,096","seq 262,144"'], ("seq 4,096", "seq 262,144")),
        (["base,new"], ("base", "new")),
        (["1,000,2,000"], ("1,000", "2,000")),
        (["a,b", "c"], ("a,b", "c")),
        (None, None),
    ],
)
def test_parse_labels(given, want):
    assert parse_labels(given) == want


def test_parse_labels_rejects_one_or_three():
    with pytest.raises(BadInputError):
        parse_labels(["only"])
    with pytest.raises(BadInputError):
        parse_labels(["a,b,c"])


def test_load_side_reads_an_analyze_output_folder(tmp_path):
    import json

    from tracelens.commands.compare import load_side

    s = summary(tokens=4096)
    (tmp_path / "summary.json").write_text(json.dumps(s))
    (tmp_path / "report.html").write_text("<html></html>")
    assert load_side(tmp_path) == s
    other = tmp_path / "base.json"  # any name: the schema says it is a summary
    other.write_text(json.dumps(s))
    assert load_side(other) == s


def test_runs_and_layout_difference_are_named():
    a, b = summary(), summary()
    a["run"].update(layout={"tp": 4, "pp": 4, "dp": 1, "cp": 1}, seq_len=4096, world_size=16, gpu="H200")
    b["run"].update(layout={"tp": 2, "pp": 4, "dp": 1, "cp": 2}, seq_len=262144, world_size=16, gpu="H200")
    c = compare(a, b, ("4k", "256k"))
    assert c["runs"]["a"]["layout"] == "tp=4, pp=4, dp=1, cp=1" and c["runs"]["b"]["seq_len"] == 262144
    assert (
        "The layouts differ (4k: tp=4, pp=4, dp=1, cp=1; 256k: tp=2, pp=4, dp=1, cp=2): part of any change "
        "comes from the layout."
    ) in c["text"]
    assert not any("layouts differ" in t for t in compare(a, a)["text"])


# ------------------------------------------------------------------------------------------- per op
def _op(op, shapes, kernel, ms, calls=10.0, flops=None, stage=0, layer=None, model=None):
    return {"stage": stage, "rank": 0, "op": op, "shapes": shapes, "kernel": kernel, "layer_type": layer,
            "model": model, "calls": calls, "ms_per_step": ms, "flops": flops}  # fmt: skip


def test_ops_matched_on_op_and_shapes_across_kernel_names():
    a, b = summary(step=100.0), summary(step=102.5)
    mm = "[[64,128],[128,32]]"
    a["op_totals"] = [
        _op("aten::mm", mm, "sm90_xmma_gemm_bf16", 4.0, flops=8e12, layer="mlp", model="gemm"),
        _op("aten::copy_", "[[8]]", "direct_copy", 2.0, layer="mlp"),
        _op(None, None, "sm90_xmma_gemm_bf16", 3.0),  # a kernel without a CPU op: no op to match
    ]
    b["op_totals"] = [
        _op("aten::mm", mm, "Cijk_Alik_Bljk_MT128x224x64", 5.0, flops=8e12, layer="mlp", model="gemm"),
        _op("aten::copy_", "[[8]]", "direct_copy", 1.0, layer="mlp"),
        _op("aten::add", "[[8]]", "add_kernel", 0.5, layer="attn"),  # only in B: 0 ms in A
    ]
    c = compare(a, b, ("H100", "MI300X"))
    ops = c["ops"]["ops"]
    assert [(r["op"], r["delta_ms"]) for r in ops] == [
        ("aten::mm", 1.0),
        ("aten::copy_", -1.0),
        ("aten::add", 0.5),
    ]
    mm_row = ops[0]
    assert (mm_row["a_ms"], mm_row["b_ms"], mm_row["ratio"]) == (4.0, 5.0, 1.25)
    assert mm_row["a_tflops"] == pytest.approx(8e12 / 4e-3 / 1e12) and mm_row["b_tflops"] == 1600.0
    assert mm_row["share_of_step_change"] == pytest.approx(1.0 / 2.5)
    assert (mm_row["a_kernel"], mm_row["b_kernel"]) == ("sm90_xmma_gemm_bf16", "Cijk_Alik_Bljk_MT128x224x64")
    assert ops[2]["a_ms"] == 0.0 and ops[2]["a_calls"] == 0.0 and ops[2]["ratio"] is None
    assert c["ops"]["unlinked_kernel_ms"] == {"a": 3.0, "b": 0.0}
    # kernels by name (the GEMM kernels of two vendors do not match), layer types and stages summed
    kern = {r["kernel"]: r for r in c["ops"]["kernels"]}
    assert kern["sm90_xmma_gemm_bf16"]["a_ms"] == 7.0 and kern["sm90_xmma_gemm_bf16"]["b_ms"] == 0.0
    layers = {r["layer_type"]: r["delta_ms"] for r in c["ops"]["layer_types"]}
    assert layers == {"mlp": 0.0, "attn": 0.5}
    assert c["ops"]["stages"][0]["a_ms"] == 9.0 and c["ops"]["stages"][0]["b_ms"] == 6.5
    assert any(line.startswith("Ops that changed most") and "aten::mm" in line for line in c["text"])


def test_ops_from_the_top_rows_of_an_older_summary_are_unknown_when_absent():
    a, b = summary(), summary()
    a["ops"] = [_op("aten::mm", "[[2,2],[2,2]]", "k", 4.0)]  # no op_totals: the top rows only
    b["op_totals"] = [_op("aten::mm", "[[2,2],[2,2]]", "k2", 3.0), _op("aten::mul", "[[2]]", "k3", 0.1)]
    res = compare(a, b)["ops"]
    assert res["source"] == {"a": "ops", "b": "op_totals"}
    rows = {r["op"]: r for r in res["ops"]}
    assert rows["aten::mm"]["delta_ms"] == -1.0
    assert rows["aten::mul"]["a_ms"] is None and rows["aten::mul"]["delta_ms"] is None  # maybe below A's cut
    assert res["ops"][-1]["op"] == "aten::mul" and res["layer_types"] == [] and res["stages"] == []
