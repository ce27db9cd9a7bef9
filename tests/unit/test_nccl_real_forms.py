"""NCCL logs and plugin dumps in the forms users really have (issue 18): launcher / timestamp prefixes,
no INIT lines (ranks unknown: analysis per process), interleaved and cut lines, NCCL 2.28.x's invalid plugin
JSON, and folders holding only logs or only plugin dumps. Every excerpt is written here from the formats
(docs/nccl-inputs.md, ../shared/docs/formats.md), not copied from bug reports."""

from __future__ import annotations

import json
from pathlib import Path

import nccl_tables
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.cli import tracelens as _cli
from tracelens import schema
from tracelens.analyze.comm import hang, nccl_sources
from tracelens.analyze.comm.collectives import busbw_factor
from tracelens.ingest import nccl_log, nccl_plugin
from tracelens.ingest.sniff import NCCL_LOG, NCCL_PLUGIN, detect_format
from tracelens.simulate.nccl_outputs import write_nccl_outputs

ROOT = Path(__file__).resolve().parents[2]


def call(host, pid, dev, func, opc, count=1024, dtype=7, comm=None, nranks=8, root=0, prefix="", tail=""):
    """One collective call line exactly as enqueue.cc prints it behind debug.cc's `host:pid:tid [dev]`."""
    comm = comm or f"0x55{pid:06x}a0"
    return (
        f"{prefix}{host}:{pid}:{pid + 7} [{dev}] NCCL INFO {func}: opCount {opc:x} sendbuff 0x7f{pid:06x}1000 "
        f"recvbuff 0x7f{pid:06x}2000 count {count} datatype {dtype} op 0 root {root} comm {comm} "
        f"[nranks={nranks}] stream 0x55{pid:06x}b0{tail}"
    )


def cli(*args):
    return _cli(*args)  # the CLI's entry point, in this process (tests/cli.py)


# ---------------------------------------------------------------------------------------------------
# 1. prefixes
# ---------------------------------------------------------------------------------------------------
PREFIXES = {
    "plain": "",
    "bare timestamp": "2026-07-25 19:54:57.101122 ",
    "NCCL_DEBUG_TIMESTAMP_FORMAT": "[2026-07-25 19:54:57] ",
    "Ray": "(RayTrainWorker pid={pid}, ip=10.72.7.6) ",
    "torchrun rank": "[rank3]:",
    "torchrun tee": "[default5]:",
    "SLURM --label": "12: ",
    "Kubernetes --timestamps": "2026-07-25T19:54:57.101122345Z ",
    "containerd CRI": "2026-07-25T19:54:57.101122345+00:00 stdout F ",
    "kubectl --prefix": "[pod/trainer-0/worker] ",
}


def test_every_prefix_form_is_stripped(tmp_path):
    lines = []
    for i, pre in enumerate(PREFIXES.values()):
        pid = 600 + i
        lines.append(call(f"gpu-node{i}.ib", pid, i % 8, "AllGather", 0x139D + i, prefix=pre.format(pid=pid)))
    p = tmp_path / "job.out"
    p.write_text("\n".join(lines) + "\n")
    assert detect_format(p) == NCCL_LOG
    df = nccl_log.read(p).to_pandas()
    assert len(df) == len(PREFIXES)
    assert list(df["process"]) == [f"gpu-node{i}.ib:{600 + i}" for i in range(len(PREFIXES))]
    assert list(df["seq"]) == [0x139D + i for i in range(len(PREFIXES))]
    assert (df["op"] == "allgather").all() and df["rank"].isna().all()  # no INIT line: rank unknown
    assert list(df["out_nelems"]) == [1024 * 8] * len(PREFIXES)


def test_rccl_globalrank_gives_the_rank_without_init(tmp_path):
    p = tmp_path / "rccl.log"
    p.write_text(
        call("mi300-3", 24888, 1, "AllReduce", 0x1E7, tail=" task 0 globalrank 5", prefix="0: ") + "\n"
        "mi300-3:24888:25056 [1] 1558545003174220 NCCL INFO AllReduce: opCount 1e8 sendbuff 0x7f80 recvbuff "
        "0x7f81 count 1001 datatype 6 op 0 root 0 comm 0x7f80467b9770 [nranks=8] stream 0x7f80 task 1 "
        "globalrank 5\n"
    )
    df = nccl_log.read(p).to_pandas()
    assert list(df["rank"]) == [5, 5] and list(df["seq"]) == [0x1E7, 0x1E8]


