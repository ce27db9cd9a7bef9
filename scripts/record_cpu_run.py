#!/usr/bin/env python3
"""Record a real 4-process PyTorch run on CPU (gloo) with the profiler and the Flight Recorder.

Why: every analyzer needs at least one multi-rank trace that real PyTorch wrote (not our simulator),
with truth we know. The run is a tiny hybrid model (Gated-DeltaNet-like "linear_attn" layers and one
"self_attn" layer + MLP per block, as in Qwen3.5) split over a 2-stage pipeline (GPipe schedule, m
microbatches, blocking send/recv of activations and gradients) and 2-way data parallelism (allreduce of
gradients in each stage's dp group). One rank does extra matmuls in its MLPs on purpose (a compute
straggler); the script measures that extra time and writes it with the layout into truth.json.

Layout (Megatron order tp-cp-dp-pp with tp=cp=1): rank = dp + 2 * pp, so stage 0 = ranks {0, 1},
stage 1 = ranks {2, 3}; dp groups {0, 1}, {2, 3}; pipeline pairs {0, 2}, {1, 3}.

Output (OUT_DIR):
  traces/<host>_<pid>.<ns>.pt.trace.json.gz   one Kineto trace per rank (tensorboard_trace_handler)
  flight_recorder/pickle/fr_trace_rank_<r>    Flight Recorder pickle dump per rank (torchfrtrace-readable)
  flight_recorder/json/fr_trace_rank_<r>.json Flight Recorder JSON dump per rank
  truth.json                                  layout, schedule, slowed rank and measured extra compute

Needs torch==2.13.0 (CPU build): `pip install -e '.[record]'`, then
`python scripts/record_cpu_run.py -o sample_traces/cpu-gloo-4rank`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

WORLD = 4
PP = 2
DP = 2
HIDDEN = 128
SEQ = 64
MICROBATCH = 2
LAYER_TYPES = ("linear_attn", "linear_attn", "linear_attn", "self_attn")  # one hybrid block
BLOCKS_PER_STAGE = 1
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build_model(torch, stage: int, slow_repeats: int):
    """The stage's layers as a torch.nn.Module; every layer part runs under a record_function annotation."""
    nn = torch.nn
    record_function = torch.profiler.record_function

    class LinearAttn(nn.Module):
        """Gated-DeltaNet-shaped mixer: q/k/v/gate projections, a linear recurrence done as a cumulative
        sum (cost linear in the sequence length), an output gate and projection."""

        def __init__(self, name: str):
            super().__init__()
            self.name = name
            self.qkvg = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
            self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.norm = nn.RMSNorm(HIDDEN)

        def forward(self, x):
            with record_function(self.name):
                h = self.norm(x)
                q, k, v, g = self.qkvg(h).chunk(4, dim=-1)
                state = torch.cumsum(k.sigmoid() * v, dim=1)
                y = q.sigmoid() * state * torch.sigmoid(g)
                return x + self.out(y)

    class SelfAttn(nn.Module):
        """Full causal attention with an output gate (cost quadratic in the sequence length)."""

        def __init__(self, name: str, heads: int = 4):
            super().__init__()
            self.name = name
            self.heads = heads
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
            self.gate = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.norm = nn.RMSNorm(HIDDEN)

        def forward(self, x):
            with record_function(self.name):
                b, s, _ = x.shape
                h = self.norm(x)
                q, k, v = self.qkv(h).view(b, s, 3, self.heads, HIDDEN // self.heads).unbind(2)
                y = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                )
                y = y.transpose(1, 2).reshape(b, s, HIDDEN) * torch.sigmoid(self.gate(h))
                return x + self.out(y)

    class Mlp(nn.Module):
        """SwiGLU MLP. `slow_repeats` > 0 adds that many extra (discarded-in-value) matmuls: the straggler."""

        def __init__(self, name: str):
            super().__init__()
            self.name = name
            self.up = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
            self.gate = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
            self.down = nn.Linear(4 * HIDDEN, HIDDEN, bias=False)
            self.norm = nn.RMSNorm(HIDDEN)
            self.extra_ns = 0

        def forward(self, x):
            with record_function(self.name):
                h = self.norm(x)
                y = self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
                if slow_repeats:
                    # one large extra matmul (a single aten::mm in the trace), its result scaled to zero
                    t0 = time.perf_counter_ns()
                    z = h.detach().reshape(-1, HIDDEN).repeat(slow_repeats, 1)
                    y = y + (z @ self.up.weight.detach().T).sum() * 0.0
                    self.extra_ns += time.perf_counter_ns() - t0
                return x + y

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            layers = []
            self.mlps = []
            first = stage * BLOCKS_PER_STAGE * len(LAYER_TYPES)
            for i in range(BLOCKS_PER_STAGE * len(LAYER_TYPES)):
                idx = first + i
                kind = LAYER_TYPES[i % len(LAYER_TYPES)]
                mixer = (
                    LinearAttn(f"layers.{idx}.linear_attn")
                    if kind == "linear_attn"
                    else SelfAttn(f"layers.{idx}.self_attn")
                )
                mlp = Mlp(f"layers.{idx}.mlp")
                self.mlps.append(mlp)
                layers += [mixer, mlp]
            self.layers = nn.ModuleList(layers)
            self.layer_names = [m.name for m in layers]

        def forward(self, x):
            for m in self.layers:
                x = m(x)
            return x

    return Stage()


