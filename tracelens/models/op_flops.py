"""FLOPs and bytes moved of one PyTorch operator call, from its recorded `Input Dims`, `Input type` and
`Concrete Inputs` (Kineto `record_shapes=True`). Formulas and their sources: docs/ops.md.

`op_cost(name, dims, types, concrete)` returns an `OpCost` (FLOPs, bytes, the model used) or None when the
operator has no model or its shapes are not usable. Bytes are the minimum traffic to and from memory: every
input read once, every output written once (what a roofline takes as the memory term); FLOPs count a
multiply-add as 2. Nothing here guesses a missing shape: an unknown is None.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

#: Bytes per element of the `Input type` strings PyTorch records.
DTYPE_BYTES = {
    "double": 8,
    "float": 4,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "half": 2,
    "bfloat16": 2,
    "long int": 8,
    "long": 8,
    "int64_t": 8,
    "int": 4,
    "unsigned int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "char": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1,
    "c10::float8_e5m2fnuz": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::half>": 4,
}
#: Compute class of an `Input type` for the roofline's peak: bf16 / fp16 / fp8 use tensor-core peaks,
#: fp32 the FP32 (non-tensor) peak, fp64 none.
DTYPE_CLASS = {
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "float": "fp32",
    "double": "fp64",
    "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8",
    "c10::float8_e4m3fnuz": "fp8",
    "c10::float8_e5m2fnuz": "fp8",
}


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes of one call; `model` names the formula (docs/ops.md); `dtype` the compute class
    (bf16, fp16, fp8, fp32, fp64 or None). `bytes` is None when element sizes are not recorded (tensor
    lists: the profiler writes `TensorList`, not the elements' dtype)."""

    flops: float
    bytes: float | None
    model: str
    dtype: str | None


@dataclass(frozen=True)
class OpContext:
    """What an op's own shapes do not say and its surroundings do (None: not known).

    Attention over a paged KV cache records q and the cache, not how many keys each query sees; an engine
    iteration's annotation does (tracelens.ingest.iterations: for the prefill (context, `c_`) and decode
    (generation, `g_`) requests, the new tokens `sq`, the keys `sk` and the sums sq*sq and sq*sk over the
    batch). A fused MoE layer records the tokens and the router logits, not the experts' top-k or size: a
    routing op nested in it (its top-k ids [tokens, k]) or the model config does."""

    c_sq: int | None = None
    c_sk: int | None = None
    c_sqsq: int | None = None
    c_sqsk: int | None = None
    g_sq: int | None = None
    g_sk: int | None = None
    g_sqsk: int | None = None
    moe_top_k: int | None = None
    moe_intermediate: int | None = None  # expert intermediate size (model config)
    moe_gated: bool = True  # gate and up projections (SwiGLU experts)


# ------------------------------------------------------------------------------------------- helpers
def _numel(d: Any) -> int:
    return int(math.prod(d)) if isinstance(d, list) and all(isinstance(x, int) for x in d) else 0


def _is_shape(d: Any) -> bool:
    return isinstance(d, list) and len(d) > 0 and all(isinstance(x, int) and x >= 0 for x in d)


def _esize(t: Any) -> int | None:
    return DTYPE_BYTES.get(str(t).strip().lower()) if t is not None else None


def _dclass(types: list) -> str | None:
    for t in types:
        c = DTYPE_CLASS.get(str(t).strip().lower())
        if c is not None:
            return c
    return None


def _tensors(dims: list, types: list) -> list[tuple[list[int], int]]:
    """(shape, element size) of every tensor input with a known dtype, in order (lists of tensors
    flattened; 0-d tensors kept as shape [])."""
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        if str(t) in ("TensorList", "GenericList") and isinstance(d, list):
            out += [(s, 0) for s in d if _is_shape(s)]  # element type of a list is not recorded: size 0
            continue
        es = _esize(t)
        if es is not None and isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append((d, es))
    return out


def _concrete(concrete: list, i: int) -> str | None:
    if i < len(concrete) and concrete[i] not in (None, ""):
        return str(concrete[i])
    return None


def _bool(v: str | None) -> bool | None:
    if v is None:
        return None
    s = v.strip().lower()
    if s.isdigit():
        return int(s) != 0
    return True if s == "true" else False if s == "false" else None


def _ints(v: str | None) -> list[int] | None:
    if v is None:
        return None
    nums = re.findall(r"-?\d+", v)
    return [int(x) for x in nums] if nums else None


def _first_int(v: str | None) -> int | None:
    nums = _ints(v)
    return nums[0] if nums else None


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(nd):
        vals = {s[len(s) - nd + k] for s in shapes if len(s) - nd + k >= 0}
        vals.discard(1)
        if len(vals) > 1:
            return None
        out.append(vals.pop() if vals else 1)
    return out


# ------------------------------------------------------------------------------------------- GEMMs
def _gemm(
    m: int, k: int, n: int, batch: int, es_a: int, es_b: int, es_c: int, c_in: int
) -> tuple[float, float]:
    """2*B*M*N*K FLOPs (+B*M*N when an input `c_in` elements big is added); bytes: A and B read, C written,
    the added input read."""
    flops = 2.0 * batch * m * n * k + (batch * m * n if c_in else 0)
    byts = batch * (m * k * es_a + k * n * es_b + m * n * es_c) + c_in * es_c
    return flops, float(byts)


def _mm(name, dims, types, concrete):
    t = _tensors(dims, types)
    if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm"):
        if len(t) < 3:
            return None
        (c, es_c), (a, es_a), (b, es_b) = t[0], t[1], t[2]
        c_in = max(_numel(c), 1)
    else:
        if len(t) < 2:
            return None
        (a, es_a), (b, es_b) = t[0], t[1]
        es_c, c_in = es_a, 0
    if name in ("aten::mm", "aten::addmm") and len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return _gemm(a[0], a[1], b[1], 1, es_a, es_b, es_c, c_in)
    if (
        name in ("aten::bmm", "aten::baddbmm")
        and len(a) == 3
        and len(b) == 3
        and a[2] == b[1]
        and a[0] == b[0]
    ):
        return _gemm(a[1], a[2], b[2], a[0], es_a, es_b, es_c, c_in)
    if name == "aten::addbmm" and len(a) == 3 and len(b) == 3 and a[2] == b[1]:  # sum over the batch
        f, by = _gemm(a[1], a[2], b[2], a[0], es_a, es_b, es_c, 0)
        return f + a[1] * b[2], by - (a[0] - 1) * a[1] * b[2] * es_c + c_in * es_c
    return None


