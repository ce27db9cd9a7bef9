#!/usr/bin/env python3
"""Record real CUDA traces of one Qwen3.5-27B hybrid block and measure the kernel costs the simulator uses.

Why: the simulator's kernel costs (tracelens/simulate/costs.py) were first set from published H100 numbers.
This script runs, on one NVIDIA GPU, one hybrid block of the real model (3 Gated DeltaNet layers + 1 gated
full-attention layer, each followed by a SwiGLU MLP) with the shapes one tensor-parallel rank of a TP=4
layout holds, at 4,096 and 32,768 tokens, forward and backward, and writes:

  traces/seq<S>/<host>_<pid>.<ns>.pt.trace.json.gz  the PyTorch profiler (Kineto) trace, as
                                                    tensorboard_trace_handler writes it (2 steps at 4,096,
                                                    1 at 32,768 to keep the file small)
  calibration.json   CUDA-event timings of the block's kernels, isolated: every GEMM shape (forward,
                     data-gradient, weight-gradient), flash attention forward/backward, a memory-bound
                     elementwise kernel, the eager Gated DeltaNet core, plus the achieved TFLOP/s and
                     bandwidth and the efficiencies they imply (what costs.py calls EFF_*)
  truth.json         what the traces must show: steps, layer annotations, all-reduces per step and
                     their sizes, per-step wall time measured with CUDA events

The TP all-reduces are real NCCL calls on a 1-rank process group (one GPU; NCCL copies locally), so the
traces carry `record_param_comms` and `distributedInfo` as a real NCCL run writes them; their durations
are not those of a multi-GPU all-reduce.

The Gated DeltaNet core is the chunked gated delta rule (chunk 64, WY form with a triangular solve, then
a sequential scan over chunks) in eager PyTorch, not flash-linear-attention's fused Triton kernels: its
time is reported for reference and is NOT used to calibrate EFF_GDN (docs/calibration.md).

Run on a machine with CUDA (any recent PyTorch):
    python scripts/record_cuda_block.py -o OUT_DIR
Dry run on CPU with tiny shapes (checks the code path, no calibration):
    python scripts/record_cuda_block.py -o OUT_DIR --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import sys
import time
from pathlib import Path

# Qwen3.5-27B text backbone (docs/simulator.md), one TP=4 shard of each layer
HIDDEN = 5120
Q_HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256
FFN = 17408
GDN_V_HEADS, GDN_QK_HEADS, GDN_HEAD_DIM = 48, 16, 128
CONV_K = 4
CHUNK = 64
LAYER_TYPES = ("linear_attn", "linear_attn", "linear_attn", "self_attn")
FIRST_LAYER = 12  # the block recorded is layers 12-15 (the 4th block), as in a real 64-layer model

TINY = {
    "HIDDEN": 64,
    "Q_HEADS": 4,
    "KV_HEADS": 4,
    "HEAD_DIM": 16,
    "FFN": 128,
    "GDN_V_HEADS": 12,
    "GDN_QK_HEADS": 4,
    "GDN_HEAD_DIM": 16,
    "TP": 4,
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dims:
    """Per-rank shapes of one TP shard."""

    def __init__(self, tp: int, tiny: bool):
        g = dict(
            HIDDEN=HIDDEN,
            Q_HEADS=Q_HEADS,
            KV_HEADS=KV_HEADS,
            HEAD_DIM=HEAD_DIM,
            FFN=FFN,
            GDN_V_HEADS=GDN_V_HEADS,
            GDN_QK_HEADS=GDN_QK_HEADS,
            GDN_HEAD_DIM=GDN_HEAD_DIM,
            TP=tp,
        )
        if tiny:
            g.update(TINY)
        tp = g["TP"]
        self.tp = tp
        self.hidden = g["HIDDEN"]
        self.q_heads = g["Q_HEADS"] // tp
        self.kv_heads = max(1, g["KV_HEADS"] // tp)  # replicated when TP > KV heads
        self.head_dim = g["HEAD_DIM"]
        self.ffn = g["FFN"] // tp
        self.v_heads = g["GDN_V_HEADS"] // tp
        self.qk_heads = g["GDN_QK_HEADS"] // tp
        self.gdn_dim = g["GDN_HEAD_DIM"]


def build(torch, dims: Dims, group):
    """The block as nn.Modules; every layer part runs under record_function("layers.<i>.<part>")."""
    nn = torch.nn
    F = torch.nn.functional
    dist = torch.distributed
    record_function = torch.profiler.record_function

    class _ReduceFromTP(torch.autograd.Function):  # Megatron's row-parallel output: all-reduce forward
        @staticmethod
        def forward(ctx, x):
            if group is not None:
                dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class _CopyToTP(torch.autograd.Function):  # Megatron's column-parallel input: all-reduce backward
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            if group is not None:
                dist.all_reduce(g, group=group)
            return g

    def lin(i, o):
        return nn.Linear(i, o, bias=False)

    class GatedDeltaNet(nn.Module):
        def __init__(self, name):
            super().__init__()
            d = dims
            self.name = name
            self.norm = nn.RMSNorm(d.hidden)
            self.kdim, self.vdim = d.qk_heads * d.gdn_dim, d.v_heads * d.gdn_dim
            self.in_proj = lin(d.hidden, 2 * self.kdim + 2 * self.vdim + 2 * d.v_heads)  # q k v z b a
            self.conv = nn.Conv1d(
                2 * self.kdim + self.vdim,
                2 * self.kdim + self.vdim,
                CONV_K,
                groups=2 * self.kdim + self.vdim,
                padding=CONV_K - 1,
                bias=False,
            )
            self.a_log = nn.Parameter(torch.zeros(d.v_heads))
            self.out_norm = nn.RMSNorm(d.gdn_dim)
            self.out_proj = lin(self.vdim, d.hidden)

        def forward(self, x):
            d = dims
            with record_function(self.name):
                t = x.shape[1]
                h = _CopyToTP.apply(self.norm(x))
                qkv, z, b, a = self.in_proj(h).split(
                    [2 * self.kdim + self.vdim, self.vdim, d.v_heads, d.v_heads], dim=-1
                )
                qkv = F.silu(self.conv(qkv.transpose(1, 2))[..., :t]).transpose(1, 2)
                q, k, v = qkv.split([self.kdim, self.kdim, self.vdim], dim=-1)
                rep = d.v_heads // d.qk_heads
                q = F.normalize(q.unflatten(-1, (d.qk_heads, d.gdn_dim)), dim=-1).repeat_interleave(rep, 2)
                k = F.normalize(k.unflatten(-1, (d.qk_heads, d.gdn_dim)), dim=-1).repeat_interleave(rep, 2)
                v = v.unflatten(-1, (d.v_heads, d.gdn_dim))
                beta = b.sigmoid()
                g = -self.a_log.float().exp() * F.softplus(a.float())  # log-decay per token and head
                o = chunk_gated_delta_rule(q, k, v, g, beta)
                o = self.out_norm(o) * F.silu(z.unflatten(-1, (d.v_heads, d.gdn_dim)))
                return x + _ReduceFromTP.apply(self.out_proj(o.flatten(-2)))

    def chunk_gated_delta_rule(q, k, v, g, beta):
        """Chunked gated delta rule (Yang et al. 2024), [B, T, H, D] inputs, fp32 inside, organised as
        flash-linear-attention's kernels are: per chunk, a triangular solve gives the WY factors (w, u);
        a sequential scan over chunks computes each chunk's starting state (fla's `..._fwd_kernel_h`);
        the outputs of all chunks then follow in parallel (fla's `chunk_fwd_kernel_o`)."""
        with record_function("chunk_gated_delta_rule"):
            dt = q.dtype
            b_, t_, h_, dk = k.shape
            dv = v.shape[-1]
            n = t_ // CHUNK
            # [B*H, N, C, D] in fp32
            q, k, v = (x.transpose(1, 2).float().reshape(b_ * h_, n, CHUNK, -1) for x in (q, k, v))
            beta = beta.transpose(1, 2).float().reshape(b_ * h_, n, CHUNK, 1)
            g = g.transpose(1, 2).float().reshape(b_ * h_, n, CHUNK).cumsum(-1)
            q = q * dk**-0.5
            kb, vb = k * beta, v * beta
            lower = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), -1)
            causal = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device))
            gdiff = g[..., :, None] - g[..., None, :]
            eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
            big_l = (kb @ k.transpose(-1, -2)) * gdiff.masked_fill(~lower, -math.inf).exp()
            tmat = torch.linalg.solve_triangular(
                eye + big_l, eye.expand_as(big_l), upper=False, unitriangular=True
            )
            w = tmat @ (kb * g.exp()[..., None])
            u = tmat @ vb
            kd = (k * (g[..., -1:] - g).exp()[..., None]).transpose(-1, -2)  # [BH, N, dk, C]
            dlast = g[..., -1].exp()[..., None, None]  # [BH, N, 1, 1]
            s = q.new_zeros(b_ * h_, dk, dv)
            states, vnews = [], []
            for i in range(n):  # the only sequential part
                states.append(s)
                vn = torch.baddbmm(u[:, i], w[:, i], s, alpha=-1.0)
                vnews.append(vn)
                s = torch.baddbmm(s * dlast[:, i], kd[:, i], vn)
            hs, vns = torch.stack(states, 1), torch.stack(vnews, 1)
            attn = (q @ k.transpose(-1, -2)) * gdiff.masked_fill(~causal, -math.inf).exp()
            o = (q * g.exp()[..., None]) @ hs + attn @ vns
            return o.reshape(b_, h_, t_, dv).transpose(1, 2).to(dt)

    class GatedAttention(nn.Module):
        def __init__(self, name):
            super().__init__()
            d = dims
            self.name = name
            self.norm = nn.RMSNorm(d.hidden)
            self.q_proj = lin(d.hidden, 2 * d.q_heads * d.head_dim)  # query and output gate
            self.k_proj = lin(d.hidden, d.kv_heads * d.head_dim)
            self.v_proj = lin(d.hidden, d.kv_heads * d.head_dim)
            self.q_norm = nn.RMSNorm(d.head_dim)
            self.k_norm = nn.RMSNorm(d.head_dim)
            self.o_proj = lin(d.q_heads * d.head_dim, d.hidden)

        def forward(self, x):
            d = dims
            with record_function(self.name):
                bsz, t, _ = x.shape
                h = _CopyToTP.apply(self.norm(x))
                q, gate = self.q_proj(h).view(bsz, t, d.q_heads, 2 * d.head_dim).chunk(2, dim=-1)
                q = self.q_norm(q).transpose(1, 2)
                k = self.k_norm(self.k_proj(h).view(bsz, t, d.kv_heads, d.head_dim)).transpose(1, 2)
                v = self.v_proj(h).view(bsz, t, d.kv_heads, d.head_dim).transpose(1, 2)
                o = sdpa(q, k, v)
                o = o.transpose(1, 2) * torch.sigmoid(gate)
                return x + _ReduceFromTP.apply(self.o_proj(o.flatten(-2)))

    def sdpa(q, k, v):
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # GQA: K/V heads shared by `rep` query heads (explicit, works with every backend)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    class Mlp(nn.Module):
        def __init__(self, name):
            super().__init__()
            d = dims
            self.name = name
            self.norm = nn.RMSNorm(d.hidden)
            self.gate_up = lin(d.hidden, 2 * d.ffn)
            self.down = lin(d.ffn, d.hidden)

        def forward(self, x):
            with record_function(self.name):
                a, b = self.gate_up(_CopyToTP.apply(self.norm(x))).chunk(2, dim=-1)
                return x + _ReduceFromTP.apply(self.down(F.silu(a) * b))

    layers = []
    for j, kind in enumerate(LAYER_TYPES):
        li = FIRST_LAYER + j
        mixer = (
            GatedDeltaNet(f"layers.{li}.linear_attn")
            if kind == "linear_attn"
            else GatedAttention(f"layers.{li}.self_attn")
        )
        layers += [mixer, Mlp(f"layers.{li}.mlp")]
    return nn.Sequential(*layers), sdpa, chunk_gated_delta_rule


