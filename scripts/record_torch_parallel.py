#!/usr/bin/env python3
"""Record a real multi-rank CPU (gloo) run made with PyTorch's own parallelism libraries, with a manifest of
its truth in the format of `../shared/runs/*/manifest.json` (so `../shared/runs/evaluate.py` scores tracelens
on it): `torch.distributed.pipelining` (PipelineStage and any of its schedules), a DeviceMesh over
(pp, dp, tp) with the dimension names you choose, DTensor tensor parallelism (ColwiseParallel /
RowwiseParallel), DDP or FSDP2 over the data-parallel dimension, and planted faults.

The model is a small hybrid decoder: layer i is full attention (scaled_dot_product_attention, GQA with
8 query and 4 KV heads) when (i + 1) % 4 == 0, else a linear-attention layer (a cumulative-sum mixer), each
followed by a SwiGLU MLP; the first virtual stage holds the embedding, the last the norm, LM head and loss.

    python scripts/record_torch_parallel.py --pp 4 --dp 2 --schedule 1f1b -o /tmp/runs/pp4dp2_1f1b_clean
    python scripts/record_torch_parallel.py --pp 2 --schedule dualpipev --slow-rank 1 -o /tmp/runs/dpv_slow1
    python scripts/record_torch_parallel.py --tp 2 --pp 2 --dp 2 --dp-mode fsdp --slow-rank 5 -o /tmp/r

Faults: `--slow-rank R` adds an H x 32H matmul to every MLP forward of rank R; `--stall-rank R` sleeps 40 ms
before each step's forward on rank R (`--stall-annotated` inside `record_function("dataloader")`);
`--heavy-stage S` gives pipeline stage S 1.5x the layers. Needs the `record` extra (torch 2.13, CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

SCHEDULES = {
    "gpipe": ("ScheduleGPipe", "loop", 1),
    "1f1b": ("Schedule1F1B", "loop", 1),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", "loop", 2),
    "loopedbfs": ("ScheduleLoopedBFS", "loop", 2),
    "izb": ("ScheduleInterleavedZeroBubble", "loop", 2),
    "zbv": ("ScheduleZBVZeroBubble", "v", 2),
    "dualpipev": ("ScheduleDualPipeV", "v", 2),
}
HIDDEN, N_HEADS, N_KV, HEAD_DIM, VOCAB, SEQ, MB_SIZE = 128, 8, 4, 16, 256, 64, 2


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", required=True, type=Path)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--layers-per-stage", type=int, default=4, help="layers of each virtual stage")
    ap.add_argument("--dim-names", default="pp,dp,tp", help="DeviceMesh dimension names for pp,dp,tp")
    ap.add_argument("--groups", default="mesh", choices=("mesh", "none"), help="none: new_group, no names")
    ap.add_argument("--annotations", default="hf", choices=("hf", "none"))
    ap.add_argument("--dp-mode", default="ddp", choices=("ddp", "fsdp"))
    ap.add_argument("--slow-rank", type=int)
    ap.add_argument("--stall-rank", type=int)
    ap.add_argument("--stall-annotated", action="store_true")
    ap.add_argument("--heavy-stage", type=int)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    return ap.parse_args()


def layer_types(n: int, start: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(start, start + n)]


def plan(a: argparse.Namespace) -> dict:
    """Virtual stages (their layers) and which rank holds each."""
    _, place, v = SCHEDULES[a.schedule]
    v = v if a.pp > 1 else 1
    n_virtual = a.pp * v
    sizes = [a.layers_per_stage] * n_virtual
    if a.heavy_stage is not None:  # the physical stage: all its virtual stages get 1.5x the layers
        for k in range(n_virtual):
            if _rank_of(k, a.pp, place) == a.heavy_stage:
                sizes[k] = a.layers_per_stage * 3 // 2
    starts = [sum(sizes[:k]) for k in range(n_virtual)]
    return {
        "v": v,
        "placement": place,
        "virtual": {
            k: {"layers": list(range(starts[k], starts[k] + sizes[k])), "pp_rank": _rank_of(k, a.pp, place)}
            for k in range(n_virtual)
        },  # fmt: skip
        "n_layers": sum(sizes),
    }


def _rank_of(k: int, p: int, place: str) -> int:
    return k % p if place == "loop" else (k if k < p else 2 * p - 1 - k)


def worker(rank: int, a: argparse.Namespace, pl: dict, tmp: str, port: int) -> None:  # noqa: C901
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    world = a.pp * a.dp * a.tp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.sched_setaffinity(0, {rank % a.cores})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    names = a.dim_names.split(",")
    dims, sizes = [], []
    for name, size in zip(names, (a.pp, a.dp, a.tp)):
        if size > 1:
            dims.append(name)
            sizes.append(size)
    mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(dims)) if dims else None
    coord = {"pp": 0, "dp": 0, "tp": 0}
    rem = rank
    for axis, size in (("tp", a.tp), ("dp", a.dp), ("pp", a.pp)):  # mesh (pp, dp, tp): tp fastest
        coord[axis] = rem % size
        rem //= size
    pp_group = None
    if a.pp > 1:
        if a.groups == "mesh":
            pp_group = mesh[names[0]].get_group()
        else:  # every rank creates every group, in the same order
            for d in range(a.dp):
                for t in range(a.tp):
                    members = [s * a.dp * a.tp + d * a.tp + t for s in range(a.pp)]
                    g = dist.new_group(members)
                    if rank in members:
                        pp_group = g
    tp_mesh = mesh[names[2]] if a.tp > 1 else None
    dp_mesh = mesh[names[1]] if a.dp > 1 else None

    class Linear(nn.Module):  # the linear-attention mixer: gated cumulative sums
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj = (
                nn.Linear(HIDDEN, HIDDEN, bias=False),
                nn.Linear(HIDDEN, HIDDEN, bias=False),
            )
            self.v_proj, self.g_proj = (
                nn.Linear(HIDDEN, HIDDEN, bias=False),
                nn.Linear(HIDDEN, HIDDEN, bias=False),
            )
            self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

        def forward(self, x):
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            kv = torch.cumsum(torch.sigmoid(k) * v, dim=1)
            norm = torch.cumsum(torch.sigmoid(k), dim=1) + 1.0
            return self.o_proj(torch.sigmoid(self.g_proj(x)) * q * kv / norm)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(HIDDEN, N_HEADS * HEAD_DIM, bias=False)
            self.k_proj = nn.Linear(HIDDEN, N_KV * HEAD_DIM, bias=False)
            self.v_proj = nn.Linear(HIDDEN, N_KV * HEAD_DIM, bias=False)
            self.o_proj = nn.Linear(N_HEADS * HEAD_DIM, HIDDEN, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
            k = self.k_proj(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
            v = self.v_proj(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))

    slow = a.slow_rank == rank

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
            self.up_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
            self.down_proj = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)
            # the planted fault: a matmul the other ranks do not run, with a buffer (not a parameter: data
            # parallelism shards and reduces the same parameters on every replica)
            if slow:
                self.register_buffer("extra", torch.randn(32 * HIDDEN, HIDDEN) * 0.01)
            else:
                self.extra = None

        def forward(self, x):
            y = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            if self.extra is not None:
                y = y + 0.0 * F.linear(x, self.extra).sum(-1, keepdim=True)
            return y

    class Layer(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
            if kind == "full_attention":
                self.self_attn = Attention()
            else:
                self.linear_attn = Linear()
            self.mlp = MLP()

        def forward(self, x):
            mixer = self.self_attn if hasattr(self, "self_attn") else self.linear_attn
            x = x + mixer(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Chunk(nn.Module):
        def __init__(self, k: int) -> None:
            super().__init__()
            info = pl["virtual"][k]
            self.first, self.last = k == 0, k == len(pl["virtual"]) - 1
            self.embed_tokens = nn.Embedding(VOCAB, HIDDEN) if self.first else None
            self.layers = nn.ModuleDict(
                {
                    str(i): Layer(t)
                    for i, t in zip(info["layers"], layer_types(len(info["layers"]), info["layers"][0]))
                }
            )
            self.norm = nn.RMSNorm(HIDDEN) if self.last else None
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False) if self.last else None

        def forward(self, x):
            if self.embed_tokens is not None:
                x = self.embed_tokens(x)
            for layer in self.layers.values():
                x = layer(x)
            if self.lm_head is not None:
                x = self.lm_head(self.norm(x))
            return x

    mine = sorted(k for k, info in pl["virtual"].items() if info["pp_rank"] == coord["pp"])
    chunks = [Chunk(k) for k in mine]
    if a.annotations == "hf":
        from torch.autograd.profiler import record_function

        for ch in chunks:
            for i, layer in ch.layers.items():
                for name, mod in layer.named_children():
                    if name.endswith("layernorm"):
                        continue
                    label = f"model.layers.{i}.{name}"

                    def pre(m, args, label=label):
                        m._rf = record_function(label)
                        m._rf.__enter__()

                    def post(m, args, out):
                        m._rf.__exit__(None, None, None)

                    mod.register_forward_pre_hook(pre)
                    mod.register_forward_hook(post)
    if tp_mesh is not None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for ch in chunks:
            for layer in ch.layers.values():
                if hasattr(layer, "self_attn"):
                    plan_ = {f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
                    plan_["self_attn.o_proj"] = RowwiseParallel()
                else:
                    plan_ = {
                        f"linear_attn.{p}": ColwiseParallel()
                        for p in ("q_proj", "k_proj", "v_proj", "g_proj")
                    }
                    plan_["linear_attn.o_proj"] = RowwiseParallel()
                plan_.update({"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                              "mlp.down_proj": RowwiseParallel()})  # fmt: skip
                parallelize_module(layer, tp_mesh, plan_)
    if dp_mesh is not None and a.dp_mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for ch in chunks:
            for layer in ch.layers.values():
                fully_shard(layer, mesh=dp_mesh)
            fully_shard(ch, mesh=dp_mesh)
    elif dp_mesh is not None:
        from torch.nn.parallel import DistributedDataParallel

        chunks = [
            DistributedDataParallel(
                ch, process_group=dp_mesh.get_group(), static_graph=True, broadcast_buffers=False
            )
            for ch in chunks
        ]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))

    sched_cls_name, _, _ = SCHEDULES[a.schedule]
    schedule = None
    if a.pp > 1:
        from torch.distributed import pipelining

        stages = [
            pipelining.PipelineStage(ch, k, len(pl["virtual"]), torch.device("cpu"), group=pp_group)
            for ch, k in zip(chunks, mine)
        ]
        cls = getattr(pipelining, sched_cls_name)
        if pl["v"] == 1:
            schedule = cls(stages[0], n_microbatches=a.microbatches, loss_fn=loss_fn)
        else:
            schedule = cls(stages, n_microbatches=a.microbatches, loss_fn=loss_fn)
    params = [p for ch in chunks for p in ch.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    g = torch.Generator().manual_seed(1 + coord["dp"])
    batch = a.microbatches * MB_SIZE
    trace_dir = Path(tmp) / "traces"
    from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler
    from torch.profiler import schedule as psched

    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=psched(wait=1, warmup=1, active=a.steps - 2),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir), use_gzip=True),  # (names: host_pid, no rank)
        record_shapes=True,
    )
    timers: dict[str, list[float]] = {"step_ms": []}
    with prof:
        for _ in range(a.steps):
            t0 = time.perf_counter()
            x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
            y = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
            if a.stall_rank == rank:
                if a.stall_annotated:
                    with record_function("dataloader"):
                        time.sleep(0.04)
                else:
                    time.sleep(0.04)
            opt.zero_grad()
            if schedule is None:
                out = chunks[0](x)
                loss_fn(out, y).backward()
            else:
                has_first = 0 in mine
                has_last = (len(pl["virtual"]) - 1) in mine
                kwargs = {"target": y} if has_last else {}
                if has_first:
                    schedule.step(x, **kwargs)
                else:
                    schedule.step(**kwargs)
            opt.step()
            timers["step_ms"].append((time.perf_counter() - t0) * 1e3)
            prof.step()
    (Path(tmp) / f"timers{rank}.json").write_text(json.dumps(timers))
    dist.barrier()
    dist.destroy_process_group()


def manifest(a: argparse.Namespace, pl: dict, out: Path) -> dict:
    world = a.pp * a.dp * a.tp
    coords = {}
    for r in range(world):
        rem, c = r, {}
        for axis, size in (("tp", a.tp), ("dp", a.dp), ("pp", a.pp)):
            c[axis] = rem % size
            rem //= size
        coords[str(r)] = c
    stages = {}
    for s in range(a.pp):
        layers = [i for k, info in pl["virtual"].items() if info["pp_rank"] == s for i in info["layers"]]
        counts: dict[str, int] = {}
        for i in layers:
            t = "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
            counts[t] = counts.get(t, 0) + 1
        stages[str(s)] = {"layers": counts, "ranks": [r for r in range(world) if coords[str(r)]["pp"] == s]}
    unequal = len({json.dumps(sorted(v["layers"].items())) for v in stages.values()}) > 1
    faults, stragglers = [], []
    if a.slow_rank is not None:
        faults.append({"kind": "compute_straggler", "rank": a.slow_rank})
        stragglers.append({"rank": a.slow_rank, "cause": "compute"})
    if a.stall_rank is not None:
        faults.append({"kind": "host_stall", "rank": a.stall_rank, "annotated": a.stall_annotated})
        stragglers.append({"rank": a.stall_rank, "cause": "host"})
    if a.heavy_stage is not None:
        faults.append({"kind": "heavy_stage", "stage": a.heavy_stage})
    fam = "pipelining" if a.pp > 1 else "tensor_parallel" if a.tp > 1 else "data_parallel"
    man = {
        "name": out.name,
        "family": fam,
        "torch": __import__("torch").__version__,
        "world_size": world,
        "layout": {"tp": a.tp, "pp": a.pp, "dp": a.dp, "cp": 1, "order": "tp-cp-dp-pp"},
        "rank_coords": coords,
        "naming": {"groups": a.groups, "dim_names": a.dim_names, "annotations": a.annotations},
        "stages": stages,
        "faults": faults,
        "expect": {
            "stragglers": stragglers,
            "heavy_stage": a.heavy_stage,
            "unequal_composition": unequal,
            "hang_culprit": None,
            "clean": not faults,
            "kv_head_replication": False,
        },
        "recorded_with": {"script": "scripts/record_torch_parallel.py", "argv": sys.argv[1:]},
    }
    if a.pp > 1:
        man["schedule"] = {"name": SCHEDULES[a.schedule][0], "p": a.pp, "v": pl["v"], "m": a.microbatches}
    return man


def main() -> int:
    a = parse()
    import socket

    import torch.multiprocessing as mp

    if a.out.exists():
        print(f"{a.out} exists", file=sys.stderr)
        return 2
    pl = plan(a)
    world = a.pp * a.dp * a.tp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="tl_record_")
    try:
        mp.spawn(worker, args=(a, pl, tmp, port), nprocs=world, join=True)
        man = manifest(a, pl, a.out)
        man["timers"] = {
            str(r): json.loads((Path(tmp) / f"timers{r}.json").read_text()) for r in range(world)
        }
        a.out.mkdir(parents=True)
        shutil.copytree(Path(tmp) / "traces", a.out / "traces")
        (a.out / "manifest.json").write_text(json.dumps(man, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