def _matmul(name, dims, types, concrete):
    """aten::matmul with broadcasting batch dims; 1-D operands are promoted as torch.matmul does."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (a, es_a), (b, es_b) = t[0], t[1]
    if not a or not b:
        return None
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    batch_shape = _broadcast([a2[:-2], b2[:-2]])
    if batch_shape is None:
        return None
    batch = math.prod(batch_shape) if batch_shape else 1
    m, k, n = a2[-2], a2[-1], b2[-1]
    flops = 2.0 * batch * m * n * k
    byts = _numel(a) * es_a + _numel(b) * es_b + batch * m * n * es_a
    return flops, float(byts)


def _linear(name, dims, types, concrete):
    """aten::linear(x[..., K], W[N, K], bias[N]?): 2*M*K*N (+M*N with bias)."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (x, es_x), (w, es_w) = t[0], t[1]
    if len(w) != 2 or not x or x[-1] != w[1]:
        return None
    m, k, n = _numel(x[:-1]) if len(x) > 1 else 1, w[1], w[0]
    bias = len(t) > 2 and _numel(t[2][0]) == n
    flops = 2.0 * m * k * n + (m * n if bias else 0)
    byts = m * k * es_x + k * n * es_w + m * n * es_x + (n * t[2][1] if bias else 0)
    return flops, float(byts)


# ------------------------------------------------------------------------------------------- attention
#: op -> (layout of q/k/v: "bhsd" or "bshd", index of is_causal in Concrete Inputs, backward?)
_ATTN = {
    "aten::scaled_dot_product_attention": ("bhsd", 5, False),
    "aten::_scaled_dot_product_flash_attention": ("bhsd", 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhsd", 4, False),
    "aten::_scaled_dot_product_efficient_attention": ("bhsd", 6, False),
    "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 6, False),
    "aten::_flash_attention_forward": ("bshd", 8, False),
    "aten::_efficient_attention_forward": ("bshd", 9, False),  # custom_mask_type: 0 none, 1/2 causal
    "aten::_cudnn_attention_forward": ("bhsd", 10, False),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhsd", 11, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bhsd", 7, True),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhsd", 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhsd", 14, True),
    "aten::_flash_attention_backward": ("bshd", 11, True),
    "aten::_efficient_attention_backward": ("bshd", 14, True),
    "aten::_cudnn_attention_backward": ("bhsd", 14, True),
}


def _attention(name, dims, types, concrete):
    """Core attention: QK^T and PV, 4*B*H*Sq*Sk*D FLOPs forward, halved when causal (the Megatron
    convention of docs/mfu.md); backward 2.5x forward (5 GEMMs to 2). Bytes: q, k, v, o (forward); q, k, v,
    o, dO read and dQ, dK, dV written (backward)."""
    layout, ci, bwd = _ATTN[name]
    t = _tensors(dims, types)
    off = 1 if bwd else 0  # backward ops take grad_out first
    if len(t) < 3 + off:
        return None
    q, k, v = t[off][0], t[off + 1][0], t[off + 2][0]
    es = t[off][1]
    if not (len(q) == len(k) == len(v) == 4):
        return None
    if layout == "bhsd":
        b, h, sq, d = q
        sk, dv = k[2], v[3]
    else:
        b, sq, h, d = q
        sk, dv = k[1], v[3]
    causal = _bool(_concrete(concrete, ci))
    if causal is None:
        return None
    fwd = 2.0 * b * h * sq * sk * (d + dv)
    if causal:
        fwd /= 2.0
    nq, nk, nv, no = _numel(q), _numel(k), _numel(v), b * h * sq * dv
    if bwd:
        return 2.5 * fwd, float(es * (2 * (nq + nk + nv) + 2 * no))
    return fwd, float(es * (nq + nk + nv + no))


# ------------------------------------------------------------------------------------------- Gated DeltaNet
def _gated_delta(name, dims, types, concrete, chunk: int = 64):
    """Chunked gated delta rule (Yang et al. 2024, fla's chunk_gated_delta_rule), q/k [B, T, H, K],
    v [B, T, H, V]: per chunk and head 2C^2(3K + 2V) (KK^T, WY factors, intra-chunk attention, its PV) plus
    6CKV (state correction, state update, inter-chunk output), i.e. per token and head 2C(3K+2V) + 6KV;
    the triangular solve (C^3/3 per chunk) is left out. Backward ops ("...backward" in the name): 2x."""
    t = _tensors(dims, types)
    if len(t) < 3:
        return None
    q, k, v = t[0][0], t[1][0], t[2][0]
    if not (len(q) == len(k) == len(v) == 4) or q[:3] != k[:3]:
        return None
    b, tt, h, kd = k
    vd, hv = v[3], v[2]
    hh = max(h, hv)
    c = min(chunk, tt)
    flops = b * tt * hh * (2.0 * c * (3 * kd + 2 * vd) + 6.0 * kd * vd)
    byts = sum(_numel(s) * es for s, es in t[:5]) + _numel(v) * t[2][1]
    if "backward" in name or "bwd" in name:
        return 2.0 * flops, 2.0 * byts
    return flops, float(byts)


# ------------------------------------------------------------------------------------------- convolution
_CONV = {
    "aten::convolution": 3,
    "aten::_convolution": 3,
    "aten::cudnn_convolution": 3,
    "aten::conv1d": 3,
    "aten::conv2d": 3,
    "aten::conv3d": 3,
    "aten::mkldnn_convolution": 3,
}


