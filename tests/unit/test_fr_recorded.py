"""Hangs in real gloo runs recorded through PyTorch's own libraries (scripts/record_fr_hang.py: pipelining
ScheduleGPipe / Schedule1F1B on a (pp, dp) DeviceMesh with DDP or FSDP2, plain DDP), with the culprit at
different ranks and the twins without a hang; stored as their Flight Recorder dumps and the traces' group
lists (tests/fr_recorded.py). The truth is each run's truth.json (what the recorder planted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import fr_recorded
from tracelens.analyze.comm.hang import diagnose_run

RUNS = fr_recorded.stored_runs()
SHARED = Path(__file__).resolve().parents[3] / "shared" / "runs"


def _diagnose(name: str):
    coll, members, descs, truth = fr_recorded.load(fr_recorded.STORED / name)
    res = diagnose_run(coll, expected_ranks=range(truth["world_size"]), members=members, descs=descs)
    return res.findings, truth


def test_every_recipe_is_stored():
    assert sorted(fr_recorded.RUNS) == RUNS


@pytest.mark.parametrize("name", RUNS)
def test_culprit_named_on_hang_runs_and_nothing_on_twins(name):
    findings, truth = _diagnose(name)
    hangs = [f for f in findings if f["code"] in ("COLLECTIVE_HANG", "P2P_HANG")]
    assert not [f for f in findings if f["code"] == "COLLECTIVE_MISMATCH"]
    culprit = truth["hang_culprit"]
    if culprit is None:
        assert hangs == []
        return
    assert hangs, "no hang found"
    first = hangs[0]
    assert culprit in first["ranks"] and len(first["ranks"]) < truth["world_size"]
    if truth["fault"]["kind"] != "skip-send" and truth["fault"]["kind"] != "stall":
        assert first["ranks"] == [culprit] and first["root_rank"] == culprit  # skipped a collective: exact


def test_skipped_collective_in_a_pipeline_names_the_rank_exactly():
    findings, truth = _diagnose("pp4dp2_1f1b_ddp_skipcoll5")
    assert [f["message"] for f in findings] == [
        "rank 5 never joined allreduce #4 on pg 0 (default_pg); 7 ranks waited"
    ]
    assert findings[0]["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]


def test_skipped_send_names_the_culprits_pipeline_not_its_blocked_dp_peer():
    """Rank 2 never sends microbatch 1 to rank 4: its pipeline (ranks 0, 2, 4, 6: pg 1 mesh_pp) is stuck in
    point-to-point, which gloo's Flight Recorder does not record; the other pipeline finished the step and
    waits in the loss all_reduce, except rank 1, which waits for rank 0 in their DDP all_reduce."""
    (f,) = _diagnose("pp4dp2_1f1b_ddp_skipsend2")[0]
    assert f["ranks"] == [0, 2, 4, 6] and f["missing_ranks"] == [0, 1, 2, 4, 6] and f["blocked_ranks"] == [1]
    assert f["waiting_ranks"] == [3, 5, 7] and (f["pg_name"], f["seq"]) == ("0", 4)
    assert "ranks 0, 2, 4, 6 are all of pg 1 (mesh_pp) and wait in no collective" in f["message"]
    assert "rank 1, missing too, waits in allreduce #11 on pg 3 (mesh_dp)" in f["message"]
    assert f["caused"] == [
        {"pg_name": "3", "pg_desc": "mesh_dp", "seq": 11, "op": "allreduce", "missing_ranks": [0],
         "waiting_ranks": [1]}
    ]  # fmt: skip


def test_a_culprit_that_skipped_and_went_on_is_told_from_the_ranks_it_blocks():
    """DDP: rank 0 skips the loss all_reduce (world #4) and goes on to the next step's DDP all_reduce (#11 on
    data_parallel), where the others never arrive: each side is missing from the other's collective. Rank 0
    departed from its routine (a DDP all_reduce right after a DDP all_reduce): it is the culprit."""
    (f,) = _diagnose("dp4_ddp_skipcoll0")[0]
    assert f["ranks"] == [0] and f["root_rank"] == 0 and (f["pg_name"], f["seq"]) == ("0", 4)
    assert f["message"] == (
        "rank 0 never joined allreduce #4 on pg 0 (default_pg); 3 ranks waited; rank 0 went on to allreduce #11 "
        "on pg 1 (data_parallel), where it waits; behind it, ranks 1-3 never reach allreduce #11 on pg 1 "
        "(data_parallel)"
    )


def test_fsdp_stall_is_named_exactly():
    (f,) = _diagnose("pp2dp2_1f1b_fsdp_stall1")[0]
    assert f["ranks"] == [1] and f["op"] == "allgather" and f["pg_desc"] == "mesh_dp"


def test_groups_are_the_declared_ones_never_the_recorders():
    """The mesh_dp groups (names 3-6, two ranks each) are judged as their traces declare them; without the
    traces' lists a group that nothing declares is judged among the ranks whose dumps hold it."""
    coll, members, descs, truth = fr_recorded.load(fr_recorded.STORED / "pp4dp2_1f1b_ddp_skipsend2")
    assert members[(2, "4")] == (2, 3) and members[(5, "2")] == (1, 3, 5, 7) and descs["2"] == "mesh_pp"
    bare = diagnose_run(coll, expected_ranks=range(8)).findings
    assert [f["ranks"] for f in bare] == [[0, 2, 4, 6]]  # the world group is the default: still found


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/runs absent")
@pytest.mark.parametrize("name", ["dp4_ddp_hang2", "dp4_ddp_fr_clean"])
def test_shared_hang_family(name, tmp_path):
    """The real runs of ../shared/runs (truth in their manifest.json), analyzed as a user would."""
    import shutil

    from tracelens.options import Options
    from tracelens.run_analysis import analyze_run

    man = json.loads((SHARED / name / "manifest.json").read_text())
    for sub in ("traces", "flight_recorder"):
        shutil.copytree(SHARED / name / sub, tmp_path / sub)
    s = analyze_run(tmp_path, Options(no_cache=True)).summary()
    hangs = [f for f in s["findings"] if f["code"] in ("COLLECTIVE_HANG", "P2P_HANG")]
    culprit = man["expect"]["hang_culprit"]
    if culprit is None:
        assert hangs == []
    else:
        assert [(f["ranks"], f.get("root_rank")) for f in hangs] == [([culprit], culprit)]
        assert hangs[0]["message"] == (
            f"rank {culprit} never joined allreduce #31 on pg 1 (data_parallel); 3 ranks waited"
        )


@pytest.mark.recording
@pytest.mark.parametrize("name", ["pp4_gpipe_skipcoll1", "pp4_gpipe_clean"])
def test_live_recording_gives_the_stored_verdict(name, tmp_path):
    """Record a run again with torch (the record extra) and analyze the whole folder: traces and dumps."""
    pytest.importorskip("torch")
    from tracelens.options import Options
    from tracelens.run_analysis import analyze_run

    run = fr_recorded.record(name, tmp_path / name)
    s = analyze_run(run, Options(no_cache=True)).summary()
    got = [(f["code"], f["ranks"]) for f in s["findings"] if f["code"] in ("COLLECTIVE_HANG", "P2P_HANG")]
    stored = [(f["code"], f["ranks"]) for f in _diagnose(name)[0]]
    assert got == stored