def test_formats_md_line_grammar(tmp_path):
    """The grammar of ../shared/docs/formats.md section 3 (debug.cc core, enqueue.cc call, init.cc lines of
    ncclCommInitRank with its newer `localSize .. used .. bytes on core` tail, and ncclCommSplit, whose
    commId comes after `parent .. color .. key ..`), in a job's stdout with unrelated lines."""
    p = tmp_path / "stdout.txt"
    p.write_text(
        "epoch 1 loss 2.31\n"
        "h1:7:7 [3] NCCL INFO NCCL version 2.27.5+cuda12.9\n"
        "h1:7:9 [3] NCCL INFO [Rank 3] ncclCommInitRank comm 0x55aa00 rank 3 nranks 8 cudaDev 3 nvmlDev 3 "
        "busId 4a000 commId 0x1a2b3c - Init START\n"
        "h1:7:9 [3] NCCL INFO ncclCommInitRank comm 0x55aa00 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4a000 "
        "commId 0x1a2b3c localSize 1208 used 1234567 bytes on core 12 - Init COMPLETE\n"
        "h1:7:9 [3] NCCL INFO ncclCommSplit comm 0x55bb00 rank 1 nranks 2 cudaDev 3 nvmlDev 3 busId 4a000 "
        "parent 0x55aa00 color 1 key 3 commId 0x77ee - Init COMPLETE\n"
        "h1:7:7 [3] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f0a recvbuff 0x7f0a count 1048576 datatype 9 "
        "op 0 root 0 comm 0x55aa00 [nranks=8] stream 0x55cc\n"
        "h1:7:7 [3] NCCL INFO Send: opCount 1f sendbuff 0x7f0b recvbuff (nil) count 16 datatype 7 op 0 "
        "root 0 comm 0x55bb00 [nranks=2] stream 0x55cc\n"
    )
    comms = nccl_log.read_comms(p).to_pylist()
    assert [(c["comm_id"], c["rank"], c["nranks"], c["global_rank"]) for c in comms] == [
        ("0x1a2b3c", 3, 8, 3),
        ("0x77ee", 1, 2, 3),
    ]
    df = nccl_log.read(p).to_pandas()
    assert list(df["pg_name"]) == ["0x1a2b3c", "0x77ee"] and list(df["seq"]) == [3, 0x1F]
    assert list(df["bytes"]) == [1048576 * 2, 16 * 4] and list(df["rank"]) == [3, 3]
    assert nccl_log.version(p) == "2.27.5+cuda12.9"


# ---------------------------------------------------------------------------------------------------
# 2. no INIT lines: communicators inferred across processes, ranks unknown
# ---------------------------------------------------------------------------------------------------
def _layout_log(steps=3, stop=None, odd=None) -> list[str]:
    """8 processes on 2 hosts (pid 1000+i): a world comm (n=8), TP pairs {0,1},{2,3},{4,5},{6,7} doing the
    same allreduces, DP pairs {0,2},{1,3} (reducescatter 1000) and {4,6},{5,7} (reducescatter 3000), and
    pp pairs {i, i+4} with send/recv only. `stop=(proc, opCount)`: that process logs nothing on the world
    comm from that opCount on; `odd=(proc, opCount, func)`: it calls `func` there instead of AllReduce."""
    lines = []
    oc = {}
    for _step in range(steps):
        for i in range(8):
            host, pid = f"node{i // 4:02d}", 1000 + i

            def line(func, comm_id, n, count, dtype=7, root=0, i=i, host=host, pid=pid):
                k = (i, comm_id)
                o = oc.get(k, 0)
                oc[k] = o + 1
                comm = f"0x55{pid:04x}{comm_id:02x}a0"
                if comm_id == 0 and stop and stop[0] == i and o >= stop[1]:
                    return
                if comm_id == 0 and odd and odd[0] == i and o == odd[1]:
                    func = odd[2]
                lines.append(call(host, pid, i % 4, func, o, count, dtype, comm, n, root))

            line("AllReduce", 1, 2, 4096, 9)
            line("AllReduce", 1, 2, 4096, 9)
            line("Send" if i < 4 else "Recv", 3, 2, 512, 9, root=1 if i < 4 else 0)
            line("ReduceScatter", 2, 2, 1000 if i < 4 else 3000, 7)
            line("AllReduce", 0, 8, 1, 7)
            line("AllReduce", 0, 8, 1, 7)
    return lines


