"""Dense (no sparsity) peak tensor-core FLOP/s per GPU, chosen from Kineto deviceProperties names.

Numbers are the vendors' datasheet dense peaks per GPU (per device as the profiler sees it). Unknown GPUs
and unsupported dtypes give None: the MFU is then null unless the user passes --peak-tflops.
"""

from __future__ import annotations

import re

from tracelens.errors import BadInputError

# (pattern on the lower-cased device name, canonical name, 16-bit TFLOP/s, FP8 TFLOP/s or None).
# Order matters: the first match wins (GB200 before B200, H100 PCIe/NVL before H100).
_GPUS: tuple[tuple[str, str, float | None, float | None], ...] = (
    (r"gb200", "GB200", 2500.0, 5000.0),
    (r"b200", "B200", 2250.0, 4500.0),
    (r"gh200", "GH200", 989.0, 1979.0),
    (r"h200", "H200", 989.0, 1979.0),
    (r"(h100|h800).*pcie", "H100 PCIe", 756.0, 1513.0),
    (r"h100.*nvl", "H100 NVL", 835.0, 1671.0),
    (r"h100|h800", "H100 SXM", 989.0, 1979.0),
    (r"a100|a800", "A100", 312.0, None),
    (r"mi325x", "MI325X", 1307.0, 2615.0),
    (r"mi300x", "MI300X", 1307.0, 2615.0),
    (r"v100.*pcie", "V100 PCIe", None, None),
    (r"v100", "V100 SXM2", None, None),
)
# V100 has no BF16 or FP8; its FP16 tensor peak is kept separately.
_FP16_ONLY = {"V100 PCIe": 112.0, "V100 SXM2": 125.0}

_DTYPES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
}


def canonical_gpu(gpu_name: str | None) -> str | None:
    """Canonical GPU family for a deviceProperties name ("NVIDIA H100 80GB HBM3" -> "H100 SXM"), or None."""
    if not gpu_name:
        return None
    low = gpu_name.lower()
    for pattern, canon, _, _ in _GPUS:
        if re.search(pattern, low):
            return canon
    return None


def peak_flops(gpu_name: str | None, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of one GPU for `dtype` (bf16, fp16, fp8); None when the GPU or dtype is unknown
    or unsupported on that GPU (A100 FP8, V100 BF16)."""
    kind = _DTYPES.get(str(dtype).lower())
    if kind is None:
        raise BadInputError(f"unknown dtype '{dtype}' for peak FLOP/s (known: bf16, fp16, fp8)")
    canon = canonical_gpu(gpu_name)
    if canon is None:
        return None
    for _, name, half, fp8 in _GPUS:
        if name == canon:
            if kind == "fp8":
                tflops = fp8
            elif half is None and kind == "fp16":
                tflops = _FP16_ONLY.get(name)
            else:
                tflops = half
            return None if tflops is None else tflops * 1e12
    return None  # pragma: no cover - canon always comes from _GPUS


def known_gpus() -> list[str]:
    """Canonical names of the GPUs with known peaks."""
    return [name for _, name, _, _ in _GPUS]


# ------------------------------------------------------------------------------------------ roofline peaks
# For the per-op roofline (tracelens.analyze.efficiency.ops): HBM bandwidth (TB/s) and the FP32 non-tensor peak
# (TFLOP/s) per GPU, from the vendors' datasheets (docs/ops.md lists the sources). Pattern on the
# lower-cased device name; first match wins. MI250(X)/MI210 have no 16-bit entry above but a bandwidth here.
_MEMORY: tuple[tuple[str, float, float | None], ...] = (
    (r"gb200", 8.0, 80.0),
    (r"b200", 8.0, 80.0),
    (r"gh200", 4.0, 67.0),
    (r"h200", 4.8, 67.0),
    (r"(h100|h800).*pcie", 2.0, 51.0),
    (r"h100.*nvl", 3.9, 60.0),
    (r"h100|h800", 3.35, 67.0),
    (r"a100.*80\s*gb|a800.*80\s*gb", 2.039, 19.5),
    (r"a100|a800", 1.555, 19.5),
    (r"mi325x", 6.0, 163.4),
    (r"mi300x", 5.3, 163.4),
    (r"mi250x|mi250", 3.2768, 47.9),
    (r"mi210", 1.6384, 22.6),
    (r"v100.*pcie", 0.9, 14.0),
    (r"v100", 0.9, 15.7),
)


def _memory_row(gpu_name: str | None) -> tuple[float, float | None] | None:
    if not gpu_name:
        return None
    low = gpu_name.lower()
    for pattern, tbps, fp32 in _MEMORY:
        if re.search(pattern, low):
            return tbps, fp32
    return None


def hbm_bandwidth(gpu_name: str | None) -> float | None:
    """Peak HBM bandwidth of one GPU in bytes/s, or None when the GPU is unknown."""
    row = _memory_row(gpu_name)
    return None if row is None else row[0] * 1e12


def roofline_peak_flops(gpu_name: str | None, dtype_class: str | None) -> float | None:
    """The compute peak a roofline uses for an op computing in `dtype_class` (bf16, fp16, fp8: dense
    tensor-core peak of peak_flops; fp32: the FP32 non-tensor peak); None when unknown (fp64 too)."""
    if dtype_class in ("bf16", "fp16", "fp8"):
        return peak_flops(gpu_name, dtype_class)
    if dtype_class == "fp32":
        row = _memory_row(gpu_name)
        return None if row is None or row[1] is None else row[1] * 1e12
    return None
