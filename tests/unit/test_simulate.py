"""Simulator: Kineto structure, collective semantics, determinism, planted faults and truth.json.

Every check re-reads the written trace files and recomputes the numbers independently of the simulator
(plain Python loops over parsed JSON), so a bug in the simulator's own bookkeeping shows up here.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tracelens.errors import BadInputError
from tracelens.simulate import TINY_MODEL, SimConfig, parse_straggler, simulate

TINY = TINY_MODEL
NCCL = re.compile(r"^nccl(Dev)?Kernel_")


def run(tmp_path: Path, name: str = "run", **kw) -> tuple[dict, Path]:
    base = dict(model=TINY, seq_len=8192, tp=2, pp=2, dp=1, cp=1, microbatches=4, steps=2, ranks_per_host=4)
    base.update(kw)
    out = tmp_path / name
    return simulate(SimConfig(**base), out), out


def load(out: Path) -> dict[int, dict]:
    traces = {}
    for f in sorted(out.glob("*.pt.trace.json*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            t = json.load(fh)
        traces[t["distributedInfo"]["rank"]] = t
    return traces


def ns(x: float) -> int:
    return round(x * 1000)


def union_len(iv: list[tuple[int, int]], lo: int, hi: int) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def steps_of(trace: dict) -> list[tuple[int, int]]:
    return [
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in trace["traceEvents"]
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]


def kernels(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    truth, out = run(tmp_path_factory.mktemp("sim"), tp=2, pp=2, dp=2)
    return truth, out, load(out)


def test_kineto_structure(clean):
    truth, out, traces = clean
    assert sorted(traces) == list(range(8))
    with gzip.open(next(out.glob("*.gz")), "rt") as fh:
        raw = fh.read()
    t = json.loads(raw)
    keys = list(t)
    assert keys == [
        "schemaVersion",
        "deviceProperties",
        "trace_id",
        "profile_memory",
        "record_shapes",
        "distributedInfo",
        "host_name",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceEvents",
        "traceName",
    ]
    assert t["baseTimeNanoseconds"] % (7_889_238 * 10**9) == 0
    assert t["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    # every ts/dur written with exactly three decimals
    nums = re.findall(r'"(?:ts|dur)": ([0-9.]+)', raw)
    assert nums and all(re.fullmatch(r"\d+\.\d{3}", x) for x in nums)
    di = t["distributedInfo"]
    assert di["backend"] == "nccl" and di["world_size"] == 8 and di["nccl_version"]
    rank = di["rank"]
    assert all(rank in g["ranks"] for g in di["pg_config"])
    descs = {g["pg_desc"] for g in di["pg_config"]}
    assert descs == {
        "default_pg",
        "TENSOR_MODEL_PARALLEL_GROUP",
        "PIPELINE_MODEL_PARALLEL_GROUP",
        "DATA_PARALLEL_GROUP",
    }
    assert di["pg_count"] == 1 + 4 + 4 + 4  # default + dp groups + tp groups + pp groups
    cats = defaultdict(int)
    for e in t["traceEvents"]:
        cats[(e.get("ph"), e.get("cat"))] += 1
    n_k = cats[("X", "kernel")]
    assert n_k > 100 and cats[("X", "cuda_runtime")] == n_k
    assert cats[("s", "ac2g")] == n_k and cats[("f", "ac2g")] == n_k
    assert cats[("i", "cpu_instant_event")] > 0 and cats[("X", "gpu_user_annotation")] > 0
    # a launch, its flow and its kernel share the correlation id
    launches = {e["args"]["correlation"]: e for e in t["traceEvents"] if e.get("cat") == "cuda_runtime"}
    for k in kernels(t):
        launch = launches[k["args"]["correlation"]]
        assert ns(k["ts"]) >= ns(launch["ts"])
        assert k["args"]["External id"] == launch["args"]["External id"]
        assert k["pid"] == k["args"]["device"] and k["tid"] == k["args"]["stream"]
    names = {k["name"] for k in kernels(t)}
    assert any(n.startswith("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(") for n in names)
    assert any(n.startswith("ncclDevKernel_SendRecv(") for n in names)
    assert any(n.startswith("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") for n in names)
    assert any("flash_fwd_kernel" in n for n in names) and any("flash_bwd" in n for n in names)
    assert any(n.startswith("chunk_gated_delta_rule_fwd_kernel") for n in names)
    assert any("causal_conv1d_fwd_kernel" in n for n in names)
    # NCCL kernels carry the record_param_comms args
    rpc = {e["args"]["External id"]: e for e in t["traceEvents"] if e.get("name") == "record_param_comms"}
    for k in kernels(t):
        if NCCL.match(k["name"]):
            a = k["args"]
            cpu = rpc[a["External id"]]["args"]
            for key in (
                "Collective name",
                "dtype",
                "In msg nelems",
                "Out msg nelems",
                "Group size",
                "Process Group Name",
                "Process Group Description",
                "Process Group Ranks",
            ):
                assert a[key] == cpu[key]
            if a["Collective name"] in ("send", "recv"):
                assert {a["Src Rank"], a["Dst Rank"]} <= set(range(8)) and rank in (
                    a["Src Rank"],
                    a["Dst Rank"],
                )
            else:
                assert isinstance(a["Seq"], int)


def test_module_annotations_recover_layer_types(clean):
    truth, _, traces = clean
    for rank, t in traces.items():
        stage = truth["ranks"][rank]["stage"]
        names = {e["name"] for e in t["traceEvents"] if e.get("cat") == "gpu_user_annotation"}
        layers = {}
        for n in names:
            m = re.fullmatch(r"layers\.(\d+)\.(self_attn|linear_attn)", n)
            if m:
                layers[int(m.group(1))] = (
                    "full_attention" if m.group(2) == "self_attn" else "linear_attention"
                )
        counts = defaultdict(int)
        for lt in layers.values():
            counts[lt] += 1
        assert dict(counts) == truth["stages"][stage]["layer_types"]
        assert sorted(layers) == truth["stages"][stage]["layers"]
        assert any(n.endswith(".mlp.backward") for n in names)


def test_compute_truth_matches_trace(clean):
    truth, _, traces = clean
    for rank, t in traces.items():
        assert rank == t["distributedInfo"]["rank"]
        comp = [(ns(k["ts"]), ns(k["ts"]) + ns(k["dur"])) for k in kernels(t) if not NCCL.match(k["name"])]
        comm = [(ns(k["ts"]), ns(k["ts"]) + ns(k["dur"])) for k in kernels(t) if NCCL.match(k["name"])]
        for (lo, hi), row in zip(steps_of(t), truth["ranks"][rank]["steps"], strict=True):
            assert hi - lo == row["step_time_ns"]
            c = union_len(comp, lo, hi)
            assert abs(c - row["compute_ns"]) <= 0.01 * row["compute_ns"]
            busy = union_len(comp + comm, lo, hi)
            assert abs((busy - c) - row["exposed_comm_ns"]) <= 0.01 * max(1, row["exposed_comm_ns"])
            assert row["compute_ns"] + row["exposed_comm_ns"] + row["idle_ns"] == row["step_time_ns"]


def _instances(traces: dict) -> dict[tuple, list[tuple[int, int, int]]]:
    """(pg name, Seq) -> [(rank, start_ns, end_ns)] for non-p2p NCCL kernels."""
    inst = defaultdict(list)
    for rank, t in traces.items():
        for k in kernels(t):
            a = k["args"]
            if NCCL.match(k["name"]) and "Seq" in a:
                inst[(a["Process Group Name"], a["Seq"])].append(
                    (rank, ns(k["ts"]), ns(k["ts"]) + ns(k["dur"]))
                )
    return inst


def test_collectives_end_after_last_arrival(clean):
    _, _, traces = clean
    inst = _instances(traces)
    assert inst
    waited = 0
    for members in inst.values():
        latest_start = max(s for _, s, _ in members)
        ends = [e for _, _, e in members]
        assert min(ends) > latest_start  # nobody finishes before the last participant arrives
        assert max(ends) - min(ends) < 5_000
        if max(s for _, s, _ in members) - min(s for _, s, _ in members) > 10_000:
            waited += 1
    assert waited > 0  # early arrivals wait inside the kernel


def test_p2p_rendezvous(clean):
    _, _, traces = clean
    sends, recvs = defaultdict(list), defaultdict(list)
    for t in traces.values():
        for k in kernels(t):
            a = k["args"]
            if a.get("Collective name") in ("send", "recv"):
                d = sends if a["Collective name"] == "send" else recvs
                d[(a["Src Rank"], a["Dst Rank"])].append((ns(k["ts"]), ns(k["ts"]) + ns(k["dur"])))
    assert sends and sends.keys() == recvs.keys()
    for key in sends:
        for (ss, se), (rs, re_) in zip(sorted(sends[key]), sorted(recvs[key]), strict=True):
            assert min(se, re_) > max(ss, rs)
            assert abs(se - re_) < 5_000


def test_deterministic_and_seeded(tmp_path):
    _, a = run(tmp_path, "a", pp=2, tp=2, steps=1)
    _, b = run(tmp_path, "b", pp=2, tp=2, steps=1)
    _, c = run(tmp_path, "c", pp=2, tp=2, steps=1, seed=1)
    fa = sorted(a.glob("*.gz"))
    assert [f.name for f in fa] == [f.name for f in sorted(b.glob("*.gz"))]
    for f in fa:
        assert f.read_bytes() == (b / f.name).read_bytes()
    assert (a / "truth.json").read_bytes() == (b / "truth.json").read_bytes()
    assert any(f.read_bytes() != g.read_bytes() for f, g in zip(fa, sorted(c.glob("*.gz")), strict=True))
    with gzip.open(fa[0]) as fh:
        assert fh.read(1) == b"{"
    assert fa[0].read_bytes()[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0


def test_straggler_waits_and_truth(tmp_path):
    truth, out = run(tmp_path, tp=2, pp=2, dp=2, stragglers=[(5, 1.5, None)])
    traces = load(out)
    assert truth["faults"]["stragglers"][0]["rank"] == 5
    # counterfactual cost: the same run without the straggler is faster by about its extra compute per step
    f = truth["faults"]
    assert f["step_time_cost_ns"] == pytest.approx(truth["mfu"]["step_time_ns"] - f["clean_step_time_ns"])
    assert f["stragglers"][0]["step_time_cost_ns"] == pytest.approx(f["step_time_cost_ns"])
    assert f["step_time_cost_ns"] > 0
    rows = {r["rank"]: r["steps"] for r in truth["ranks"]}
    peers = [r for r in range(8) if truth["ranks"][r]["stage"] == truth["ranks"][5]["stage"] and r != 5]
    for k in range(2):
        assert rows[5][k]["compute_ns"] > 1.3 * max(rows[p][k]["compute_ns"] for p in peers)
    # the straggler arrives last, so its TP collective kernels are the shortest in its group
    tp_peer = 4

    def tp_time(rank):
        return sum(
            ns(k["dur"])
            for k in kernels(traces[rank])
            if k["args"].get("Process Group Description") == "TENSOR_MODEL_PARALLEL_GROUP"
        )

    assert tp_time(5) < 0.5 * tp_time(tp_peer)


def test_straggler_steps_subset(tmp_path):
    truth, _ = run(tmp_path, steps=3, stragglers=[(1, 2.0, [1])])
    rows = truth["ranks"][1]["steps"]
    other = truth["ranks"][0]["steps"]
    assert rows[1]["compute_ns"] > 1.6 * other[1]["compute_ns"]
    assert rows[0]["compute_ns"] < 1.1 * other[0]["compute_ns"]
    assert truth["faults"]["stragglers"][0]["steps"] == [truth["schedule"]["first_step"] + 1]


def test_clock_offset_shifts_one_host(tmp_path):
    truth, out = run(tmp_path, clock_offsets={1: 850.5}, ranks_per_host=2)
    traces = load(out)
    for rank, t in traces.items():
        base = t["baseTimeNanoseconds"]
        shift = 850_500 if rank >= 2 else 0
        assert t["host_name"] == f"gpu-node-{rank // 2:03d}"
        for (lo, _), row in zip(steps_of(t), truth["ranks"][rank]["steps"], strict=True):
            assert base + lo - shift == row["step_start_ns"]


def test_host_stall_idles_gpu(tmp_path):
    clean_truth, _ = run(tmp_path, "clean")
    truth, _ = run(tmp_path, "stall", host_stalls=[(0, 3.0), (3, 3.0)])
    for rank, peer in ((0, 1), (3, 2)):  # stage 0 and stage 1 (after its first receive)
        a = clean_truth["ranks"][rank]["steps"][1]
        b = truth["ranks"][rank]["steps"][1]
        assert b["idle_ns"] - a["idle_ns"] > 2_500_000
        assert abs(b["compute_ns"] - a["compute_ns"]) < 0.05 * a["compute_ns"]
        # its TP peer now waits for it inside the collectives
        pa, pb = clean_truth["ranks"][peer]["steps"][1], truth["ranks"][peer]["steps"][1]
        assert pb["exposed_comm_ns"] - pa["exposed_comm_ns"] > 2_500_000


def test_slow_link_slows_its_groups(tmp_path):
    clean_truth, c_out = run(tmp_path, "clean", tp=2, pp=2, dp=2)
    truth, out = run(tmp_path, "slow", tp=2, pp=2, dp=2, slow_links=[(0, 4.0)])

    def tp_comm(traces, rank):
        return sum(
            ns(k["dur"])
            for k in kernels(traces[rank])
            if k["args"].get("Process Group Description") == "TENSOR_MODEL_PARALLEL_GROUP"
        )

    slow, base = load(out), load(c_out)
    assert tp_comm(slow, 0) > 2.0 * tp_comm(base, 0)
    assert truth["faults"]["slow_links"][0]["cause"] == "communication"


def test_kv_replication_and_cp(tmp_path):
    truth, out = run(tmp_path, tp=8, pp=1, ranks_per_host=8, steps=1)
    assert truth["faults"]["kv_replication"] == 4.0
    truth_cp, out_cp = run(tmp_path, "cp", tp=2, pp=2, cp=2, steps=1)
    t = load(out_cp)[0]
    a2a = [k for k in kernels(t) if k["args"].get("Collective name") == "all_to_all"]
    assert a2a and all(k["name"].startswith("ncclDevKernel_SendRecv") for k in a2a)
    assert all(k["args"]["Process Group Description"] == "CONTEXT_PARALLEL_GROUP" for k in a2a)
    # all-to-all only around attention layers: 2 forward + 2 backward per full-attention layer per microbatch
    n_full = truth_cp["stages"][0]["layer_types"].get("full_attention", 0)
    assert len(a2a) == 4 * n_full * 4


def test_bubbles_and_schedules(tmp_path):
    for sched in ("1f1b", "gpipe"):
        # balanced stages (every layer full attention) so only the schedule and P2P transfers make bubbles
        model = dict(TINY, hidden_size=2048, intermediate_size=8192, full_attention_interval=1)
        truth, _ = run(tmp_path, sched, model=model, tp=1, pp=4, microbatches=8, schedule=sched, steps=2)
        exp = 3 / 11
        for st in truth["stages"]:
            assert st["expected_bubble_fraction"] == pytest.approx(exp)
            assert st["bubble_fraction"] == pytest.approx(exp, rel=0.2)
        last = truth["ranks"][3]["steps"][1]
        first = truth["ranks"][0]["steps"][1]
        assert last["bubble_fill_ns"] > 5 * first["bubble_fill_ns"]
        assert first["bubble_inflight_ns"] > last["bubble_inflight_ns"]


def test_interleaved_1f1b(tmp_path):
    """Interleaved 1F1B with v = 2 chunks per rank: chunk c of stage s is virtual stage c*p + s (layers cut
    evenly), the last stage sends chunk 0's activations back to stage 0, each rank runs PyTorch's order, and
    the schedule's bubble is (p-1)/(v*m+p-1)."""
    model = dict(TINY, hidden_size=2048, intermediate_size=8192, full_attention_interval=1)
    truth, out = run(tmp_path, "inter", model=model, tp=1, pp=2, microbatches=4, steps=2,
                     schedule="interleaved_1f1b", virtual_stages=2)  # fmt: skip
    assert [st["layers"] for st in truth["stages"]] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert truth["schedule"]["virtual_stages"] == 2 and truth["config"]["virtual_stages"] == 2
    exp = 1 / 9
    for st in truth["stages"]:
        assert st["expected_bubble_fraction"] == pytest.approx(exp)
    traces = load(out)
    sends: dict[tuple[int, int], int] = defaultdict(int)
    for t in traces.values():
        for k in kernels(t):
            if k["args"].get("Collective name") == "send":
                sends[(k["args"]["Src Rank"], k["args"]["Dst Rank"])] += 1
    # per step and microbatch rank 0 sends the activations of virtual stages 0 and 2 and the gradient of 2;
    # rank 1 the activations of 1 and the gradients of 3 and 1: 3 x 4 microbatches x 2 steps each way
    assert sends == {(0, 1): 24, (1, 0): 24}
    # forward module order on rank 0 in the first step: PyTorch's interleaved order (warm-up of 4 forwards:
    # chunk 0 microbatches 0, 1, then chunk 1 microbatches 0, 1)
    names = [e["name"] for e in sorted(traces[0]["traceEvents"], key=lambda e: e.get("ts", 0))
             if e.get("cat") == "user_annotation" and re.fullmatch(r"layers\.[0-7]\.self_attn", e["name"])]  # fmt: skip
    assert names[:4] == [
        "layers.0.self_attn",
        "layers.1.self_attn",
        "layers.0.self_attn",
        "layers.1.self_attn",
    ]
    assert names[4:8] == [
        "layers.4.self_attn",
        "layers.5.self_attn",
        "layers.4.self_attn",
        "layers.5.self_attn",
    ]
    with pytest.raises(BadInputError):
        run(tmp_path, "bad1", schedule="interleaved_1f1b", virtual_stages=1)
    with pytest.raises(BadInputError):
        run(tmp_path, "bad2", schedule="1f1b", virtual_stages=2)
    with pytest.raises(BadInputError):
        run(tmp_path, "bad3", schedule="interleaved_1f1b", virtual_stages=2, pp=4, microbatches=9, tp=1)