def _conv(name, dims, types, concrete):
    """2 * N * C_out * prod(out spatial) * (C_in / groups) * prod(kernel) (+ N*C_out*out for a bias)."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (x, es), (w, es_w) = t[0], t[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    sp = len(x) - 2
    bias = len(dims) > 2 and _is_shape(dims[2])
    base = 3  # stride, padding, dilation follow input, weight, bias
    if name == "aten::cudnn_convolution":  # (input, weight, padding, stride, dilation, groups, ...)
        pad, stride, dil = (_ints(_concrete(concrete, i)) for i in (2, 3, 4))
        groups = _ints(_concrete(concrete, 5))
        bias = False
    else:
        stride, pad, dil = (_ints(_concrete(concrete, i)) for i in (base, base + 1, base + 2))
        if name in ("aten::convolution", "aten::_convolution"):
            transposed = _bool(_concrete(concrete, 6))
            if transposed:
                return None
            groups = _ints(_concrete(concrete, 8))
        else:
            groups = _ints(_concrete(concrete, 6))
    if stride is None or pad is None or dil is None or groups is None:
        return None
    rep = lambda v: v * sp if len(v) == 1 else v  # noqa: E731
    stride, pad, dil, g = rep(stride), rep(pad), rep(dil), groups[0]
    if min(len(stride), len(pad), len(dil)) < sp or g <= 0:
        return None
    out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(sp)]
    if any(o <= 0 for o in out):
        return None
    n, cout = x[0], w[0]
    nout = n * cout * math.prod(out)
    flops = 2.0 * nout * w[1] * math.prod(w[2:]) + (nout if bias else 0)
    byts = _numel(x) * es + _numel(w) * es_w + nout * es + (cout * es if bias else 0)
    return flops, float(byts)


# ------------------------------------------------------------------------------------------- norms, softmax
_NORM_FLOPS = {
    "aten::native_layer_norm": 5,
    "aten::layer_norm": 5,
    "aten::native_group_norm": 5,
    "aten::native_batch_norm": 5,
    "aten::_fused_rms_norm": 4,
    "aten::rms_norm": 4,
    "aten::native_layer_norm_backward": 8,
    "aten::native_group_norm_backward": 8,
    "aten::native_batch_norm_backward": 8,
    "aten::_fused_rms_norm_backward": 7,
}


def _norm(name, dims, types, concrete):
    """Per element of the input: 5 FLOPs (LayerNorm: mean, variance, normalise, scale, shift), 4 (RMSNorm),
    8 / 7 backward. Bytes: input read and output written (backward: grad_out and input read, grad_in
    written), plus the weight and bias."""
    t = _tensors(dims, types)
    if not t:
        return None
    bwd = "backward" in name
    x, es = t[1] if bwd and len(t) > 1 else t[0]
    n = _numel(x)
    if n == 0:
        return None
    params = sum(_numel(s) * e for s, e in t[(2 if bwd else 1) :] if 0 < _numel(s) < n)
    return float(_NORM_FLOPS[name] * n), float(n * es * (3 if bwd else 2) + params)


_SOFTMAX = {
    "aten::_softmax": 5,
    "aten::softmax": 5,
    "aten::_log_softmax": 5,
    "aten::log_softmax": 5,
    "aten::_softmax_backward_data": 4,
    "aten::_log_softmax_backward_data": 4,
}


def _softmax(name, dims, types, concrete):
    """5 FLOPs per element forward (max, subtract, exp, sum, divide), 4 backward; bytes: in + out
    (backward: grad_out and output read, grad_in written)."""
    t = _tensors(dims, types)
    if not t:
        return None
    x, es = t[0]
    n = _numel(x)
    bwd = "backward" in name
    return float(_SOFTMAX[name] * n), float(n * es * (3 if bwd else 2))


# ------------------------------------------------------------------------------------------- embedding
def _embedding(name, dims, types, concrete):
    """Forward: rows gathered (n_idx * D read and written) plus the indices; no FLOPs. Backward
    (embedding_dense_backward): grad read, indices read, the V x D weight gradient written; n_idx * D adds."""
    t = _tensors(dims, types)
    if name == "aten::embedding":
        if len(t) < 2 or len(t[0][0]) != 2:
            return None
        (w, es), (idx, es_i) = t[0], t[1]
        n, d = _numel(idx), w[1]
        return 0.0, float(2 * n * d * es + n * es_i)
    if len(t) < 2:
        return None
    (g, es), (idx, es_i) = t[0], t[1]
    nw = _ints(_concrete(concrete, 2))
    if not g or nw is None:
        return None
    d, n = g[-1], _numel(idx)
    return float(n * d), float(n * d * es + n * es_i + nw[0] * d * es)


# ------------------------------------------------------------------------------------------- optimizers
#: fused / foreach optimizer steps: FLOPs per parameter element, tensor lists read and written.
_OPTIM = {
    "aten::_fused_adam_": (12, 4, 3),
    "aten::_fused_adamw_": (13, 4, 3),
    "aten::_fused_sgd_": (3, 3, 2),
    "aten::_fused_adagrad_": (6, 3, 2),
}


def _optimizer(name, dims, types, concrete):
    """Fused Adam(W): ~12 (13 with decoupled weight decay) FLOPs per parameter element; reads param, grad,
    exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq (7 elements of the lists' dtype). SGD with
    momentum: 3 FLOPs, reads param, grad, buffer, writes param, buffer."""
    fl, reads, writes = _OPTIM[name]
    lists = [d for i, d in enumerate(dims) if i < len(types) and str(types[i]) == "TensorList"]
    if not lists or not isinstance(lists[0], list):
        return None
    n = sum(_numel(s) for s in lists[0] if isinstance(s, list))
    if n == 0:
        return None
    return float(fl * n), None  # (bytes: reads + writes elements each, of a dtype the trace does not say)


# ------------------------------------------------------------------------------------------- elementwise
_UNARY = {
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sigmoid",
    "tanh",
    "relu",
    "silu",
    "gelu",
    "abs",
    "reciprocal",
    "sin",
    "cos",
    "erf",
    "softplus",
    "exp2",
    "log1p",
    "expm1",
    "sign",
    "square",
    "hardswish",
    "mish",
    "elu",
    "leaky_relu",
    "threshold",
    "logical_not",
    "bitwise_not",
    "clamp",
    "clamp_min",
    "clamp_max",
    "pow",
    "nan_to_num",
    "silu_backward",
    "gelu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "softplus_backward",
}
_BINARY = {
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "where",
    "masked_fill",
    "addcmul",
    "addcdiv",
    "lerp",
    "rsub",
    "remainder",
    "fmod",
    "logical_and",
    "logical_or",
    "bitwise_and",
    "bitwise_or",
    "xor",
    "atan2",
    "hypot",
    "copysign",
    "floor_divide",
}
_TERNARY = {"where", "addcmul", "addcdiv", "lerp", "masked_fill"}
_MOVE = {
    "copy",
    "fill",
    "zero",
    "clone",
    "contiguous",
    "_to_copy",
    "cat",
    "stack",
    "index_select",
    "gather",
    "scatter",
    "masked_scatter",
    "flip",
    "roll",
    "repeat",
    "repeat_interleave",
    "tril",
    "triu",
}
_REDUCE = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "prod",
    "norm",
    "linalg_vector_norm",
    "cumsum",
    "var",
    "std",
    "argmax",
    "argmin",
    "all",
    "any",
}
_FOREACH = re.compile(r"^aten::_foreach_(\w+?)_?$")


def _base(name: str) -> str | None:
    if not name.startswith("aten::"):
        return None
    b = name[6:]
    return b[:-1] if b.endswith("_") and not b.startswith("_") else b


def elementwise_kind(name: str) -> str | None:
    """'unary', 'binary', 'move', 'reduce' or 'foreach' for elementwise-like aten ops, else None."""
    if _FOREACH.match(name):
        return "foreach"
    b = _base(name)
    if b is None:
        return None
    for kind, names in (("unary", _UNARY), ("binary", _BINARY), ("move", _MOVE), ("reduce", _REDUCE)):
        if b in names:
            return kind
    return None


def _elementwise(name, dims, types, concrete):
    """1 FLOP per output element (unary, binary, ternary; 0 for copies, fills and gathers; 1 per input
    element for reductions); bytes: every tensor input read once, the (broadcast) output written once.
    In-place ops (trailing `_`) write their first input. _foreach_*: the same over the tensor lists."""
    kind = elementwise_kind(name)
    if kind == "foreach":
        lists = [d for i, d in enumerate(dims) if i < len(types) and str(types[i]) == "TensorList"]
        if not lists:
            return None
        n = sum(_numel(s) for s in lists[0] if isinstance(s, list))
        return float(n), None  # (element dtype of the lists not recorded)
    t = _tensors(dims, types)
    if not t:
        return None
    b = _base(name) or ""
    if b in ("fill", "zero"):
        x, es = t[0]
        return 0.0, float(_numel(x) * es)
    if b == "copy" and len(t) >= 2:
        (dst, es_d), (_src, es_s) = t[0], t[1]
        return 0.0, float(_numel(dst) * es_d + _numel(dst) * es_s)
    arity = 3 if b in _TERNARY else 2 if kind == "binary" or b == "pow" else 1
    if kind in ("unary", "binary") and len(t) > arity:
        ins = _broadcast([s for s, _ in t[:arity]])
        if ins is not None and t[-1][0] == ins:  # an `out=` tensor: written, not read
            t = t[:-1]
    read = sum(_numel(s) * es for s, es in t)
    if kind == "reduce":
        n_in = _numel(t[0][0])
        return float(n_in), float(read + t[0][1])  # (output written: small next to the input)
    if kind == "move" and b in ("cat", "stack"):
        return 0.0, float(2 * read)
    out = _broadcast([s for s, _ in t])
    if out is None:
        return None
    n_out = _numel(out) if out else 1
    flops = 0.0 if kind == "move" else float(n_out)
    return flops, float(read + n_out * t[0][1])


# ------------------------------------------------------------------------------------------- fp8 / custom GEMMs
#: Bytes per element of a c10::ScalarType code as `Concrete Inputs` writes an `out_dtype` argument.
_SCALAR_TYPE_BYTES = {
    0: 1,
    1: 1,
    2: 2,
    3: 4,
    4: 8,
    5: 2,
    6: 4,
    7: 8,
    11: 1,
    15: 2,
    23: 1,
    24: 1,
    25: 1,
    26: 1,
}


def _out_bytes(concrete: list, i: int, default: int) -> int:
    """Element size of an `out_dtype` argument (a ScalarType code) at Concrete Inputs[i], else `default`."""
    v = _ints(_concrete(concrete, i))
    return _SCALAR_TYPE_BYTES.get(v[0], default) if v and len(v) == 1 else default


def _scaled_mm(name, dims, types, concrete):
    """aten::_scaled_mm(a[M,K], b[K,N], scale_a, scale_b, bias?, scale_result?, out_dtype?, ...): the fp8
    GEMM, 2*M*N*K (+M*N with a bias); bytes: a, b and the scales read, the output (out_dtype, else a's
    type) written, a bias read."""
    if len(dims) < 2 or not (_is_shape(dims[0]) and _is_shape(dims[1])):
        return None
    a, b = dims[0], dims[1]
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    es_a, es_b = _esize(types[0]) if types else None, _esize(types[1]) if len(types) > 1 else None
    if es_a is None or es_b is None:
        return None
    m, k, n = a[0], a[1], b[1]
    es_c = _out_bytes(concrete, 6, es_a)
    scales = sum(  # (a per-tensor scale is a 0-d tensor: dims [], one element)
        math.prod(dims[i]) * (_esize(types[i]) or 4)
        for i in (2, 3)
        if i < len(dims) and isinstance(dims[i], list) and all(isinstance(x, int) for x in dims[i])
    )
    bias = _numel(dims[4]) if len(dims) > 4 and _is_shape(dims[4]) and _numel(dims[4]) == n else 0
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    byts = m * k * es_a + k * n * es_b + scales + m * n * es_c + bias * es_c
    return flops, float(byts)


def _gemm_nt(name, dims, types, concrete):
    """Custom linear GEMMs x[..., K] . W^T, W [N, K] (vLLM `rocm_unquantized_gemm`, aiter `gemm_a16w16`,
    `gemm_a8w8`): 2*M*N*K (+M*N with a bias [N]); bytes: x, W (and its scales) read, y [M, N] written in
    x's type (an explicit out_dtype where the op has one)."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (x, es_x), (w, es_w) = t[0], t[1]
    if len(w) != 2 or len(x) < 2 or x[-1] != w[1]:
        return None
    m, k, n = _numel(x[:-1]), w[1], w[0]
    rest = t[2:]
    bias = (
        any(len(s) == 1 and s[0] == n for s, _ in rest[-1:])
        if name == "vllm::rocm_unquantized_gemm"
        else False
    )
    scales = sum(
        _numel(s) * e for s, e in rest if name.startswith("aiter::gemm_a8w8") and 0 < _numel(s) < m * k
    )
    es_y = 2 if es_x == 1 else es_x  # fp8 / int8 inputs give a 16-bit output
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    byts = m * k * es_x + n * k * es_w + scales + m * n * es_y + (n * es_y if bias else 0)
    return flops, float(byts)


def _cutlass_scaled_mm(name, dims, types, concrete):
    """vLLM `_C::cutlass_scaled_mm(out[M,N], a[M,K], b[K,N], a_scales, b_scales, bias?)`: 2*M*N*K (+M*N);
    bytes: a, b, the scales read, out written."""
    t = _tensors(dims, types)
    if len(t) < 3:
        return None
    (out, es_o), (a, es_a), (b, es_b) = t[0], t[1], t[2]
    if len(a) != 2 or len(b) != 2 or len(out) != 2 or a[1] != b[0] or out != [a[0], b[1]]:
        return None
    m, k, n = a[0], a[1], b[1]
    extra = t[3:]
    bias = bool(extra) and len(extra[-1][0]) == 1 and extra[-1][0][0] == n and len(extra) == 3
    scales = sum(_numel(s) * e for s, e in extra[:2])
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    byts = m * k * es_a + k * n * es_b + scales + m * n * es_o + (n * extra[-1][1] if bias else 0)
    return flops, float(byts)


def _te_gemm(name, dims, types, concrete):
    """TransformerEngine `tex_ts::te_gemm_ts(A, A_scale_inv, A_fp8_idx, A_type, transa, B, B_scale_inv,
    B_fp8_idx, B_type, transb, D, ...)`: D [M, N] = op(B) op(A) in TE's column-major convention, K the dim
    of A that is not N: 2*M*N*K; bytes: A, B read, D written."""
    if len(dims) < 11 or not all(_is_shape(dims[i]) for i in (0, 5, 10)):
        return None
    a, b, d = dims[0], dims[5], dims[10]
    if len(a) != 2 or len(b) != 2 or len(d) != 2:
        return None
    m, n = d
    k = a[1] if a[0] == n else a[0] if a[1] == n else None
    if k is None or k not in b:
        return None
    es_a, es_b, es_d = (_esize(types[i]) if i < len(types) else None for i in (0, 5, 10))
    if es_a is None or es_b is None or es_d is None:
        return None
    return 2.0 * m * n * k, float(_numel(a) * es_a + _numel(b) * es_b + m * n * es_d)


def _te_linear(name, dims, types, concrete):
    """TransformerEngine `_Linear` (the autograd function of te.Linear, recorded with its arguments): the
    weight W [N, K] is its first 2-D tensor, the input the last tensor after it whose last dim is K (an fp8
    copy of W sits between them in older versions); 2*M*N*K (+M*N with a bias [N]); bytes: x, W, bias read,
    y written in x's type."""
    t = _tensors(dims, types)
    wi = next((i for i, (s, e) in enumerate(t) if len(s) == 2 and e), None)
    if wi is None:
        return None
    w, es_w = t[wi]
    xs = [(s, e) for s, e in t[wi + 1 :] if len(s) >= 2 and s[-1] == w[1] and e]
    if not xs:
        return None
    x, es_x = xs[-1]
    m, k, n = _numel(x[:-1]), w[1], w[0]
    bias = any(len(s) == 1 and s[0] == n for s, _ in t[wi + 1 :])
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    return flops, float(m * k * es_x + n * k * es_w + m * n * es_x + (n * es_x if bias else 0))


# ------------------------------------------------------------------------------------------- grouped GEMM, MoE
def _grouped_mm(name, dims, types, concrete):
    """aten::_grouped_mm / _scaled_grouped_mm(mat_a, mat_b, [scales,] offs?, ...): the MoE expert GEMMs.
    2-D x 3-D (tokens routed to G experts, a [T, K], b [G, K, N]): 2*T*K*N; 3-D x 3-D ([G, M, K] x
    [G, K, N]): 2*G*M*K*N; 2-D x 2-D (the weight gradient, K split by offs: a [M, Ktot], b [Ktot, N]):
    2*M*Ktot*N. Bytes: a, b read, the output written in a's type (16-bit for fp8 inputs)."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (a, es_a), (b, es_b) = t[0], t[1]
    es_c = _out_bytes(concrete, len(dims) - 2, 2 if es_a == 1 else es_a) if "scaled" in name else es_a
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:
        out = a[0] * b[2]
        flops = 2.0 * a[0] * a[1] * b[2]
    elif len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        out = a[0] * a[1] * b[2]
        flops = 2.0 * a[0] * a[1] * a[2] * b[2]
    elif len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        groups = _numel(t[-1][0]) if len(t) > 2 and len(t[-1][0]) == 1 else 1
        out = groups * a[0] * b[1]
        flops = 2.0 * a[0] * a[1] * b[1]
    else:
        return None
    scales = sum(_numel(s) * e for s, e in t[2:4] if "scaled" in name and len(s) <= 2)
    return flops, float(_numel(a) * es_a + _numel(b) * es_b + scales + out * es_c)


def _fused_experts(name, dims, types, concrete):
    """vLLM `fused_experts` (outplace / inplace): hidden [T, H], w1 [E, N1, H] (gate and up: N1 = 2I), w2
    [E, H, N2], top-k weights and ids [T, k]. Each of the T*k routed rows runs both expert GEMMs:
    2*T*k*(N1*H + H*N2). Bytes: hidden and the routing read, the output [T, H] written, and the weights of
    the experts the tokens reach, min(E, T*k) of E (all of them once T*k >= E, as in prefill)."""
    t = _tensors(dims, types)
    if len(t) < 5:
        return None
    (x, es_x), (w1, es_w1), (w2, es_w2), (tw, es_tw), (ti, es_ti) = t[:5]
    if len(x) != 2 or len(w1) != 3 or len(w2) != 3 or len(ti) != 2 or ti[0] != x[0]:
        return None
    tok, h = x
    e, n1, n2 = w1[0], w1[1], w2[2]
    if w1[2] != h or w2[0] != e or w2[1] != h:
        return None
    routed = tok * ti[1]
    flops = 2.0 * routed * (n1 * h + h * n2)
    touched = min(e, routed)
    byts = (
        2 * _numel(x) * es_x
        + touched * (n1 * h * es_w1 + h * n2 * es_w2)
        + _numel(tw) * es_tw
        + _numel(ti) * es_ti
    )
    return flops, float(byts)


def _moe_layer(name, dims, types, concrete, ctx: OpContext | None = None):
    """vLLM `moe_forward` (the fused MoE layer as one op: hidden [T, H], router logits [T, E]): its shapes
    give T, H and E, not the experts' top-k and size. With those (top-k from a routing op nested in it or
    the model config; the expert intermediate size I from the model config): the routed rows T*k run the
    expert MLP, 2*T*k*H*I*(3 gated, 2 not) FLOPs (+ the router GEMM is a separate op); bytes: hidden read,
    output written, the touched experts' weights, min(E, T*k) x H*I*(3 or 2)."""
    if ctx is None or not ctx.moe_top_k or not ctx.moe_intermediate:
        return None
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (x, es), (logits, _) = t[0], t[1]
    if len(x) != 2 or len(logits) != 2 or logits[0] != x[0]:
        return None
    tok, h = x
    e, k, i = logits[1], ctx.moe_top_k, ctx.moe_intermediate
    mult = 3 if ctx.moe_gated else 2
    routed = tok * k
    flops = 2.0 * routed * h * i * mult
    byts = 2 * tok * h * es + min(e, routed) * h * i * mult * es
    return flops, float(byts)