def test_no_init_communicators_are_inferred_across_processes(tmp_path):
    p = tmp_path / "merged.log"
    p.write_text("\n".join(_layout_log()) + "\n")
    coll = nccl_log.read(p)
    df = coll.to_pandas().assign(pg_name=lambda d: d["pg_name"].astype(str))
    assert df["rank"].isna().all() and len(df) == 8 * 3 * 6
    groups = {
        name: (frozenset(g["process"].astype(str)), set(g["op"].astype(str)), int(g["group_size"].iloc[0]))
        for name, g in df.groupby("pg_name")
    }
    proc = frozenset(f"node{i // 4:02d}:{1000 + i}" for i in range(8))
    first, second = frozenset(sorted(proc)[:4]), frozenset(sorted(proc)[4:])
    # world: one communicator of the 8 processes; the 4 TP pairs do the same thing: one class of 8 streams
    # (indistinguishable from the log); DP pairs differ by stage: 2 classes of 4; p2p-only pp pairs: 1 class
    assert sorted(groups.values(), key=str) == sorted(
        [
            (proc, {"allreduce"}, 8),
            (proc, {"allreduce"}, 2),
            (first, {"reducescatter"}, 2),
            (second, {"reducescatter"}, 2),
            (proc, {"send", "recv"}, 2),
        ],
        key=str,
    )
    assert groups["n8#0"] == (proc, {"allreduce"}, 8)
    assert nccl_sources.diagnose_processes(coll) == [] and hang.diagnose(coll) == []


def test_hang_from_logs_without_ranks_names_the_process(tmp_path):
    p = tmp_path / "merged.log"
    p.write_text("\n".join(_layout_log(steps=3, stop=(5, 3))) + "\n")
    coll = nccl_log.read(p)
    found = hang.diagnose(coll, expected_ranks=range(8))  # the API never raises on null ranks
    assert [f["code"] for f in found] == ["COLLECTIVE_HANG"]
    f = found[0]
    assert f["missing_processes"] == ["node01:1005"] and len(f["waiting_processes"]) == 7
    assert f["severity"] == "error" and f["ranks"] == [] and f["seq"] == 3
    assert f["message"] == (
        "process node01:1005 never called allreduce opCount 0x3 on communicator n8#0 (8 ranks); 7 processes did"
    )


def test_log_cut_at_the_end_is_only_a_warning(tmp_path):
    lines = _layout_log(steps=3)
    # the last world allreduce (opCount 5) is missing for 5 of the 8 processes: a cut, not a hang
    cut = [ln for ln in lines if not (" opCount 5 " in ln and "[nranks=8]" in ln and ":100" in ln and
                                      int(ln.split(":")[1]) >= 1003)]  # fmt: skip
    p = tmp_path / "cut.log"
    p.write_text("\n".join(cut) + "\n")
    found = nccl_sources.diagnose_processes(nccl_log.read(p))
    assert [(f["code"], f["severity"]) for f in found] == [("COLLECTIVE_HANG", "warning")]
    assert len(found[0]["missing_processes"]) == 5 and "unless the logs were cut here" in found[0]["message"]


def test_mismatch_from_logs_without_ranks(tmp_path):
    p = tmp_path / "merged.log"
    p.write_text("\n".join(_layout_log(steps=3, odd=(6, 4, "AllGather"))) + "\n")
    found = nccl_sources.diagnose_processes(nccl_log.read(p))
    assert [f["code"] for f in found] == ["COLLECTIVE_MISMATCH"]
    assert found[0]["processes"] == ["node01:1006"] and found[0]["mismatch"] == "op"
    assert found[0]["message"] == (
        "op mismatch at opCount 0x4 on communicator n8#0 (8 ranks): process node01:1006 called allgather "
        "where 7 processes called allreduce"
    )


# ---------------------------------------------------------------------------------------------------
# 3. interleaved and cut lines
# ---------------------------------------------------------------------------------------------------
def test_interleaved_and_cut_lines(tmp_path):
    A = lambda o, **k: call("nodeA", 100, 0, "Broadcast", o, comm="0xaaa0", nranks=2, **k)  # noqa: E731
    B = lambda o, **k: call("nodeB", 200, 1, "Broadcast", o, comm="0xbbb0", nranks=2, **k)  # noqa: E731
    a1 = A(1)
    cut_at = a1.index("datatype") + 3
    lines = [
        "nodeB:200:207 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
        A(0) + B(0),  # two messages on one line, the second glued to the first's stream pointer
        a1[:cut_at],  # A's opCount 1 cut across two lines
        a1[cut_at:],
        B(2)[B(2).index("Broadcast") :],  # B's opCount 2 lost its prefix: attributed through comm 0xbbb0
        call("nodeC", 300, 0, "Broadcast", 0, comm="0xccc0")[27:],  # no prefix and an unknown comm
        "nodeA:100:107 [0] NCCL INFO Broad" + B(1),  # A's opCount 2 cut short by B's line: lost
    ]
    p = tmp_path / "interleaved.log"
    p.write_text("\n".join(lines) + "\n")
    coll, stats = nccl_log.read_many_stats([p])
    df = coll.to_pandas()
    got = sorted(zip(df["process"].astype(str), df["seq"]))
    assert got == [("nodeA:100", 0), ("nodeA:100", 1), ("nodeB:200", 0), ("nodeB:200", 1), ("nodeB:200", 2)]
    assert (df["op"] == "broadcast").all()
    assert stats == {"lines": 7, "nccl_lines": 4, "calls": 5, "multi_message_lines": 2, "rejoined": 1,
                     "prefix_recovered": 1, "unattributed": 1, "damaged": 1, "files": 1}  # fmt: skip