def test_unequal_split_and_mfu(tmp_path):
    truth, _ = run(tmp_path, tp=1, pp=3, split=[4, 2, 2], ranks_per_host=8)
    assert [s["num_layers"] for s in truth["stages"]] == [4, 2, 2]
    assert truth["faults"]["unequal_split"] is True
    m = truth["mfu"]
    assert m["value"] == pytest.approx(
        m["flops_per_step"] / (m["step_time_ns"] * 1e-9 * m["peak_flops_per_gpu"] * m["n_gpus"])
    )
    assert m["tokens_per_step"] == 8192 * 4


def test_bad_inputs(tmp_path):
    with pytest.raises(BadInputError):
        run(tmp_path, stragglers=[(99, 2.0, None)])
    with pytest.raises(BadInputError):
        run(tmp_path, split=[7, 2])
    with pytest.raises(BadInputError):
        run(tmp_path, schedule="interleaved")
    with pytest.raises(BadInputError):
        parse_straggler("3")
    assert parse_straggler("3:1.5:0,2-3") == (3, 1.5, [0, 2, 3])


def test_cli_simulate(tmp_path):
    from typer.testing import CliRunner

    from tracelens.cli import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "-o",
            str(out),
            "--model",
            str(cfg),
            "--tp",
            "2",
            "--pp",
            "2",
            "--seq-len",
            "2048",
            "--steps",
            "1",
            "--straggler",
            "1:1.5",
            "--clock-offset",
            "0:120",
            "--no-gzip",
        ],
    )
    assert res.exit_code == 0, res.output
    truth = json.loads((out / "truth.json").read_text())
    assert truth["faults"]["stragglers"][0]["factor"] == 1.5
    assert len(list(out.glob("*.pt.trace.json"))) == 4
    bad = CliRunner().invoke(app, ["simulate", "-o", str(out), "--model", str(cfg), "--straggler", "x:y"])
    assert isinstance(bad.exception, BadInputError)  # the real CLI maps it to exit code 2


