"""Stage composition from module annotations or the model config; imbalance findings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from pipeline_tables import events_table

from tracelens.analyze.layout import grid_from_layout
from tracelens.analyze.pipeline.composition import _microbatches_from_spans, analyze_composition, module_spans
from tracelens.models import get_model

# stage 0: layers 0,1,2 DeltaNet (10 us each) ; stage 1: layer 3 attention (40 us) + layer 4 DeltaNet
LAYERS = {
    0: [(0, "linear_attn", 10), (1, "linear_attn", 10), (2, "linear_attn", 10)],
    1: [(3, "self_attn", 40), (4, "linear_attn", 10)],
}
MLP_US = 5


def _rows(m=2, steps=1, gpu_annotations=True):
    rows = []
    for rank, layers in LAYERS.items():
        t = 0
        for st in range(steps):
            start = t
            for _mb in range(m):
                for bwd in (False, True):
                    for li, mod, us in layers if not bwd else layers[::-1]:
                        for name, d in (
                            (f"layers.{li}.{mod}", us * 1000),
                            (f"layers.{li}.mlp", MLP_US * 1000),
                        ):
                            name += ".backward" if bwd else ""
                            d *= 2 if bwd else 1
                            corr = len(rows) + 1
                            if gpu_annotations:
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "gpu_user_annotation",
                                        "name": name,
                                        "ts_ns": t,
                                        "dur_ns": d,
                                        "step": st,
                                    }
                                )
                            else:
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "user_annotation",
                                        "name": name,
                                        "ts_ns": t,
                                        "dur_ns": 100,
                                        "tid": 2 if bwd else 1,
                                        "step": st,
                                    }
                                )
                                rows.append(
                                    {
                                        "rank": rank,
                                        "kind": "cuda_runtime",
                                        "name": "cudaLaunchKernel",
                                        "ts_ns": t + 10,
                                        "dur_ns": 5,
                                        "tid": 2 if bwd else 1,
                                        "correlation": corr,
                                        "step": st,
                                    }
                                )
                            rows.append(
                                {
                                    "rank": rank,
                                    "kind": "kernel",
                                    "name": "gemm",
                                    "ts_ns": t,
                                    "dur_ns": d,
                                    "correlation": corr,
                                    "step": st,
                                    "stream": 7,
                                }
                            )
                            t += d
            rows.append(
                {
                    "rank": rank,
                    "kind": "user_annotation",
                    "name": f"ProfilerStep#{st}",
                    "ts_ns": start,
                    "dur_ns": t - start + 10_000,
                    "tid": 1,
                }
            )
            t += 10_000
    return rows


@pytest.mark.parametrize("gpu_annotations", [True, False])
def test_counts_costs_and_shares(gpu_annotations):
    ev = events_table(_rows(gpu_annotations=gpu_annotations))
    grid = grid_from_layout(2, pp=2)
    res = analyze_composition(ev, grid)
    assert res.source == "annotations"
    assert res.stages == {
        0: {"full_attention": 0, "linear_attention": 3},
        1: {"full_attention": 1, "linear_attention": 1},
    }
    assert res.layer_split == [3, 2]
    # per microbatch, forward + backward (x2) = 3x the forward time
    assert res.per_stage_type_ms[0] == pytest.approx({"linear_attention": 0.090, "mlp": 0.045})
    assert res.per_stage_type_ms[1] == pytest.approx(
        {"full_attention": 0.120, "linear_attention": 0.030, "mlp": 0.030}
    )
    # compute per step: stage 0 = 2 mb * 135 us, stage 1 = 2 mb * 180 us
    assert res.per_stage_compute == pytest.approx({0: 0.270, 1: 0.360})
    assert res.heavy_stage == 1 and res.imbalance == pytest.approx(0.360 / 0.315)
    codes = [f["code"] for f in res.findings]
    assert codes == ["UNEQUAL_STAGE_COMPOSITION", "STAGE_IMBALANCE"]
    unequal, imb = res.findings
    assert unequal["stages"] == [0, 1]  # stage 1 holds the attention layer, stage 0 the most DeltaNet
    assert "stage 1 holds the most full_attention" in unequal["message"]
    assert imb["stages"] == [1] and imb["ranks"] == [1] and "stage 1" in imb["message"]
    # time shares over both ranks' step time (270 + 360 us compute + 2 x 10 us tail each)
    total = (270 + 10 + 360 + 10) / 1000
    assert res.time_share == pytest.approx(
        {
            "linear_attention": (180 + 60) / 1000 / total,
            "full_attention": 240 / 1000 / total,
            "mlp": (90 + 60) / 1000 / total,
        }
    )


def test_threshold_is_configurable():
    ev = events_table(_rows())
    res = analyze_composition(ev, grid_from_layout(2, pp=2), imbalance_threshold=1.2)
    assert [f["code"] for f in res.findings] == ["UNEQUAL_STAGE_COMPOSITION"]


def test_nested_annotation_counted_once():
    rows = [
        {
            "rank": 0,
            "kind": "gpu_user_annotation",
            "name": "layers.0.self_attn",
            "ts_ns": 0,
            "dur_ns": 100,
            "step": 0,
        },
        {
            "rank": 0,
            "kind": "gpu_user_annotation",
            "name": "layers.0.self_attn.core_attention",
            "ts_ns": 10,
            "dur_ns": 50,
            "step": 0,
        },
        {"rank": 0, "kind": "kernel", "name": "flash_fwd", "ts_ns": 0, "dur_ns": 100, "step": 0},
    ]
    sp = module_spans(events_table(rows))
    assert sp.num_rows == 1 and sp.column("compute_ns").to_pylist() == [100]


def test_from_model_config_and_suggested_split():
    model = get_model("qwen3.5-27b")
    ev = events_table(
        [
            {
                "rank": r,
                "kind": "kernel",
                "name": "gemm",
                "ts_ns": 0,
                "dur_ns": 100 + 50 * (r == 2),
                "step": 0,
            }
            for r in range(3)
        ]
    )
    res = analyze_composition(ev, grid_from_layout(3, pp=3), model=model, seq_len=4096)
    assert res.source == "model" and res.layer_split == [22, 21, 21]
    # 64 layers = 16 x (3 DeltaNet + 1 attention at 3, 7, ..., 63): 0-21 hold 3..19, 22-42 hold 23..39,
    # 43-63 hold 43..63
    assert res.stages[0] == {"linear_attention": 17, "full_attention": 5}
    assert res.stages[1] == {"linear_attention": 16, "full_attention": 5}
    assert res.stages[2] == {"linear_attention": 15, "full_attention": 6}
    assert [f["code"] for f in res.findings] == ["UNEQUAL_STAGE_COMPOSITION", "STAGE_IMBALANCE"]
    assert res.heavy_stage == 2
    assert res.suggested_split and sum(res.suggested_split) == 64
    assert all(n % 4 == 0 for n in res.suggested_split)
    assert "balanced split" in res.findings[1]["message"]


def test_audit_for_run_reuses_the_layout_audit():
    from tracelens.analyze.layout import Grid
    from tracelens.analyze.pipeline.composition import audit_for_run

    model = get_model("qwen3.5-27b")
    audit, findings = audit_for_run(grid_from_layout(32, tp=8, pp=4), model, seq_len=4096)
    assert audit is not None and audit.kv_replication
    assert "KV_HEAD_REPLICATION" in [f["code"] for f in findings]
    # codes already reported by the measured composition are not repeated
    _, again = audit_for_run(
        grid_from_layout(24, tp=8, pp=3), model, 4096, existing=[{"code": "UNEQUAL_STAGE_COMPOSITION"}]
    )
    assert "UNEQUAL_STAGE_COMPOSITION" not in [f["code"] for f in again]
    assert audit_for_run(Grid(pp=4), model) == (None, [])
    assert audit_for_run(grid_from_layout(4, tp=4), None) == (None, [])


def _real_like_rows(with_seq: bool = True, hook_annotations: bool = False):
    """One rank as real PyTorch writes it: module annotations only around the forward (thread 1); the
    autograd thread (2) runs `evaluate_function` nodes carrying the forward op's sequence number."""
    rows, seqs = [], []

    def add(seq=None, **r):
        rows.append({"rank": 0, "step": 0, **r})
        seqs.append(seq)

    add(kind="user_annotation", name="ProfilerStep#0", ts_ns=0, dur_ns=10_000, tid=1)
    # forward: attention op (seq 10) and MLP op (seq 11), each launching one kernel
    add(kind="user_annotation", name="layers.0.self_attn", ts_ns=100, dur_ns=900, tid=1)
    add(seq=10, kind="cpu_op", name="aten::mm", ts_ns=200, dur_ns=50, tid=1)
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=210, dur_ns=5, tid=1, correlation=1)
    add(kind="kernel", name="attn_fwd", ts_ns=2000, dur_ns=40, correlation=1, stream=7)
    add(kind="user_annotation", name="layers.0.mlp", ts_ns=1000, dur_ns=900, tid=1)
    add(seq=11, kind="cpu_op", name="aten::mm", ts_ns=1100, dur_ns=50, tid=1)
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=1110, dur_ns=5, tid=1, correlation=2)
    add(kind="kernel", name="mlp_fwd", ts_ns=2040, dur_ns=10, correlation=2, stream=7)
    # backward, reverse order, on the autograd thread; the MLP node launches two kernels
    add(
        seq=11,
        kind="cpu_op",
        name="autograd::engine::evaluate_function: MmBackward0",
        ts_ns=5000,
        dur_ns=400,
        tid=2,
    )
    add(seq=11, kind="cpu_op", name="MmBackward0", ts_ns=5010, dur_ns=380, tid=2)
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=5100, dur_ns=5, tid=2, correlation=3)
    add(kind="kernel", name="mlp_dgrad", ts_ns=6000, dur_ns=12, correlation=3, stream=7)
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=5200, dur_ns=5, tid=2, correlation=4)
    add(kind="kernel", name="mlp_wgrad", ts_ns=6012, dur_ns=8, correlation=4, stream=7)
    add(
        seq=10,
        kind="cpu_op",
        name="autograd::engine::evaluate_function: MmBackward0",
        ts_ns=5500,
        dur_ns=400,
        tid=2,
    )
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=5600, dur_ns=5, tid=2, correlation=5)
    add(kind="kernel", name="attn_bwd", ts_ns=6020, dur_ns=80, correlation=5, stream=7)
    # a node whose forward op ran outside every module annotation (e.g. the loss): not attributed
    add(
        seq=3,
        kind="cpu_op",
        name="autograd::engine::evaluate_function: MeanBackward0",
        ts_ns=4800,
        dur_ns=100,
        tid=2,
    )
    add(seq=3, kind="cpu_op", name="aten::mean", ts_ns=3000, dur_ns=50, tid=1)
    add(kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=4850, dur_ns=5, tid=2, correlation=6)
    add(kind="kernel", name="mean_bwd", ts_ns=5990, dur_ns=10, correlation=6, stream=7)
    if hook_annotations:  # as module backward hooks write them; the attention one closes too early
        add(kind="user_annotation", name="layers.0.mlp.backward", ts_ns=4990, dur_ns=420, tid=2)
        add(kind="user_annotation", name="layers.0.self_attn.backward", ts_ns=5450, dur_ns=20, tid=2)
    ev = events_table(rows)
    if with_seq:
        import pyarrow as pa

        ev = ev.set_column(
            ev.schema.get_field_index("sequence_nr"), "sequence_nr", pa.array(seqs, pa.int64())
        )
    return ev


