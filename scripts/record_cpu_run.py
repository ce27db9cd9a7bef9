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
import contextlib
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


# ================================================================================================
# 8-rank pipeline runs (`--kind pipeline`): pp stages x dp replicas, real isend/irecv, DDP-style buckets
# ================================================================================================
#
# Built so that layouts, schedules, annotation conventions and faults are independent options: a schedule
# is a function (SCHEDULES), an annotation convention a function of (layer index, part) (ANNOTATIONS), and
# each fault a field of PipelineOptions read in one place.

#: Layer-annotation conventions: name of the span a layer part runs under. `part` is the mixer type
#: ("linear_attention" | "full_attention") or "mlp"; `whole` marks the span around the whole layer.
ANNOTATIONS = {
    # tracelens' own layer-type names, one span per layer: layer.N.<type>
    "layer_type": lambda i, part, whole: f"layer.{i}.{part}" if whole else None,
    # Hugging Face module paths
    "hf": lambda i, part, whole: (
        None
        if whole
        else f"model.layers.{i}."
        + {"linear_attention": "linear_attn", "full_attention": "self_attn"}.get(part, part)
    ),
    # Megatron-Core module paths (hybrid models call a non-attention mixer `mixer`)
    "megatron": lambda i, part, whole: (
        None
        if whole
        else f"decoder.layers.{i}."
        + {"linear_attention": "mixer", "full_attention": "self_attention"}.get(part, part)
    ),
    # torchtitan module paths
    "torchtitan": lambda i, part, whole: (
        None
        if whole
        else f"layers.{i}."
        + {"linear_attention": "linear_attn", "full_attention": "attention", "mlp": "feed_forward"}[part]
    ),
    # module-class names, as `with_modules` / nn.Module hooks name them (instance index, no path)
    "class": lambda i, part, whole: (
        f"nn.Module: Qwen3_5DecoderLayer_{i}"
        if whole
        else "nn.Module: "
        + {
            "linear_attention": "Qwen3_5GatedDeltaNet",
            "full_attention": "Qwen3_5Attention",
            "mlp": "Qwen3_5MLP",
        }[part]
        + f"_{i}"
    ),
}


class PipelineOptions:
    """Options of one pipeline recording (argparse namespace fields of the same names)."""

    def __init__(self, args: argparse.Namespace):
        self.pp: int = args.pp
        self.dp: int = args.dp
        self.world = self.pp * self.dp
        self.microbatches: int = args.microbatches
        self.schedule: str = args.schedule
        self.annotate: str = args.annotate
        self.layers_per_stage: list[int] = [args.layers_per_stage] * self.pp
        if args.heavy_stage is not None:
            self.layers_per_stage[args.heavy_stage] = args.heavy_layers
        self.heavy_stage_given = args.heavy_stage is not None
        self.slow_rank: int | None = args.slow_rank if args.fault_compute else None
        self.slow_factor: float = args.slow_factor
        self.stall_rank: int | None = args.stall_rank
        self.stall_ms: float = args.stall_ms
        self.skip_send: tuple[int, int, int] | None = args.skip_send_t
        self.timeout_s: float = args.timeout_s
        self.buckets: int = args.buckets
        self.hidden: int = args.hidden
        self.seq: int = args.seq

    def stage_dp(self, rank: int) -> tuple[int, int]:
        """Megatron order tp-cp-dp-pp with tp=cp=1: rank = dp_index + dp * stage."""
        return divmod(rank, self.dp)[0], rank % self.dp

    def rank_of(self, stage: int, dp_idx: int) -> int:
        return stage * self.dp + dp_idx

    def first_layer(self, stage: int) -> int:
        return sum(self.layers_per_stage[:stage])


def _layer_kind(i: int) -> str:
    return "full_attention" if i % 4 == 3 else "linear_attention"


