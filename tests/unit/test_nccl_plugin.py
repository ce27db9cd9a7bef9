"""NCCL profiler-plugin traces: hand-written files in the plugin's exact format, and simulated runs whose
collective counts, bytes, peers and (after alignment) end times must equal the source table."""

from __future__ import annotations

import nccl_tables
import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest import nccl_plugin as npl
from tracelens.ingest.sniff import NCCL_PLUGIN, detect_format
from tracelens.simulate.nccl_outputs import write_nccl_outputs

# Two events as print_event.cc writes them (COLL with a PROXY op inside, and a P2P), world of 4.
HANDWRITTEN = """[
{"name": "AllGather", "cat": "COLL", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1500.250000, "args": {"SeqNum": 0, "CommHash": 987654321, "Rank": 2, "Count": 1024, "Datatype": "ncclBfloat16", "Algorithm": "Ring", "Protocol": "LL128", "nChannels": 8}},
{"name": "ScheduleSend", "cat": "PROXY", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1501.000000, "args": {"Channel": 0, "Peer": 3, "Steps": 6, "ChunkSize": 131072, "transSize": 6144}},
{"name": "ScheduleSend", "cat": "PROXY", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1502.000000},
{"name": "ProgressSend", "cat": "PROXY", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1502.000000, "args": {"Channel": 0, "Peer": 3, "Steps": 6, "ChunkSize": 131072, "transSize": 6144}},
{"name": "ProgressSend", "cat": "PROXY", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1540.500000},
{"name": "AllGather", "cat": "COLL", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1550.750000},
{"name": "Send", "cat": "P2P", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1600.000000, "args": {"CommHash": 987654321, "Rank": 2, "Peer": 0, "Count": 100, "Datatype": "ncclFloat32", "nChannels": 1}},
{"name": "Send", "cat": "P2P", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1610.000000},
{}]
"""  # noqa: E501


def test_handwritten_plugin_file(tmp_path):
    p = tmp_path / "prof_987654321_2.json"
    p.write_text(HANDWRITTEN)
    assert detect_format(p) == NCCL_PLUGIN
    assert npl.name_info(p) == ("987654321", 2)
    t = npl.read(p, comm_ranks={"987654321": [4, 5, 6, 7]})
    assert t.schema.equals(schema.COLLECTIVES)
    df = t.to_pandas()
    assert list(df["op"]) == ["allgather", "send"]
    assert list(df["rank"]) == [6, 6]  # local 2 of [4, 5, 6, 7]
    assert list(df["in_nelems"]) == [1024, 100]
    assert list(df["out_nelems"]) == [4096, 100]  # AllGather count is per rank
    assert list(df["bytes"]) == [4096 * 2, 400]
    assert list(df["dtype"]) == ["BFloat16", "Float"]
    assert df["peer"].iloc[1] == 4 and pd.isna(df["peer"].iloc[0])
    assert list(df["enqueue_ns"]) == [1_500_250, 1_600_000]
    assert list(df["end_ns"]) == [1_550_750, 1_610_000]
    assert list(df["is_p2p"]) == [False, True]
    assert df["seq"].iloc[0] == 0 and list(df["group_size"]) == [4, 4]
    d = npl.read_details(p).to_pylist()
    assert d[0]["algorithm"] == "Ring" and d[0]["protocol"] == "LL128" and d[0]["n_channels"] == 8
    assert d[0]["proxy_steps"] == 6 and d[0]["proxy_bytes"] == 6144  # the Progress op only
    # without membership: local rank, per-rank count only
    bare = npl.read(p).to_pandas()
    assert list(bare["rank"]) == [2, 2] and pd.isna(bare["out_nelems"].iloc[0])


def test_truncated_file_is_salvaged(tmp_path):
    p = tmp_path / "prof_1_0.json"
    cut = HANDWRITTEN[: HANDWRITTEN.index('{"name": "Send", "cat": "P2P", "ph": "e"')]
    p.write_text(cut)
    df = npl.read(p).to_pandas()
    assert list(df["op"]) == ["allgather", "send"]
    assert list(df["state"]) == ["completed", "started"] and pd.isna(df["end_ns"].iloc[1])
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(BadTraceError):
        npl.read(tmp_path / "bad.json")