def _annotate_backward(torch, model) -> None:
    """record_function("<name>.backward") from each part's backward pre-hook (gradient w.r.t. its output
    ready) to its backward hook (gradient w.r.t. its input computed), on the autograd thread."""
    for m in model:
        label = f"{m.name}.backward"

        def pre(mod, grad_output, label=label):
            rf = torch.profiler.record_function(label)
            rf.__enter__()
            mod._tl_backward_rf = rf

        def post(mod, grad_input, grad_output):
            rf = getattr(mod, "_tl_backward_rf", None)
            if rf is not None:
                rf.__exit__(None, None, None)
                mod._tl_backward_rf = None

        m.register_full_backward_pre_hook(pre)
        m.register_full_backward_hook(post)


def _timer(torch, device):
    """Median milliseconds of fn() over `reps` runs (CUDA events on GPU, perf_counter on CPU)."""

    def run(fn, *args, reps=10, warm=3):
        for _ in range(warm):
            fn(*args)
        times = []
        for _ in range(reps):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*args)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn(*args)
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return times[len(times) // 2]

    return run


def _attention(torch, t, s, heads, head_dim, device, dtype, peak) -> dict:
    """Forward and backward time of causal scaled_dot_product_attention with `heads` heads."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (
        torch.randn(1, heads, s, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    fwd_flops = 4.0 * s * s * head_dim * heads / 2  # causal: half of the full QK^T and PV products
    go = torch.randn(1, heads, s, head_dim, device=device, dtype=dtype)
    reps = 10 if s <= 32768 else 3
    ms_f = t(lambda q, k, v: sdpa(q, k, v, is_causal=True), q, k, v, reps=reps)
    ms_fb = t(
        lambda q, k, v, go: torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), go),
        q,
        k,
        v,
        go,
        reps=reps,
    )
    ms_b = max(ms_fb - ms_f, 1e-6)
    return {
        "seq": s,
        "heads": heads,
        "head_dim": head_dim,
        "fwd_flops": fwd_flops,
        "fwd_ms": ms_f,
        "bwd_ms": ms_b,
        "fwd_eff": fwd_flops / ms_f / 1e-3 / peak,
        "bwd_eff": 2.5 * fwd_flops / ms_b / 1e-3 / peak,  # backward = 2.5x forward FLOPs (FA convention)
    }


def calibrate(torch, dims: Dims, seqs, device, dtype, gdn, peak, hbm, attn_seqs=()) -> dict:
    """Isolated kernel timings of the block's operations at each sequence length."""
    t = _timer(torch, device)
    d = dims
    out: dict = {"gemm": [], "attention": [], "memory_bound": [], "gdn_core": []}
    shapes = {
        "gdn.in_proj": (d.hidden, 2 * d.qk_heads * d.gdn_dim + 2 * d.v_heads * d.gdn_dim + 2 * d.v_heads),
        "gdn.out_proj": (d.v_heads * d.gdn_dim, d.hidden),
        "attn.q_proj": (d.hidden, 2 * d.q_heads * d.head_dim),
        "attn.kv_proj": (d.hidden, d.kv_heads * d.head_dim),
        "attn.o_proj": (d.q_heads * d.head_dim, d.hidden),
        "mlp.gate_up": (d.hidden, 2 * d.ffn),
        "mlp.down": (d.ffn, d.hidden),
    }
    for s in seqs:
        for name, (k_in, n_out) in shapes.items():
            x = torch.randn(s, k_in, device=device, dtype=dtype)
            w = torch.randn(n_out, k_in, device=device, dtype=dtype)
            gy = torch.randn(s, n_out, device=device, dtype=dtype)
            flops = 2.0 * s * k_in * n_out
            for kind, fn in (
                ("fprop", lambda x, w, gy: x @ w.t()),
                ("dgrad", lambda x, w, gy: gy @ w),
                ("wgrad", lambda x, w, gy: gy.t() @ x),
            ):
                ms = t(fn, x, w, gy)
                out["gemm"].append(
                    {
                        "seq": s,
                        "name": name,
                        "pass": kind,
                        "m": s,
                        "k": k_in,
                        "n": n_out,
                        "flops": flops,
                        "ms": ms,
                        "tflops": flops / ms / 1e9,
                        "eff": flops / ms / 1e-3 / peak,
                    }
                )
            del x, w, gy
        # fused causal attention alone (K/V already expanded to every query head): this rank's heads,
        # and at 32,768 tokens and more also twice as many (a TP=2 rank, as the 262,144-token sample uses)
        for heads in (d.q_heads, 2 * d.q_heads) if s >= 32768 else (d.q_heads,):
            out["attention"].append(_attention(torch, t, s, heads, d.head_dim, device, dtype, peak))
        # memory-bound: an elementwise gate over the hidden state (read 2 tensors, write 1)
        a = torch.randn(s, d.hidden, device=device, dtype=dtype)
        b = torch.randn(s, d.hidden, device=device, dtype=dtype)
        nbytes = 3 * a.numel() * a.element_size()
        ms = t(lambda a, b: a * torch.sigmoid(b), a, b, reps=20)
        # two kernels (sigmoid, mul): 5 tensor passes in all
        ms_mul = t(torch.mul, a, b, reps=20)
        out["memory_bound"].append(
            {
                "seq": s,
                "op": "mul",
                "bytes": nbytes,
                "ms": ms_mul,
                "gbps": nbytes / ms_mul / 1e6,
                "eff": nbytes / ms_mul / 1e-3 / hbm,
                "gate_ms": ms,
            }
        )
        del a, b
        # the eager gated delta rule core (reference only)
        qg = torch.randn(1, s, d.v_heads, d.gdn_dim, device=device, dtype=dtype)
        kg = torch.nn.functional.normalize(torch.randn_like(qg), dim=-1)
        vg = torch.randn_like(qg)
        gg = -torch.rand(1, s, d.v_heads, device=device) * 0.1
        bb = torch.rand(1, s, d.v_heads, device=device, dtype=dtype)
        ms = t(gdn, qg, kg, vg, gg, bb, reps=3, warm=1)
        out["gdn_core"].append({"seq": s, "heads": d.v_heads, "head_dim": d.gdn_dim, "fwd_ms": ms})
        del qg, kg, vg, gg, bb
    for s in attn_seqs:  # long sequences: attention alone (a Ulysses CP rank holds every token)
        out["attention"].append(_attention(torch, t, s, d.q_heads, d.head_dim, device, dtype, peak))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU dry run)")
    ap.add_argument("--tp", type=int, default=4, help="TP degree whose per-rank shard is run (default 4)")
    ap.add_argument("--seqs", default="4096,32768")
    ap.add_argument("--steps", type=int, default=2, help="profiled steps up to 8,192 tokens (longer: 1)")
    ap.add_argument("--attn-seqs", default="262144", help="extra sequence lengths for the attention timing")
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument(
        "--annotate-backward",
        action="store_true",
        help="also wrap each part's backward in record_function('<name>.backward') (module backward hooks): "
        "ground truth for attributing backward kernels without annotations",
    )
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("error: CUDA is not available (use --device cpu --tiny for a dry run)", file=sys.stderr)
        return 2
    out = args.out
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    seqs = [int(s) for s in args.seqs.split(",")]
    dims = Dims(args.tp, args.tiny)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if device == "cuda" else "gloo"
    group = None
    try:
        dist.init_process_group(
            backend, rank=0, world_size=1, device_id=torch.device("cuda", 0) if device == "cuda" else None
        )
        group = dist.new_group([0], group_desc="tensor_model_parallel")
        probe = torch.ones(8, device=device)
        dist.all_reduce(probe, group=group)  # fail here, not inside the profiled steps
        sync_probe = probe.sum().item()
        if sync_probe != 8:
            raise RuntimeError(f"1-rank all_reduce gave {sync_probe}")
    except Exception as e:  # noqa: BLE001 (the run is still useful without collectives)
        print(f"warning: no process group ({e!r}); recording without all-reduces", file=sys.stderr)

    model, sdpa, gdn = build(torch, dims, group)
    model = model.to(device=device, dtype=dtype)
    if args.annotate_backward:
        _annotate_backward(torch, model)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    for m in model.modules():
        if hasattr(m, "a_log"):
            torch.nn.init.uniform_(m.a_log, -1.0, 0.5)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    truth: dict = {
        "what": "one Qwen3.5-27B hybrid block (layers 12-15), one TP rank's shard",
        "tp_shard_of": dims.tp,
        "dims": vars(dims),
        "layer_types": list(LAYER_TYPES),
        "first_layer": FIRST_LAYER,
        "microbatch": 1,
        "dtype": str(dtype).replace("torch.", ""),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "backend": backend if group else None,
        "runs": [],
    }
    for s in seqs:
        active = args.steps if s <= 8192 else 1
        x = torch.randn(1, s, dims.hidden, device=device, dtype=dtype)
        step_ms: list[float] = []

        def step(x=x, step_ms=step_ms):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            t0 = time.perf_counter()
            y = model(x)
            y.float().square().mean().backward()
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                b.record()
                b.synchronize()
                step_ms.append(a.elapsed_time(b))
            else:
                step_ms.append((time.perf_counter() - t0) * 1e3)

        for _ in range(2):  # warm-up outside the profiler (cuBLAS heuristics, allocator)
            step()
        sync()
        step_ms.clear()
        tdir = out / "traces" / f"seq{s}"
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(
            activities=acts,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=active),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tdir), use_gzip=True),
            record_shapes=True,  # Input Dims / Input type: the per-op FLOPs of docs/ops.md
        ) as prof:
            for _ in range(1 + active):
                step()
                prof.step()
        sync()
        n_ar = 0
        if group is not None:
            n_ar = 2 * len(model)  # one forward (row-parallel output) + one backward (column-parallel input)
        truth["runs"].append(
            {
                "seq": s,
                "trace_dir": str(tdir.relative_to(out)),
                "profiled_steps": active,
                "step_ms_cuda_events": step_ms[1:],  # the first profiled step is the profiler's warm-up
                "all_reduces_per_step": n_ar,
                "all_reduce_bytes": s * dims.hidden * (2 if dtype == torch.bfloat16 else 4),
                "annotations_per_step": [m.name for m in model]
                + ([f"{m.name}.backward" for m in reversed(model)] if args.annotate_backward else []),
            }
        )
        print(f"seq {s}: steps {[round(v, 1) for v in step_ms]} ms -> {tdir}", flush=True)
        del x

    if not args.no_calibrate:
        peak = 989e12 if device == "cuda" else 1e12
        hbm = 4.8e12 if device == "cuda" else 50e9
        attn_seqs = [int(x) for x in args.attn_seqs.split(",") if x]
        cal = calibrate(torch, dims, seqs, device, dtype, gdn, peak, hbm, attn_seqs)
        cal.update(
            {
                "peak_bf16_flops": peak,
                "hbm_bytes_per_s": hbm,
                "device": truth["device"],
                "torch": torch.__version__,
            }
        )
        (out / "calibration.json").write_text(json.dumps(cal, indent=1) + "\n")
        for r in cal["gemm"]:
            print(
                f"gemm seq={r['seq']} {r['name']:13s} {r['pass']:5s} {r['tflops']:7.1f} TFLOP/s eff {r['eff']:.3f}"
            )
        for r in cal["attention"]:
            print(
                f"attn seq={r['seq']} heads={r['heads']} fwd {r['fwd_ms']:.3f} ms eff {r['fwd_eff']:.3f} "
                f"bwd {r['bwd_ms']:.3f} ms eff {r['bwd_eff']:.3f}"
            )
        for r in cal["memory_bound"]:
            print(f"mem seq={r['seq']} mul {r['gbps']:.0f} GB/s eff {r['eff']:.3f}")
        for r in cal["gdn_core"]:
            print(f"gdn seq={r['seq']} fwd {r['fwd_ms']:.2f} ms")
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    if group is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
