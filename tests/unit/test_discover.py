"""Run discovery: which files are traces and which rank each one is."""

from __future__ import annotations

import gzip

import kineto_traces as kt
import pytest

from tracelens.discover import discover
from tracelens.errors import BadInputError, NoTracesError, RankError


def _ranks(files):
    return [(f.rank, f.path.name, f.rank_source) for f in files]


def test_rank_from_distributed_info_any_name(tmp_path):
    # tensorboard_trace_handler names carry no rank; gzip and plain, nested folders
    kt.write(tmp_path / "a" / "host_123.1712195495.pt.trace.json.gz", kt.doc(rank=1, world_size=2))
    kt.write(tmp_path / "host_456.1712195496.pt.trace.json", kt.doc(rank=0, world_size=2))
    files = discover(tmp_path)
    assert _ranks(files) == [
        (0, "host_456.1712195496.pt.trace.json", "distributedInfo"),
        (1, "host_123.1712195495.pt.trace.json.gz", "distributedInfo"),
    ]
    assert all(f.world_size == 2 and f.fmt == "kineto" for f in files)
    assert files[1].size == (tmp_path / "a" / "host_123.1712195495.pt.trace.json.gz").stat().st_size
    assert files[0].mtime > 0


@pytest.mark.parametrize(
    "name", ["rank-3.json", "trace_rank_3.json.gz", "RANK3.json", "job.Rank_3.pt.trace.json"]
)
def test_rank_from_file_name(tmp_path, name):
    kt.write(tmp_path / name, kt.doc())
    kt.write(tmp_path / "rank0.json", kt.doc())
    files = discover(tmp_path)
    assert [(f.rank, f.rank_source) for f in files] == [(0, "filename"), (3, "filename")]


def test_distributed_info_wins_over_name(tmp_path):
    kt.write(tmp_path / "rank7.json", kt.doc(rank=2))
    kt.write(tmp_path / "rank0.json", kt.doc(rank=0))
    assert [f.rank for f in discover(tmp_path)] == [0, 2]


def test_missing_rank_is_an_error_naming_the_file(tmp_path):
    kt.write(tmp_path / "rank0.json", kt.doc())
    kt.write(tmp_path / "mystery.json", kt.doc())
    with pytest.raises(RankError, match="mystery.json"):
        discover(tmp_path)


def test_single_trace_without_rank_is_rank_0(tmp_path):
    p = kt.write(tmp_path / "trace.json", kt.doc())
    assert _ranks(discover(p)) == [(0, "trace.json", "default")]
    assert _ranks(discover(tmp_path)) == [(0, "trace.json", "default")]


def test_duplicate_ranks(tmp_path):
    kt.write(tmp_path / "x" / "t.json", kt.doc(rank=1))
    kt.write(tmp_path / "y" / "t.json", kt.doc(rank=1))
    with pytest.raises(RankError, match=r"rank 1 appears twice.*x/t\.json.*y/t\.json"):
        discover(tmp_path)


def test_world_sizes_disagree(tmp_path):
    kt.write(tmp_path / "a.json", kt.doc(rank=0, world_size=8))
    kt.write(tmp_path / "b.json", kt.doc(rank=1, world_size=2))
    with pytest.raises(RankError, match=r"world sizes disagree.*a\.json.*8.*b\.json.*2"):
        discover(tmp_path)


def test_rank_outside_world_size(tmp_path):
    kt.write(tmp_path / "a.json", kt.doc(rank=0, world_size=2))
    kt.write(tmp_path / "b.json", kt.doc(rank=5, world_size=2))
    with pytest.raises(RankError, match="outside world size 2"):
        discover(tmp_path)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(BadInputError, match="no such"):
        discover(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(NoTracesError):
        discover(tmp_path)


def test_skips_hidden_and_cache_folders_keeps_other_formats(tmp_path):
    kt.write(tmp_path / "rank0.json", kt.doc(rank=0))
    kt.write(tmp_path / ".tracelens" / "cache" / "rank1.json", kt.doc(rank=1))
    kt.write(tmp_path / ".hidden" / "rank2.json", kt.doc(rank=2))
    (tmp_path / "nccl_trace_rank_1").write_text('{"version": "2.4", "pg_config": {}, "entries": []}')
    (tmp_path / "train.log").write_text("node:1:2 [0] NCCL INFO AllReduce: opCount 0\n")
    (tmp_path / "model.json").write_text('{"hidden_size": 4096}')  # JSON but not a trace
    files = discover(tmp_path)
    assert [(f.fmt, f.rank) for f in files] == [
        ("kineto", 0),
        ("flight_recorder_json", 1),
        ("nccl_log", None),
    ]


def test_gzip_rank_after_events_in_big_head(tmp_path):
    events = [kt.x("cpu_op", f"op{i}", f"{i}.000", "1.000") for i in range(30000)]  # > 1 MiB before the key
    d = kt.doc(events=events)
    d["distributedInfo"] = {"rank": 1, "world_size": 2}
    kt.write(tmp_path / "a.json.gz", d)
    kt.write(tmp_path / "b.json", kt.doc(rank=0, world_size=2))
    assert [(f.rank, f.path.name) for f in discover(tmp_path)] == [(0, "b.json"), (1, "a.json.gz")]
    assert gzip.decompress((tmp_path / "a.json.gz").read_bytes()).find(b"distributedInfo") > 1 << 20
