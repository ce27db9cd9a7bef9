"""A missing or damaged Flight Recorder dump is no evidence, never a hang (docs/bad-input.md, "Missing or
damaged Flight Recorder dumps"). Built from the bundled real gloo runs (sample_traces/cpu-gloo-4rank: healthy,
with a barrier after training; cpu-gloo-4rank-hang: rank 3 skips world allreduce #5), damage applied here."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tracelens.analyze.comm.hang import diagnose, diagnose_run
from tracelens.ingest import flight_recorder as fr
from tracelens.options import Options
from tracelens.run_analysis import analyze_run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
GLOO = SAMPLES / "cpu-gloo-4rank"
GLOO_HANG = SAMPLES / "cpu-gloo-4rank-hang"
HANGS = ("COLLECTIVE_HANG", "P2P_HANG")


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "absent":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "cut":  # a dump cut mid-write
        path.write_bytes(data[: len(data) // 2])
    elif kind == "unreadable":  # bytes that are no dump at all
        path.write_bytes(bytes((i * 131 + 7) % 256 for i in range(len(data))))
    else:
        raise ValueError(kind)


def _copy(src: Path, dst: Path, traces: bool) -> Path:
    shutil.copytree(src / "flight_recorder", dst / "flight_recorder")
    if traces:
        shutil.copytree(src / "traces", dst / "traces")
    return dst


def _rank_dumps(run: Path, rank: int) -> list[Path]:
    return [run / "flight_recorder" / "json" / f"fr_trace_rank_{rank}.json",
            run / "flight_recorder" / "pickle" / f"fr_trace_rank_{rank}"]  # fmt: skip


def test_healthy_run_with_a_dump_absent_is_not_a_hang(tmp_path):
    """The issue's case: the bundled healthy run (traces and dumps) without rank 2's dumps."""
    run = _copy(GLOO, tmp_path / "run", traces=True)
    for p in _rank_dumps(run, 2):
        p.unlink()
    a = analyze_run(run, Options(no_cache=True))
    s = a.summary()
    assert not [f for f in s["findings"] if f["code"] in HANGS + ("COLLECTIVE_MISMATCH",)]
    notes = [w for w in s["run"]["warnings"] if w.startswith("Flight Recorder:")]
    assert notes == [
        "Flight Recorder: no usable dump from rank 2 (no dump): its collectives are unknown, not missing "
        "(it is never named as a rank that did not join)"
    ]
    assert a.fr_unusable == {2: "no dump"} and a.fr_dumped == {0, 1, 3}


@pytest.mark.parametrize("kind", ["absent", "empty", "cut", "unreadable"])
def test_damaged_dump_is_named_and_not_a_hang(tmp_path, kind):
    run = _copy(GLOO, tmp_path / "run", traces=False)
    for p in _rank_dumps(run, 2):
        _damage(p, kind)
    # without the damaged rank's evidence the dumps of the others alone look like a hang: the old verdict
    coll = fr.read_many(
        sorted(p for p in (run / "flight_recorder" / "json").iterdir() if "rank_2" not in p.name)
    )
    old = diagnose(coll, expected_ranks=range(4), dumps=range(4))
    assert [(f["code"], f["ranks"], f["op"], f["seq"]) for f in old] == [
        ("COLLECTIVE_HANG", [2], "barrier", 1)
    ]
    s = analyze_run(run, Options(no_cache=True)).summary()
    assert not [f for f in s["findings"] if f["code"] in HANGS + ("COLLECTIVE_MISMATCH",)]
    warns = [w for w in s["run"]["warnings"] if "no usable dump from rank 2" in w]
    assert len(warns) == 1
    want = {
        "absent": ["(no dump)"],
        "empty": ["fr_trace_rank_2.json: empty", "fr_trace_rank_2: empty"],
        "cut": ["fr_trace_rank_2.json: invalid JSON", "fr_trace_rank_2: unsafe or invalid pickle"],
        "unreadable": ["fr_trace_rank_2.json: not a Flight Recorder dump", "fr_trace_rank_2: not a Flight"],
    }[kind]
    assert all(w in warns[0] for w in want), warns[0]


def test_damaged_json_falls_back_to_the_same_ranks_pickle(tmp_path):
    run = _copy(GLOO, tmp_path / "run", traces=False)
    _damage(_rank_dumps(run, 2)[0], "cut")
    a = analyze_run(run, Options(no_cache=True))
    s = a.summary()
    assert not [f for f in s["findings"] if f["code"] in HANGS]
    assert a.fr_dumped == {0, 1, 2, 3} and not a.fr_unusable
    assert any(
        w.startswith("Flight Recorder: rank 2's fr_trace_rank_2 was read instead")
        for w in s["run"]["warnings"]
    )
    # rank 2's pickle holds what its JSON held: every rank's records are in the table
    assert sorted(set(a.nccl["flight_recorder"].column("rank").to_pylist())) == [0, 1, 2, 3]


def test_hung_run_with_a_waiting_ranks_dump_missing_still_names_the_culprit(tmp_path):
    run = _copy(GLOO_HANG, tmp_path / "run", traces=False)
    for p in _rank_dumps(run, 1):
        p.unlink()
    s = analyze_run(run, Options(no_cache=True)).summary()
    (f,) = [f for f in s["findings"] if f["code"] in HANGS]
    assert f["ranks"] == [3] and f["root_rank"] == 3 and f["no_evidence_ranks"] == [1]
    assert f["waiting_ranks"] == [0, 2] and f["seq"] == 5
    assert f["message"] == (
        "rank 3 never joined allreduce #5 on pg 0 (default_pg); 2 ranks waited; "
        "no usable Flight Recorder dump from rank 1: not judged"
    )


def test_hung_run_without_the_culprits_dump_is_a_note_not_a_hang():
    """Rank 3 (the culprit) left no dump: the others are in allreduce #5, and that is all one can say."""
    coll = fr.read_many(
        sorted(p for p in (GLOO_HANG / "flight_recorder" / "json").iterdir() if "rank_3" not in p.name)
    )
    res = diagnose_run(coll, expected_ranks=range(4), dumps=[0, 1, 2])
    assert res.findings == []
    assert res.notes == [
        "ranks 0-2 were still in allreduce #5 on pg 0 (default_pg) when dumped; rank 3 left no usable Flight "
        "Recorder dump, so whether it joined is unknown: no hang is reported without evidence"
    ]


