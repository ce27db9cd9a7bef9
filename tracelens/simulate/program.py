"""Per-stage programs: the ordered list of GPU operations one pipeline stage runs in a training step.

All ranks of a stage (every dp, cp, tp coordinate) run the same program; per-rank differences
(jitter, stragglers, slow links, host stalls) are applied by the engine. Durations here are the
nominal ones from the cost model (costs.py) and the model description (tracelens.models).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracelens.simulate import costs as C
from tracelens.simulate.config import SimConfig

# Streams (CUDA stream ids as they appear in traces).
S_COMPUTE = 7
S_TP = 20
S_CP = 24
S_P2P_RECV = 28
S_P2P_SEND = 32
S_DP = 36
S_WORLD = 40
AXIS_STREAM = {"tp": S_TP, "cp": S_CP, "dp": S_DP, "world": S_WORLD, "pp": S_P2P_SEND}

# Op kinds.
COMPUTE, COLL, ASYNC, WAIT, SEND, RECV, WORLD = range(7)


@dataclass(eq=False)
class Op:
    """One GPU operation (a kernel, or a stream wait with no kernel)."""

    kind: int
    name: str = ""
    stream: int = S_COMPUTE
    base_ns: float = 0.0  # compute duration, or nominal transfer time (per-group factors applied later)
    module: int = -1  # index into Program.modules, -1 when outside a module annotation
    phase: str = "F"  # F forward, B backward, O step end (optimizer, gradient sync)
    mb: int = -1
    thread: int = 0  # 0 main thread, 1 autograd thread
    axis: str = ""  # collective axis: tp | cp | dp | world | pp
    coll: str = ""  # allreduce | reduce_scatter | all_gather | all_to_all | send | recv
    dtype: str = "BFloat16"
    in_nelems: int = 0
    out_nelems: int = 0
    peer: int = 0  # p2p: +1 next stage, -1 previous stage
    key: tuple = ()  # p2p match key (src_stage, dst_stage, direction, mb)
    mem: int = 0  # bytes allocated (+) or freed (-) at this op's launch ([memory] event)
    grid: tuple = (132, 1, 1)
    block: tuple = (256, 1, 1)
    layer_type: str = ""  # layer type of the enclosing layer module, "" otherwise


@dataclass
class Module:
    """A module annotation instance (`layers.15.self_attn`, `layers.15.mlp.backward`, ...)."""

    name: str
    thread: int
    layer_type: str = ""  # full_attention | linear_attention | mlp | "" (other)


@dataclass
class Program:
    """The op list of one stage for one step, with its module annotations and summary facts."""

    stage: int
    layers: list[int]
    ops: list[Op] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)
    params: int = 0  # parameters held by one rank of this stage
    static_bytes: int = 0
    act_bytes_per_mb: int = 0
    full_recompute_memory: bool = False  # memory accounted as with full activation checkpointing


def stage_split(cfg: SimConfig, num_layers: int) -> list[int]:
    """Layers per stage: the given split, else as even as possible (earlier stages take the remainder)."""
    from tracelens.errors import BadInputError

    if cfg.split is not None:
        if len(cfg.split) != cfg.pp:
            raise BadInputError(f"--split has {len(cfg.split)} entries but --pp is {cfg.pp}")
        if sum(cfg.split) != num_layers or min(cfg.split) < 1:
            raise BadInputError(f"--split must hold {cfg.pp} positive counts summing to {num_layers} layers")
        return list(cfg.split)
    if cfg.pp > num_layers:
        raise BadInputError(f"--pp {cfg.pp} exceeds the model's {num_layers} layers")
    base, rem = divmod(num_layers, cfg.pp)
    return [base + (1 if s < rem else 0) for s in range(cfg.pp)]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class ProgramBuilder:
    """Builds each stage's program from the model description, the layout and the cost model."""

    def __init__(self, cfg: SimConfig, model, gpu: C.GpuSpec, peak: float):
        self.cfg, self.m, self.gpu, self.peak = cfg, model, gpu, peak
        self.costs = C.KERNEL_COSTS[cfg.kernel_costs]
        tp = cfg.tp
        m = model
        self.T = cfg.micro_batch_size * cfg.seq_len // cfg.cp  # tokens per rank per microbatch
        self.T_norm = self.T // tp if cfg.sequence_parallel else self.T
        h = m.hidden_size
        self.h = h
        q_out = m.num_attention_heads * m.head_dim * (2 if getattr(m, "attn_output_gate", False) else 1)
        self.q_r = _ceil_div(q_out, tp)
        self.nq_r = _ceil_div(m.num_attention_heads, tp)
        self.kv_r = _ceil_div(m.num_key_value_heads, tp)  # >= 1: KV heads are replicated when tp > heads
        self.kv_replication = max(1.0, tp / m.num_key_value_heads)
        self.ffn_r = _ceil_div(m.intermediate_size, tp)
        nk = getattr(m, "linear_num_key_heads", 0) or 0
        nv = getattr(m, "linear_num_value_heads", 0) or 0
        self.dk = getattr(m, "linear_key_head_dim", 0) or 0
        self.dv = getattr(m, "linear_value_head_dim", 0) or 0
        self.nk_r = _ceil_div(nk, tp) if nk else 0
        self.nv_r = _ceil_div(nv, tp) if nv else 0
        self.conv_k = getattr(m, "linear_conv_kernel_dim", 4) or 4
        self.vocab_r = _ceil_div(m.vocab_size, tp)
        self.split = stage_split(cfg, m.num_layers)
        self.layer_types = list(m.layer_types)

    # ---- parameter counts (per rank) -------------------------------------------------------------
    def layer_params(self, lt: str) -> int:
        h, hd = self.h, self.m.head_dim
        mlp = 3 * h * self.ffn_r + h
        if lt == "full_attention":
            attn = h * (self.q_r + 2 * self.kv_r * hd) + self.nq_r * hd * h + h
        else:
            attn = h * (2 * self.nk_r * self.dk + 2 * self.nv_r * self.dv + 2 * self.nv_r)
            attn += (
                (2 * self.nk_r * self.dk + self.nv_r * self.dv) * self.conv_k + self.nv_r * self.dv * h + h
            )
        return attn + mlp

    # ---- helpers building ops --------------------------------------------------------------------
    def _gemm(self, name: str, m_: int, k: int, n: int, **kw) -> Op:
        flops = 2.0 * m_ * k * n
        return Op(
            COMPUTE,
            name,
            S_COMPUTE,
            self.costs.gemm_ns(flops, self.peak),
            grid=(max(1, n // 256), max(1, m_ // 128), 1),
            block=(384, 1, 1),
            **kw,
        )

    def _mem(self, name: str, nbytes: float, **kw) -> Op:
        return Op(
            COMPUTE,
            name,
            S_COMPUTE,
            self.costs.mem_ns(nbytes, self.gpu),
            grid=(max(1, int(nbytes // 65536)), 1, 1),
            block=(256, 1, 1),
            **kw,
        )

    def _flops(self, name: str, flops: float, attn: str = "", **kw) -> Op:
        """A FLOP-bound kernel: fused attention (`attn` = "fwd" | "bwd") or a chunked Gated DeltaNet one."""
        if attn:
            ns = self.costs.attn_ns(flops, self.peak, backward=attn == "bwd")
        else:
            ns = self.costs.gdn_ns(flops, self.peak)
        return Op(
            COMPUTE,
            name,
            S_COMPUTE,
            ns,
            grid=(self._attn_grid(), 1, 1),
            block=(128, 1, 1),
            **kw,
        )

    def _attn_grid(self) -> int:
        """Grid x of attention-style kernels: one block per 128 tokens per head."""
        return max(1, self.T // 128) * max(1, self.nq_r)

    def _coll(
        self, kind: int, axis: str, coll: str, in_n: int, out_n: int, dtype: str = "BFloat16", **kw
    ) -> Op:
        nbytes = max(in_n, out_n) * C.DTYPE_BYTES[dtype]
        return Op(
            kind,
            C.NCCL_NAMES[(coll, dtype)],
            AXIS_STREAM[axis],
            float(nbytes),
            axis=axis,
            coll=coll,
            dtype=dtype,
            in_nelems=in_n,
            out_nelems=out_n,
            grid=(8 if coll != "all_to_all" else 16, 1, 1),
            block=(640, 1, 1),
            **kw,
        )

    def _tp_fwd_out(self, kw) -> list[Op]:
        """Row-parallel output: all-reduce (or reduce-scatter with sequence parallel), blocking."""
        if self.cfg.tp == 1:
            return []
        n = self.T * self.h
        if self.cfg.sequence_parallel:
            return [self._coll(COLL, "tp", "reduce_scatter", n, n // self.cfg.tp, **kw)]
        return [self._coll(COLL, "tp", "allreduce", n, n, **kw)]

    def _tp_fwd_in(self, kw) -> list[Op]:
        if self.cfg.tp == 1 or not self.cfg.sequence_parallel:
            return []
        n = self.T * self.h
        return [self._coll(COLL, "tp", "all_gather", n // self.cfg.tp, n, **kw)]

    def _tp_bwd_in_async(self, kw) -> list[Op]:
        """Column-parallel input gradient: async all-reduce (reduce-scatter with SP) overlapped with wgrad."""
        if self.cfg.tp == 1:
            return []
        n = self.T * self.h
        if self.cfg.sequence_parallel:
            return [self._coll(ASYNC, "tp", "reduce_scatter", n, n // self.cfg.tp, **kw)]
        return [self._coll(ASYNC, "tp", "allreduce", n, n, **kw)]

    def _tp_bwd_out(self, kw) -> list[Op]:
        if self.cfg.tp == 1 or not self.cfg.sequence_parallel:
            return []
        n = self.T * self.h
        return [self._coll(COLL, "tp", "all_gather", n // self.cfg.tp, n, **kw)]

    def _wait(self, axis: str, kw) -> list[Op]:
        if axis == "tp" and self.cfg.tp == 1:
            return []
        return [Op(WAIT, axis=axis, **kw)]

    def _cp_a2a(self, nelems: int, kw) -> list[Op]:
        if self.cfg.cp == 1:
            return []
        return [self._coll(COLL, "cp", "all_to_all", nelems, nelems, **kw)]

    # ---- layer bodies ----------------------------------------------------------------------------
    def attn_fwd(self, lt: str, kw) -> list[Op]:
        T, h, Tn = self.T, self.h, self.T_norm
        ops = self._tp_fwd_in(kw)
        ops.append(self._mem(C.RMSNORM_FWD, 2 * 2 * Tn * h, **kw))
        if lt == "full_attention":
            hd = self.m.head_dim
            ops.append(self._gemm(C.GEMM_FPROP, T, h, self.q_r + 2 * self.kv_r * hd, **kw))
            ops += self._cp_a2a(T * (self.q_r + 2 * self.kv_r * hd), kw)
            heads = self.nq_r / self.cfg.cp
            flops = 2.0 * self.cfg.micro_batch_size * self.cfg.seq_len**2 * hd * heads  # 4*s^2*d*h/2, causal
            ops.append(self._flops(self.costs.attn_fwd_kernel, flops, attn="fwd", **kw))
            ops += self._cp_a2a(T * self.nq_r * hd, kw)
            ops.append(self._gemm(C.GEMM_FPROP, T, self.nq_r * hd, h, **kw))
        else:
            dk, dv, nk, nv = self.dk, self.dv, self.nk_r, self.nv_r
            ops.append(self._gemm(C.GEMM_FPROP, T, h, 2 * nk * dk + 2 * nv * dv + 2 * nv, **kw))
            conv_ch = 2 * nk * dk + nv * dv
            ops.append(self._mem(C.CONV_FWD, 2 * 2 * T * conv_ch, **kw))
            ck = C.GDN_CHUNK
            # chunked delta rule: intra-chunk K K^T and WY transform + state recurrence, then the output
            ops.append(self._flops(C.GDN_FWD[0], T * nv * (4.0 * dk * dv + 2 * ck * dk), **kw))
            ops.append(self._flops(C.GDN_FWD[1], T * nv * (2.0 * dk * dv + 2 * ck * (dk + dv)), **kw))
            ops.append(self._mem(C.GATED_NORM_FWD, 3 * 2 * T * nv * dv, **kw))
            ops.append(self._gemm(C.GEMM_FPROP, T, nv * dv, h, **kw))
        ops += self._tp_fwd_out(kw)
        return ops

    def attn_bwd(self, lt: str, kw) -> list[Op]:
        T, h, Tn = self.T, self.h, self.T_norm
        ops = self._tp_bwd_out(kw)
        if lt == "full_attention":
            hd = self.m.head_dim
            ops.append(self._gemm(C.GEMM_DGRAD, T, h, self.nq_r * hd, **kw))
            ops.append(self._gemm(C.GEMM_WGRAD, self.nq_r * hd, T, h, **kw))
            ops += self._cp_a2a(T * self.nq_r * hd, kw)
            heads = self.nq_r / self.cfg.cp
            flops = 2.5 * 2.0 * self.cfg.micro_batch_size * self.cfg.seq_len**2 * hd * heads
            ops.append(self._flops(self.costs.attn_bwd_kernel, flops, attn="bwd", **kw))
            ops += self._cp_a2a(T * (self.q_r + 2 * self.kv_r * hd), kw)
            n_in = self.q_r + 2 * self.kv_r * hd
        else:
            dk, dv, nk, nv = self.dk, self.dv, self.nk_r, self.nv_r
            ck = C.GDN_CHUNK
            ops.append(self._gemm(C.GEMM_DGRAD, T, h, nv * dv, **kw))
            ops.append(self._gemm(C.GEMM_WGRAD, nv * dv, T, h, **kw))
            ops.append(self._mem(C.GATED_NORM_BWD, 5 * 2 * T * nv * dv, **kw))
            ops.append(self._flops(C.GDN_BWD[0], 4.0 * T * dk * dv * nv, **kw))
            ops.append(self._flops(C.GDN_BWD[1], T * nv * (4.0 * dk * dv + 8 * ck * dk + 6 * ck * dv), **kw))
            conv_ch = 2 * nk * dk + nv * dv
            ops.append(self._mem(C.CONV_BWD, 3 * 2 * T * conv_ch, **kw))
            n_in = 2 * nk * dk + 2 * nv * dv + 2 * nv
        ops.append(self._gemm(C.GEMM_DGRAD, T, n_in, h, **kw))
        ops += self._tp_bwd_in_async(kw)
        ops.append(self._gemm(C.GEMM_WGRAD, h, T, n_in, **kw))
        ops += self._wait("tp", kw)
        ops.append(self._mem(C.RMSNORM_BWD, 3 * 2 * Tn * h, **kw))
        return ops

    def mlp_fwd(self, kw) -> list[Op]:
        T, h, f = self.T, self.h, self.ffn_r
        ops = self._tp_fwd_in(kw)
        ops.append(self._mem(C.RMSNORM_FWD, 2 * 2 * self.T_norm * h, **kw))
        ops.append(self._gemm(C.GEMM_FPROP, T, h, 2 * f, **kw))
        ops.append(self._mem(C.SWIGLU_FWD, 3 * 2 * T * f, **kw))
        ops.append(self._gemm(C.GEMM_FPROP, T, f, h, **kw))
        ops += self._tp_fwd_out(kw)
        return ops

    def mlp_bwd(self, kw) -> list[Op]:
        T, h, f = self.T, self.h, self.ffn_r
        ops = self._tp_bwd_out(kw)
        ops.append(self._gemm(C.GEMM_DGRAD, T, h, f, **kw))
        ops.append(self._gemm(C.GEMM_WGRAD, f, T, h, **kw))
        ops.append(self._mem(C.SWIGLU_BWD, 5 * 2 * T * f, **kw))
        ops.append(self._gemm(C.GEMM_DGRAD, T, 2 * f, h, **kw))
        ops += self._tp_bwd_in_async(kw)
        ops.append(self._gemm(C.GEMM_WGRAD, h, T, 2 * f, **kw))
        ops += self._wait("tp", kw)
        ops.append(self._mem(C.RMSNORM_BWD, 3 * 2 * self.T_norm * h, **kw))
        return ops

    # ---- stage program ---------------------------------------------------------------------------
    def chunks(self, stage: int) -> list[list[int]]:
        """The layers of each model chunk the stage holds (one chunk, its split entry, unless the schedule
        interleaves: then chunk c of stage s is virtual stage c*p + s, the layers cut evenly over the
        p*v virtual stages, earlier ones taking the remainder)."""
        cfg = self.cfg
        v = cfg.virtual_stages
        if v == 1:
            first = sum(self.split[:stage])
            return [list(range(first, first + self.split[stage]))]
        n = self.m.num_layers
        base, rem = divmod(n, cfg.pp * v)
        sizes = [base + (1 if k < rem else 0) for k in range(cfg.pp * v)]
        out = []
        for c in range(v):
            k = c * cfg.pp + stage
            first = sum(sizes[:k])
            out.append(list(range(first, first + sizes[k])))
        return out

    def build(self, stage: int) -> Program:
        cfg = self.cfg
        p, mcount, v = cfg.pp, cfg.microbatches, cfg.virtual_stages
        chunks = self.chunks(stage)
        layers = [li for c in chunks for li in c]
        prog = Program(stage, layers)
        prog.params = sum(self.layer_params(self.layer_types[i]) for i in layers)
        if stage == 0:
            prog.params += self.vocab_r * self.h
        if stage == p - 1:
            prog.params += self.vocab_r * self.h + self.h
        # bf16 params + fp32 grads + fp32 master/m/v sharded over dp (distributed optimizer)
        prog.static_bytes = int(prog.params * (2 + 4) + prog.params * 12 // cfg.dp)
        # activation bytes per layer and microbatch (Korthikanti et al. 2022, flash attention, no recompute)
        act_per_layer = int(self.T * self.h * (10 + 24 / cfg.tp))
        if cfg.sequence_parallel:
            act_per_layer = int(self.T * self.h * 34 / cfg.tp)
        if cfg.schedule == "interleaved_1f1b":
            from tracelens.analyze.pipeline.schedule import canonical_orders

            orders = canonical_orders("interleaved_1f1b", p, mcount, v)
            if orders is None:
                from tracelens.errors import BadInputError

                raise BadInputError(
                    f"interleaved 1F1B needs --microbatches to be a multiple of max(1, m // pp): {mcount} is not"
                )
            order = [(a[1], a[2], a[0] // p) for unit in orders[stage] for a in unit]  # (phase, mb, chunk)
            held = peak = 0
            for ph, _, _ in order:  # chunk-microbatches held at once, each 1/v of the stage's layers
                held += 1 if ph == "F" else -1
                peak = max(peak, held)
            in_flight = peak / v
        else:
            in_flight = min(cfg.microbatches, p - stage) if cfg.schedule == "1f1b" else cfg.microbatches
            if cfg.schedule == "gpipe":
                order = [("F", i, 0) for i in range(mcount)] + [("B", i, 0) for i in range(mcount)]
            else:
                warm = min(p - stage - 1, mcount)
                order = [("F", i, 0) for i in range(warm)]
                for i in range(mcount - warm):
                    order += [("F", warm + i, 0), ("B", i, 0)]
                order += [("B", i, 0) for i in range(mcount - warm, mcount)]
        if prog.static_bytes + in_flight * act_per_layer * len(layers) > 0.9 * self.gpu.total_mem:
            # would not fit: account memory as with full activation checkpointing (layer inputs only);
            # the recompute kernels themselves are not simulated (docs/simulator.md)
            act_per_layer = 2 * self.T * self.h // (cfg.tp if cfg.sequence_parallel else 1)
            prog.full_recompute_memory = True
        prog.act_bytes_per_mb = act_per_layer * len(layers)
        self._act_per_layer = act_per_layer

        for phase, mb, c in order:
            if phase == "F":
                self._forward(prog, stage, chunks[c], mb, c)
            else:
                self._backward(prog, stage, chunks[c], mb, last=(mb == mcount - 1), chunk=c)
        self._step_end(prog, stage)
        return prog

    def _module(self, prog: Program, name: str, thread: int, layer_type: str = "") -> int:
        prog.modules.append(Module(name, thread, layer_type))
        return len(prog.modules) - 1

    def _p2p_nelems(self) -> int:
        n = self.T * self.h
        return n // self.cfg.tp if self.cfg.sequence_parallel else n

    def _forward(self, prog: Program, stage: int, layers: list[int], mb: int, chunk: int = 0) -> None:
        p = self.cfg.pp
        k, last_k = chunk * p + stage, p * self.cfg.virtual_stages - 1  # virtual stage, the last one
        ops = prog.ops
        n = self._p2p_nelems()
        if k > 0:  # (from the previous virtual stage: the previous rank, or the last one for chunk c > 0)
            ops.append(
                self._coll(
                    RECV,
                    "pp",
                    "recv",
                    n,
                    n,
                    phase="F",
                    mb=mb,
                    peer=-1 if stage > 0 else p - 1,
                    key=(k - 1, k, "F", mb),
                )  # fmt: skip
            )
            ops[-1].stream = S_P2P_RECV
        if k == 0:
            mi = self._module(prog, "embed_tokens", 0)
            ops.append(self._mem(C.EMBED_FWD, 2 * 2 * self.T * self.h, module=mi, phase="F", mb=mb))
        per_layer_act = self._act_per_layer
        for li in layers:
            lt = self.layer_types[li]
            mod = "self_attn" if lt == "full_attention" else "linear_attn"
            mi = self._module(prog, f"layers.{li}.{mod}", 0, lt)
            kw = {"module": mi, "phase": "F", "mb": mb, "layer_type": lt}
            body = self.attn_fwd(lt, kw)
            body[0].mem = per_layer_act  # the layer's saved activations (one [memory] event per layer)
            ops += body
            mi = self._module(prog, f"layers.{li}.mlp", 0, "mlp")
            kw = {"module": mi, "phase": "F", "mb": mb, "layer_type": "mlp"}
            body = self.mlp_fwd(kw)
            ops += body
        if k == last_k:
            mi = self._module(prog, "lm_head", 0)
            kw = {"module": mi, "phase": "F", "mb": mb}
            ops.append(self._mem(C.RMSNORM_FWD, 2 * 2 * self.T_norm * self.h, **kw))
            ops.extend(self._tp_fwd_in(kw))
            ops.append(self._gemm(C.GEMM_FPROP, self.T, self.h, self.vocab_r, **kw))
            ops.append(self._mem(C.XENT_FWD, 3 * 4 * self.T * self.vocab_r, **kw))
        if k < last_k:
            ops.append(
                self._coll(
                    SEND,
                    "pp",
                    "send",
                    n,
                    n,
                    phase="F",
                    mb=mb,
                    peer=+1 if stage < p - 1 else 1 - p,
                    key=(k, k + 1, "F", mb),
                )  # fmt: skip
            )
            ops[-1].stream = S_P2P_SEND

    def _backward(
        self, prog: Program, stage: int, layers: list[int], mb: int, last: bool, chunk: int = 0
    ) -> None:
        p, cfg = self.cfg.pp, self.cfg
        k, last_k = chunk * p + stage, p * cfg.virtual_stages - 1
        ops = prog.ops
        n = self._p2p_nelems()
        if k < last_k:
            ops.append(
                self._coll(
                    RECV,
                    "pp",
                    "recv",
                    n,
                    n,
                    phase="B",
                    mb=mb,
                    peer=+1 if stage < p - 1 else 1 - p,
                    key=(k + 1, k, "B", mb),
                )  # fmt: skip
            )
            ops[-1].stream = S_P2P_RECV
        bucket_params = 0
        bucket_layers = 0
        if k == last_k:
            mi = self._module(prog, "lm_head.backward", 1)
            kw = {"module": mi, "phase": "B", "mb": mb, "thread": 1}
            ops.append(self._mem(C.XENT_BWD, 3 * 4 * self.T * self.vocab_r, **kw))
            ops.append(self._gemm(C.GEMM_DGRAD, self.T, self.vocab_r, self.h, **kw))
            ops.append(self._gemm(C.GEMM_WGRAD, self.vocab_r, self.T, self.h, **kw))
            ops.append(self._mem(C.RMSNORM_BWD, 3 * 2 * self.T_norm * self.h, **kw))
            bucket_params += self.vocab_r * self.h + self.h
        per_layer_act = self._act_per_layer
        for li in reversed(layers):
            lt = self.layer_types[li]
            mi = self._module(prog, f"layers.{li}.mlp.backward", 1, "mlp")
            kw = {"module": mi, "phase": "B", "mb": mb, "thread": 1, "layer_type": "mlp"}
            body = self.mlp_bwd(kw)
            ops += body
            mod = "self_attn" if lt == "full_attention" else "linear_attn"
            mi = self._module(prog, f"layers.{li}.{mod}.backward", 1, lt)
            kw = {"module": mi, "phase": "B", "mb": mb, "thread": 1, "layer_type": lt}
            body = self.attn_bwd(lt, kw)
            body[-1].mem = -per_layer_act
            ops += body
            bucket_params += self.layer_params(lt)
            bucket_layers += 1
            if last and cfg.dp > 1 and bucket_layers == 4:
                ops.append(self._dp_bucket(bucket_params))
                bucket_params = bucket_layers = 0
        if k == 0:
            mi = self._module(prog, "embed_tokens.backward", 1)
            ops.append(self._mem(C.EMBED_BWD, 3 * 2 * self.T * self.h, module=mi, phase="B", mb=mb, thread=1))
            bucket_params += self.vocab_r * self.h
        if last and cfg.dp > 1 and bucket_params:
            ops.append(self._dp_bucket(bucket_params))
        if k > 0:
            ops.append(
                self._coll(
                    SEND,
                    "pp",
                    "send",
                    n,
                    n,
                    phase="B",
                    mb=mb,
                    peer=-1 if stage > 0 else p - 1,
                    key=(k, k - 1, "B", mb),
                )  # fmt: skip
            )
            ops[-1].stream = S_P2P_SEND

    def _dp_bucket(self, params: int) -> Op:
        dp = self.cfg.dp
        n = _ceil_div(params, dp) * dp
        return self._coll(
            ASYNC,
            "dp",
            "reduce_scatter",
            n,
            n // dp,
            dtype="Float",
            phase="B",
            mb=self.cfg.microbatches - 1,
            thread=1,
        )

    def _step_end(self, prog: Program, stage: int) -> None:
        cfg = self.cfg
        ops = prog.ops
        if cfg.dp > 1:
            ops.append(Op(WAIT, axis="dp", phase="O"))
        shard = _ceil_div(prog.params, cfg.dp)
        mi = self._module(prog, "clip_grad_norm_", 0)
        ops.append(self._mem(C.L2NORM, 4 * shard, module=mi, phase="O"))
        ops.append(self._coll(WORLD, "world", "allreduce", 1, 1, dtype="Float", phase="O"))
        mi = self._module(prog, "Optimizer.step#AdamW.step", 0)
        n_adam = 2
        for _ in range(n_adam):
            ops.append(self._mem(C.ADAM, 30 * shard / n_adam, module=mi, phase="O"))
        if cfg.dp > 1:
            ops.append(
                self._coll(
                    COLL,
                    "dp",
                    "all_gather",
                    _ceil_div(prog.params, cfg.dp),
                    _ceil_div(prog.params, cfg.dp) * cfg.dp,
                    phase="O",
                )
            )

    def expected_bubble_fraction(self) -> float:
        p, m, v = self.cfg.pp, self.cfg.microbatches, self.cfg.virtual_stages
        return (p - 1) / (v * m + p - 1)


def kv_replication(cfg: SimConfig, model) -> float:
    """How many times each K/V head is held across a TP group (1.0 = no replication)."""
    return max(1.0, cfg.tp / model.num_key_value_heads)
