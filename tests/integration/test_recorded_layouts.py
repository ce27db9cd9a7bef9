"""Layout and schedule read from a real run's structure, not its names (issue 23): 8-rank gloo runs
recorded in the session by scripts/record_cpu_layouts.py (tests/recorded.py), analysed with no --layout.

Truth comes from the recorder (truth.json: the grid it built, the groups, the schedule it ran, the faults
it planted, the all-to-all calls and sizes it issued)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.recorded import recorded_layout, truth
from tracelens.run_analysis import analyze_run

pytestmark = pytest.mark.slow


def _summary(kind: str):
    run = recorded_layout(kind)
    return analyze_run(run).summary(), truth(run)


def _layout(s: dict) -> dict:
    return {a: s["run"]["layout"][a] for a in ("tp", "pp", "dp", "cp")}


def test_tp_pp_dp_inferred_from_groups_named_with_several_axes():
    s, t = _summary("tppdp_clean")
    assert all("_" in n and n.count("_") >= 1 for n in t["process_groups"])  # tp_stage0_dp1 ...
    assert s["run"]["layout"]["source"] == "inferred"
    assert _layout(s) == {a: t["layout"][a] for a in ("tp", "pp", "dp", "cp")}
    ev = s["run"]["layout"]["evidence"]
    # the axes rest on traffic: per-layer TP all-reduces outnumber the DP gradient buckets
    assert ev["tp"]["basis"] == "traffic" and ev["tp"]["stride"] == 1
    assert ev["dp"]["basis"] == "traffic" and ev["dp"]["stride"] == t["layout"]["tp"]
    # pp rests on the sends themselves: gloo's group-local peers mapped through the pp groups
    assert ev["pp"]["basis"] == "p2p"
    assert all(e["names_agree"] for e in ev.values())
    # stages from the grid: ranks 0-3 stage 0, 4-7 stage 1 (order tp-cp-dp-pp)
    for r in s["ranks"]:
        assert r["stage"] == t["coords"][str(r["rank"])]["pp"]
    assert s["stragglers"] == []  # the clean twin: no false straggler against the right peers
    assert not {"STRAGGLER", "SLOW_GROUP"} & {f["code"] for f in s["findings"]}


def test_slow_tp_rank_named_alone_with_cause_compute():
    s, t = _summary("tppdp_slow_tp")
    slow = t["faults"]["compute"]["rank"]
    assert _layout(s) == {a: t["layout"][a] for a in ("tp", "pp", "dp", "cp")}
    assert [(x["rank"], x["cause"]) for x in s["stragglers"]] == [(slow, "compute")]
    ev = s["stragglers"][0]["evidence"]
    # op counts, not wall clock: the slow rank runs the extra matmuls the recorder planted
    assert ev["ops_ratio"] > 1.05
    peers = ev["peers"]
    # its TP peer (the victim, waiting in the TP all-reduces) is one of the peers, and not named
    assert set(t["faults"]["compute"]["tp_peers"]) <= set(peers)


def test_ulysses_cp_inferred_and_all_to_all_sized_and_attributed_to_full_attention():
    s, t = _summary("ulysses")
    assert _layout(s) == {"tp": 1, "pp": 1, "dp": 4, "cp": 2}
    assert s["run"]["layout"]["evidence"]["cp"]["basis"] == "traffic"
    a2a = t["all_to_all"]
    comm = s["composition"]["comm_by_type"]
    assert set(comm) == {"full_attention"}  # the linear-attention layers scan locally: no exchange
    rec = comm["full_attention"]["alltoall"]
    assert rec["calls_per_step"] == pytest.approx(a2a["calls_per_step"])
    assert rec["bytes_per_step"] == pytest.approx(a2a["calls_per_step"] * a2a["bytes_per_call"])
    by_op = {o["op"]: o for o in s["collectives"]["by_op"]}
    assert by_op["alltoall"]["bytes"] == by_op["alltoall"]["calls"] * a2a["bytes_per_call"]


def test_ulysses_comm_per_layer_type_in_compare_view():
    from tracelens.summaries.compare import layer_comm_metrics

    s, t = _summary("ulysses")
    m = {x["key"]: x for x in layer_comm_metrics(s, s)}
    b = m["comm.full_attention.alltoall.bytes"]
    assert b["a"] == pytest.approx(t["all_to_all"]["calls_per_step"] * t["all_to_all"]["bytes_per_call"])


def test_interleaved_v_and_m_from_p2p_and_bubble_expectation():
    s, t = _summary("interleaved_bare")
    sch = t["schedule"]
    p, v, m = sch["pp"], sch["virtual_stages"], sch["microbatches"]
    pipe = s["pipeline"]
    assert (pipe["schedule"], pipe["virtual_stages"], pipe["microbatches"]) == ("interleaved_1f1b", v, m)
    assert pipe["expected_bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1))
    # = (p-1)/(v*m) of the ideal time
    e = pipe["expected_bubble_fraction"]
    assert e / (1 - e) == pytest.approx((p - 1) / (v * m))
    ev = pipe["schedule_evidence"]
    assert ev["warmup_forwards"] == {str(k): n for k, n in sch["warmup_forwards"].items() if int(k) < p - 1}
    assert ev["warmup_matches"] is True
    assert not any(f["code"] == "PIPELINE_BUBBLE_EXCESS" for f in s["findings"])


# ----- gloo collective sizes from the trace itself (no Flight Recorder dump) ----------------------------------


def _traces_only(run, dest, strip_annotation_dims: bool = False, with_fr: bool = False):
    """A copy of the recorded run's traces (and, `with_fr`, its Flight Recorder dumps); `strip_annotation_dims`
    drops `Input Dims` / `Input type` from the `gloo:*` work annotations, leaving the c10d ops' shapes alone."""
    import gzip
    import json
    import shutil

    (dest / "traces").mkdir(parents=True)
    for f in sorted((run / "traces").iterdir()):
        if not strip_annotation_dims:
            shutil.copy(f, dest / "traces" / f.name)
            continue
        d = json.loads(gzip.decompress(f.read_bytes()))
        for e in d["traceEvents"]:
            if str(e.get("name", "")).startswith("gloo:"):
                for k in ("Input Dims", "Input type"):
                    e.get("args", {}).pop(k, None)
        (dest / "traces" / f.name).write_bytes(gzip.compress(json.dumps(d).encode()))
    if with_fr:
        shutil.copytree(run / "flight_recorder", dest / "flight_recorder")
    return dest