# ------------------------------------------------------------------------------------------- attention kernels
def _pairs(b: int, sq: int, sk: int, causal: bool) -> float:
    """Query-key pairs a batch of b sequences computes: b*sq*sk, less the masked half sq^2/2 when causal
    (bottom-right aligned: the sq queries are the last of the sk keys; sq = sk gives the halving of
    docs/mfu.md)."""
    return float(b) * (sq * sk - (sq * sq / 2.0 if causal else 0.0))


def _attn_cost(pairs: float, h: int, d: int, dv: int, in_bytes: float, out_elems: int, es: int, bwd: bool):
    fwd = 2.0 * h * (d + dv) * pairs
    if bwd:
        return 2.5 * fwd, float(2 * in_bytes + 2 * out_elems * es)
    return fwd, float(in_bytes + out_elems * es)


#: flash-attn's custom ops and autograd function: (varlen?, backward?, index of `causal` in Concrete Inputs)
_FLASH = {
    "flash_attn::_flash_attn_forward": (False, False, 5),
    "FlashAttnFunc": (False, False, 5),
    "flash_attn::_flash_attn_backward": (False, True, 11),
    "flash_attn::_flash_attn_varlen_forward": (True, False, 9),
    "flash_attn::_flash_attn_varlen_backward": (True, True, 15),
    "aiter::mha_fwd": (False, False, 5),
    "aiter::_flash_attn_forward": (False, False, 5),
    "aiter::mha_batch_prefill": (True, False, 12),
}