def test_host_cut_at_the_start_of_a_line(tmp_path):
    p = tmp_path / "cut_host.log"
    full = call("gpu-node03", 4119, 4, "AllGather", 1)
    p.write_text(full + "\n" + call("gpu-node03", 4119, 4, "AllGather", 2)[5:] + "\n")  # `ode03:4119:..`
    coll, stats = nccl_log.read_many_stats([p])
    assert list(coll.column("process").to_pylist()) == ["gpu-node03:4119"] * 2
    assert stats["prefix_recovered"] == 1 and stats["damaged"] == 0


def test_glued_host_without_a_clean_line(tmp_path):
    """Even when a host never starts a line, a stream pointer or RCCL globalrank glued before it is split off."""
    p = tmp_path / "glued.log"
    p.write_text(
        call("nodeA", 100, 0, "AllReduce", 7, nranks=2)
        + call("nodeZ", 900, 1, "AllReduce", 7, nranks=2, tail=" task 0 globalrank 1")
        + call("zeta", 901, 2, "AllReduce", 7, nranks=2)
        + "\n"
    )
    df = nccl_log.read(p).to_pandas()
    assert list(df["process"]) == ["nodeA:100", "nodeZ:900", "zeta:901"]
    assert df["rank"].iloc[1] == 1 and pd.isna(df["rank"].iloc[2])


# ---------------------------------------------------------------------------------------------------
# 4. NCCL 2.28.x example plugin: bare (invalid JSON) values
# ---------------------------------------------------------------------------------------------------
def _plugin_dump(quoted: bool) -> str:
    q = (lambda v: f'"{v}"') if quoted else (lambda v: v)  # noqa: E731
    ev = []
    pid = 3937375
    for k, (func, seq) in enumerate([("AllReduce", 0), ("AllGather", 0), ("AllReduce", 1)]):
        t = 1000.0 + 100 * k
        ev.append(f'{{"name": "{func}", "cat": "COLL_API", "ph": "b", "id": {k}, "pid": {pid}, "tid": 1, '
                  f'"ts": 0.000000, "args": {{"count": 262144, "datatype": {q("ncclFloat32")}, "root": 0, '
                  f'"GraphCaptured": 0, "Stream": {q("0x262ca50" if k else "(nil)")}}}}},')  # fmt: skip
        ev.append(f'{{"name": "KernelLaunch", "cat": "KERNEL_LAUNCH", "ph": "b", "id": {k}, "pid": {pid}, '
                  f'"tid": 1, "ts": {t:f}, "args": {{"groupId": {k}, "Stream": {q("0x420aa70")}}}}},')  # fmt: skip
        ev.append(f'{{"name": "{func}", "cat": "COLL", "ph": "b", "id": {k}, "pid": {pid}, "tid": 1, '
                  f'"ts": {t + 1:f}, "args": {{"SeqNum": {seq}, "CommHash": 12715772615376301750, "Rank": 1, '
                  f'"Count": 262144, "Datatype": "ncclFloat32", "Algorithm": "RING", "Protocol": "SIMPLE", '
                  f'"nChannels": 16}}}},')  # fmt: skip
        ev.append(f'{{"name": "{func}", "cat": "COLL", "ph": "e", "id": {k}, "pid": {pid}, "tid": 1, '
                  f'"ts": {t + 51.5:f}}},')  # fmt: skip
    return "[\n\n" + "\n".join(ev) + "\n{}]\n"


