"""Hang and desync diagnosis: planted hangs in simulated Flight Recorder dumps (JSON and pickle), mismatches,
ring-buffer truncation, and the real gloo dumps (a clean run)."""

from __future__ import annotations

import json
from pathlib import Path

import nccl_tables
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tracelens.analyze.comm.hang import diagnose, progress
from tracelens.ingest import flight_recorder as fr
from tracelens.simulate.nccl_outputs import write_nccl_outputs

GLOO = Path(__file__).resolve().parents[2] / "sample_traces" / "cpu-gloo-4rank"
GLOO_HANG = GLOO.parent / "cpu-gloo-4rank-hang"


@pytest.fixture(scope="module")
def run() -> pa.Table:
    return nccl_tables.build(steps=3, seed=1)


@pytest.mark.parametrize("fmt", ["fr_json", "fr_pickle"])
def test_planted_hang_on_world_group(tmp_path, run, fmt):
    out = write_nccl_outputs(tmp_path, run, hang=(5, 2), formats=(fmt,))
    truth = out["hang"]
    coll = fr.read_many(out["files"][fmt])
    findings = diagnose(coll)
    assert findings, "the planted hang was not found"
    first = findings[0]
    assert first["code"] == "COLLECTIVE_HANG" and first["severity"] == "error"
    assert first["ranks"] == [5] == [truth["rank"]]
    assert first["seq"] == 2 and first["pg_name"] == "0" and first["op"] == "allreduce"
    assert first["message"] == "rank 5 never joined allreduce #2 on pg 0 (default_pg); 7 ranks waited"
    assert first["message"] == truth["message"]
    assert first["waiting_ranks"] == [0, 1, 2, 3, 4, 6, 7]
    prog = {p["rank"]: p for p in first["progress"]}
    assert prog[5] == {"rank": 5, "last_enqueued": 1, "last_started": 1, "last_completed": 1}
    for r in (0, 1, 2, 3, 4, 6, 7):
        assert prog[r] == {"rank": r, "last_enqueued": 2, "last_started": 2, "last_completed": 1}
    assert not any(f["code"] == "COLLECTIVE_MISMATCH" for f in findings)


@pytest.mark.parametrize("fmt", ["fr_json", "fr_pickle"])
def test_planted_hang_on_subgroup(tmp_path, run, fmt):
    dp = next(n for n, (d, rs) in nccl_tables.groups().items() if d == "dp_pp1_tp1")  # ranks [5, 7]
    out = write_nccl_outputs(tmp_path, run, hang=(7, 3, dp), formats=(fmt,))
    findings = diagnose(fr.read_many(out["files"][fmt]))
    first = findings[0]
    assert first["code"] == "COLLECTIVE_HANG"
    assert first["ranks"] == [7] and first["seq"] == 3 and first["pg_name"] == dp
    # seq 3 of a dp group is the second step's reducescatter (reducescatter + allgather per step)
    assert first["op"] == "reducescatter"
    assert first["message"] == f"rank 7 never joined reducescatter #3 on pg {dp} (dp_pp1_tp1); 1 rank waited"


def test_clean_run_has_no_findings(tmp_path, run):
    out = write_nccl_outputs(tmp_path, run, formats=("fr_json",))
    coll = fr.read_many(out["files"]["fr_json"])
    assert diagnose(coll) == []
    p = progress(coll)
    world = p[p["pg_name"] == "0"]
    assert (world["last_completed"] == 3).all() and len(world) == 8


def test_ring_buffer_truncation_is_not_a_hang(tmp_path, run):
    out = write_nccl_outputs(tmp_path, run, formats=("fr_json",))
    path = Path(out["files"]["fr_json"][3])
    dump = json.loads(path.read_text())
    dump["entries"] = dump["entries"][10:]  # rank 3 forgot its oldest records
    path.write_text(json.dumps(dump))
    assert diagnose(fr.read_many(out["files"]["fr_json"])) == []


def _with(coll: pa.Table, mask, column: str, value) -> pa.Table:
    i = coll.schema.get_field_index(column)
    col = coll.column(column)
    typ = coll.schema.field(column).type
    new = pc.if_else(
        mask,
        pa.scalar(value, typ.value_type if pa.types.is_dictionary(typ) else typ),
        col.cast(typ.value_type) if pa.types.is_dictionary(typ) else col,
    )
    if pa.types.is_dictionary(typ):
        new = new.dictionary_encode().cast(typ)
    return coll.set_column(i, column, new)