def _pipeline_model(torch, o: PipelineOptions, stage: int, slow_mms: int):
    """The stage's layers; each part runs under the chosen annotation convention. `slow_mms` extra
    `aten::mm` per layer forward (results discarded) make a compute straggler."""
    nn = torch.nn
    rf = torch.profiler.record_function
    H = o.hidden
    name = ANNOTATIONS[o.annotate]

    class Layer(nn.Module):
        def __init__(self, idx: int):
            super().__init__()
            self.idx, self.kind = idx, _layer_kind(idx)
            self.mix = nn.Linear(H, 4 * H, bias=False)
            self.mix_out = nn.Linear(H, H, bias=False)
            self.up = nn.Linear(H, 4 * H, bias=False)
            self.down = nn.Linear(4 * H, H, bias=False)
            self.norm1, self.norm2 = nn.RMSNorm(H), nn.RMSNorm(H)
            self.extra_ns = 0

        def _span(self, part: str, whole: bool = False):
            n = name(self.idx, part, whole)
            return rf(n) if n else contextlib.nullcontext()

        def forward(self, x):
            with self._span(self.kind, whole=True):
                with self._span(self.kind):
                    h = self.norm1(x)
                    q, k, v, g = self.mix(h).chunk(4, dim=-1)
                    if self.kind == "linear_attention":
                        y = q.sigmoid() * torch.cumsum(k.sigmoid() * v, dim=1) * torch.sigmoid(g)
                    else:
                        b, s, _ = x.shape
                        y = torch.nn.functional.scaled_dot_product_attention(
                            q.view(b, s, 4, H // 4).transpose(1, 2),
                            k.view(b, s, 4, H // 4).transpose(1, 2),
                            v.view(b, s, 4, H // 4).transpose(1, 2),
                            is_causal=True,
                        )
                        y = y.transpose(1, 2).reshape(b, s, H) * torch.sigmoid(g)
                    x = x + self.mix_out(y)
                with self._span("mlp"):
                    h = self.norm2(x)
                    x = x + self.down(torch.nn.functional.silu(self.up(h)))
                    if slow_mms:
                        t0 = time.perf_counter_ns()
                        hd = h.detach().reshape(-1, H)
                        acc = None
                        for _ in range(slow_mms):  # one aten::mm each
                            z = hd @ self.up.weight.detach().T
                            acc = z if acc is None else acc + z
                        x = x + acc.sum() * 0.0
                        self.extra_ns += time.perf_counter_ns() - t0
            return x

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            first = o.first_layer(stage)
            self.layers = nn.ModuleList(Layer(first + i) for i in range(o.layers_per_stage[stage]))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

        @property
        def extra_ns(self) -> int:
            return sum(layer.extra_ns for layer in self.layers)

    return Stage()


class _Buckets:
    """DDP-style gradient buckets: when every parameter of a bucket has its gradient accumulated on the
    last microbatch, the comm hook runs (inside autograd's AccumulateGrad frame, as DDP's reducer does):
    an optional host stall (`time.sleep`, no ops), then an async all_reduce of the flattened bucket."""

    def __init__(self, torch, dist, params: list, group, n_buckets: int, stall_s: float):
        self.torch, self.dist, self.group, self.stall_s = torch, dist, group, stall_s
        params = list(reversed(params))  # gradients arrive roughly in reverse order, as DDP assumes
        per = max(1, -(-len(params) // n_buckets))
        self.buckets = [params[i : i + per] for i in range(0, len(params), per)]
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.armed = False
        self.ready: list[set] = [set() for _ in self.buckets]
        self.works: list = []
        self.slept_ns = 0
        self.allreduces = 0
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def arm(self) -> None:
        """Call before the last microbatch's backward: its accumulated gradients are reduced."""
        self.armed = True
        self.ready = [set() for _ in self.buckets]
        self.works = []

    def _hook(self, p) -> None:
        if not self.armed:
            return
        b = self.bucket_of[id(p)]
        self.ready[b].add(id(p))
        if len(self.ready[b]) == len(self.buckets[b]):
            self._comm_hook(b)

    def _comm_hook(self, b: int) -> None:
        if self.stall_s:
            t0 = time.perf_counter_ns()
            time.sleep(self.stall_s)  # host stall: no op runs
            self.slept_ns += time.perf_counter_ns() - t0
        flat = self.torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
        self.works.append((b, flat, self.dist.all_reduce(flat, group=self.group, async_op=True)))
        self.allreduces += 1

    def finish(self, world: int, timeout=None) -> None:
        """Wait for every bucket's all_reduce and write the averaged gradients back."""
        for b, flat, work in self.works:
            work.wait(timeout) if timeout is not None else work.wait()
            flat /= world
            off = 0
            for p in self.buckets[b]:
                n = p.grad.numel()
                p.grad.copy_(flat[off : off + n].view_as(p.grad))
                off += n
        self.armed = False


class _P2P:
    """Point-to-point transfers of one pipeline (isend/irecv on the rank's pp group); counts what it issued.
    `skip` = (step, microbatch) of a forward send this rank never issues (a planted hang)."""

    def __init__(self, dist, group, shape, skip: tuple[int, int] | None, timeout):
        self.dist, self.group, self.shape, self.skip, self.timeout = dist, group, shape, skip, timeout
        self.pending: list = []
        self.counts = {"isend": 0, "irecv": 0}
        self.skipped: dict | None = None

    def recv(self, torch, src: int):
        buf = torch.empty(self.shape)
        self.counts["irecv"] += 1
        self.dist.irecv(buf, src=src, group=self.group).wait(self.timeout)  # gloo p2p: no default timeout
        return buf

    def send(self, t, dst: int, step: int, mb: int, what: str) -> None:
        if what == "activation" and self.skip == (step, mb):
            self.skipped = {"step": step, "microbatch": mb, "dst": dst, "op": "isend"}
            return
        self.counts["isend"] += 1
        self.pending.append(self.dist.isend(t.contiguous(), dst=dst, group=self.group))

    def drain(self) -> None:
        for w in self.pending:
            w.wait(self.timeout)
        self.pending = []


def _forward(ctx, step: int, mb: int):
    """One microbatch forward on this stage: receive activations (not on the first stage), run, send."""
    torch, o, s, p2p = ctx["torch"], ctx["o"], ctx["stage"], ctx["p2p"]
    with torch.profiler.record_function(f"forward_mb{mb}"):
        if s == 0:
            g = torch.Generator().manual_seed(step * 1000 + mb * 10 + ctx["dp_idx"])
            x = torch.randn(ctx["shape"], generator=g)
        else:
            x = p2p.recv(torch, ctx["prev"]).requires_grad_(True)
        y = ctx["model"](x)
        if s < o.pp - 1:
            p2p.send(y.detach(), ctx["next"], step, mb, "activation")
        ctx["acts"][mb] = (x, y)


def _backward(ctx, step: int, mb: int):
    """One microbatch backward: receive the output gradient (not on the last stage), run, send input grad."""
    torch, o, s, p2p = ctx["torch"], ctx["o"], ctx["stage"], ctx["p2p"]
    with torch.profiler.record_function(f"backward_mb{mb}"):
        x, y = ctx["acts"].pop(mb)
        if mb == o.microbatches - 1:
            ctx["buckets"].arm()
        if s == o.pp - 1:
            ((y.float() ** 2).mean() / o.microbatches).backward()
        else:
            y.backward(p2p.recv(torch, ctx["next"]))
        if s > 0:
            p2p.send(x.grad, ctx["prev"], step, mb, "gradient")


def schedule_gpipe(ctx, step: int) -> None:
    """GPipe: all m forwards, then all m backwards."""
    m = ctx["o"].microbatches
    for mb in range(m):
        _forward(ctx, step, mb)
    for mb in range(m):
        _backward(ctx, step, mb)


def schedule_1f1b(ctx, step: int) -> None:
    """1F1B (PipeDream-flush): p-s-1 warm-up forwards, then alternate one forward / one backward, then
    the remaining backwards."""
    o, s = ctx["o"], ctx["stage"]
    m = o.microbatches
    warm = min(o.pp - s - 1, m)
    f = b = 0
    for _ in range(warm):
        _forward(ctx, step, f)
        f += 1
    while f < m:
        _forward(ctx, step, f)
        f += 1
        _backward(ctx, step, b)
        b += 1
    while b < m:
        _backward(ctx, step, b)
        b += 1


SCHEDULES = {"gpipe": schedule_gpipe, "1f1b": schedule_1f1b}


def _dump_fr(torch, fr_dir: Path, rank: int) -> None:
    c10d = torch._C._distributed_c10d
    (fr_dir / "pickle").mkdir(parents=True, exist_ok=True)
    (fr_dir / "json").mkdir(parents=True, exist_ok=True)
    pkl = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    (fr_dir / "pickle" / f"fr_trace_rank_{rank}").write_bytes(pkl)
    js = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    (fr_dir / "json" / f"fr_trace_rank_{rank}.json").write_bytes(js if isinstance(js, bytes) else js.encode())


def _pipeline_worker(rank: int, args: argparse.Namespace, init_method: str, stage_dir: str) -> None:
    """One process of a pipeline run: groups, DDP-style buckets, the schedule under the profiler."""
    import datetime

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist

    o = PipelineOptions(args)
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=o.world,
        timeout=datetime.timedelta(seconds=o.timeout_s),
    )
    stage, dp_idx = o.stage_dp(rank)
    dp_groups = [
        dist.new_group([o.rank_of(s, d) for d in range(o.dp)], group_desc=f"dp_stage{s}") for s in range(o.pp)
    ]
    pp_groups = [
        dist.new_group([o.rank_of(s, d) for s in range(o.pp)], group_desc=f"pp_dp{d}") for d in range(o.dp)
    ]
    H = o.hidden
    per_layer = 4 * H * H * 3 + H * H  # params per layer (mix, mix_out, up, down)
    slow_mms = 0
    if rank == o.slow_rank:
        # +slow_factor of the layer's forward matmul work as extra (B*S x H) @ (H x 4H) matmuls
        slow_mms = max(1, round(o.slow_factor * 3 * per_layer / (4 * H * H)))
    model = _pipeline_model(torch, o, stage, slow_mms)
    with torch.no_grad():  # replicas agree on the initial weights (as DDP's constructor broadcast does)
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        dist.broadcast(flat, src=o.rank_of(stage, 0), group=dp_groups[stage])
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
    stall_s = o.stall_ms / 1e3 if rank == o.stall_rank else 0.0
    buckets = _Buckets(torch, dist, list(model.parameters()), dp_groups[stage], o.buckets, stall_s)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    shape = (1, o.seq, H)
    skip = None
    if o.skip_send is not None and o.skip_send[0] == rank:
        skip = (o.skip_send[1], o.skip_send[2])
    p2p = _P2P(dist, pp_groups[dp_idx], shape, skip, datetime.timedelta(seconds=o.timeout_s))
    ctx = {
        "torch": torch,
        "o": o,
        "stage": stage,
        "dp_idx": dp_idx,
        "model": model,
        "p2p": p2p,
        "buckets": buckets,
        "shape": shape,
        "acts": {},
        "prev": o.rank_of(stage - 1, dp_idx) if stage > 0 else None,
        "next": o.rank_of(stage + 1, dp_idx) if stage < o.pp - 1 else None,
    }
    dist.barrier()  # every rank set up before the first step (spawned processes start seconds apart)
    run_schedule = SCHEDULES[o.schedule]
    step_wall, step_extra, step_slept = [], [], []
    failure = None

    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    total = PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(Path(stage_dir) / "traces"), use_gzip=True),
        record_shapes=True,
    ) as prof:
        for step in range(total):
            t0, e0, s0 = time.perf_counter_ns(), model.extra_ns, buckets.slept_ns
            if failure is None:
                try:
                    opt.zero_grad(set_to_none=False)
                    run_schedule(ctx, step)
                    buckets.finish(o.dp, datetime.timedelta(seconds=o.timeout_s))
                    p2p.drain()
                    with torch.profiler.record_function("optimizer_step"):
                        opt.step()
                except RuntimeError as err:  # a peer never sent / never joined: gloo's timeout fires
                    failure = {"step": step, "error": str(err).splitlines()[0][:300]}
            step_wall.append(time.perf_counter_ns() - t0)
            step_extra.append(model.extra_ns - e0)
            step_slept.append(buckets.slept_ns - s0)
            prof.step()

    _dump_fr(torch, Path(stage_dir) / "flight_recorder", rank)
    result = {
        "rank": rank,
        "stage": stage,
        "dp_index": dp_idx,
        "pid": os.getpid(),
        "step_wall_ns": step_wall,
        "extra_compute_ns": step_extra,
        "slept_ns": step_slept,
        "extra_mm_per_layer_forward": slow_mms,
        "issued": {**p2p.counts, "allreduce": buckets.allreduces, "broadcast": 1},
        "skipped_send": p2p.skipped,
        "failure": failure,
        "layers": [layer.idx for layer in model.layers],
    }
    (Path(stage_dir) / f"rank{rank}.result.json").write_text(json.dumps(result))
    if failure is not None or o.skip_send is not None:
        os._exit(0)  # the process group is broken after a timeout: no clean shutdown
    dist.barrier()
    dist.destroy_process_group()


def record_pipeline(args: argparse.Namespace) -> int:
    """Record an 8-rank (pp x dp) pipeline run with the chosen schedule, annotations and faults."""
    import torch
    import torch.multiprocessing as mp

    o = PipelineOptions(args)
    stage_dir = tempfile.mkdtemp(prefix="tracelens-pp-")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    mp.spawn(_pipeline_worker, args=(args, init_method, stage_dir), nprocs=o.world, join=True)
    results = [json.loads((Path(stage_dir) / f"rank{r}.result.json").read_text()) for r in range(o.world)]
    active = list(range(PROFILE_WAIT + PROFILE_WARMUP, PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE))
    faults: dict = {}
    if o.slow_rank is not None:
        r = results[o.slow_rank]
        faults["compute"] = {
            "rank": o.slow_rank,
            "cause": "compute",
            "extra_mm_per_layer_forward": r["extra_mm_per_layer_forward"],
            "extra_mm_per_step": r["extra_mm_per_layer_forward"] * len(r["layers"]) * o.microbatches,
            "extra_compute_ms_per_step": {str(s): r["extra_compute_ns"][s] / 1e6 for s in active},
        }
    if o.stall_rank is not None:
        r = results[o.stall_rank]
        faults["host_stall"] = {
            "rank": o.stall_rank,
            "cause": "host",
            "where": "DDP-style comm hook, before each bucket's all_reduce (inside AccumulateGrad)",
            "buckets": o.buckets,
            "stall_ms_per_bucket": o.stall_ms,
            "slept_ms_per_step": {str(s): r["slept_ns"][s] / 1e6 for s in active},
        }
    if o.heavy_stage_given:
        faults["heavy_stage"] = {"stage": args.heavy_stage, "layers": o.layers_per_stage}
    if o.skip_send is not None:
        root = o.skip_send[0]
        faults["skipped_send"] = {
            "rank": root,
            **(results[root]["skipped_send"] or {}),
            "failed_ranks": {str(r["rank"]): r["failure"] for r in results if r["failure"]},
        }
    truth = {
        "kind": "real",
        "recorded_with": {
            "script": "scripts/record_cpu_run.py",
            "argv": sys.argv[1:],
            "torch": torch.__version__,
            "python": platform.python_version(),
            "backend": "gloo",
            "threads_per_rank": 1,
            "cpu_cores": os.cpu_count(),
            "note": "real run; ranks share the host's cores, so timings carry OS scheduling noise",
        },
        "world_size": o.world,
        "layout": {"tp": 1, "pp": o.pp, "dp": o.dp, "cp": 1, "order": "tp-cp-dp-pp"},
        "annotate": o.annotate,
        "stages": {
            str(s): {
                "ranks": [o.rank_of(s, d) for d in range(o.dp)],
                "layers": {
                    t: sum(1 for i in results[o.rank_of(s, 0)]["layers"] if _layer_kind(i) == t)
                    for t in ("linear_attention", "full_attention")
                },
                "layer_indices": results[o.rank_of(s, 0)]["layers"],
            }
            for s in range(o.pp)
        },
        "schedule": {
            "kind": o.schedule,
            "microbatches": o.microbatches,
            "pp": o.pp,
            "expected_bubble_fraction": (o.pp - 1) / (o.microbatches + o.pp - 1),
        },
        "profiled_steps": active,
        "faults": faults,
        "ranks": [
            {
                "rank": r["rank"],
                "stage": r["stage"],
                "dp_index": r["dp_index"],
                "pid": r["pid"],
                "step_wall_ms": {str(s): r["step_wall_ns"][s] / 1e6 for s in active},
                "issued": r["issued"],
                "failure": r["failure"],
            }
            for r in results
        ],
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
    ap.add_argument(
        "--kind",
        choices=("gloo4", "pipeline"),
        default="gloo4",
        help="gloo4: the 4-rank GPipe sample run; pipeline: pp x dp ranks with isend/irecv (see docs/recording.md)",
    )
    pp = ap.add_argument_group("pipeline runs (--kind pipeline)")
    pp.add_argument("--pp", type=int, default=4)
    pp.add_argument("--dp", type=int, default=2)
    pp.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    pp.add_argument("--annotate", choices=sorted(ANNOTATIONS), default="layer_type")
    pp.add_argument("--layers-per-stage", type=int, default=4)
    pp.add_argument("--heavy-stage", type=int, default=None, help="this stage holds --heavy-layers layers")
    pp.add_argument("--heavy-layers", type=int, default=6)
    pp.add_argument(
        "--fault-compute", action="store_true", help="--slow-rank does +--slow-factor forward matmuls"
    )
    pp.add_argument("--slow-factor", type=float, default=0.4)
    pp.add_argument("--stall-rank", type=int, default=None, help="rank sleeping in its comm hook per bucket")
    pp.add_argument("--stall-ms", type=float, default=30.0)
    pp.add_argument("--buckets", type=int, default=2, help="DDP-style gradient buckets per stage")
    pp.add_argument(
        "--skip-send", metavar="RANK:STEP:MB", default=None, help="RANK never sends activation MB of STEP"
    )
    pp.add_argument("--timeout-s", type=float, default=60.0, help="process-group timeout (gloo)")
    pp.add_argument("--hidden", type=int, default=64)
    pp.add_argument("--seq", type=int, default=32)
    args = ap.parse_args(argv)
    if args.kind == "pipeline":
        args.skip_send_t = tuple(int(v) for v in args.skip_send.split(":")) if args.skip_send else None
        if args.microbatches == 3 and "--microbatches" not in (argv or sys.argv):
            args.microbatches = 4
        return record_pipeline(args)
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
