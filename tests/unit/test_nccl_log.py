"""NCCL_DEBUG=INFO logs: hand-written lines in NCCL's exact format, and simulated runs whose collective
counts, bytes and peers must equal the source table."""

from __future__ import annotations

import nccl_tables
import pandas as pd
import pytest

from tracelens import schema
from tracelens.errors import BadTraceError
from tracelens.ingest import nccl_log
from tracelens.ingest.sniff import NCCL_LOG, detect_format
from tracelens.simulate.nccl_outputs import write_nccl_outputs

LOG = """\
node07:31337:31337 [3] NCCL INFO NCCL version 2.27.5+cuda12.9
node07:31337:31400 [3] NCCL INFO ncclCommInitRank comm 0x55d0c0a1b2c0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4a000 commId 0x1a2b3c4d5e6f7081 - Init COMPLETE
node07:31337:31400 [3] NCCL INFO ncclCommInitRank comm 0x55d0c0ffee00 rank 1 nranks 2 cudaDev 3 nvmlDev 3 busId 4a000 commId 0xabc - Init COMPLETE
some unrelated training output line
node07:31337:31337 [3] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f0000001000 recvbuff 0x7f0000001000 count 1048576 datatype 9 op 0 root 0 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO AllGather: opCount 1b sendbuff 0x7f0000001000 recvbuff 0x7f0000002000 count 4096 datatype 7 op 0 root 0 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO ReduceScatter: opCount 1c sendbuff 0x7f0000001000 recvbuff 0x7f0000002000 count 4096 datatype 6 op 0 root 0 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO Send: opCount 0 sendbuff 0x7f0000001000 recvbuff (nil) count 256 datatype 9 op 0 root 0 comm 0x55d0c0ffee00 [nranks=2] stream 0x55d0c0000b00
node07:31337:31337 [3] NCCL INFO Recv: opCount 1 sendbuff (nil) recvbuff 0x7f0000001000 count 256 datatype 9 op 0 root 6 comm 0x55d0c0a1b2c0 [nranks=8] stream 0x55d0c0000b00
"""  # noqa: E501


def _counts(df: pd.DataFrame) -> pd.DataFrame:
    """Number of calls and total bytes per (rank, op)."""
    df = df.assign(op=df["op"].astype(str))
    return df.groupby(["rank", "op"]).agg(n=("op", "size"), b=("bytes", "sum")).sort_index()


def test_handwritten_log(tmp_path):
    p = tmp_path / "nccl.node07.31337.log"
    p.write_text(LOG)
    assert detect_format(p) == NCCL_LOG
    t = nccl_log.read(p)
    assert t.schema.equals(schema.COLLECTIVES)
    df = t.to_pandas()
    assert list(df["op"]) == ["allreduce", "allgather", "reducescatter", "send", "recv"]
    assert list(df["seq"]) == [0x1A, 0x1B, 0x1C, 0, 1]  # opCount is hex
    assert (df["rank"] == 3).all()  # rank in the largest communicator
    assert list(df["dtype"]) == ["BFloat16", "Float", "Half", "BFloat16", "BFloat16"]
    assert list(df["in_nelems"]) == [1048576, 4096, 4096 * 8, 256, 256]
    assert list(df["out_nelems"]) == [1048576, 4096 * 8, 4096, 256, 256]
    assert list(df["bytes"]) == [1048576 * 2, 4096 * 8 * 4, 4096 * 8 * 2, 512, 512]
    assert list(df["group_size"]) == [8, 8, 8, 2, 8]
    assert list(df["pg_name"][:3]) == ["0x1a2b3c4d5e6f7081"] * 3 and df["pg_name"].iloc[3] == "0xabc"
    assert pd.isna(df["peer"].iloc[3])  # peer in a sub-communicator: unknown from one log
    assert df["peer"].iloc[4] == 6  # peer in the world communicator is global
    assert df["enqueue_ns"].isna().all() and (df["state"] == "completed").all()
    comms = nccl_log.read_comms(p).to_pylist()
    assert [c["comm_id"] for c in comms] == ["0x1a2b3c4d5e6f7081", "0xabc"]
    assert comms[0]["bus_id"] == "4a000" and comms[0]["nranks"] == 8 and comms[1]["rank"] == 1
    assert {c["global_rank"] for c in comms} == {3}
    assert nccl_log.version(p) == "2.27.5+cuda12.9"