def test_size_and_op_mismatch(tmp_path, run):
    out = write_nccl_outputs(tmp_path, run, formats=("fr_json",))
    coll = fr.read_many(out["files"]["fr_json"])
    tp0 = next(n for n, (d, rs) in nccl_tables.groups().items() if d == "tp_0")
    target = pc.and_(
        pc.and_(pc.equal(coll["rank"], 1), pc.equal(coll["pg_name"].cast(pa.string()), tp0)),
        pc.equal(coll["seq"], 4),
    )
    bad = _with(coll, target, "in_nelems", 12345)
    f = diagnose(bad)
    assert [x["code"] for x in f] == ["COLLECTIVE_MISMATCH"]
    assert f[0]["ranks"] in ([1], [0])  # two members: either side may be the odd one
    assert f[0]["seq"] == 4 and f[0]["pg_name"] == tp0 and f[0]["mismatch"] == "size"

    world = pc.and_(pc.equal(coll["pg_name"].cast(pa.string()), "0"), pc.equal(coll["seq"], 2))
    odd = pc.and_(world, pc.equal(coll["rank"], 6))
    f = diagnose(_with(coll, odd, "op", "allgather"))
    assert [x["code"] for x in f] == ["COLLECTIVE_MISMATCH"]
    assert f[0]["ranks"] == [6] and f[0]["mismatch"] == "op"
    assert f[0]["message"] == (
        "op mismatch in allreduce #2 on pg 0 (default_pg): "
        "rank 6 called allgather where 7 ranks called allreduce"
    )
    f = diagnose(_with(coll, odd, "dtype", "Half"))
    assert f[0]["ranks"] == [6] and f[0]["mismatch"] == "dtype"


def test_membership_from_expected_ranks(tmp_path, run):
    """Without pg_config (as in gloo dumps), members come from `expected_ranks`."""
    out = write_nccl_outputs(tmp_path, run, hang=(2, 3), formats=("fr_json",))
    coll = fr.read_many(out["files"]["fr_json"])
    coll = coll.set_column(
        coll.schema.get_field_index("pg_ranks"), "pg_ranks", pa.nulls(coll.num_rows, pa.list_(pa.int32()))
    )
    f = diagnose(coll, expected_ranks=range(8))
    assert f[0]["ranks"] == [2] and f[0]["seq"] == 3 and f[0]["pg_name"] == "0"


def test_real_gloo_dumps_are_clean():
    for kind in ("json", "pickle"):
        coll = fr.read_many(sorted((GLOO / "flight_recorder" / kind).iterdir()))
        assert coll.num_rows > 0
        assert diagnose(coll, expected_ranks=range(4)) == []


@pytest.mark.parametrize("fmt", ["fr_json", "fr_pickle"])
def test_hang_in_kineto_simulated_run(tmp_path, fmt):
    """The Kineto simulator's run, read back from its traces, with a hang planted in its NCCL outputs."""
    coll = nccl_tables.kineto_run(tmp_path / "kineto")
    tp = coll.filter(pc.and_(pc.equal(coll["rank"], 6), pc.equal(coll["op"].cast(pa.string()), "allreduce")))
    tp_pg = next(p for p, d in zip(tp["pg_name"].to_pylist(), tp["pg_desc"].to_pylist()) if "TENSOR" in d)
    out = write_nccl_outputs(tmp_path / "nccl", coll, hang=(6, 7, tp_pg), formats=(fmt,))
    first = diagnose(fr.read_many(out["files"][fmt]))[0]
    assert first["code"] == "COLLECTIVE_HANG"
    assert (first["ranks"], first["seq"], first["pg_name"], first["op"]) == ([6], 7, tp_pg, "allreduce")
    assert first["message"] == out["hang"]["message"]
    assert first["message"].endswith("; 1 rank waited")


@pytest.mark.parametrize("kind", ["json", "pickle"])
def test_real_gloo_hang_is_diagnosed(kind):
    """Real torch 2.13 gloo dumps of a hung run (scripts/record_cpu_run.py --hang 3:5)."""
    truth = json.loads((GLOO_HANG / "truth.json").read_text())["hang"]
    coll = fr.read_many(sorted((GLOO_HANG / "flight_recorder" / kind).iterdir()))
    findings = diagnose(coll, expected_ranks=range(4))
    assert [f["code"] for f in findings] == ["COLLECTIVE_HANG"]
    f = findings[0]
    assert f["message"] == truth["message"]
    assert (f["ranks"], f["seq"], f["pg_name"], f["op"]) == ([truth["rank"]], truth["seq"], "0", "allreduce")
    assert f["waiting_ranks"] == truth["waiting_ranks"]
    prog = {p["rank"]: p for p in f["progress"]}
    assert prog[truth["rank"]]["last_enqueued"] == truth["seq"] - 1
    for r in truth["waiting_ranks"]:
        # gloo leaves every entry "scheduled": the pending one is not retired (in flight: started), the
        # earlier ones are (completed)
        assert prog[r] == {"rank": r, "last_enqueued": truth["seq"], "last_started": truth["seq"],
                           "last_completed": truth["seq"] - 1}  # fmt: skip