def _flash(name, dims, types, concrete, ctx: OpContext | None = None):
    """flash-attn (and aiter's ports of it): q/k/v [B, S, H, D], or packed [T, H, D] with cu_seqlens (varlen;
    aiter's batch prefill reads k/v from a paged cache) and max_seqlen_q / _k after them. FLOPs as the
    attention family, with the query-key pairs of `_pairs`. A varlen batch's pairs need each sequence's
    lengths, which the shapes give only when every sequence has the longest length (T = B*max_seqlen, and
    max_seqlen_k = max_seqlen_q: every query sees its own sequence): else the engine iteration's sums of
    sq*sk (OpContext), else null. Backward: 2.5x forward; the ops take grad_out first."""
    varlen, bwd, ci = _FLASH[name]
    off = 1 if bwd else 0
    t = _tensors(dims, types)
    if len(t) < 3 + off:
        return None
    (q, es), (k, _), (v, _) = t[off], t[off + 1], t[off + 2]
    causal = _bool(_concrete(concrete, ci))
    if not varlen:
        if not (len(q) == len(k) == len(v) == 4) or causal is None:
            return None
        b, sq, h, d = q
        sk, dv = k[1], v[3]
        in_b = es * (_numel(q) + _numel(k) + _numel(v))
        return _attn_cost(_pairs(b, sq, sk, causal), h, d, dv, in_b, b * sq * h * dv, es, bwd)
    if len(q) != 3 or len(k) < 3 or len(v) < 3:
        return None
    tq, h, d = q
    dv, hk = v[-1], k[-2]
    # cu_seqlens_q: the first 1-D int tensor after q, k, v
    cu = next((s for s, _ in t[off + 3 :] if len(s) == 1), None)
    mi = 6 if name == "aiter::mha_batch_prefill" else (11 if bwd else 5)
    mq, mk = _first_int(_concrete(concrete, mi)), _first_int(_concrete(concrete, mi + 1))
    nb = cu[0] - 1 if cu else None
    pairs = None
    equal = False
    if causal is not None and nb and mq and mk and tq == nb * mq and mk == mq:
        equal = True
        pairs = _pairs(nb, mq, mq, causal)
    elif ctx is not None and not bwd:
        pairs = _ctx_pairs(ctx, tq)
    if pairs is None:
        return None
    if name != "aiter::mha_batch_prefill":  # packed k/v [Tk, Hk, D]
        kv_tokens = k[0]
    elif not equal and ctx is not None and ctx.c_sk is not None and ctx.g_sk is not None:
        kv_tokens = ctx.c_sk + ctx.g_sk  # (a paged cache: the keys the batch reads, not the cache's size)
    else:
        kv_tokens = tq
    in_b = es * (_numel(q) + 2 * kv_tokens * hk * d)
    return _attn_cost(pairs, h, d, dv, in_b, tq * h * dv, es, bwd)