def test_not_a_log(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    assert detect_format(p) is None
    with pytest.raises(BadTraceError):
        nccl_log.read(p)


def test_simulated_logs_match_source(tmp_path):
    run = nccl_tables.build(steps=2, seed=5)
    out = write_nccl_outputs(tmp_path, run, formats=("log",))
    files = out["files"]["log"]
    assert len(files) == nccl_tables.WORLD and all(detect_format(f) == NCCL_LOG for f in files)
    got = nccl_log.read_many(files).to_pandas()
    src = run.to_pandas()

    pd.testing.assert_frame_equal(_counts(got), _counts(src), check_dtype=False)
    for op in ("send", "recv"):
        g = got[got["op"] == op].sort_values(["rank", "seq"], kind="stable")
        s = src[src["op"] == op].sort_values(["rank", "enqueue_ns"], kind="stable")
        assert list(g["peer"]) == list(s["peer"])
    # every communicator's members come back as global ranks, identical on all its members
    members = got.groupby(got["pg_name"].astype(str))["pg_ranks"].apply(lambda x: {tuple(v) for v in x})
    assert all(len(v) == 1 for v in members)
    assert sorted(next(iter(v)) for v in members) == sorted(
        tuple(rs) for _, rs in nccl_tables.groups().values()
    )


def test_kineto_simulated_run_counts_and_bytes(tmp_path):
    """Acceptance: the log files of a simulated run give the collective counts and bytes of its traces."""
    coll = nccl_tables.kineto_run(tmp_path / "kineto")
    out = write_nccl_outputs(tmp_path / "nccl", coll, formats=("log",))
    got = nccl_log.read_many(out["files"]["log"]).to_pandas()
    src = coll.to_pandas()
    assert len(got) == len(src) > 0
    pd.testing.assert_frame_equal(_counts(got), _counts(src), check_dtype=False)


def test_log_variants(tmp_path):
    """Timestamped NCCL lines, RCCL lines (numeric timestamp, `task N globalrank G`), a 2.4-era init line."""
    p = tmp_path / "variants.log"
    p.write_text(
        "[2026-05-13 18:01:41] nodeA:100:101 [0] NCCL INFO comm 0x7fe3d4001980 rank 0 nranks 1 cudaDev 0 "
        "nvmlDev 0 - Init COMPLETE\n"
        "[2026-05-13 18:01:42] nodeA:100:100 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f01 "
        "recvbuff 0x7f01 count 1 datatype 7 op 0 root 0 comm 0x7fe3d4001980 [nranks=1] stream (nil)\n"
        "rocm-3:24888:25056 [1] 1558545003174220 NCCL INFO AllReduce: opCount 1e7 sendbuff 0x7f80 "
        "recvbuff 0x7f81 count 1001 datatype 6 op 0 root 0 comm 0x7f80467b9770 [nranks=8] stream 0x7f80 "
        "task 0 globalrank 5\n"
    )
    df = nccl_log.read(p).to_pandas()
    assert list(df["seq"]) == [0, 0x1E7]
    assert list(df["rank"]) == [0, 5]  # init line for the first; RCCL's globalrank for the second
    assert list(df["bytes"]) == [4, 1001 * 2]
    comms = nccl_log.read_comms(p).to_pylist()
    assert comms[0]["bus_id"] is None and comms[0]["comm_id"] is None and comms[0]["nranks"] == 1