def _worker(rank: int, args: argparse.Namespace, init_method: str, stage_dir: str) -> None:
    """One process of the run: set up groups, train with the profiler on, dump the Flight Recorder."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)

    stage, dp_idx = divmod(rank, DP)
    # Every rank creates every group, in the same order (a c10d requirement).
    dp_groups = [
        dist.new_group([s * DP + d for d in range(DP)], group_desc=f"dp_stage{s}") for s in range(PP)
    ]
    pp_groups = [
        dist.new_group([s * DP + d for s in range(PP)], group_desc=f"pp_{d}_{d + DP}") for d in range(DP)
    ]
    dp_group = dp_groups[stage]
    pp_group = pp_groups[dp_idx]
    peer = (1 - stage) * DP + dp_idx  # the other stage's rank in my pipeline pair

    slow_repeats = args.slow_repeats if rank == args.slow_rank else 0
    model = _build_model(torch, stage, slow_repeats)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mb_shape = (MICROBATCH, SEQ, HIDDEN)
    counts = {"send": 0, "recv": 0, "allreduce": 0, "broadcast": 0}

    # broadcast the stage's initial weights from dp rank 0 so dp replicas agree (real DDP does this)
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        dist.broadcast(flat, src=stage * DP, group=dp_group)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
    counts["broadcast"] += 1

    step_wall = []
    step_extra = []

    def train_step(step: int) -> None:
        """GPipe: all forwards, then all backwards, then the dp gradient allreduce and the optimizer."""
        t_step = time.perf_counter_ns()
        extra0 = sum(m.extra_ns for m in model.mlps)
        opt.zero_grad(set_to_none=False)
        inputs, outputs = [], []
        for mb in range(args.microbatches):
            with torch.profiler.record_function(f"forward_mb{mb}"):
                if stage == 0:
                    g = torch.Generator().manual_seed(step * 1000 + mb * 10 + dp_idx)
                    x = torch.randn(mb_shape, generator=g)
                else:
                    x = torch.empty(mb_shape)
                    dist.recv(x, src=peer, group=pp_group)
                    counts["recv"] += 1
                    x.requires_grad_(True)
                y = model(x)
                if stage == 0:
                    dist.send(y.detach(), dst=peer, group=pp_group)
                    counts["send"] += 1
                inputs.append(x)
                outputs.append(y)
        for mb in range(args.microbatches):
            with torch.profiler.record_function(f"backward_mb{mb}"):
                y = outputs[mb]
                if stage == PP - 1:
                    loss = (y.float() ** 2).mean() / args.microbatches
                    loss.backward()
                    dist.send(inputs[mb].grad, dst=peer, group=pp_group)
                    counts["send"] += 1
                else:
                    grad = torch.empty(mb_shape)
                    dist.recv(grad, src=peer, group=pp_group)
                    counts["recv"] += 1
                    y.backward(grad)
        with torch.profiler.record_function("dp_grad_allreduce"):
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            counts["allreduce"] += 1
            flat /= DP
            off = 0
            for gr in grads:
                n = gr.numel()
                gr.copy_(flat[off : off + n].view_as(gr))
                off += n
        with torch.profiler.record_function("optimizer_step"):
            opt.step()
        step_wall.append(time.perf_counter_ns() - t_step)
        step_extra.append(sum(m.extra_ns for m in model.mlps) - extra0)

    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    total_steps = PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE
    trace_dir = Path(stage_dir) / "traces"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir), use_gzip=True),
        record_shapes=True,
    ) as prof:
        for step in range(total_steps):
            train_step(step)
            prof.step()

    dist.barrier()
    counts["barrier"] = 1
    c10d = torch._C._distributed_c10d
    fr_dir = Path(stage_dir) / "flight_recorder"
    (fr_dir / "pickle").mkdir(parents=True, exist_ok=True)
    (fr_dir / "json").mkdir(parents=True, exist_ok=True)
    pkl = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    (fr_dir / "pickle" / f"fr_trace_rank_{rank}").write_bytes(pkl)
    js = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    (fr_dir / "json" / f"fr_trace_rank_{rank}.json").write_bytes(js if isinstance(js, bytes) else js.encode())

    result = {
        "rank": rank,
        "stage": stage,
        "dp_index": dp_idx,
        "pid": os.getpid(),
        "step_wall_ns": step_wall,
        "extra_compute_ns": step_extra,
        "collectives_issued": counts,
        "layers": model.layer_names,
    }
    (Path(stage_dir) / f"rank{rank}.result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _hang_worker(rank: int, args: argparse.Namespace, init_method: str, stage_dir: str) -> None:
    """A real hang: every rank runs `args.hang_seq - 1` world allreduces, then `args.hang_rank` skips the next
    one while the others enter it; each rank dumps its Flight Recorder while the collective is pending."""
    import datetime

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=20)
    )
    x = torch.ones(1024)
    for _ in range(args.hang_seq - 1):
        dist.all_reduce(x)
    pending = None
    if rank != args.hang_rank:
        pending = dist.all_reduce(x, async_op=True)  # never completes: one member is missing
    time.sleep(3.0)  # let every rank reach its state before dumping
    c10d = torch._C._distributed_c10d
    fr_dir = Path(stage_dir) / "flight_recorder"
    (fr_dir / "pickle").mkdir(parents=True, exist_ok=True)
    (fr_dir / "json").mkdir(parents=True, exist_ok=True)
    pkl = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    (fr_dir / "pickle" / f"fr_trace_rank_{rank}").write_bytes(pkl)
    js = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    (fr_dir / "json" / f"fr_trace_rank_{rank}.json").write_bytes(js if isinstance(js, bytes) else js.encode())
    (Path(stage_dir) / f"rank{rank}.done").write_text("pending" if pending is not None else "skipped")
    os._exit(0)  # do not wait for the hung collective (or for gloo's timeout)


def record_hang(args: argparse.Namespace) -> int:
    """Record real Flight Recorder dumps of a hung gloo run into args.out (no profiler traces)."""
    import torch
    import torch.multiprocessing as mp

    stage_dir = tempfile.mkdtemp(prefix="tracelens-hang-")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    mp.spawn(_hang_worker, args=(args, init_method, stage_dir), nprocs=WORLD, join=True)
    truth = {
        "kind": "real",
        "recorded_with": {
            "script": "scripts/record_cpu_run.py",
            "argv": sys.argv[1:],
            "torch": torch.__version__,
            "backend": "gloo",
        },
        "world_size": WORLD,
        "hang": {
            "rank": args.hang_rank,
            "seq": args.hang_seq,
            "pg_name": "0",
            "pg_desc": "default_pg",
            "op": "allreduce",
            "waiting_ranks": [r for r in range(WORLD) if r != args.hang_rank],
            "message": (
                f"rank {args.hang_rank} never joined allreduce #{args.hang_seq} on pg 0 (default_pg); "
                f"{WORLD - 1} ranks waited"
            ),
        },
    }
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(Path(stage_dir) / "flight_recorder", out / "flight_recorder")
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    shutil.rmtree(stage_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True, type=Path, help="output folder (replaced)")
    ap.add_argument("--slow-rank", type=int, default=1, help="rank made slower with extra matmuls")
    ap.add_argument(
        "--slow-repeats",
        type=int,
        default=16,
        help="rows x this of extra matmul per MLP call on the slow rank",
    )
    ap.add_argument("--microbatches", type=int, default=3)
    ap.add_argument(
        "--hang",
        metavar="RANK:SEQ",
        help="record Flight Recorder dumps of a real hang instead: RANK skips world allreduce #SEQ",
    )
    args = ap.parse_args(argv)
    if args.hang:
        try:
            args.hang_rank, args.hang_seq = (int(v) for v in args.hang.split(":"))
        except ValueError:
            ap.error("--hang takes RANK:SEQ, e.g. 3:5")
        if not (0 <= args.hang_rank < WORLD and args.hang_seq >= 1):
            ap.error(f"--hang rank must be in 0..{WORLD - 1} and seq >= 1")
        return record_hang(args)

    import torch
    import torch.multiprocessing as mp

    stage_dir = tempfile.mkdtemp(prefix="tracelens-record-")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    mp.spawn(_worker, args=(args, init_method, stage_dir), nprocs=WORLD, join=True)

    results = [json.loads((Path(stage_dir) / f"rank{r}.result.json").read_text()) for r in range(WORLD)]
    active = list(range(PROFILE_WAIT + PROFILE_WARMUP, PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE))
    truth = {
        "kind": "real",
        "recorded_with": {
            "script": "scripts/record_cpu_run.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "backend": "gloo",
            "threads_per_rank": 1,
            "cpu_cores": os.cpu_count(),
            "note": "real run; ranks share the host's cores, so timings carry OS scheduling noise",
            "flight_recorder": "gloo: collectives only (no send/recv), state 'scheduled', no times",
        },
        "world_size": WORLD,
        "layout": {"tp": 1, "pp": PP, "dp": DP, "cp": 1, "order": "tp-cp-dp-pp"},
        "stages": {
            str(s): {"ranks": [s * DP + d for d in range(DP)], "layers": results[s * DP]["layers"]}
            for s in range(PP)
        },
        "process_groups": {
            **{f"dp_stage{s}": [s * DP + d for d in range(DP)] for s in range(PP)},
            **{f"pp_{d}_{d + DP}": [s * DP + d for s in range(PP)] for d in range(DP)},
        },
        "model": {
            "hidden": HIDDEN,
            "seq_len": SEQ,
            "microbatch_size": MICROBATCH,
            "layer_pattern": list(LAYER_TYPES),
        },
        "schedule": {
            "kind": "gpipe",
            "microbatches": args.microbatches,
            "pp": PP,
            "expected_bubble_fraction": (PP - 1) / (args.microbatches + PP - 1),
        },
        "profiled_steps": active,
        "straggler": {
            "rank": args.slow_rank,
            "cause": "compute",
            "extra_matmul_repeats_per_mlp_call": args.slow_repeats,
            "extra_compute_ms_per_step": {
                str(s): results[args.slow_rank]["extra_compute_ns"][s] / 1e6 for s in active
            },
        },
        "ranks": [
            {
                "rank": r["rank"],
                "stage": r["stage"],
                "dp_index": r["dp_index"],
                "pid": r["pid"],
                "step_wall_ms": {str(s): r["step_wall_ns"][s] / 1e6 for s in active},
                "collectives_issued_total": r["collectives_issued"],
            }
            for r in results
        ],
        "flight_recorder": {
            "pickle_prefix": "flight_recorder/pickle/fr_trace_rank_",
            "json_prefix": "flight_recorder/json/fr_trace_rank_",
        },
    }
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(Path(stage_dir) / "traces", out / "traces")
    shutil.copytree(Path(stage_dir) / "flight_recorder", out / "flight_recorder")
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    shutil.rmtree(stage_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