def test_backward_attributed_by_sequence_number():
    sp = module_spans(_real_like_rows()).to_pandas()
    fwd = sp[~sp["backward"]].set_index("module")["compute_ns"].to_dict()
    bwd = sp[sp["backward"]].groupby("module")["compute_ns"].sum().to_dict()
    assert fwd == {"full_attention": 40, "mlp": 10}
    assert bwd == {"full_attention": 80, "mlp": 20}  # both MLP backward kernels; the loss node is not
    assert set(sp["layer"]) == {0}
    # without sequence numbers (older traces) only the forward is attributed, as before
    sp0 = module_spans(_real_like_rows(with_seq=False)).to_pandas()
    assert not sp0["backward"].any() and sp0["compute_ns"].sum() == 50
    # backward annotations (module hooks) are replaced where sequence numbers work: nothing counted twice
    sp2 = module_spans(_real_like_rows(hook_annotations=True)).to_pandas()
    assert sp2[sp2["backward"]].groupby("module")["compute_ns"].sum().to_dict() == bwd
    # and are used as before without them
    sp3 = module_spans(_real_like_rows(with_seq=False, hook_annotations=True)).to_pandas()
    assert sp3[sp3["backward"]].groupby("module")["compute_ns"].sum().to_dict() == {"mlp": 20}