def _issued(t: dict) -> dict:
    """{(rank, op): {bytes: calls}} the recorder issued over the profiled steps (truth.json)."""
    n = len(t["profiled_steps"])
    out = {}
    for r in t["ranks"]:
        for op, per in r["bytes_per_step"].items():
            out[(r["rank"], op)] = {int(b): round(c * n) for b, c in per.items()}
    return out


def _seen(df) -> dict:
    out: dict = {}
    for (rank, op), g in df.groupby(["rank", "op"]):
        vals = g["bytes"].astype("Int64")
        out[(int(rank), str(op))] = {
            (None if v is None or v is pd.NA else int(v)): int(n)
            for v, n in vals.value_counts(dropna=False).items()
        }
    return out


@pytest.mark.parametrize("kind", ["tppdp_clean", "ulysses"])
def test_gloo_sizes_from_the_trace_without_flight_recorder(kind, tmp_path):
    run = recorded_layout(kind)
    t = truth(run)
    a = analyze_run(_traces_only(run, tmp_path / kind))
    assert "flight_recorder" not in a.nccl
    df = a.sized_collectives
    # every call the recorder issued, with the bytes it issued (TP / DP all-reduces, all-to-alls, P2P)
    assert _seen(df) == _issued(t)
    assert set(df["size_source"]) == {"trace"}
    by_op = {o["op"]: o for o in a.summary()["collectives"]["by_op"]}
    for op in {op for _, op in _issued(t)}:
        want = sum(b * c for (_, o), per in _issued(t).items() if o == op for b, c in per.items())
        assert by_op[op]["bytes"] == want and "calls_bytes_unknown" not in by_op[op]


def test_gloo_sizes_from_c10d_shapes_alone_and_the_flight_recorder_fills_the_dtype(tmp_path):
    run = recorded_layout("ulysses")
    t = truth(run)
    issued = _issued(t)
    # only the c10d ops' shapes: alltoall_base_ names its dtype (sized); allreduce_ takes a TensorList (its
    # element count is known, its dtype is not recorded): bytes null, never 0
    a = analyze_run(_traces_only(run, tmp_path / "bare", strip_annotation_dims=True))
    df = a.sized_collectives
    a2a = df[df["op"] == "alltoall"]
    assert _seen(a2a) == {k: v for k, v in issued.items() if k[1] == "alltoall"}
    ar = df[df["op"] == "allreduce"]
    assert ar["bytes"].isna().all() and ar["dtype"].isna().all()
    nel = {
        (k[0], "allreduce"): {b // 4: c for b, c in v.items()}
        for k, v in issued.items()
        if k[1] == "allreduce"
    }
    got = {
        (int(r), "allreduce"): g["in_nelems"].astype(int).value_counts().to_dict()
        for r, g in ar.groupby("rank")
    }
    assert got == nel  # float32 gradients: bytes / 4 elements
    rec = {o["op"]: o for o in a.summary()["collectives"]["by_op"]}["allreduce"]
    assert rec["bytes"] is None and rec["calls_bytes_unknown"] == len(ar)
    # with the dump beside the traces, its records size them (and agree with what was issued)
    b = analyze_run(_traces_only(run, tmp_path / "fr", strip_annotation_dims=True, with_fr=True))
    df = b.sized_collectives
    assert _seen(df) == issued
    assert set(df.loc[df["op"] == "allreduce", "size_source"]) == {"flight_recorder"}
    assert set(df.loc[df["op"] == "alltoall", "size_source"]) == {"trace"}