@pytest.fixture(scope="module")
def gloo_kineto() -> pa.Table:
    return analyze_run(GLOO, Options(no_cache=True)).cross.collectives


def test_a_rank_seen_completing_the_collective_in_its_trace_is_not_hung(gloo_kineto):
    """Dumps taken right after the profiled steps (no barrier yet), rank 2's without its last allreduce (#5 of
    dp_stage1, in ProfilerStep#3): its dump says nothing of #5, its Kineto trace shows it in #5."""
    coll = fr.read_many(sorted((GLOO / "flight_recorder" / "json").iterdir()))
    barrier = pc.equal(coll["op"].cast(pa.string()), "barrier")
    last = pc.and_(pc.equal(coll["rank"], 2), pc.equal(coll["seq"], 5))
    coll = coll.filter(pc.invert(pc.or_(barrier, last)))
    found = diagnose(coll, expected_ranks=range(4))
    assert [(f["code"], f["ranks"], f["seq"], f["pg_desc"]) for f in found] == [
        ("COLLECTIVE_HANG", [2], 5, "dp_stage1")
    ]
    assert diagnose(coll, expected_ranks=range(4), kineto=gloo_kineto) == []
    # the trace's call must overlap the collective: an hour later (past the 30 min pg timeout) it is another
    later = gloo_kineto
    for col in ("start_ns", "end_ns"):
        later = later.set_column(
            later.schema.get_field_index(col), col, pc.add(later[col], 3_600_000_000_000)
        )
    assert [f["ranks"] for f in diagnose(coll, expected_ranks=range(4), kineto=later)] == [[2]]


def test_gloo_state_comes_from_retired():
    """gloo leaves entries "scheduled": retired ones are completed, the pending one started."""
    dump = json.loads((GLOO_HANG / "flight_recorder" / "json" / "fr_trace_rank_0.json").read_text())
    assert [e["retired"] for e in dump["entries"]] == [True, True, True, True, False]
    t = fr.read(GLOO_HANG / "flight_recorder" / "json" / "fr_trace_rank_0.json")
    assert t.column("state").to_pylist() == ["completed"] * 4 + ["started"]


def test_gloo_status_marks_count_work_not_collectives(tmp_path):
    """Without `retired`, gloo's pg_status marks are compared with op_id (its work sequence, point-to-point
    included): a pipeline rank's collective #2 (op_id 46) is not completed because last_completed is 29."""
    dump = json.loads((GLOO_HANG / "flight_recorder" / "json" / "fr_trace_rank_0.json").read_text())
    entries = [dict(dump["entries"][0], op_id=29, collective_seq_id=1),
               dict(dump["entries"][1], op_id=46, collective_seq_id=2)]  # fmt: skip
    for e in entries:
        e.pop("retired")
    dump.update(entries=entries, pg_status={"0": {"last_enqueued_collective": "46", "last_started_collective": "-1",
                                                  "last_completed_collective": "29"}})  # fmt: skip
    p = tmp_path / "fr_trace_rank_0.json"
    p.write_text(json.dumps(dump))
    assert fr.read(p).column("state").to_pylist() == ["completed", "scheduled"]


def test_sibling_that_is_no_dump_is_named_only_when_named_like_the_dumps(tmp_path):
    run = _copy(GLOO, tmp_path / "run", traces=False)
    (run / "flight_recorder" / "json" / "notes_rank_7.txt").write_text("x")  # not named like the dumps
    os.remove(_rank_dumps(run, 2)[0])
    s = analyze_run(run, Options(no_cache=True)).summary()
    assert not any("rank 7" in w for w in s["run"]["warnings"])
    assert not [w for w in s["run"]["warnings"] if "no usable dump" in w]  # rank 2's pickle was read