def test_unequal_finding_names_a_stage_once_when_it_holds_the_most_of_two_types():
    from tracelens.analyze.pipeline.composition import _unequal_finding

    f = _unequal_finding(
        {0: {"linear_attention": 3, "full_attention": 1}, 1: {"linear_attention": 6, "full_attention": 2}}
    )
    assert f["stages"] == [1]
    assert "stage 1 holds the most full_attention layers" in f["message"]
    assert "stage 1 holds the most linear_attention layers" in f["message"]


def microbatches_reference(sp):
    """`_microbatches_from_spans` before vectorisation: a group-by loop over ranks, boolean masks each."""
    fwd = sp[~sp["backward"] & (sp["layer"] >= 0)]
    if not len(fwd):
        return None
    counts = []
    for _, g in fwd.groupby("rank"):
        first = g[g["layer"] == g["layer"].min()]
        first = first[first["module"] == first["module"].iloc[0]]
        per_step = first.groupby("step", dropna=False).size()
        counts.append(int(per_step.median()))
    return int(np.median(counts)) if counts else None


def _span_frame(rows):
    """rows: (rank, step (None: outside every step), layer, module, backward)"""
    df = pd.DataFrame(rows, columns=["rank", "step", "layer", "module", "backward"])
    df["step"] = df["step"].astype("float64")  # null steps as module_spans' table converts them
    df["rank"] = df["rank"].astype("int32")
    df["layer"] = df["layer"].astype("int32")
    df["backward"] = df["backward"].astype(bool)
    return df


