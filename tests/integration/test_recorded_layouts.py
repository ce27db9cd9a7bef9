"""Layout and schedule read from a real run's structure, not its names (issue 23): 8-rank gloo runs
recorded in the session by scripts/record_cpu_layouts.py (tests/recorded.py), analysed with no --layout.

Truth comes from the recorder (truth.json: the grid it built, the groups, the schedule it ran, the faults
it planted, the all-to-all calls and sizes it issued)."""

from __future__ import annotations

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
    assert ev["pp"]["basis"] == "traffic" and ev["pp"]["stride"] == t["layout"]["tp"] * t["layout"]["dp"]
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
    from tracelens.analyze.compare import layer_comm_metrics

    s, t = _summary("ulysses")
    m = {x["key"]: x for x in layer_comm_metrics(s, s)}
    b = m["comm.full_attention.alltoall.bytes"]
    assert b["a"] == pytest.approx(t["all_to_all"]["calls_per_step"] * t["all_to_all"]["bytes_per_call"])


def test_interleaved_v_and_m_from_p2p_and_bubble_expectation():
    s, t = _summary("interleaved_bare")
    sch = t["schedule"]
    p, v, m = sch["pp"], sch["virtual_stages"], sch["microbatches"]
    pipe = s["pipeline"]
    assert (pipe["schedule"], pipe["virtual_stages"], pipe["microbatches"]) == ("interleaved", v, m)
    assert pipe["expected_bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1))
    # = (p-1)/(v*m) of the ideal time
    e = pipe["expected_bubble_fraction"]
    assert e / (1 - e) == pytest.approx((p - 1) / (v * m))
    ev = pipe["schedule_evidence"]
    assert ev["warmup_forwards"] == {str(k): n for k, n in sch["warmup_forwards"].items() if int(k) < p - 1}
    assert ev["warmup_matches"] is True
    assert not any(f["code"] == "PIPELINE_BUBBLE_EXCESS" for f in s["findings"])
