"""The one table of communication kernel families, the CPU ops that mark communication, and the rule that
reads a collective's size from a CPU op's `Input Dims` / `Input type`. See docs/breakdown.md.

Everything that decides "is this kernel communication?" (analyze.rank.classify, analyze.comm.collectives, the
conformance suite) reads `FAMILIES`, `COMM_CPU_OP` and `MEMORY_FAMILIES` from here, so a new family is one
line in one place.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any, NamedTuple


class Family(NamedTuple):
    name: str
    kernel: re.Pattern  # searched in the kernel name (names often start with `void ` and a namespace)
    what: str


#: Communication kernel families (class "communication"). Order matters only for the reported family.
FAMILIES: tuple[Family, ...] = (
    Family(
        "nccl",
        re.compile(r"^(nccl(Dev)?Kernel_|ncclKernel|ncclDevKernel|ncclSymk|ncclDevFunc)", re.IGNORECASE),
        "NCCL collective / P2P kernels, old (`ncclKernel_SendRecv_*`) and new (`ncclDevKernel_*`) names",
    ),
    Family(
        "rccl", re.compile(r"^rccl|ncclDevKernel_Generic", re.IGNORECASE), "RCCL (`ncclDevKernel_Generic`)"
    ),
    Family(
        "symm_mem",
        re.compile(
            r"multimem_(all_reduce|all_gather|reduce_scatter|ld_reduce|st)|one_shot_all_reduce|"
            r"two_shot_all_reduce|symm_mem",
            re.IGNORECASE,
        ),
        "PyTorch symmetric memory all-reduce / all-gather (multimem, one_shot, two_shot)",
    ),
    Family(
        "custom_allreduce",
        re.compile(r"cross_device_reduce|custom_all_?reduce", re.IGNORECASE),
        "vLLM / SGLang / aiter custom all-reduce (`cross_device_reduce_1stage`, `_2stage`)",
    ),
    Family("deepep", re.compile(r"\b(deep_ep|dpsk::ep)::", re.IGNORECASE), "DeepEP MoE dispatch / combine"),
    Family("nvshmem", re.compile(r"nvshmem", re.IGNORECASE), "NVSHMEM kernels"),
    Family("mscclpp", re.compile(r"mscclpp", re.IGNORECASE), "MSCCL++ kernels"),
)

#: Kernel families that move memory, not compute (class "memory"), besides memcpy / memset names.
MEMORY_FAMILIES: tuple[Family, ...] = (
    Family(
        "memcpy",
        re.compile(r"^(Memcpy|Memset|\[?memcpy|\[?memset|hipMemcpy|hipMemset)", re.IGNORECASE),
        "memcpy / memset activities and kernels named like them",
    ),
    Family("mtia_dma", re.compile(r"^dma_request$", re.IGNORECASE), "MTIA DMA transfers (`dma_request`)"),
)

#: CPU ops (cpu_op / user_annotation names) that are communication: a kernel launched directly inside one
#: (it is the innermost op enclosing the launch) is communication whatever its name.
COMM_CPU_OP = re.compile(
    r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms$|gloo:|nccl:|rccl:|hccl:|"
    r"ProcessGroup|symm_mem::|deep_ep::|dpsk::ep::|_C_custom_ar::|vllm::all_reduce|"
    r"sgl_kernel::.*all_reduce|nvshmem|mscclpp)"
)


def family_of_kernel(name: str | None) -> str | None:
    """Name of the communication family a kernel name belongs to, else None."""
    if not isinstance(name, str):
        return None
    for f in FAMILIES:
        if f.kernel.search(name):
            return f.name
    return None


def is_memory_kernel(name: str | None) -> bool:
    return isinstance(name, str) and any(f.kernel.search(name) for f in MEMORY_FAMILIES)


def is_comm_cpu_op(name: str | None) -> bool:
    return isinstance(name, str) and bool(COMM_CPU_OP.match(name))


# ------------------------------------------------------------------------------------ sizes from shapes
#: c10d ops whose first two tensor inputs are (output, input) rather than (input, ...).
_OUT_IN = re.compile(r"(_base_|into_tensor|alltoall_base|_allgather_base|_reduce_scatter_base)")

#: c10d ops whose first two arguments are (output, input) tensors or tensor lists (torch 2.x schemas, e.g.
#: `allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, ...)`, `alltoall_(Tensor[] output_tensors,
#: Tensor[] input_tensors, ...)`); the other c10d collectives take their one tensor (list) first
#: (`allreduce_(Tensor[] tensors, ...)`, `send`, `recv_`, `broadcast_`, `reduce_`, `barrier`).
_C10D_OUT_IN_ARGS = re.compile(
    r"^c10d::(allgather_|allgather_coalesced_|gather_|alltoall_|reduce_scatter_|scatter_|"
    r"allgather_into_tensor_coalesced_|reduce_scatter_tensor_coalesced_)$"
)


def _nelems(dims: Any) -> int | None:
    """Elements of one tensor's shape (a list of ints); None for anything else (a list, a scalar: [])."""
    if not isinstance(dims, list) or not dims:
        return None
    if not all(type(d) is int and d >= 0 for d in dims):
        return None
    return math.prod(dims)