def _ctx_pairs(ctx: OpContext, tokens: int) -> float | None:
    """Query-key pairs of an engine iteration (prefill causal within its new tokens: sq*sk - sq^2/2; decode
    sq*sk), when its annotation gives the sums and its tokens are the op's (not a padded graph's)."""
    if ctx.c_sqsk is None or ctx.g_sqsk is None or ctx.c_sqsq is None:
        return None
    if ctx.c_sq is not None and ctx.g_sq is not None and ctx.c_sq + ctx.g_sq != tokens:
        return None
    return ctx.c_sqsk - ctx.c_sqsq / 2.0 + ctx.g_sqsk


def _engine_attention(name, dims, types, concrete, ctx: OpContext | None = None):
    """Attention of inference engines over a paged KV cache (vLLM `unified_attention(_with_output)`, aiter
    `mha_varlen_fwd` / `fmha_v3_varlen_fwd`, vLLM's flash-attn builds, FlashInfer): q [T, H, D] (the op's
    first 3-D tensor with the iteration's T rows) and k after it ([T, Hk, D] or a paged cache [..., Hk, D]),
    whose shapes do not say which keys each query sees. FLOPs from the engine iteration's sums (OpContext):
    2*H*(D + Dv)*(c_sqsk - c_sqsq/2 + g_sqsk) with Dv = D, as AMD TraceLens' inference attention; bytes: q
    read, output written, the keys and values the iteration's queries see (c_sk + g_sk tokens; the new tokens
    when the annotation does not state them)."""
    if ctx is None or ctx.c_sq is None or ctx.g_sq is None:
        return None
    t = [(s, e) for s, e in _tensors(dims, types) if e >= 2]  # (floating tensors: q, k, v, out, caches)
    tokens = ctx.c_sq + ctx.g_sq
    qi = next((i for i, (s, _) in enumerate(t) if len(s) == 3 and s[0] == tokens), None)
    if qi is None:
        return None
    q, es = t[qi]
    tq, h, d = q
    # the keys: the next tensor of 3 or more dims whose last is the head dim ([T, Hk, D] or a paged cache
    # [blocks, block, Hk, D]); its heads the second-to-last dim
    k = next((s for s, _ in t[qi + 1 :] if len(s) >= 3 and s[-1] == d), None)
    if k is None:
        return None
    pairs = _ctx_pairs(ctx, tq)
    if pairs is None:
        return None
    hk, dv = k[-2], d
    sk = ctx.c_sk + ctx.g_sk if ctx.c_sk is not None and ctx.g_sk is not None else tq
    return _attn_cost(pairs, h, d, dv, es * (_numel(q) + sk * hk * (d + dv)), tq * h * dv, es, False)