def test_write_for_run_and_parse_hang(tmp_path):
    """The simulate command's path: Kineto run folder -> NCCL outputs with a hang given as RANK:SEQ."""
    from tracelens.errors import BadInputError
    from tracelens.simulate.nccl_outputs import parse_hang, write_for_run

    nccl_tables.kineto_run(tmp_path)
    assert parse_hang("3:2") == (3, 2) and parse_hang("1:4:5") == (1, 4, "5")
    with pytest.raises(BadInputError):
        parse_hang("x")
    out = write_for_run(tmp_path, hang=parse_hang("3:2"), formats=("fr_json",))
    first = diagnose(fr.read_many(out["files"]["fr_json"]))[0]
    assert first["message"] == "rank 3 never joined allreduce #2 on pg 0 (default_pg); 7 ranks waited"
    assert json.loads((tmp_path / "nccl_truth.json").read_text())["hang"]["message"] == first["message"]
    with pytest.raises(BadInputError):
        write_for_run(tmp_path / "flight_recorder")  # no Kineto traces there


def _dump(
    path: Path, rank: int, entries: list[tuple[str, str, int, str, int]], cfg: dict | None = None
) -> Path:
    """A minimal NCCL-style JSON dump: entries (pg_name, desc, seq, op, numel), all completed but the last."""
    rows = [
        {"record_id": i, "pg_id": 0, "process_group": [n, d], "collective_seq_id": seq, "p2p_seq_id": 0,
         "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": 1_000_000 * (i + 1),
         "input_sizes": [[numel]], "output_sizes": [[numel]], "input_dtypes": ["Float"],
         "output_dtypes": ["Float"], "state": "completed" if i < len(entries) - 1 else "started",
         "time_discovered_started_ns": 1, "time_discovered_completed_ns": 2 if i < len(entries) - 1 else 0,
         "retired": i < len(entries) - 1, "is_p2p": False}
        for i, (n, d, seq, op, numel) in enumerate(entries)
    ]  # fmt: skip
    doc = {"version": "2.10", "pg_config": cfg or {}, "pg_status": {}, "entries": rows}
    path.write_text(json.dumps(doc))
    return path


def test_groups_sharing_a_name_are_not_one_group(tmp_path):
    """split_group can give two groups over different ranks one name: ranks 0-1 and ranks 2-3 each run their
    own collectives on "5". Matched by name alone they make a group of ranks 0-3 that does not exist, with a
    mismatch in it; by (name, declared ranks) each is whole."""
    paths = []
    for r in range(4):
        op, n = ("allreduce", 8) if r < 2 else ("allgather", 4)
        paths.append(
            _dump(tmp_path / f"fr_{r}.json", r, [("5", "split", 1, op, n), ("5", "split", 2, op, n)])
        )
    coll = fr.read_many(paths)
    assert diagnose(coll)[0]["code"] == "COLLECTIVE_MISMATCH"  # the group "5" of the ranks that recorded it
    members = {(r, "5"): (0, 1) if r < 2 else (2, 3) for r in range(4)}
    assert diagnose(coll, members=members) == []
    # the dump's own pg_config says the same, per rank
    for r in range(4):
        ranks = "[0, 1]" if r < 2 else "[2, 3]"
        op, n = ("allreduce", 8) if r < 2 else ("allgather", 4)
        _dump(paths[r], r, [("5", "split", 1, op, n), ("5", "split", 2, op, n)],
              {"5": {"name": "5", "desc": "split", "ranks": ranks}})  # fmt: skip
    assert diagnose(fr.read_many(paths)) == []


def test_a_group_nothing_declares_says_so(tmp_path):
    paths = [
        _dump(
            tmp_path / f"fr_{r}.json",
            r,
            [("7", "undefined", 1, "allreduce", 8), ("7", "undefined", 2, "allreduce", 8 if r else 9)],
        )  # fmt: skip
        for r in range(3)
    ]
    (f,) = diagnose(fr.read_many(paths), expected_ranks=range(8))
    assert f["code"] == "COLLECTIVE_MISMATCH" and f["ranks"] == [0]
    assert "on pg 7 (members unknown: judged among the 3 ranks whose dumps hold it)" in f["message"]