def _arg_nelems(dims: Any) -> int | None:
    """Elements of one argument: a tensor's shape, or a tensor list's shapes (torch 2.x records a `Tensor[]`
    as the list of its tensors' shapes, `[[6, 5], [3]]`: their sum). `[]` (an empty or nested list, a
    scalar) and anything else: None."""
    n = _nelems(dims)
    if n is not None or not isinstance(dims, list) or not dims:
        return n
    total = 0
    for d in dims:
        k = _nelems(d)
        if k is None:
            return None
        total += k
    return total


def sizes_from_shapes(name: str, dims: Any, types: Any) -> tuple[int | None, int | None, str | None]:
    """(in_nelems, out_nelems, dtype) of a communication CPU op from its `Input Dims` / `Input type`.

    `nccl:*` / `gloo:*` annotations: the first tensor is the input (output unknown). `c10d::*` ops named
    `*_base_` / `*into_tensor*` / `alltoall_base_`: (output, input). c10d ops whose schema starts with
    (output, input) tensor lists (`allgather_`, `alltoall_`, `gather_`, `scatter_`, `reduce_scatter_`, ...):
    arguments 0 and 1, a tensor list counting the elements of all its tensors, a `Tensor[][]` (recorded `[]`)
    unknown. Other c10d ops: the first tensor or tensor list is the input (`allreduce_`'s `[[[6, 5]]]` -> 30).
    A tensor list's `Input type` is `TensorList`: its dtype is unknown (null), not guessed. Empty lists
    (dims `[]`) and scalars give nothing: unknown, never 0.
    """
    if not isinstance(dims, list):
        return None, None, None
    types = types if isinstance(types, list) else []

    def typ(i: int) -> str | None:
        return types[i] if i < len(types) and isinstance(types[i], str) else None

    if name.startswith("c10d::") and _C10D_OUT_IN_ARGS.match(name) and len(dims) >= 2:
        out_n, in_n = _arg_nelems(dims[0]), _arg_nelems(dims[1])
        if out_n is None and in_n is None:
            return None, None, None
        return in_n, out_n, _dtype_name(typ(1) if in_n is not None else typ(0)) or _dtype_name(typ(0))
    tensors = []
    lists = name.startswith("c10d::")  # c10d ops take tensor lists; annotations list tensors
    for i, d in enumerate(dims):
        n = _arg_nelems(d) if lists else _nelems(d)
        if n is not None:
            tensors.append((n, typ(i)))
    if not tensors:
        return None, None, None
    if name.startswith("c10d::") and _OUT_IN.search(name) and len(tensors) >= 2:
        (out_n, out_t), (in_n, in_t) = tensors[0], tensors[1]
        return in_n, out_n, _dtype_name(in_t or out_t)
    n, t = tensors[0]
    return n, None, _dtype_name(t)


@lru_cache(maxsize=256)
def _dtype_name(t: str | None) -> str | None:
    """A C++ `Input type` as the c10 dtype name collectives.DTYPE_BYTES knows (None when unknown)."""
    if not t:
        return None
    low = t.strip().lower()
    c10 = {
        "float": "float", "double": "double", "c10::half": "half", "half": "half", "c10::bfloat16": "bfloat16",
        "bfloat16": "bfloat16", "int": "int", "long int": "long", "long": "long", "long long": "long",
        "short int": "short", "short": "short", "signed char": "char", "char": "char", "unsigned char": "byte",
        "bool": "bool", "c10::complex<float>": "complexfloat", "c10::complex<double>": "complexdouble",
        "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
        "c10::float8_e4m3fnuz": "float8_e4m3fnuz", "c10::float8_e5m2fnuz": "float8_e5m2fnuz",
    }  # fmt: skip
    return c10.get(low)
