"""Issue 18 acceptance through the CLI and the API: a folder holding only NCCL 2.28.x example-plugin dumps
(invalid JSON: bare `Stream` pointers and `datatype` enum names) with a desync, and a folder holding only an
interleaved, cut log. Rows read, ops summarised, the mismatch reported with its processes, the unrecoverable
fragments counted, no traceback. Excerpts written here from the formats (../shared/docs/formats.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import tracelens as _cli

ROOT = Path(__file__).resolve().parents[2]
COMM = "12715772615376301750"


def cli(*args):
    return _cli(*args)  # the CLI's entry point, in this process (tests/cli.py)


def _plugin_228(rank: int, calls: list[tuple[str, int]]) -> str:
    """One rank's dump as NCCL 2.28.x's example plugin printed it: `"datatype": ncclFloat32` and `"Stream":
    0x..` unquoted; COLL events quoted as always. Every call takes 50.5 µs from its COLL begin."""
    pid = 5000 + rank
    ev = []
    for k, (func, seq) in enumerate(calls):
        t = 1000.0 + 100 * k
        ev += [
            f'{{"name": "{func}", "cat": "COLL_API", "ph": "b", "id": {k}, "pid": {pid}, "tid": 1, "ts": {t - 1:f}, '
            f'"args": {{"count": 262144, "datatype": ncclFloat32, "root": 0, "GraphCaptured": 0, '
            f'"Stream": 0x262ca5{rank}}}}},',
            f'{{"name": "KernelLaunch", "cat": "KERNEL_LAUNCH", "ph": "b", "id": {k}, "pid": {pid}, "tid": 1, '
            f'"ts": {t:f}, "args": {{"groupId": {k}, "Stream": (nil)}}}},',
            f'{{"name": "{func}", "cat": "COLL", "ph": "b", "id": {k}, "pid": {pid}, "tid": 1, "ts": {t + 1:f}, '
            f'"args": {{"SeqNum": {seq}, "CommHash": {COMM}, "Rank": {rank}, "Count": 262144, '
            f'"Datatype": "ncclFloat32", "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 16}}}},',
            f'{{"name": "{func}", "cat": "COLL", "ph": "e", "id": {k}, "pid": {pid}, "tid": 1, "ts": {t + 51.5:f}}},',
        ]
    return "[\n" + "\n".join(ev) + "\n{}]\n"


def test_plugin_2_28_only_folder_with_a_desync(tmp_path):
    run_dir = tmp_path / "prof"
    run_dir.mkdir()
    for r in range(4):
        # rank 2 calls AllGather where the others make their second AllReduce (SeqNum counts per type)
        calls = (
            [("AllReduce", 0), ("AllGather", 0), ("AllReduce", 1)]
            if r == 2
            else [("AllReduce", s) for s in range(3)]
        )
        text = _plugin_228(r, calls)
        with pytest.raises(ValueError):
            json.loads(text)  # really the invalid JSON 2.28.x wrote
        (run_dir / f"ncclprof_{COMM}_{r}.json").write_text(text)
    out = tmp_path / "out"
    res = cli("analyze", run_dir, "-o", out, "--no-cache", "--no-report")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "nccl_plugin only: 4 process(es), 1 communicator(s), 12 calls" in res.stdout
    assert "COLLECTIVE_MISMATCH: op mismatch at call #1 (SeqNum 1)" in res.stdout
    s = json.loads((out / "summary.json").read_text())
    by_op = {b["op"]: b for b in s["collectives"]["by_op"]}
    assert {op: (b["calls"], b["instances"], b["bytes"]) for op, b in by_op.items()} == {
        "allreduce": (11, 3, 11 * 262144 * 4),
        "allgather": (1, 1, 4 * 262144 * 4),  # out buffer = nranks x count
    }
    # nccl-tests busbw: bytes / 50.5 µs x 2(n-1)/n for allreduce, (n-1)/n for allgather (n = 4)
    assert by_op["allreduce"]["busbw_gbps_median"] == pytest.approx(
        262144 * 4 / 50.5e-6 * 1.5 / 1e9, rel=1e-6
    )
    assert by_op["allgather"]["busbw_gbps_median"] == pytest.approx(
        4 * 262144 * 4 / 50.5e-6 * 0.75 / 1e9, rel=1e-6
    )
    assert sorted((p["process"], p["rank"], p["calls"]) for p in s["collectives"]["processes"]) == [
        (f"pid {5000 + r}", r, 3) for r in range(4)
    ]
    (mm,) = [f for f in s["findings"] if f["code"] == "COLLECTIVE_MISMATCH"]
    assert mm["processes"] == ["pid 5002"] and mm["ranks"] == [2] and mm["severity"] == "error"

    import tracelens

    run = tracelens.load(run_dir, no_cache=True)
    assert list(run.findings()["code"]) == ["COLLECTIVE_MISMATCH"]
    assert len(run.collectives()) == 12


def _call(host, pid, dev, opc, comm):
    return (
        f"{host}:{pid}:{pid + 7} [{dev}] NCCL INFO Broadcast: opCount {opc:x} sendbuff 0x7f01 recvbuff 0x7f02 "
        f"count 1024 datatype 7 op 0 root 0 comm {comm} [nranks=2] stream 0x55{pid:04x}b0"
    )


def test_interleaved_log_only_folder_counts_what_was_lost(tmp_path):
    """nodeB never starts a line: its host is known only from behind A's stream pointer, and the `Broad`
    fragment glued before it on the last line is lost (counted), not a process `BroadnodeB:200`."""
    A = lambda o: _call("nodeA", 100, 0, o, "0xaaa0")  # noqa: E731
    B = lambda o: _call("nodeB", 200, 1, o, "0xbbb0")  # noqa: E731
    a1 = A(1)
    cut = a1.index("datatype") + 3
    run_dir = tmp_path / "logs"
    run_dir.mkdir()
    (run_dir / "job.out").write_text(
        "\n".join(
            [
                "2026-07-25 19:54:57.101122 " + A(0) + B(0),  # two messages on one line, behind a timestamp
                "[rank0]:" + a1[:cut],  # A's opCount 1 cut across two lines
                a1[cut:],
                B(2)[B(2).index("Broadcast") :],  # lost its prefix: given to nodeB through comm 0xbbb0
                "nodeA:100:107 [0] NCCL INFO Broad" + B(1),  # A's opCount 2 cut short by B's line: lost
            ]
        )
        + "\n"
    )
    out = tmp_path / "out"
    res = cli("analyze", run_dir, "-o", out, "--no-cache", "--no-report")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "nccl_log only: 2 process(es)" in res.stdout
    assert "1 call fragments could not be read" in " ".join(res.stdout.split())
    s = json.loads((out / "summary.json").read_text())
    lp = s["collectives"]["log_parse"]
    assert (lp["calls"], lp["multi_message_lines"], lp["rejoined"], lp["prefix_recovered"], lp["damaged"]) == (
        5, 2, 1, 1, 1
    )  # fmt: skip
    (b,) = s["collectives"]["by_op"]
    assert (b["op"], b["calls"], b["instances"], b["bytes"], b["busbw_gbps_median"]) == (
        "broadcast",
        5,
        3,
        5 * 4096,
        None,
    )
    assert sorted((p["process"], p["rank"], p["calls"]) for p in s["collectives"]["processes"]) == [
        ("nodeA:100", None, 2),
        ("nodeB:200", None, 3),
    ]
    # A never logged opCount 2 (its line was cut): the last call on the communicator, so only a warning
    (h,) = [f for f in s["findings"] if f["code"] == "COLLECTIVE_HANG"]
    assert h["severity"] == "warning" and h["missing_processes"] == ["nodeA:100"] and h["seq"] == 2