def counts_and_bytes(df: pd.DataFrame) -> pd.DataFrame:
    """Number of calls and total bytes per (rank, op)."""
    df = df.assign(op=df["op"].astype(str))
    return df.groupby(["rank", "op"]).agg(n=("op", "size"), b=("bytes", "sum")).sort_index()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    run = nccl_tables.build(steps=2, seed=3)
    out = write_nccl_outputs(tmp_path_factory.mktemp("plugin"), run, formats=("plugin",))
    return run, out["files"]["plugin"]


def test_simulated_plugin_matches_source(sim):
    run, files = sim
    assert all(detect_format(f) == NCCL_PLUGIN for f in files)
    got = npl.read_many(files).to_pandas()
    src = run.to_pandas()
    pd.testing.assert_frame_equal(counts_and_bytes(got), counts_and_bytes(src), check_dtype=False)
    sends = got[got["op"] == "send"].sort_values(["rank", "enqueue_ns"])
    src_sends = src[src["op"] == "send"].sort_values(["rank", "enqueue_ns"])
    assert list(sends["peer"]) == list(src_sends["peer"])
    # SeqNum counts per communicator and per collective type, from 0
    tp = got[got["op"] == "allreduce"].groupby(["rank", "pg_name"], observed=True)["seq"].apply(list)
    assert all(v == list(range(len(v))) for v in tp)


def _assert_aligned(aligned: pd.DataFrame, src: pd.DataFrame) -> None:
    for r in range(nccl_tables.WORLD):
        a = np.sort(aligned.loc[aligned["rank"] == r, "end_ns"].to_numpy(np.int64))
        s = np.sort(src.loc[src["rank"] == r, "end_ns"].to_numpy(np.int64))
        assert len(a) == len(s) and np.abs(a - s).max() <= 1


def test_align_onto_reference_clock(sim):
    run, files = sim
    plugin = npl.read_many(files)
    src = run.to_pandas()
    raw = plugin.to_pandas()
    # each process's plugin clock starts at its own time: the raw offsets differ per rank
    offsets = {
        r: src.loc[src["rank"] == r, "end_ns"].min() - raw.loc[raw["rank"] == r, "end_ns"].min()
        for r in range(nccl_tables.WORLD)
    }
    assert len(set(offsets.values())) == nccl_tables.WORLD
    _assert_aligned(npl.align(plugin, run).to_pandas(), src)
    # a reference that misses the first step still gives every rank its offset
    later = run.filter(pc.greater(run["step"], 0))
    _assert_aligned(npl.align(plugin, later).to_pandas(), src)


def test_kineto_simulated_run_counts_and_bytes(tmp_path):
    """Acceptance: the plugin files of a simulated run give the collective counts and bytes of its traces."""
    coll = nccl_tables.kineto_run(tmp_path / "kineto")
    out = write_nccl_outputs(tmp_path / "nccl", coll, formats=("plugin",))
    got = npl.read_many(out["files"]["plugin"]).to_pandas()
    src = coll.to_pandas()
    assert len(got) == len(src) > 0
    pd.testing.assert_frame_equal(counts_and_bytes(got), counts_and_bytes(src), check_dtype=False)


def test_align_ranks_without_reference(sim):
    """No Kineto trace: ranks are put on rank 0's plugin clock by their shared collectives' end times."""
    run, files = sim
    aligned = npl.align_ranks(npl.read_many(files)).to_pandas()
    src = run.to_pandas()
    # one constant (rank 0's clock origin) maps every aligned row back to the source clock
    a = aligned.sort_values(["rank", "enqueue_ns"]).reset_index(drop=True)
    s = src.sort_values(["rank", "enqueue_ns"]).reset_index(drop=True)
    assert list(a["rank"]) == list(s["rank"]) and list(a["op"].astype(str)) == list(s["op"].astype(str))
    delta = s["end_ns"].astype("int64") - a["end_ns"].astype("int64")
    assert delta.max() - delta.min() <= 2
    assert (s["enqueue_ns"].astype("int64") - a["enqueue_ns"].astype("int64") - delta).abs().max() <= 2
