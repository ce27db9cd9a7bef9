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
_GDN = re.compile(r"chunk_gated_delta_rule", re.IGNORECASE)


def op_family(name: str) -> str | None:
    """The model family of an operator name (gemm, attention, gated_deltanet, conv, norm, softmax,
    embedding, optimizer, elementwise) or None when it has none."""
    if name in _MODELS:
        return _MODELS[name][0]
    if _GDN.search(name):
        return "gated_deltanet"
    if elementwise_kind(name) is not None:
        return "elementwise"
    return None


def op_cost(name: str, dims: Any, types: Any, concrete: Any = None) -> OpCost | None:
    """FLOPs and bytes of one call of `name`, or None (no model, or shapes missing/unusable)."""
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
    else:
        fn = _MODELS[name][1]
    try:
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