def test_microbatches_from_spans_known_answer():
    rows = []
    # rank 0: first layer 3, its first module mlp (listed before full_attention: not alphabetical);
    # mlp forwards per step: step 0: 4, step 1: 5, outside every step: 2 -> median 4
    rows += [(0, 0, 3, "mlp", False)] * 4 + [(0, 0, 3, "full_attention", False)] * 9
    rows += [(0, 1, 3, "mlp", False)] * 5 + [(0, None, 3, "mlp", False)] * 2
    rows += [(0, 0, 3, "mlp", True)] * 7 + [(0, 0, -1, "mlp", False)] * 8 + [(0, 0, 5, "mlp", False)] * 9
    # rank 1: steps 0: 3, 1: 4 -> 3.5 -> 3
    rows += [(1, 0, 0, "full_attention", False)] * 3 + [(1, 1, 0, "full_attention", False)] * 4
    # rank 2: 6 and 6 -> 6
    rows += [(2, 0, 1, "linear_attention", False)] * 6 + [(2, 1, 1, "linear_attention", False)] * 6
    # rank 3: step -1 and null are two groups: 1, 1, 7 -> 1 (not (2 + 7) / 2)
    rows += [(3, -1, 0, "mlp", False), (3, None, 0, "mlp", False)] + [(3, 0, 0, "mlp", False)] * 7
    sp = _span_frame(rows)
    assert _microbatches_from_spans(sp) == 3  # median of 4, 3, 6, 1 = 3.5
    assert microbatches_reference(sp) == 3
    assert _microbatches_from_spans(sp[sp["rank"] != 3]) == 4
    assert _microbatches_from_spans(sp[sp["backward"]]) is None