# ------------------------------------------------------------------------------------------- fused inference ops
def _fused_rmsnorm(name, dims, types, concrete):
    """Fused RMSNorm kernels of the engines (aiter `rmsnorm` / `rms_norm` / `rmsnorm2d_fwd*`, vLLM `_C::rms_norm`
    / `fused_add_rms_norm` and its aiter wrappers, sgl-kernel `rmsnorm` / `fused_add_rmsnorm`): 4 FLOPs per
    element (square, sum, scale by the rsqrt, weight), 5 when a residual is added first (`add` in the name).
    Bytes: the input read and the output written (with a residual: input and residual read, the sum and the
    output written), the weight [H] read; in-place or out-of-place alike."""
    t = _tensors(dims, types)
    acts = [(s, e) for s, e in t if len(s) >= 2]
    if not acts:
        return None
    x, es = acts[0]
    n = _numel(x)
    if n == 0 or any(_numel(s) != n for s, _ in acts):
        return None
    add = "add" in name.split("::")[-1]
    weight = sum(_numel(s) * e for s, e in t if len(s) == 1 and s[0] == x[-1])
    return float((5 if add else 4) * n), float(n * es * (4 if add else 2) + weight)


def _act_and_mul(name, dims, types, concrete):
    """silu_and_mul / gelu_and_mul (vLLM `_C`, sgl-kernel, aiter): out [T, I] = act(x[:, :I]) * x[:, I:]
    of x [T, 2I]: 2 FLOPs per output element (the activation, counted 1 as the elementwise family, and the
    product); bytes: x read, out written."""
    t = _tensors(dims, types)
    if len(t) != 2:
        return None
    (a, es_a), (b, es_b) = t
    (x, es_x), (y, es_y) = ((a, es_a), (b, es_b)) if _numel(a) == 2 * _numel(b) else ((b, es_b), (a, es_a))
    if _numel(x) != 2 * _numel(y) or _numel(y) == 0 or x[:-1] != y[:-1]:
        return None
    return 2.0 * _numel(y), float(_numel(x) * es_x + _numel(y) * es_y)


def _rotary(name, dims, types, concrete):
    """Rotary embedding in place (vLLM `_C::rotary_embedding`, sgl-kernel `rotary_embedding`): positions [T],
    query [T, Hq*D], key [T, Hk*D], head_size D, cos_sin_cache [P, R] (R = rotary dim), is_neox. Each
    rotated element is x*cos -/+ x'*sin: 3 FLOPs, on R of every head's D; bytes: q and k read and written,
    the positions and one cache row per token read."""
    if len(dims) < 5:
        return None
    t = dims
    pos, q, k, cache = t[0], t[1], t[2], t[4]
    hd = _ints(_concrete(concrete, 3))
    es = _esize(types[1]) if len(types) > 1 else None
    es_c = _esize(types[4]) if len(types) > 4 else None
    if not (_is_shape(pos) and _is_shape(q) and _is_shape(cache)) or not hd or es is None or es_c is None:
        return None
    d = hd[0]
    kn = _numel(k) if _is_shape(k) else 0
    tok = _numel(pos)
    if d <= 0 or len(cache) != 2 or (_numel(q) + kn) % d or cache[1] > d:
        return None
    heads_tok = (_numel(q) + kn) // d  # (q and k heads) x tokens
    rot = cache[1]
    flops = 3.0 * heads_tok * rot
    byts = 2 * (_numel(q) + kn) * es + tok * (_esize(types[0]) or 8) + tok * rot * es_c
    return flops, float(byts)


def _kv_store(name, dims, types, concrete):
    """Writing the new tokens' keys and values into the paged KV cache (vLLM `reshape_and_cache(_flash)`,
    `unified_kv_cache_update`, SGLang `store_cache`): no FLOPs; bytes: k and v read, as many written to the
    cache (in the cache's type), the slot of each token read."""
    t = _tensors(dims, types)
    if len(t) < 2:
        return None
    (k, es_k), (v, es_v) = t[0], t[1]
    n_k, n_v = _numel(k), _numel(v)
    if not n_k or not n_v:
        return None
    es_cache = t[2][1] if len(t) > 2 and _numel(t[2][0]) > n_k else es_k
    slots = next((_numel(s) * e for s, e in t[2:] if len(s) == 1 and s[0] == k[0]), 0)
    return 0.0, float(n_k * es_k + n_v * es_v + (n_k + n_v) * es_cache + slots)