def test_plugin_2_28_bare_values_read_like_quoted(tmp_path):
    bad, good = tmp_path / "old_12715772615376301750_1.json", tmp_path / "new_12715772615376301750_1.json"
    bad.write_text(_plugin_dump(quoted=False))
    good.write_text(_plugin_dump(quoted=True))
    with pytest.raises(ValueError):
        json.loads(bad.read_text())  # really invalid JSON
    assert detect_format(bad) == NCCL_PLUGIN == detect_format(good)
    a, b = nccl_plugin.read(bad).to_pandas(), nccl_plugin.read(good).to_pandas()
    pd.testing.assert_frame_equal(a, b)
    assert list(a["op"]) == ["allreduce", "allgather", "allreduce"] and list(a["seq"]) == [0, 0, 1]
    assert (a["dtype"] == "Float").all() and list(a["end_ns"] - a["enqueue_ns"]) == [50_500] * 3
    assert (a["process"] == "pid 3937375").all() and (a["pg_name"] == "12715772615376301750").all()
    assert nccl_plugin.quote_bare_values('{"a": true, "b": null, "c": 0x1f, "d": -nan}') == (
        '{"a": true, "b": null, "c": "0x1f", "d": "-nan"}'
    )


def test_plugin_older_tree_layout(tmp_path):
    """ext-profiler/example/print_event.c (older NCCL): COLL `nMaxChannels`, P2P without nChannels, one
    `Send` PROXY op with nested state objects."""
    p = tmp_path / "prof_42_0.json"
    p.write_text(
        "[\n"
        '{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": 77, "tid": 1, "ts": 10.000000, "args": '
        '{"SeqNum": 0, "CommHash": 42, "Rank": 0, "Count": 1024, "Datatype": "ncclBfloat16", "Algorithm": "RING", '
        '"Protocol": "LL", "nMaxChannels": 2}},\n'
        '{"name": "Send", "cat": "PROXY", "ph": "b", "id": 0, "pid": 77, "tid": 1, "ts": 12.000000, "args": '
        '{"Channel": 0, "Peer": 1, "Steps": 3, "ChunkSize": 65536, "transSize": 2048, "POSTED": {"step": 3, '
        '"ts": 12.5}, "REM_FIFO_WAIT": {"step": 3, "ts": 13.0}, "TRANSMITTED": {"step": 3, "ts": 14.0}, '
        '"DONE": {"step": 3, "ts": 15.0}}},\n'
        '{"name": "Send", "cat": "PROXY", "ph": "e", "id": 0, "pid": 77, "tid": 1, "ts": 15.000000},\n'
        '{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": 77, "tid": 1, "ts": 16.000000},\n'
        '{"name": "Send", "cat": "P2P", "ph": "b", "id": 0, "pid": 77, "tid": 1, "ts": 20.000000, "args": '
        '{"CommHash": 42, "Rank": 0, "Peer": 1, "Count": 8, "Datatype": "ncclFloat32"}},\n'
        '{"name": "Send", "cat": "P2P", "ph": "e", "id": 0, "pid": 77, "tid": 1, "ts": 21.000000},\n'
        "{}]\n"
    )
    d = nccl_plugin.read_details(p).to_pylist()
    assert [(r["op"], r["n_channels"], r["proxy_steps"], r["proxy_bytes"]) for r in d] == [
        ("allreduce", 2, 3, 2048),
        ("send", None, 0, 0),
    ]
    t = nccl_plugin.read(p).to_pandas()
    assert list(t["bytes"]) == [2048, 32] and list(t["end_ns"] - t["enqueue_ns"]) == [6000, 1000]


# ---------------------------------------------------------------------------------------------------
# 5. per-op analysis with times (plugin): busbw against the simulated truth
# ---------------------------------------------------------------------------------------------------
def test_plugin_busbw_matches_truth(tmp_path):
    run = nccl_tables.build(steps=2, seed=3)
    out = write_nccl_outputs(tmp_path, run, formats=("plugin",))
    coll = nccl_plugin.align_ranks(nccl_plugin.read_many(out["files"]["plugin"]))
    got = {r["op"]: r for r in nccl_sources.by_op(nccl_sources.frame(coll))}
    src = run.to_pandas()
    src = src[~src["is_p2p"].astype(bool)].assign(op=lambda d: d["op"].astype(str))
    inst = src.groupby(["pg_name", "seq"], observed=True)
    xfer = src["end_ns"] - inst["enqueue_ns"].transform("max")
    bw = src["bytes"] / xfer * [busbw_factor(o, n) for o, n in zip(src["op"], src["group_size"])]
    for op, g in src.assign(bw=bw).groupby("op"):
        assert got[op]["calls"] == len(g) and got[op]["bytes"] == int(g["bytes"].sum())
        assert got[op]["busbw_gbps_median"] == pytest.approx(float(np.median(g["bw"])), rel=1e-6)


