"""Hangs through point-to-point from call sequences (tracelens.analyze.comm.p2p_hang), gloo retired entries
(tracelens.analyze.comm.hang) and Flight Recorder sniffing by real keys."""

from __future__ import annotations

import json

import pyarrow as pa

from tracelens import schema
from tracelens.analyze.comm.hang import diagnose
from tracelens.analyze.comm.p2p_hang import diagnose_p2p, hung_steps
from tracelens.ingest.sniff import FR_JSON, detect_format


def _table(rows: list[dict], sch: pa.Schema) -> pa.Table:
    cols = {}
    for f in sch:
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        cols[f.name] = pa.array([r.get(f.name) for r in rows], type=t)
    return pa.Table.from_pydict(cols).cast(sch)


def _bd(times: dict[tuple[int, int], int]) -> pa.Table:
    rows = []
    for (r, s), dur in times.items():
        start = s * 1_000_000_000
        rows.append({"rank": r, "step": s, "window_start_ns": start, "window_end_ns": start + dur,
                     "step_time_ns": dur, "compute_ns": 0, "comm_ns": 0, "overlapped_comm_ns": 0,
                     "exposed_comm_ns": 0, "memcpy_ns": 0, "idle_ns": 0, "path": "cpu"})  # fmt: skip
    from tracelens.schema import BREAKDOWN

    return _table(rows, BREAKDOWN)


def _calls(rank: int, step: int, ops: list[str], t0: int) -> list[dict]:
    name = {"send": "c10d::send", "recv": "c10d::recv_", "allreduce": "c10d::allreduce_"}
    out = [{"rank": rank, "kind": "user_annotation", "name": f"ProfilerStep#{step}", "tid": 1,
            "ts_ns": step * 1_000_000_000, "dur_ns": 1, "step": step}]  # fmt: skip
    for i, op in enumerate(ops):
        out.append({"rank": rank, "kind": "cpu_op", "name": name[op], "tid": 1, "ts_ns": t0 + 1000 * i,
                    "dur_ns": 10, "step": step})  # fmt: skip
    return out


HEALTHY = {0: ["send", "send", "recv", "recv"], 1: ["recv", "send", "recv", "send"]}


def test_root_is_the_rank_whose_sequence_departs_and_the_blocked_one_a_prefix():
    ev = []
    for r, ops in HEALTHY.items():
        ev += _calls(r, 1, ops, 1_000_000_000 + 100)
    # step 2: rank 0 skips its second send and goes on to recv; rank 1 blocks in its second recv
    ev += _calls(0, 2, ["send", "recv"], 2_000_000_000 + 100)
    ev += _calls(1, 2, ["recv", "send", "recv"], 2_000_000_000 + 50)
    events = _table(ev, schema.EVENTS)
    bd = _bd({(0, 1): 10_000_000, (1, 1): 10_000_000, (0, 2): 9_000_000_000, (1, 2): 9_000_000_000})
    assert hung_steps(bd) == [2]
    res = diagnose_p2p(events, bd, {0: 0, 1: 1})
    (f,) = res.findings
    assert f["code"] == "P2P_HANG" and f["root_rank"] == 0
    assert (f["missing_op"], f["missing_nth"]) == ("send", 2)
    assert {b["rank"]: b["op"] for b in f["blocked_chain"]} == {0: "recv", 1: "recv"}
    assert [b["rank"] for b in f["blocked_chain"]] == [0, 1]  # earliest blocked first
    assert [p["rank"] for p in f["progress"]] == [0, 1]


def test_no_hung_step_no_finding():
    bd = _bd({(0, 1): 10_000_000, (0, 2): 12_000_000})
    assert hung_steps(bd) == []


def _coll(rank, seq, state, pg=("1", "dp"), ranks=(0, 1), end=None):
    return {"rank": rank, "source": "flight_recorder", "pg_name": pg[0], "pg_desc": pg[1], "pg_ranks": list(ranks),
            "op": "allreduce", "seq": seq, "is_p2p": False, "state": state, "end_ns": end,
            "in_nelems": 4, "out_nelems": 4, "dtype": "Float"}  # fmt: skip


def test_retired_completion_without_all_participants_is_a_hang():
    # gloo after a timeout: rank 1 shows seq 3 "completed" (pg_status), rank 0 never issued it
    rows = [_coll(0, s, "completed") for s in (1, 2)] + [_coll(1, s, "completed") for s in (1, 2, 3)]
    (f,) = diagnose(_table(rows, schema.COLLECTIVES))
    assert f["code"] == "COLLECTIVE_HANG" and f["missing_ranks"] == [0] and f["seq"] == 3


def test_completion_with_a_time_is_believed():
    rows = [_coll(0, s, "completed", end=5) for s in (1, 2)] + [
        _coll(1, s, "completed", end=5) for s in (1, 2, 3)
    ]
    assert diagnose(_table(rows, schema.COLLECTIVES)) == []


def test_any_json_with_entries_is_not_a_flight_recorder_dump(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"entries": [{"name": "x"}], "total": 1}))
    (tmp_path / "b.json").write_text(
        json.dumps(
            {
                "version": "2.10",
                "pg_config": {},
                "pg_status": {},
                "entries": [{"record_id": 0, "profiling_name": "gloo:all_reduce"}],
            }
        )  # fmt: skip
    )
    assert detect_format(tmp_path / "a.json") is None
    assert detect_format(tmp_path / "b.json") == FR_JSON


def test_hung_steps_at_once_equal_the_per_step_medians():
    """Each row's reference read off its rank's sorted durations with the row left out equals pandas'
    median of the other steps, computed per step (even and odd counts, equal durations, ranks that miss
    steps, a rank with one step: no reference)."""
    import numpy as np

    from tracelens.analyze.comm.p2p_hang import _hung_steps_frame

    rng = np.random.default_rng(2)
    hung = 0
    for _ in range(400):
        steps = {(r, s): int(rng.choice([rng.integers(1, 20), rng.integers(50, 200)]))
                 for r in range(int(rng.integers(1, 5))) for s in range(int(rng.integers(1, 8)))
                 if rng.random() < 0.8}  # fmt: skip
        if not steps:
            continue
        bd = _bd(steps)
        for factor in (5.0, 2.0, 1.0):
            got = hung_steps(bd, factor)
            assert got == _hung_steps_frame(bd, factor)
            hung += len(got)
    assert hung > 50