_SPAN_ROW = hst.tuples(
    hst.integers(0, 4),
    hst.sampled_from([None, -1, 0, 1, 2]),
    hst.integers(-1, 3),
    hst.sampled_from(["full_attention", "linear_attention", "mlp"]),
    hst.booleans(),
)


@settings(deadline=None, max_examples=100)
@given(hst.lists(_SPAN_ROW, min_size=1, max_size=60))
def test_microbatches_from_spans_matches_reference_on_random_spans(rows):
    sp = _span_frame(rows)
    assert _microbatches_from_spans(sp) == microbatches_reference(sp)
    filled = sp.assign(step=sp["step"].fillna(-1).astype("int64"))  # as analyze_pipeline passes them
    assert _microbatches_from_spans(filled) == microbatches_reference(filled)


def test_microbatches_from_spans_matches_reference_on_a_sample(tmp_path):
    from tracelens.run_analysis import Options, analyze_run

    samples = Path(__file__).resolve().parents[2] / "sample_traces"
    an = analyze_run(samples / "qwen35-27b-seq4k-tp2pp3-split22-21-21", Options(cache_dir=str(tmp_path)))
    sp = an.spans.to_pandas()
    assert _microbatches_from_spans(sp) == microbatches_reference(sp) == an.pipeline.microbatches_observed
    assert an.pipeline.microbatches_observed > 1


def test_name_matches_are_remembered_per_pattern_text_and_flags():
    """composition's per-process memo of name matches: patterns of the same text but other flags are other
    patterns (a case-insensitive rule must not reuse the case-sensitive rule's misses, nor the reverse)."""
    import re

    from tracelens.analyze.pipeline.composition import _match_names

    text = r"layers\.(?P<layer>\d+)\.(?P<module>mlp)"
    names = ["model.layers.3.MLP", "model.layers.4.mlp"]
    strict = _match_names(names, [re.compile(text)])
    loose = _match_names(names, [re.compile(text, re.IGNORECASE)])
    assert strict[0][:2].tolist() == [False, True]
    assert loose[0][:2].tolist() == [True, True] and loose[1][:2].tolist() == [3, 4]
    assert _match_names(names, [re.compile(text)])[0][:2].tolist() == [False, True]  # from the memo


@pytest.mark.parametrize("seed", range(4))
def test_stage_layer_counts_match_the_group_by(seed):
    # the distinct-triples count against the per-stage group-by it replaced, on random spans (mixer and
    # other types, layer -1, stages -1 left out)
    import numpy as np
    import pandas as pd

    from tracelens.analyze.pipeline.composition import MIXER_TYPES, _stage_layer_counts

    rng = np.random.default_rng(seed)
    n = 2000
    mods = np.array([*MIXER_TYPES, "mlp", "lm_head", None], dtype=object)
    sp = pd.DataFrame(
        {
            "stage": rng.integers(-1, 4, n),
            "layer": rng.integers(-1, 30, n).astype(np.int32),
            "module": mods[rng.integers(0, mods.size, n)],
        }
    )
    sp["module"] = sp["module"].astype("str").where(sp["module"].notna(), None)
    want_counts, want_pairs = {}, {}
    mix = sp[sp["module"].isin(MIXER_TYPES) & (sp["stage"] >= 0)]
    for s, g in mix.groupby("stage"):
        kinds = g.drop_duplicates(["layer", "module"]).groupby("module")["layer"].nunique()
        want_counts[int(s)] = {str(k): int(v) for k, v in kinds.items()}
        want_pairs[int(s)] = set(zip(g["module"], g["layer"]))
    counts, pairs = _stage_layer_counts(sp)
    assert list(counts.items()) == list(want_counts.items())  # same order too (it is the summary's)
    assert all(list(counts[s]) == list(want_counts[s]) for s in counts)
    assert {s: len(p) for s, p in pairs.items()} == {s: len(p) for s, p in want_pairs.items()}
