#!/usr/bin/env python3
"""Record real 8-rank CPU (gloo) runs of the layouts and schedules that layout inference must read from
structure, not names: Megatron-style TP x PP x DP, Ulysses context parallelism, interleaved 1F1B.

Layouts (`--layout`; Megatron order tp-cp-dp-pp, rank = t + TP*(c + CP*(d + DP*s))):
  tppdp        tp=2 x pp=2 x dp=2, 1F1B with m=4; Megatron f/g all-reduces on the TP group around every
               column/row-parallel pair (2 forward + 2 backward per layer and microbatch); groups named with
               several axes: `tp_stage{s}_dp{d}`, `dp_stage{s}_tp{t}`, `pp_dp{d}_tp{t}`.
               `--slow-rank R` gives rank R +40% `aten::mm` (extra matmuls in every layer forward).
  ulysses      cp=2 x dp=4, no pipeline; `all_to_all_single` on the CP group before and after each
               full-attention layer's attention (sequence <-> head partition, and again in backward); the
               linear-attention layers scan their local sequence chunk; groups `cp_dp{d}`, `dp_cp{c}`.
  interleaved  pp=4 x dp=2, Megatron's interleaved 1F1B with v=2 model chunks per rank and m=8; chunk c of
               stage s is virtual stage c*p+s, so the last stage sends chunk-0 activations to stage 0 (a
               ring); warm-up forwards per stage (p-s-1)*2 + (v-1)*p = 10/8/6/4; groups `pp_dp{d}`, `dp_stage{s}`.

Every run: profiler on CPU with record_shapes, layer spans `layer.N.<type>` (record_cpu_run's
`layer_type` convention), DDP-style gradient buckets on the data-parallel group, Flight Recorder dumps,
and truth.json (layout, groups, schedule, faults, collective counts and sizes).

    python scripts/record_cpu_layouts.py --layout tppdp --slow-rank 5 -o /tmp/run
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_cpu_run as base  # noqa: E402

LAYOUTS = {
    "tppdp": {"tp": 2, "cp": 1, "dp": 2, "pp": 2, "v": 1, "m": 4, "layers_per_chunk": 4},
    "ulysses": {"tp": 1, "cp": 2, "dp": 4, "pp": 1, "v": 1, "m": 2, "layers_per_chunk": 8},
    "interleaved": {"tp": 1, "cp": 1, "dp": 2, "pp": 4, "v": 2, "m": 8, "layers_per_chunk": 1},
}
HEADS = 4


class Opts:
    def __init__(self, args: argparse.Namespace):
        L = LAYOUTS[args.layout]
        self.layout = args.layout
        self.tp, self.cp, self.dp, self.pp, self.v, self.m = (
            L[k] for k in ("tp", "cp", "dp", "pp", "v", "m")
        )
        self.L = L["layers_per_chunk"]
        self.world = self.tp * self.cp * self.dp * self.pp
        self.hidden, self.seq = args.hidden, args.seq
        self.slow_rank = args.slow_rank
        self.slow_factor = args.slow_factor
        self.timeout_s = args.timeout_s
        self.buckets = 2
        self.bare = args.bare  # no layer / forward / backward annotations (as Megatron runs without them)

    def span(self, torch, name: str):
        import contextlib

        return contextlib.nullcontext() if self.bare else torch.profiler.record_function(name)

    def coords(self, r: int) -> tuple[int, int, int, int]:
        """(t, c, d, s) of rank r (order tp-cp-dp-pp)."""
        t = r % self.tp
        c = (r // self.tp) % self.cp
        d = (r // (self.tp * self.cp)) % self.dp
        s = r // (self.tp * self.cp * self.dp)
        return t, c, d, s

    def rank(self, t: int, c: int, d: int, s: int) -> int:
        return t + self.tp * (c + self.cp * (d + self.dp * s))

    def kind(self, i: int) -> str:
        """Layer type of layer i: interleaved runs put linear attention in chunk 0 and full attention in the
        last chunk (equal stages); the others repeat (3 linear + 1 full) as in Qwen3.5."""
        if self.v > 1:
            return "full_attention" if i >= self.L * self.pp * (self.v - 1) else "linear_attention"
        return base._layer_kind(i)

    def warmup(self, s: int) -> int:
        """Forward passes before the steady state (Megatron's num_warmup_microbatches)."""
        total = self.v * self.m
        if self.v == 1:
            return min(self.pp - s - 1, total)
        return min((self.pp - s - 1) * 2 + (self.v - 1) * self.pp, total)

    def groups(self) -> list[tuple[str, list[int]]]:
        """(name, ranks) of every group, in creation order (the same on every rank)."""
        out: list[tuple[str, list[int]]] = []
        T, C, D, P = self.tp, self.cp, self.dp, self.pp
        if self.layout == "tppdp":
            out += [
                (f"tp_stage{s}_dp{d}", [self.rank(t, 0, d, s) for t in range(T)])
                for s in range(P)
                for d in range(D)
            ]
            out += [
                (f"dp_stage{s}_tp{t}", [self.rank(t, 0, d, s) for d in range(D)])
                for s in range(P)
                for t in range(T)
            ]
            out += [
                (f"pp_dp{d}_tp{t}", [self.rank(t, 0, d, s) for s in range(P)])
                for d in range(D)
                for t in range(T)
            ]
        elif self.layout == "ulysses":
            out += [(f"cp_dp{d}", [self.rank(0, c, d, 0) for c in range(C)]) for d in range(D)]
            out += [(f"dp_cp{c}", [self.rank(0, c, d, 0) for d in range(D)]) for c in range(C)]
        else:
            out += [(f"dp_stage{s}", [self.rank(0, 0, d, s) for d in range(D)]) for s in range(P)]
            out += [(f"pp_dp{d}", [self.rank(0, 0, d, s) for s in range(P)]) for d in range(D)]
        return out


def _issued(counts: dict, op: str, t) -> None:
    """Count one collective call of `op` moving tensor `t` (truth: bytes issued per op and size)."""
    per = counts.setdefault("issued_bytes", {}).setdefault(op, {})
    b = str(t.numel() * t.element_size())
    per[b] = per.get(b, 0) + 1


def _model(torch, dist, o: Opts, layer_ids: list[int], tp_group, cp_group, slow_mms: int, counts: dict):
    """Layers `layer_ids` of the model: Megatron TP (column/row parallel with f/g all-reduces) when tp > 1,
    Ulysses all-to-alls around full attention when cp > 1."""
    nn = torch.nn
    H, T, C = o.hidden, o.tp, o.cp
    Hl = H // T  # this TP rank's share of the hidden features (and heads)

    class _F(torch.autograd.Function):  # Megatron's f: identity forward, all-reduce of the gradient
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous().clone()
            dist.all_reduce(g, group=tp_group)
            counts["tp_allreduce"] += 1
            _issued(counts, "allreduce", g)
            return g

    class _G(torch.autograd.Function):  # Megatron's g: all-reduce of the partial sums, identity backward
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous().clone()
            dist.all_reduce(x, group=tp_group)
            counts["tp_allreduce"] += 1
            _issued(counts, "allreduce", x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    def a2a(x, seq_to_head: bool):
        """Ulysses all-to-all: (b, s/C, h, d) -> (b, s, h/C, d) or back."""
        if seq_to_head:
            b, sl, h, d = x.shape
            inp = x.reshape(b, sl, C, h // C, d).permute(2, 0, 1, 3, 4).contiguous()
        else:
            b, s, hl, d = x.shape
            inp = x.reshape(b, C, s // C, hl, d).permute(1, 0, 2, 3, 4).contiguous()
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp, group=cp_group)
        counts["cp_all_to_all"] += 1
        counts["cp_all_to_all_bytes"] = inp.numel() * inp.element_size()
        _issued(counts, "alltoall", inp)
        if seq_to_head:
            return out.permute(1, 0, 2, 3, 4).reshape(b, C * sl, h // C, d)
        return out.permute(1, 2, 0, 3, 4).reshape(b, s // C, hl * C, d)

    class _A2A(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, seq_to_head: bool):
            ctx.dir = seq_to_head
            return a2a(x, seq_to_head)

        @staticmethod
        def backward(ctx, g):
            return a2a(g.contiguous(), not ctx.dir), None

    class Layer(nn.Module):
        def __init__(self, idx: int):
            super().__init__()
            self.idx, self.kind = idx, o.kind(idx)
            self.mix = nn.Linear(H, 4 * Hl, bias=False)  # column parallel (q, k, v, gate)
            self.mix_out = nn.Linear(Hl, H, bias=False)  # row parallel
            self.up = nn.Linear(H, 4 * Hl, bias=False)  # column parallel
            self.down = nn.Linear(4 * Hl, H, bias=False)  # row parallel
            self.norm1, self.norm2 = nn.RMSNorm(H), nn.RMSNorm(H)
            self.extra_ns = 0

        def forward(self, x):
            with o.span(torch, f"layer.{self.idx}.{self.kind}"):
                h = self.norm1(x)
                if T > 1:
                    h = _F.apply(h)
                q, k, v, g = self.mix(h).chunk(4, dim=-1)
                if self.kind == "linear_attention":
                    y = q.sigmoid() * torch.cumsum(k.sigmoid() * v, dim=1) * torch.sigmoid(g)
                else:
                    b, s, _ = x.shape
                    nh = HEADS // T
                    q, k, v = (t.reshape(b, s, nh, Hl // nh) for t in (q, k, v))
                    if C > 1:
                        q, k, v = (_A2A.apply(t, True) for t in (q, k, v))
                    att = torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                    ).transpose(1, 2)
                    if C > 1:
                        att = _A2A.apply(att.contiguous(), False)
                    y = att.reshape(b, s, Hl) * torch.sigmoid(g)
                o_ = self.mix_out(y)
                x = x + (_G.apply(o_) if T > 1 else o_)
                h = self.norm2(x)
                if T > 1:
                    h = _F.apply(h)
                d_ = self.down(torch.nn.functional.silu(self.up(h)))
                x = x + (_G.apply(d_) if T > 1 else d_)
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

    class Chunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer(i) for i in layer_ids)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

        @property
        def extra_ns(self) -> int:
            return sum(layer.extra_ns for layer in self.layers)

    return Chunk()


def _order(o: Opts, s: int) -> list[tuple[str, int, int]]:
    """This stage's sequence of ('F'|'B', chunk, microbatch): 1F1B, or Megatron's interleaved 1F1B."""
    v, m, p = o.v, o.m, o.pp
    total = v * m

    def fwd(k: int) -> tuple[int, int]:
        if v == 1:
            return 0, k
        return (k // p) % v, (k // (p * v)) * p + k % p

    def bwd(k: int) -> tuple[int, int]:
        c, mb = fwd(k)
        return v - 1 - c, mb

    if p == 1:
        seq = []
        for k in range(m):
            seq += [("F", 0, k), ("B", 0, k)]
        return seq
    warm = o.warmup(s)
    seq = [("F", *fwd(k)) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        seq.append(("F", *fwd(f)))
        f += 1
        seq.append(("B", *bwd(b)))
        b += 1
    while b < total:
        seq.append(("B", *bwd(b)))
        b += 1
    return seq


def _worker(rank: int, args: argparse.Namespace, init_method: str, stage_dir: str) -> None:
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "4000")
    import torch
    import torch.distributed as dist

    o = Opts(args)
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)
    timeout = datetime.timedelta(seconds=o.timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=o.world, timeout=timeout)
    t, c, d, s = o.coords(rank)
    mine: dict[str, object] = {}
    for name, ranks in o.groups():
        g = dist.new_group(ranks, group_desc=name)
        if rank in ranks:
            mine[name.split("_")[0]] = g
    tp_group, cp_group = mine.get("tp"), mine.get("cp")
    dp_group, pp_group = mine["dp"], mine.get("pp")
    counts = {"tp_allreduce": 0, "cp_all_to_all": 0, "cp_all_to_all_bytes": 0}
    H = o.hidden
    slow_mms = 0
    if rank == o.slow_rank:
        # a layer runs 12 aten::mm per microbatch (4 linears: 4 forward + 8 backward); +slow_factor of that
        # count as extra (B*S x H) @ (H x 4H/tp) matmuls in the forward: +40% -> 5 (272 vs 192 mm per step)
        slow_mms = max(1, round(o.slow_factor * 12))
    chunks = [
        _model(
            torch,
            dist,
            o,
            [(ch * o.pp + s) * o.L + i for i in range(o.L)],
            tp_group,
            cp_group,
            slow_mms,
            counts,
        )
        for ch in range(o.v)
    ]
    params = [p for ch in chunks for p in ch.parameters()]
    with torch.no_grad():  # dp replicas agree on the initial weights
        for ch in chunks:
            flat = torch.nn.utils.parameters_to_vector(ch.parameters())
            dist.broadcast(flat, src=dist.get_process_group_ranks(dp_group)[0], group=dp_group)
            torch.nn.utils.vector_to_parameters(flat, ch.parameters())
    buckets = [base._Buckets(torch, dist, list(ch.parameters()), dp_group, o.buckets, 0.0) for ch in chunks]
    opt = torch.optim.SGD(params, lr=1e-3)
    shape = (1, o.seq // o.cp, H)
    p2p = base._P2P(dist, pp_group, shape, None, timeout) if pp_group is not None else None
    prev = o.rank(t, c, d, (s - 1) % o.pp)
    nxt = o.rank(t, c, d, (s + 1) % o.pp)
    last_vs = o.v * o.pp - 1
    order = _order(o, s)
    acts: dict = {}

    def forward(step: int, ch: int, mb: int) -> None:
        vs = ch * o.pp + s
        with o.span(torch, f"forward_chunk{ch}_mb{mb}"):
            if vs == 0:
                g = torch.Generator().manual_seed(step * 1000 + mb * 10 + d * 100 + c)
                x = torch.randn(shape, generator=g)
            else:
                x = p2p.recv(torch, prev).requires_grad_(True)
            y = chunks[ch](x)
            if vs < last_vs:
                p2p.send(y.detach(), nxt, step, mb, "activation")
            acts[(ch, mb)] = (x, y)

    def backward(step: int, ch: int, mb: int) -> None:
        vs = ch * o.pp + s
        with o.span(torch, f"backward_chunk{ch}_mb{mb}"):
            x, y = acts.pop((ch, mb))
            if mb == o.m - 1:
                buckets[ch].arm()
            if vs == last_vs:
                ((y.float() ** 2).mean() / o.m).backward()
            else:
                y.backward(p2p.recv(torch, nxt))
            if vs > 0:
                p2p.send(x.grad, prev, step, mb, "gradient")

    dist.barrier()
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    W, WU, A = base.PROFILE_WAIT, base.PROFILE_WARMUP, base.PROFILE_ACTIVE
    step_wall, step_extra = [], []
    steps_run = W + WU + A
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=W, warmup=WU, active=A, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(Path(stage_dir) / "traces"), use_gzip=True),
        record_shapes=True,
    ) as prof:
        for step in range(W + WU + A):
            t0, e0 = time.perf_counter_ns(), sum(ch.extra_ns for ch in chunks)
            opt.zero_grad(set_to_none=False)
            for kind, ch, mb in order:
                (forward if kind == "F" else backward)(step, ch, mb)
            for b in buckets:
                b.finish(o.dp, timeout)
            if p2p is not None:
                p2p.drain()
            with torch.profiler.record_function("optimizer_step"):
                opt.step()
            step_wall.append(time.perf_counter_ns() - t0)
            step_extra.append(sum(ch.extra_ns for ch in chunks) - e0)
            prof.step()

    base._dump_fr(torch, Path(stage_dir) / "flight_recorder", rank)
    result = {
        "rank": rank,
        "coords": {"tp": t, "cp": c, "dp": d, "pp": s},
        "pid": os.getpid(),
        "step_wall_ns": step_wall,
        "extra_compute_ns": step_extra,
        "extra_mm_per_layer_forward": slow_mms,
        "layers": [[layer.idx for layer in ch.layers] for ch in chunks],
        "issued": {
            **(p2p.counts if p2p is not None else {}),
            "dp_allreduce": sum(b.allreduces for b in buckets),
            "tp_allreduce": counts["tp_allreduce"],
            "cp_all_to_all": counts["cp_all_to_all"],
        },
        "cp_all_to_all_bytes": counts["cp_all_to_all_bytes"],
        "issued_bytes": _issued_bytes(counts, buckets, p2p, shape, steps_run),
        "order": [f"{k}{ch}.{mb}" for k, ch, mb in order],
    }
    (Path(stage_dir) / f"rank{rank}.result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _issued_bytes(counts: dict, buckets: list, p2p, shape: tuple, steps_run: int) -> dict:
    """{op: {bytes per call: calls per step}} of every collective and P2P call this rank issued in a step
    (steps repeat the same calls): TP all-reduces and CP all-to-alls as counted, one all-reduce per DP
    gradient bucket (its parameters' bytes), P2P sends and receives of the float32 activation shape."""
    tot: dict = {op: dict(v) for op, v in counts.get("issued_bytes", {}).items()}
    ar = tot.setdefault("allreduce", {})
    for b in buckets:
        for ps in b.buckets:
            k = str(sum(q.numel() * q.element_size() for q in ps))
            ar[k] = ar.get(k, 0) + steps_run  # each bucket is reduced once per step
    if p2p is not None:
        k = str(4 * math.prod(shape))
        for op, n in (("send", p2p.counts["isend"]), ("recv", p2p.counts["irecv"])):
            if n:
                tot[op] = {k: n}
    out = {}
    for op, per in tot.items():
        if per:
            out[op] = {k: v / steps_run for k, v in sorted(per.items(), key=lambda kv: int(kv[0]))}
    return out


def record(args: argparse.Namespace) -> int:
    import torch
    import torch.multiprocessing as mp

    o = Opts(args)
    stage_dir = tempfile.mkdtemp(prefix="tracelens-layout-")
    init_method = f"tcp://127.0.0.1:{base._free_port()}"
    mp.spawn(_worker, args=(args, init_method, stage_dir), nprocs=o.world, join=True)
    results = [json.loads((Path(stage_dir) / f"rank{r}.result.json").read_text()) for r in range(o.world)]
    W, WU, A = base.PROFILE_WAIT, base.PROFILE_WARMUP, base.PROFILE_ACTIVE
    active = list(range(W + WU, W + WU + A))
    p, v, m = o.pp, o.v, o.m
    faults: dict = {}
    if o.slow_rank is not None:
        r = results[o.slow_rank]
        n_layers = sum(len(x) for x in r["layers"])
        faults["compute"] = {
            "rank": o.slow_rank,
            "cause": "compute",
            "slow_factor": o.slow_factor,
            "extra_mm_per_layer_forward": r["extra_mm_per_layer_forward"],
            "extra_mm_per_step": r["extra_mm_per_layer_forward"] * n_layers * m,
            "extra_compute_ms_per_step": {str(st): r["extra_compute_ns"][st] / 1e6 for st in active},
            "tp_peers": [
                q for q in range(o.world) if o.coords(q)[1:] == o.coords(o.slow_rank)[1:] and q != o.slow_rank
            ],
        }
    truth = {
        "kind": "real",
        "recorded_with": {
            "script": "scripts/record_cpu_layouts.py",
            "argv": sys.argv[1:],
            "torch": torch.__version__,
            "python": platform.python_version(),
            "backend": "gloo",
            "threads_per_rank": 1,
            "cpu_cores": os.cpu_count(),
            "note": "real run; ranks share the host's cores, so timings carry OS scheduling noise",
        },
        "world_size": o.world,
        "layout": {"tp": o.tp, "pp": p, "dp": o.dp, "cp": o.cp, "order": "tp-cp-dp-pp"},
        "process_groups": {n: rs for n, rs in o.groups()},
        "coords": {str(r["rank"]): r["coords"] for r in results},
        "schedule": {
            "kind": "interleaved" if v > 1 else ("1f1b" if p > 1 else None),
            "pp": p,
            "virtual_stages": v,
            "microbatches": m,
            "warmup_forwards": {str(s): o.warmup(s) for s in range(p)} if p > 1 else {},
            "expected_bubble_fraction": (p - 1) / (v * m + p - 1) if p > 1 else None,
            "expected_bubble_of_ideal": (p - 1) / (v * m) if p > 1 else None,
        },
        "layers": {
            "per_rank": {str(r["rank"]): r["layers"] for r in results},
            "kinds": {str(i): o.kind(i) for i in range(o.L * o.v * p)},
        },
        "all_to_all": {
            "group_axis": "cp",
            "layer_type": "full_attention",
            "calls_per_step": results[0]["issued"]["cp_all_to_all"] // (W + WU + A),
            "bytes_per_call": results[0]["cp_all_to_all_bytes"],
        }
        if o.cp > 1
        else None,
        "annotated": not o.bare,
        "profiled_steps": active,
        "faults": faults,
        "ranks": [
            {
                "rank": r["rank"],
                "coords": r["coords"],
                "pid": r["pid"],
                "step_wall_ms": {str(st): r["step_wall_ns"][st] / 1e6 for st in active},
                "issued": r["issued"],
                "bytes_per_step": r["issued_bytes"],
                "order": r["order"],
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
    ap.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    ap.add_argument("--slow-rank", type=int, default=None, help="rank given +--slow-factor matmul work")
    ap.add_argument("--slow-factor", type=float, default=0.4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--bare", action="store_true", help="no layer / forward / backward annotations")
    args = ap.parse_args(argv)
    return record(args)


if __name__ == "__main__":
    raise SystemExit(main())