# ------------------------------------------------------------------------------------------- dispatch
_MODELS: dict[str, Any] = {}
for _n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"):
    _MODELS[_n] = ("gemm", _mm)
_MODELS["aten::matmul"] = ("gemm", _matmul)
_MODELS["aten::linear"] = ("gemm", _linear)
for _n in _ATTN:
    _MODELS[_n] = ("attention", _attention)
for _n in _CONV:
    _MODELS[_n] = ("conv", _conv)
for _n in _NORM_FLOPS:
    _MODELS[_n] = ("norm", _norm)
for _n in _SOFTMAX:
    _MODELS[_n] = ("softmax", _softmax)
for _n in ("aten::embedding", "aten::embedding_dense_backward"):
    _MODELS[_n] = ("embedding", _embedding)
for _n in _OPTIM:
    _MODELS[_n] = ("optimizer", _optimizer)
_MODELS["aten::_scaled_mm"] = ("gemm", _scaled_mm)
for _n in (
    "vllm::rocm_unquantized_gemm",
    "aiter::gemm_a16w16",
    "aiter::gemm_a8w8",
    "aiter::gemm_a8w8_bpreshuffle",
    "aiter::gemm_a8w8_blockscale",
):
    _MODELS[_n] = ("gemm", _gemm_nt)
_MODELS["_C::cutlass_scaled_mm"] = ("gemm", _cutlass_scaled_mm)
_MODELS["tex_ts::te_gemm_ts"] = ("gemm", _te_gemm)
_MODELS["_Linear"] = ("gemm", _te_linear)
for _n in ("aten::_grouped_mm", "aten::_scaled_grouped_mm"):
    _MODELS[_n] = ("grouped_gemm", _grouped_mm)
for _n in ("vllm::outplace_fused_experts", "vllm::inplace_fused_experts"):
    _MODELS[_n] = ("moe", _fused_experts)
for _n in ("vllm::moe_forward", "vllm::moe_forward_shared"):
    _MODELS[_n] = ("moe", _moe_layer)
for _n in _FLASH:
    _MODELS[_n] = ("attention", _flash)
#: Engine attention over a paged KV cache, rated from the iteration's annotation (`_engine_attention`).
ENGINE_ATTENTION = (
    "vllm::unified_attention",
    "vllm::unified_attention_with_output",
    "aiter::mha_varlen_fwd",
    "aiter::fmha_v3_varlen_fwd",
    "_vllm_fa2_C::varlen_fwd",
    "_vllm_fa3_C::fwd",
)
for _n in ENGINE_ATTENTION:
    _MODELS[_n] = ("attention", _engine_attention)
_FLASHINFER_ATTN = re.compile(r"^flashinfer::\w*(prefill|decode|attention)", re.IGNORECASE)
for _n in (
    "aiter::rmsnorm",
    "aiter::rms_norm",
    "aiter::add_rmsnorm",
    "aiter::rmsnorm2d_fwd",
    "aiter::rmsnorm2d_fwd_ck",
    "aiter::rmsnorm2d_fwd_with_add",
    "aiter::rmsnorm2d_fwd_with_add_ck",
    "vllm::rocm_aiter_rms_norm",
    "vllm::rocm_aiter_rmsnorm2d_fwd_with_add",
    "_C::rms_norm",
    "_C::fused_add_rms_norm",
    "sgl_kernel::rmsnorm",
    "sgl_kernel::fused_add_rmsnorm",
    "sgl_kernel::gemma_rmsnorm",
    "sgl_kernel::gemma_fused_add_rmsnorm",
):
    _MODELS[_n] = ("norm", _fused_rmsnorm)
for _ns in ("_C", "sgl_kernel", "aiter"):
    for _a in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        _MODELS[f"{_ns}::{_a}"] = ("activation", _act_and_mul)
for _n in ("_C::rotary_embedding", "sgl_kernel::rotary_embedding"):
    _MODELS[_n] = ("rotary", _rotary)
for _n in (
    "_C_cache_ops::reshape_and_cache",
    "_C_cache_ops::reshape_and_cache_flash",
    "vllm::unified_kv_cache_update",
    "sglang::store_cache",
):
    _MODELS[_n] = ("kv_cache", _kv_store)
#: Models that read an OpContext (the others see the op's own shapes only).
_CONTEXT_MODELS = {_flash, _engine_attention, _moe_layer}
_GDN = re.compile(r"chunk_gated_delta_rule", re.IGNORECASE)


def op_family(name: str) -> str | None:
    """The model family of an operator name (gemm, attention, gated_deltanet, conv, norm, softmax,
    embedding, optimizer, elementwise) or None when it has none."""
    if name in _MODELS:
        return _MODELS[name][0]
    if _GDN.search(name):
        return "gated_deltanet"
    if _FLASHINFER_ATTN.search(name):
        return "attention"
    if elementwise_kind(name) is not None:
        return "elementwise"
    return None


def op_cost(
    name: str, dims: Any, types: Any, concrete: Any = None, context: OpContext | None = None
) -> OpCost | None:
    """FLOPs and bytes of one call of `name`, or None (no model, or shapes missing/unusable). `context`: what
    the op's surroundings say (OpContext), read by the models that need it."""
    if not isinstance(dims, list) or not dims:
        return None
    types = types if isinstance(types, list) else []
    concrete = concrete if isinstance(concrete, list) else []
    fam = op_family(name)
    if fam is None:
        return None
    fn: Any
    if fam == "gated_deltanet":
        fn = _gated_delta
    elif fam == "elementwise":
        fn = _elementwise
    elif name not in _MODELS:  # (FlashInfer attention, by its name)
        fn = _engine_attention
    else:
        fn = _MODELS[name][1]
    try:
        if fn in _CONTEXT_MODELS:
            res = fn(name, dims, types, concrete, context)
        else:
            res = fn(name, dims, types, concrete)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    if res is None:
        return None
    flops, byts = res
    if not math.isfinite(flops) or flops < 0:
        return None
    if byts is not None and (not math.isfinite(byts) or byts < 0):
        return None
    if byts is not None and any(str(t) in ("TensorList", "GenericList") for t in types):
        byts = None  # some inputs are tensor lists of unrecorded dtype: their bytes are unknown
    return OpCost(
        flops=float(flops), bytes=None if byts is None else float(byts), model=fam, dtype=_dclass(types)
    )
