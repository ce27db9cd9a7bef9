"""Flight Recorder ingest: real gloo dumps, version variants, restricted unpickling, sniffing."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest

from tracelens import schema
from tracelens.errors import BadTraceError, RankError
from tracelens.ingest import flight_recorder as fr
from tracelens.ingest.sniff import FR_JSON, FR_PICKLE, detect_format

REPO = Path(__file__).resolve().parents[2]
GLOO = REPO / "sample_traces" / "cpu-gloo-4rank"


def _truth() -> dict:
    return json.loads((GLOO / "truth.json").read_text())


@pytest.mark.parametrize("kind", ["json", "pickle"])
def test_real_gloo_dumps_load(kind):
    truth = _truth()
    files = sorted((GLOO / "flight_recorder" / kind).iterdir())
    assert len(files) == truth["world_size"]
    for f in files:
        assert detect_format(f) == (FR_JSON if kind == "json" else FR_PICKLE)
        t = fr.read(f)
        assert t.schema.equals(schema.COLLECTIVES)
        rank = fr.rank_from_path(f)
        info = next(r for r in truth["ranks"] if r["rank"] == rank)
        issued = info["collectives_issued_total"]
        df = t.to_pandas()
        # gloo records collectives only: broadcast + allreduce + barrier, never send/recv
        assert len(df) == issued["broadcast"] + issued["allreduce"] + issued["barrier"]
        assert (df["op"] == "allreduce").sum() == issued["allreduce"]
        assert (df["op"] == "broadcast").sum() == issued["broadcast"]
        assert not df["op"].isin(["send", "recv"]).any()
        assert set(df["rank"]) == {rank}
        assert set(df["source"]) == {"flight_recorder"}
        # every entry says "scheduled" (gloo never updates it); pg_status says all completed
        assert set(df["state"]) == {"completed"}
        assert df["start_ns"].isna().all() and df["end_ns"].isna().all()
        assert df["enqueue_ns"].notna().all() and df["enqueue_ns"].is_monotonic_increasing
        # the dp group is the one named after the rank's stage in truth.json
        stage = info["stage"]
        dp = df[df["op"].isin(["allreduce", "broadcast"])]
        assert set(dp["pg_desc"]) == {f"dp_stage{stage}"}
        assert list(dp["seq"]) == list(range(1, len(dp) + 1))
        assert (dp["bytes"] == dp["in_nelems"] * 4).all()  # Float
        assert df.loc[df["op"] == "barrier", "pg_desc"].tolist() == ["default_pg"]


def test_real_gloo_json_and_pickle_agree():
    for r in range(_truth()["world_size"]):
        a = fr.read(GLOO / "flight_recorder" / "json" / f"fr_trace_rank_{r}.json")
        b = fr.read(GLOO / "flight_recorder" / "pickle" / f"fr_trace_rank_{r}")
        assert a.to_pylist() == b.to_pylist()


def test_real_gloo_status():
    st = fr.read_status(GLOO / "flight_recorder" / "json" / "fr_trace_rank_2.json")
    st_p = fr.read_status(GLOO / "flight_recorder" / "pickle" / "fr_trace_rank_2")
    assert st["pg_status"] == st_p["pg_status"]  # JSON has strings, pickle ints: both normalised
    assert st["pg_config"] == {}  # gloo: one empty entry, dropped
    issued = next(r for r in _truth()["ranks"] if r["rank"] == 2)["collectives_issued_total"]
    dp = next(v for v in st["pg_status"].values() if v["pg_desc"] == "dp_stage1")
    assert dp["last_enqueued_collective"] == issued["broadcast"] + issued["allreduce"]
    assert dp["last_completed_collective"] == dp["last_enqueued_collective"]
    assert dp["last_started_collective"] is None  # gloo never reports "started"


def _entry(**kw) -> dict:
    base = {
        "record_id": 0,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "op_id": 1,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_000,
        "input_sizes": [[4, 8]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[4, 8]],
        "output_dtypes": ["BFloat16"],
        "state": "completed",
        "time_discovered_started_ns": 1_500,
        "time_discovered_completed_ns": 2_500,
        "retired": True,
        "is_p2p": False,
    }
    base.update(kw)
    return base


def test_nccl_style_dump_fields(tmp_path):
    dump = {
        "version": "2.10",
        "comm_lib_version": "2.27.5",
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
            "3": {"name": "3", "desc": "pp", "ranks": "[2, 6]"},
        },
        "pg_status": {
            "0": {"last_enqueued_collective": 2, "last_started_collective": 2, "last_completed_collective": 1}
        },
        "entries": [
            _entry(),
            _entry(
                record_id=1,
                collective_seq_id=2,
                profiling_name="nccl:_allgather_base",
                input_sizes=[[16]],
                output_sizes=[[64]],
                state="started",
                time_discovered_completed_ns=None,
            ),
            _entry(
                record_id=2,
                pg_id=3,
                process_group=["3", "pp"],
                collective_seq_id=0,
                p2p_seq_id=7,
                profiling_name="nccl:send 0->1",
                input_sizes=[[100]],
                output_sizes=[[100]],
                is_p2p=True,
            ),
            _entry(
                record_id=3,
                pg_id=3,
                process_group=["3", "pp"],
                p2p_seq_id=8,
                profiling_name="nccl:recv 0<-1",
                is_p2p=True,
                input_sizes=[[10]],
                output_sizes=[[10]],
                state="scheduled",
                time_discovered_started_ns=None,
                time_discovered_completed_ns=None,
            ),
        ],
    }
    path = tmp_path / "nccl_trace_rank_2"
    path.write_bytes(pickle.dumps(dump))
    df = fr.read(path).to_pandas()
    assert list(df["op"]) == ["allreduce", "allgather", "send", "recv"]
    assert list(df["seq"]) == [1, 2, 7, 8]  # p2p rows take p2p_seq_id
    assert list(df["in_nelems"]) == [32, 16, 100, 10]
    assert list(df["out_nelems"]) == [32, 64, 100, 10]
    assert list(df["bytes"]) == [64, 128, 200, 20]  # BFloat16, larger buffer
    assert list(df["peer"].fillna(-1)) == [-1, -1, 6, 6]  # local 1 of pg [2, 6] is global rank 6
    assert list(df["state"]) == ["completed", "started", "completed", "scheduled"]
    assert (
        df["end_ns"].iloc[0] == 2_500
        and df["start_ns"].iloc[0] == 1_500
        and df["enqueue_ns"].iloc[0] == 1_000
    )
    assert df["end_ns"].isna().iloc[1]
    assert list(df["pg_ranks"].iloc[0]) == [0, 1, 2, 3] and df["group_size"].iloc[0] == 4
    assert list(df["order"]) == [0, 0, 0, 0]
    assert (df["rank"] == 2).all()
    st = fr.read_status(path)
    assert st["comm_lib_version"] == "2.27.5"
    assert st["pg_status"]["0"]["last_started_collective"] == 2


def test_old_versions_by_key_presence(tmp_path):
    """A 2.3-era dump: `seq_id`, no p2p_seq_id/is_p2p/dtypes/state/times, `nccl_version`, odd version."""
    entries = [
        {
            "record_id": 0,
            "pg_id": 0,
            "seq_id": 5,
            "profiling_name": "nccl:broadcast",
            "time_created_ns": 10,
            "input_sizes": [[8]],
            "output_sizes": [[8]],
        },
        {
            "record_id": 1,
            "pg_id": 0,
            "seq_id": 6,
            "profiling_name": "nccl:send 0->1",
            "time_created_ns": 20,
            "input_sizes": [[8]],
            "output_sizes": [[8]],
            "time_discovered_completed_ns": 30,
        },
    ]
    dump = {
        "version": "weird-2.3",
        "nccl_version": "2.18.1",
        "pg_config": {"0": {"desc": "default_pg", "ranks": [0, 1]}},
        "entries": entries,
    }
    path = tmp_path / "dump_1.json"
    path.write_text(json.dumps(dump))
    df = fr.read(path).to_pandas()
    assert list(df["op"]) == ["broadcast", "send"]
    assert list(df["seq"]) == [5, 6]
    assert list(df["is_p2p"]) == [False, True]
    assert df["dtype"].isna().all() and df["bytes"].isna().all()
    assert list(df["state"]) == ["scheduled", "completed"]  # inferred from the discovered times
    assert list(df["pg_name"]) == ["0", "0"]
    assert df["peer"].iloc[1] == 1
    assert fr.read_status(path)["comm_lib_version"] == "2.18.1"


def test_gzip_and_rank_names(tmp_path):
    dump = {"version": "2.10", "pg_config": {}, "entries": [_entry()]}
    p = tmp_path / "trace_rank_12.json.gz"
    p.write_bytes(gzip.compress(json.dumps(dump).encode()))
    assert detect_format(p) == FR_JSON
    assert fr.read(p).column("rank").to_pylist() == [12]
    assert fr.rank_from_path("nccl_trace_rank_7") == 7
    assert fr.rank_from_path("fr_3.pkl") == 3
    assert fr.rank_from_path("no_rank_here.json") is None
    q = tmp_path / "dump.json"
    q.write_text(json.dumps(dump))
    with pytest.raises(RankError):
        fr.read(q)
    assert fr.read(q, rank=4).column("rank").to_pylist() == [4]


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_callable_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = {"version": "2.10", "pg_config": {}, "entries": [_Evil(marker)]}
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(BadTraceError, match="unsafe or invalid pickle"):
        fr.read(path)
    assert not marker.exists()
    # a global through the GLOBAL opcode (builtins.eval), and through the copyreg extension opcode EXT1
    path.write_bytes(b"\x80\x04cbuiltins\neval\n(S'1+1'\ntR.")
    with pytest.raises(BadTraceError):
        fr.load_dump(path)
    import copyreg

    copyreg.add_extension("os", "system", 0x7A)
    try:
        path.write_bytes(b"\x80\x02\x82\x7a(S'touch " + str(marker).encode() + b"'\ntR.")
        with pytest.raises(BadTraceError):
            fr.load_dump(path)
    finally:
        copyreg.remove_extension("os", "system", 0x7A)
    assert not marker.exists()


def test_not_a_dump(tmp_path):
    p = tmp_path / "x_0.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(BadTraceError, match="not a Flight Recorder dump"):
        fr.read(p)
    p.write_text("{broken")
    with pytest.raises(BadTraceError):
        fr.read(p)
    p.write_bytes(b"\x80\x04\x95")  # truncated pickle
    with pytest.raises(BadTraceError):
        fr.read(p)
    p.write_text('{"version": "2.10", "entries": [1, 2]}')
    with pytest.raises(BadTraceError, match="entries"):
        fr.read(p)


def test_normalise_op():
    assert fr.normalise_op("nccl:recv 3<-0") == ("recv", 0, 3)
    assert fr.normalise_op("nccl:send 1->2") == ("send", 1, 2)
    assert fr.normalise_op("gloo:all_reduce")[0] == "allreduce"
    assert fr.normalise_op("nccl:_reduce_scatter_base")[0] == "reducescatter"
    assert fr.normalise_op("nccl:all_to_all_single")[0] == "alltoall"
    assert fr.normalise_op("xccl:something_new")[0] == "something_new"


def test_non_finite_numbers_are_unknown(tmp_path):
    """JSON dumps may hold Infinity/NaN (Python's json writes them): they read as unknown, no crash."""
    import math

    src = (
        Path(__file__).resolve().parents[2] / "sample_traces" / "cpu-gloo-4rank" / "flight_recorder" / "json"
    )
    if not src.is_dir():
        pytest.skip("sample_traces/cpu-gloo-4rank is absent")
    d = json.loads((src / "fr_trace_rank_0.json").read_text())
    n = len(d["entries"])
    d["pg_status"] = {
        "0": {
            "last_enqueued_collective": math.inf,
            "last_started_collective": math.nan,
            "last_completed_collective": -math.inf,
        }
    }
    d["entries"][0]["time_created_ns"] = math.inf
    d["entries"][1]["time_discovered_started_ns"] = math.nan
    p = tmp_path / "fr_trace_rank_0.json"
    p.write_text(json.dumps(d))
    t = fr.read(p, 0)
    assert t.num_rows == n
    st = fr.read_status(p)["pg_status"]["0"]
    assert st["last_enqueued_collective"] is None and st["last_started_collective"] is None
