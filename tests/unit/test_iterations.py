"""Inference iterations (tracelens.ingest.iterations, analyze.efficiency.inference): the engines' annotation formats,
nesting, iterations as steps in the reader, repeating work, and the per-phase figures, by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.unit.kineto_traces import BASE, write, x
from tracelens import schema
from tracelens._testing import table_from_rows
from tracelens.analyze.efficiency.inference import inference_summary, op_contexts
from tracelens.ingest import iterations as I
from tracelens.ingest.kineto import read


@pytest.mark.parametrize(
    ("name", "fmt", "kind", "phase", "tokens", "prefill", "decode", "requests"),
    [
        # AMD's detailed vLLM annotation: 2 prefill requests (6144 new tokens), 3 decodes
        ("execute_6147_context_2(sq6144sk7144sqsq20971520sqsk23019520)_generation_3(sq3sk6144sqsq3sqsk6144)",
         "execute", "iteration", "mixed", 6147, 6144, 3, 5),
        ("execute_context_0(0)_generation_64(64)", "execute", "iteration", "decode", 64, 0, 64, 64),
        ("execute_context_2(14721)_generation_0(0)", "execute", "iteration", "prefill", 14721, 14721, 0, 2),
        # vLLM's own: requests only (a continuing request may be a chunked prefill): no tokens
        ("execute_new_2_cached_0", "execute", "iteration", "prefill", None, None, None, 2),
        ("execute_new_0_cached_32", "execute", "iteration", "decode", None, None, None, 32),
        ("execute_new_1_cached_7", "execute", "iteration", "mixed", None, None, None, 8),
        ("step[EXTEND bs=2 toks=14721]", "step", "iteration", "prefill", 14721, 14721, 0, 2),
        ("step[DECODE bs=64]", "step", "iteration", "decode", 64, 0, 64, 64),
        ("step[DECODE bs=64 g_sq=128 g_sqsq=256 g_sqsk=262144 g_sk=131072]", "step", "iteration", "decode",
         128, 0, 128, 64),  # MTP: 2 tokens per request
        ("step[MIXED bs=2 c=1 g=1 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=1 g_sk=12 g_sqsq=1 g_sqsk=12]",
         "step", "iteration", "mixed", 6, 5, 1, 2),
        ("prefill[bs=2 tok=14721 ctx=[7803, 6918]]", "atom", "iteration", "prefill", 14721, 14721, 0, 2),
        ("decode[bs=117/128 tok=117 d=117]", "atom", "iteration", "decode", 117, 0, 117, 117),
        ("capture_32_FULL", "capture", "capture", "decode", 32, 0, 32, None),
        ("capture_8192_PIECEWISE", "capture", "capture", "mixed", 8192, None, None, None),
        ("capture_32_DECODE", "capture", "capture", "decode", 32, 0, 32, None),
        ("capture_256_mixed_prefill", "capture", "capture", "mixed", 256, None, None, None),
        ("capture_32_draft_FULL", "capture", "capture", "decode", 32, 0, 32, None),
    ],
)  # fmt: skip
def test_engine_annotation_formats(name, fmt, kind, phase, tokens, prefill, decode, requests):
    it = I.parse_iteration(name)
    assert it is not None
    assert (it.format, it.kind, it.phase, it.tokens) == (fmt, kind, phase, tokens)
    assert (it.prefill_tokens, it.decode_tokens, it.requests) == (prefill, decode, requests)


def test_detailed_annotations_keep_the_attention_sums():
    it = I.parse_iteration(
        "execute_6147_context_2(sq6144sk7144sqsq20971520sqsk23019520)_generation_3(sq3sk6144sqsq3sqsk6144)"
    )
    assert (it.c_sq, it.c_sk, it.c_sqsq, it.c_sqsk) == (6144, 7144, 20971520, 23019520)
    assert (it.g_sq, it.g_sk, it.g_sqsq, it.g_sqsk) == (3, 6144, 3, 6144)


@pytest.mark.parametrize(
    "name", ["ProfilerStep#3", "execute_model", "step", "capture", "decode", "nn.Module: Linear", "aten::mm"]
)
def test_other_names_are_no_iterations(name):
    assert I.parse_iteration(name) is None


def _columns(rows):
    """(kind codes, name DictionaryArray, ts, dur, tid, cpu mask) of (kind, name, ts, dur, tid) rows."""
    kinds = np.array([schema.KINDS.index(r[0]) for r in rows], dtype=np.int8)
    names = pa.array([r[1] for r in rows]).dictionary_encode()
    ts = np.array([r[2] for r in rows], dtype=np.int64)
    dur = np.array([r[3] for r in rows], dtype=np.int64)
    tid = np.array([r[4] for r in rows], dtype=np.int64)
    cpu = np.isin(kinds, [schema.KINDS.index("cpu_op"), schema.KINDS.index("user_annotation")])
    return kinds, names, ts, dur, tid, cpu


def test_outermost_annotation_is_the_iteration_and_nested_ones_fill_it_in():
    outer = "execute_new_15_cached_0"  # requests only
    rows = [
        ("user_annotation", outer, 1000, 500, 7),
        ("user_annotation", "step[EXTEND bs=15 toks=15360]", 1100, 100, 7),  # the same iteration, with tokens
        ("cpu_op", "aten::mm", 1150, 10, 7),
        ("user_annotation", "step[DECODE bs=15]", 2000, 50, 7),  # the next iteration
        ("gpu_user_annotation", "step[DECODE bs=15]", 2005, 50, 0),  # device side: not a CPU window
    ]
    w = I.annotated_windows(*_columns(rows))
    assert w is not None
    assert w.start.tolist() == [1000, 2000] and w.end.tolist() == [1500, 2050] and w.rows.tolist() == [0, 3]
    first, second = w.iterations
    assert (first.name, first.phase, first.requests, first.tokens) == (outer, "prefill", 15, 15360)
    assert (second.phase, second.tokens) == ("decode", 15)


def test_find_period_takes_the_unit_that_explains_most():
    # warm-up (9), three iterations of (1, 2, 3), a tail (7)
    assert I.find_period([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7]) == (3, 1, 3)
    assert I.find_period([1, 2, 3, 1, 2, 3]) is None  # two repeats are no loop
    assert I.find_period([1, 2, 3, 4, 5]) is None


def _doc(events, **meta):
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE, "traceEvents": events, **meta}


def _iteration_events(name, t0, corr):
    """An engine step at t0 µs on thread 10: its annotation, an op that launches one kernel (5 µs later)."""
    return [
        x("user_annotation", name, f"{t0}.000", "100.000", pid=1, tid=10, **{"External id": corr}),
        x("cpu_op", "aten::mm", f"{t0 + 10}.000", "20.000", pid=1, tid=10, **{"External id": corr + 1}),
        x(
            "cuda_runtime",
            "cudaLaunchKernel",
            f"{t0 + 12}.000",
            "5.000",
            pid=1,
            tid=10,
            correlation=corr,
            **{"External id": corr + 1},
        ),  # fmt: skip
        x(
            "kernel",
            "gemm",
            f"{t0 + 140}.000",
            "30.000",
            pid=0,
            tid=7,
            correlation=corr,
            **{"External id": corr + 1, "device": 0, "stream": 7},
        ),  # fmt: skip
    ]


def test_reader_makes_each_iteration_a_step(tmp_path):
    names = ["step[EXTEND bs=2 toks=1000]", "step[DECODE bs=2]", "step[DECODE bs=2]"]
    ev = [e for i, n in enumerate(names) for e in _iteration_events(n, 1000 + 1000 * i, 100 * (i + 1))]
    t = read(write(tmp_path / "t.json", _doc(ev)))
    e = t.events.to_pandas()
    marks = e[e["name"].str.startswith("ProfilerStep#")].sort_values("ts_ns")
    assert marks["name"].tolist() == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert (marks["ts_ns"] - BASE).tolist() == [1_000_000, 2_000_000, 3_000_000]
    assert marks["dur_ns"].tolist() == [100_000] * 3 and marks["tid"].tolist() == [10] * 3
    assert (marks["kind"] == "user_annotation").all() and marks["pid"].tolist() == [1] * 3
    # the kernels run after their annotation ended: each is still in its launch's step
    k = e[e["kind"] == "kernel"].sort_values("ts_ns")
    assert k["step"].tolist() == [0, 1, 2]
    recs = json.loads(t.metadata["iterations_json"])
    assert [(r["step"], r["phase"], r["tokens"]) for r in recs] == [
        (0, "prefill", 1000),
        (1, "decode", 2),
        (2, "decode", 2),
    ]


def test_reader_keeps_profiler_steps_and_describes_them(tmp_path):
    ev = [
        x("user_annotation", "ProfilerStep#134", "900.000", "500.000", pid=1, tid=10, **{"External id": 1}),
        *_iteration_events("capture_32_DECODE", 1000, 100),
    ]
    t = read(write(tmp_path / "t.json", _doc(ev)))
    e = t.events.to_pandas()
    assert e["name"].str.startswith("ProfilerStep#").sum() == 1  # no marker added
    assert set(e["step"].dropna()) == {134}
    recs = json.loads(t.metadata["iterations_json"])
    assert [(r["step"], r["kind"], r["phase"], r["tokens"]) for r in recs] == [(134, "capture", "decode", 32)]


def test_training_traces_get_no_iterations(tmp_path):
    ev = [
        x("user_annotation", "ProfilerStep#1", "900.000", "500.000", pid=1, tid=10),
        *_iteration_events("forward", 1000, 1),
    ]
    t = read(write(tmp_path / "t.json", _doc(ev)))
    assert t.metadata["iterations_json"] is None
    assert t.events.num_rows == len(ev)


def test_engine_trace_without_annotations_gets_its_repeats(tmp_path):
    """A vLLM-like trace (ops in `_C::`) with no annotation: a warm-up op, then four iterations of the same
    top-level ops on the launching thread; each repeat is a step, phase unknown."""
    ev = [x("cpu_op", "aten::zeros", "100.000", "10.000", pid=1, tid=10, **{"External id": 1}),
          x("cuda_runtime", "cudaLaunchKernel", "101.000", "2.000", pid=1, tid=10, correlation=1)]  # fmt: skip
    for i in range(4):
        t0 = 1000 + 1000 * i
        for j, op in enumerate(("_C::rms_norm", "aten::mm", "_C::silu_and_mul")):
            c = 10 + 10 * i + j
            ev += [
                x("cpu_op", op, f"{t0 + 100 * j}.000", "50.000", pid=1, tid=10, **{"External id": c}),
                x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    f"{t0 + 100 * j + 5}.000",
                    "5.000",
                    pid=1,
                    tid=10,
                    correlation=c,
                    **{"External id": c},
                ),  # fmt: skip
                x(
                    "kernel",
                    f"k{j}",
                    f"{t0 + 100 * j + 20}.000",
                    "20.000",
                    pid=0,
                    tid=7,
                    correlation=c,
                    **{"device": 0, "stream": 7},
                ),  # fmt: skip
            ]
    t = read(write(tmp_path / "t.json", _doc(ev)))
    e = t.events.to_pandas()
    marks = e[e["name"].str.startswith("ProfilerStep#")].sort_values("ts_ns")
    assert (marks["ts_ns"] - BASE).tolist() == [1_000_000, 2_000_000, 3_000_000, 4_000_000]
    assert marks["dur_ns"].tolist() == [250_000] * 4  # first op's start to the last op's end
    recs = json.loads(t.metadata["iterations_json"])
    assert [(r["step"], r["kind"], r["phase"]) for r in recs] == [(i, "repeat", None) for i in range(4)]
    # the same trace with aten ops only is no engine's: one window, as before
    plain = [dict(ev_, name=ev_["name"].replace("_C::", "aten::")) for ev_ in ev]
    assert read(write(tmp_path / "p.json", _doc(plain))).metadata["iterations_json"] is None


def _meta(iters_by_rank):
    rows = [{"rank": r, "iterations_json": json.dumps(v)} for r, v in iters_by_rank.items()]
    return table_from_rows(rows, schema.METADATA)


def _rec(step, phase, tokens, **kw):
    return {"step": step, "name": f"it{step}", "format": "step", "kind": "iteration", "phase": phase,
            "tokens": tokens, "prefill_tokens": None, "decode_tokens": None, "requests": None, **kw}  # fmt: skip


def test_per_phase_time_per_token_idle_and_launch_overhead():
    # rank 0: a prefill of 1,000 tokens in 40 ms, two decodes of 8 tokens in 10 and 12 ms
    md = _meta({0: [_rec(0, "prefill", 1000), _rec(1, "decode", 8), _rec(2, "decode", 8)]})
    ms = 1_000_000
    bd = pa.table({
        "rank": [0, 0, 0], "step": [0, 1, 2], "step_time_ns": [40 * ms, 10 * ms, 12 * ms],
        "compute_ns": [36 * ms, 3 * ms, 4 * ms], "idle_ns": [4 * ms, 7 * ms, 8 * ms],
    })  # fmt: skip
    idle = pd.DataFrame({"rank": [0, 0, 0], "step": [0, 1, 2], "launch_overhead_ns": [1 * ms, 6 * ms, 6 * ms],
                         "host_bound_ns": [3 * ms, 1 * ms, 2 * ms]})  # fmt: skip
    s = inference_summary(md, bd, idle)
    assert [(i["step"], i["phase"], i["tokens"], i["ms_per_token"]) for i in s["iterations"]] == [
        (0, "prefill", 1000, 0.04), (1, "decode", 8, 1.25), (2, "decode", 8, 1.5)
    ]  # fmt: skip
    d = s["phases"]["decode"]
    assert d["steps"] == 2 and d["step_time_ms"] == 11.0 and d["ms_per_token"] == 22 / 16
    assert d["tokens_per_s"] == pytest.approx(16 / 0.022, abs=1e-3)
    assert (d["compute_ms"], d["idle_ms"], d["launch_overhead_ms"], d["host_bound_ms"]) == (
        3.5,
        7.5,
        6.0,
        1.5,
    )
    assert d["idle_share"] == pytest.approx(7.5 / 11)
    p = s["phases"]["prefill"]
    assert (p["ms_per_token"], p["launch_overhead_ms"]) == (0.04, 1.0) and "mixed" not in s["phases"]
    assert inference_summary(table_from_rows([{"rank": 0}], schema.METADATA), bd, idle) is None


def test_iteration_context_for_the_attention_models():
    md = _meta({0: [_rec(3, "mixed", 104, c_sq=100, c_sk=128, c_sqsq=10000, c_sqsk=12800, g_sq=4, g_sk=200,
                         g_sqsq=4, g_sqsk=200), _rec(4, "decode", 4)]})  # fmt: skip
    ctx = op_contexts(md)
    assert set(ctx) == {(0, 3)}  # step 4 states no sums
    assert (ctx[(0, 3)].c_sqsk, ctx[(0, 3)].g_sqsk, ctx[(0, 3)].c_sqsq) == (12800, 200, 10000)