def test_cli_nccl_outputs_with_hang(tmp_path):
    from typer.testing import CliRunner

    from tracelens.cli import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "hang"
    args = [
        "simulate",
        "-o",
        str(out),
        "--model",
        str(cfg),
        "--tp",
        "2",
        "--pp",
        "2",
        "--seq-len",
        "2048",
        "--steps",
        "1",
        "--hang",
        "1:3",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (out / "nccl_truth.json").is_file() and (out / "flight_recorder").is_dir()
    assert json.loads((out / "nccl_truth.json").read_text())


def test_layout_orders_and_groups():
    from tracelens.simulate.layout import Layout

    lay = Layout(SimConfig(tp=2, pp=2, dp=2, cp=1))
    assert lay.coords(5) == {"tp": 1, "cp": 0, "dp": 0, "pp": 1}  # tp fastest, then cp, dp, pp
    assert [g.ranks for g in lay.groups if g.axis == "tp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [g.ranks for g in lay.groups if g.axis == "pp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [g.ranks for g in lay.groups if g.axis == "dp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    other = Layout(SimConfig(tp=2, pp=2, dp=2, order="pp-tp-dp-cp"))
    assert other.coords(1) == {"pp": 1, "tp": 0, "dp": 0, "cp": 0}
    assert [g.ranks for g in other.groups if g.axis == "pp"][0] == (0, 1)
    for r in range(8):
        cfgs = lay.pg_config(r)
        assert [c["pg_desc"] for c in cfgs][0] == "default_pg"
        assert all(r in c["ranks"] for c in cfgs) and len(cfgs) == 4


def test_sequence_parallel_collectives(tmp_path):
    _, out = run(tmp_path, tp=2, pp=1, steps=1, sequence_parallel=True)
    names = {k["args"]["Collective name"] for k in kernels(load(out)[0]) if NCCL.match(k["name"])}
    assert {
        "_allgather_base",
        "_reduce_scatter_base",
    } <= names and "allreduce" in names  # allreduce: grad norm
    tp_ar = [
        k
        for k in kernels(load(out)[0])
        if k["args"].get("Collective name") == "allreduce"
        and k["args"]["Process Group Description"] == "TENSOR_MODEL_PARALLEL_GROUP"
    ]
    assert not tp_ar