# ---------------------------------------------------------------------------------------------------
# 6. CLI and API on folders holding only logs / only plugin dumps, and the Kineto cross-check
# ---------------------------------------------------------------------------------------------------
def test_cli_on_log_only_folder_reports_the_mismatch(tmp_path):
    run_dir = tmp_path / "logs"
    run_dir.mkdir()
    lines = _layout_log(steps=3, odd=(6, 4, "AllGather"))
    for i in range(8):  # one file per process, each with a different launcher prefix
        mine = [ln for ln in lines if f":{1000 + i}:" in ln]
        pre = list(PREFIXES.values())[i].format(pid=1000 + i)
        (run_dir / f"rank{i}.out").write_text("\n".join(pre + ln for ln in mine) + "\n")
    out = tmp_path / "out"
    r = cli("analyze", run_dir, "-o", out, "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "nccl_log only: 8 process(es)" in r.stdout and "node01:1006" in r.stdout
    assert "COLLECTIVE_MISMATCH: op mismatch at opCount 0x4" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    by_op = {b["op"]: b for b in s["collectives"]["by_op"]}
    assert by_op["allgather"]["calls"] == 1 and by_op["reducescatter"]["calls"] == 24
    assert by_op["allreduce"]["calls"] == 8 * 3 * 4 - 1 and by_op["send"]["calls"] == 12
    assert len(s["collectives"]["processes"]) == 8
    assert all(p["rank"] is None for p in s["collectives"]["processes"])
    mm = [f for f in s["findings"] if f["code"] == "COLLECTIVE_MISMATCH"]
    assert len(mm) == 1 and mm[0]["processes"] == ["node01:1006"]
    assert (
        s["collectives"]["log_parse"]["calls"] == 8 * 3 * 6 and s["collectives"]["log_parse"]["damaged"] == 0
    )

    import tracelens

    run = tracelens.load(run_dir, no_cache=True)
    assert "COLLECTIVE_MISMATCH" in set(run.findings()["code"])


def test_cli_on_plugin_only_folder(tmp_path):
    run = nccl_tables.build(steps=2, seed=5)
    write_nccl_outputs(tmp_path / "run", run, formats=("plugin",))
    out = tmp_path / "out"
    r = cli("analyze", tmp_path / "run" / "nccl_profiler", "-o", out, "--no-cache")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "nccl_plugin only: 8 process(es)" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    by_op = {b["op"]: b for b in s["collectives"]["by_op"]}
    src = run.to_pandas().assign(op=lambda d: d["op"].astype(str))
    assert {op: b["calls"] for op, b in by_op.items()} == src["op"].value_counts().to_dict()
    assert by_op["allreduce"]["busbw_gbps_median"] > 0
    assert sorted(p["rank"] for p in s["collectives"]["processes"]) == list(range(8))


def _strip_init(files):
    for f in files:  # what users paste: the call lines only
        p = Path(f)
        p.write_text("".join(ln for ln in p.read_text().splitlines(True) if "Init COMPLETE" not in ln))


def test_hang_planted_in_simulated_logs_without_init_lines(tmp_path):
    run = nccl_tables.build(steps=2, seed=5)
    out = write_nccl_outputs(tmp_path, run, hang=(5, 2, "0"), formats=("log",))  # world allreduce #2
    _strip_init(out["files"]["log"])
    coll = nccl_log.read_many(out["files"]["log"])
    found = [f for f in hang.diagnose(coll) if f["code"] == "COLLECTIVE_HANG"]
    assert len(found) == 1 and found[0]["missing_processes"] == ["node000:40005"]
    assert found[0]["op"] == out["hang"]["op"] and found[0]["severity"] == "error"
    assert len(found[0]["waiting_processes"]) == len(out["hang"]["waiting_ranks"]) == 7


def test_hang_in_a_subgroup_from_logs(tmp_path):
    """With INIT lines the log names the rank; without them the 4 TP pairs, which made the same calls, are
    one class: the finding says so instead of pretending to know the pair."""
    run = nccl_tables.build(steps=2, seed=5)
    out = write_nccl_outputs(tmp_path / "a", run, hang=(5, 3), formats=("log",))  # tp_2 = ranks {4, 5}
    found = nccl_sources.diagnose_processes(nccl_log.read_many(out["files"]["log"]))
    hangs = [f for f in found if f["code"] == "COLLECTIVE_HANG"]
    assert [(f["ranks"], f["missing_processes"], f["waiting_processes"]) for f in hangs] == [
        ([5], ["node000:40005"], ["node000:40004"])
    ]
    assert hangs[0]["message"].startswith("rank 5 (node000:40005) never called allreduce opCount 0x2")
    _strip_init(out["files"]["log"])
    found = nccl_sources.diagnose_processes(nccl_log.read_many(out["files"]["log"]))
    hangs = [f for f in found if f["code"] == "COLLECTIVE_HANG"]
    assert hangs and "node000:40005" in hangs[0]["missing_processes"] and hangs[0]["ranks"] == []
    assert "8 processes in groups of 2 that made the same calls" in hangs[0]["message"]


def test_kineto_and_logs_cross_checked(tmp_path):
    run_dir = tmp_path / "run"
    coll = nccl_tables.kineto_run(run_dir)
    write_nccl_outputs(run_dir, coll, formats=("log",))
    out = tmp_path / "out"
    r = cli("analyze", run_dir, "-o", out, "--no-cache", "--no-report")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    (cc,) = s["collectives"]["cross_check"]
    assert cc["agree"] and cc["source"] == "nccl_log"
    assert all(
        b["kineto_calls"] == b["source_calls"] and not b["sizes_missing_in_source"] for b in cc["by_op"]
    )
    # logs of another run: the sizes the traces saw never appear in the logs
    other = tmp_path / "other"
    write_nccl_outputs(other, nccl_tables.build(steps=1, seed=1), formats=("log",))
    res = nccl_sources.cross_check(nccl_log.read_many(sorted((other / "nccl_logs").iterdir())), coll)
    assert not res["agree"] and "disagree" in res["note"]


def _plugin_rows(calls: dict[int, list[tuple[str, bool]]]) -> pa.Table:
    """COLLECTIVES rows as the plugin reader makes them: per rank a list of (op, completed), SeqNum per op."""

    rows = []
    for rank, seqs in calls.items():
        per_op: dict[str, int] = {}
        for k, (op, done) in enumerate(seqs):
            s = per_op.get(op, 0)
            per_op[op] = s + 1
            rows.append({"rank": rank, "source": "nccl_plugin", "pg_name": "777", "group_size": len(calls),
                         "op": op, "dtype": "Float", "in_nelems": 64, "out_nelems": 64 * (4 if op == "allgather" else 1),
                         "bytes": 256, "seq": s, "is_p2p": False, "state": "completed" if done else "started",
                         "enqueue_ns": 1000 * k + rank, "end_ns": 1000 * k + 500 if done else None,
                         "process": f"pid {10 + rank}"})  # fmt: skip
    return schema.table_from_rows(rows, schema.COLLECTIVES)


def test_plugin_desync_and_hang_by_position():
    """The plugin's SeqNum counts per collective type, so calls are matched by their position in the
    communicator's sequence: an allgather where the others call their second allreduce is a desync."""
    odd = _plugin_rows(
        {r: [("allreduce", True), ("allgather" if r == 2 else "allreduce", True)] for r in range(4)}
    )
    (f,) = nccl_sources.diagnose_processes(odd)
    assert f["code"] == "COLLECTIVE_MISMATCH" and f["ranks"] == [2] and f["processes"] == ["pid 12"]
    assert f["message"] == (
        "op mismatch at call #1 (SeqNum 1) on communicator 777 (4 ranks): rank 2 (pid 12) called allgather "
        "where 3 processes called allreduce"
    )
    stuck = _plugin_rows(
        {r: [("allreduce", True)] + ([] if r == 3 else [("allreduce", False)]) for r in range(4)}
    )
    (f,) = nccl_sources.diagnose_processes(stuck)
    assert f["code"] == "COLLECTIVE_HANG" and f["severity"] == "error" and f["ranks"] == [3]
    assert f["message"] == (
        "rank 3 (pid 13) never called allreduce call #1 (SeqNum 1) on communicator 777 (4 ranks); 3 processes did"
    )
    done = _plugin_rows(
        {r: [("allreduce", True)] + ([] if r == 3 else [("allreduce", True)]) for r in range(4)}
    )
    assert nccl_sources.diagnose_processes(done) == []  # completed by the others: rank 3's record is lost


def test_rccl_mismatch_names_rank_and_process(tmp_path):
    """RCCL lines (numeric timestamp after [dev], `task N globalrank G`), no INIT lines: one process calls
    AllGather at opCount 0x28c where the others call AllReduce."""
    lines = []
    for oc in range(0x28A, 0x28E):
        for r in range(4):
            func = "AllGather" if (oc == 0x28C and r == 1) else "AllReduce"
            lines.append(
                f"mi250-{r // 2}:{300 + r}:{310 + r} [{r % 2}] 16583740{oc:04d}{r} NCCL INFO {func}: opCount {oc:x} "
                f"sendbuff 0x7f01 recvbuff 0x7f02 count 4096 datatype 7 op 0 root 0 comm 0x55{r}0 [nranks=4] "
                f"stream 0x7f03 task {oc - 0x28A} globalrank {r}"
            )
    p = tmp_path / "rccl.log"
    p.write_text("\n".join(lines) + "\n")
    (f,) = nccl_sources.diagnose_processes(nccl_log.read(p))
    assert f["code"] == "COLLECTIVE_MISMATCH" and f["ranks"] == [1] and f["processes"] == ["mi250-0:301"]
    assert f["message"].startswith(
        "op mismatch at opCount 0x28c on communicator n4#0 (4 ranks): rank 1 (mi250-0:301) called allgather "
        "where 3 processes called allreduce"
    )


# ---------------------------------------------------------------------------------------------------
# 6. one communicator whose processes disagree on every call (a real RCCL log, no INIT lines)
# ---------------------------------------------------------------------------------------------------
RCCL_429 = ROOT / "tests" / "data" / "nccl_logs" / "rccl_issue429.log"  # the log excerpt of ROCm/rccl#429


def test_real_rccl_log_desync_is_a_likely_mismatch():
    """Process 45006 calls AllReduce at opCounts 0x28c-0x28d, process 45012 AllGather at the same opCounts,
    each on its only 4-rank communicator (pointers 0x55bef0201370 and 0x559c24b55610: per-process
    addresses). The calls disagree everywhere, so the sequences alone keep them apart."""
    coll = nccl_log.read(RCCL_429)
    assert sorted(set(coll.column("pg_name").to_pylist())) == ["n4#0", "n4#1"]
    (f,) = nccl_sources.diagnose_processes(coll)
    assert (f["code"], f["severity"], f["likely"], f["mismatch"]) == (
        "COLLECTIVE_MISMATCH",
        "warning",
        True,
        "op",
    )
    assert f["processes"] == ["h03r3n06:45006", "h03r3n06:45012"] and f["seq"] == 0x28C and f["ranks"] == []
    assert f["calls"] == {
        "h03r3n06:45006": "allreduce of in 9984512 / out 9984512 elements",
        "h03r3n06:45012": "allgather of in 59205120 / out 236820480 elements",  # count x nranks out
    }
    assert f["message"] == (
        "likely op mismatch at opCount 0x28c on a 4-rank communicator: process h03r3n06:45012 called allgather "
        "where process h03r3n06:45006 called allreduce. Likely one communicator (the log has no INIT lines and "
        "comm pointers differ per process): each of these processes logged one 4-rank communicator, they make "
        "at most 4 processes together, and their calls cover the same opCounts 0x28c-0x28d"
    )


def test_real_rccl_log_in_a_folder_reports_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rccl.log").write_bytes(RCCL_429.read_bytes())
    r = cli(
        "analyze", run, "--json", tmp_path / "s.json", "-o", tmp_path / "out", "--no-cache", "--no-report"
    )
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert [(f["code"], f["severity"]) for f in s["findings"] if f["code"].startswith("COLLECTIVE")] == [
        ("COLLECTIVE_MISMATCH", "warning")
    ]


def _two_process_log(extra: list[str] | None = None, n2: int = 4) -> list[str]:
    lines = [call("h", 10, 0, "AllReduce", oc, count=100, nranks=4, comm="0x5510") for oc in (7, 8)]
    lines += [
        call("h", 11, 1, "AllGather", oc, count=300, dtype=0, nranks=n2, comm="0x5520") for oc in (7, 8)
    ]
    return lines + (extra or [])


@pytest.mark.parametrize(
    "case, extra, n2, found",
    [
        ("the pair", [], 4, 1),
        # another nranks: not one communicator
        ("different nranks", [], 8, 0),
        # process 11 logs a second incomplete 4-rank communicator at those opCounts: which one is the pair?
        (
            "ambiguous",
            [call("h", 11, 1, "Broadcast", oc, count=5, nranks=4, comm="0x5530") for oc in (7, 8)],
            4,
            0,
        ),
        # no common opCount: nothing says they are one communicator
        ("disjoint opCounts", None, 4, 0),
    ],
)
def test_likely_pairing_rules(tmp_path, case, extra, n2, found):
    lines = _two_process_log(extra, n2)
    if extra is None:
        lines = [ln.replace("opCount 7 ", "opCount 70 ").replace("opCount 8 ", "opCount 71 ") if ":11:" in ln
                 else ln for ln in lines]  # fmt: skip
    p = tmp_path / "x.log"
    p.write_text("\n".join(lines) + "\n")
    got = [f for f in nccl_sources.diagnose_processes(nccl_log.read(p)) if f.get("likely")]
    assert len(got) == found, case
