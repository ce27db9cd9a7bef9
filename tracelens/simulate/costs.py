"""Hardware constants and kernel cost model of the simulator.

Two kernel-cost presets (`KERNEL_COSTS`, `tracelens simulate --kernel-costs NAME`):

- `published` (the default, used by the committed samples): efficiencies from published H100 numbers
  (docs/simulator.md): dense BF16 cuBLAS GEMMs ~70-75% of the 989 TFLOP/s peak on large shapes,
  FlashAttention-2 ~35% forward / ~30% backward, the chunked Gated DeltaNet Triton kernels
  (flash-linear-attention) ~20-25%, memory-bound kernels ~75-80% of HBM bandwidth.
- `h200-measured`: fitted to kernels timed on an NVIDIA H200 by scripts/record_cuda_block.py
  (docs/calibration.md): cuBLAS GEMMs of the Qwen3.5-27B TP=4 shapes, cuDNN fused attention (what
  PyTorch 2.11 and Transformer Engine run on Hopper), an elementwise kernel for HBM bandwidth.

Both: NVLink4 all-reduce bus bandwidth ~360 GB/s within a host and ~45 GB/s per GPU over 400 Gb/s
InfiniBand (nccl-tests results published for DGX H100); the Gated DeltaNet efficiency stays the published
one in both (the recording ran an eager reference implementation, not fla's fused kernels).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """What the cost model needs to know about one GPU type."""

    key: str
    device_name: str  # deviceProperties.name as CUDA reports it
    total_mem: int
    num_sms: int
    peak_bf16: float  # dense FLOP/s (fallback when tracelens.models.hardware is unavailable)
    hbm_bw: float  # bytes/s
    nvlink_busbw: float  # bytes/s, collective bus bandwidth within a host
    net_busbw: float  # bytes/s, collective bus bandwidth across hosts (per GPU)
    p2p_intra: float  # bytes/s, send/recv within a host
    p2p_inter: float  # bytes/s, send/recv across hosts


GPUS = {
    "H100": GpuSpec(
        "H100", "NVIDIA H100 80GB HBM3", 85_045_346_304, 132, 989e12, 3.35e12, 360e9, 45e9, 180e9, 45e9
    ),
    "H200": GpuSpec("H200", "NVIDIA H200", 150_110_011_392, 132, 989e12, 4.8e12, 380e9, 45e9, 190e9, 45e9),
}

# Efficiencies (fraction of peak FLOP/s or of HBM bandwidth).
EFF_GEMM = 0.72
EFF_GEMM_HALF_FLOPS = 2e9  # GEMMs with this many FLOPs reach half of EFF_GEMM (small shapes are slower)
EFF_FLASH_FWD = 0.36
EFF_FLASH_BWD = 0.30
EFF_GDN = 0.22
EFF_HBM = 0.78
KERNEL_FLOOR_NS = 2500  # smallest kernel duration (launch + tail)
COLL_LATENCY_NS = {"intra": 12_000, "inter": 25_000}
GDN_CHUNK = 64


@dataclass(frozen=True)
class KernelCosts:
    """Efficiencies of one kernel-cost preset. Each efficiency ramps with the work of one kernel,
    `eff x W / (W + half)` (W = FLOPs or bytes; half = 0 means constant), as measured: small kernels
    do not fill the GPU."""

    name: str
    gemm_eff: float
    gemm_half_flops: float
    attn_fwd_eff: float
    attn_fwd_half_flops: float
    attn_bwd_eff: float
    attn_bwd_half_flops: float
    gdn_eff: float
    hbm_eff: float
    hbm_half_bytes: float
    floor_ns: float
    attn_fwd_kernel: str
    attn_bwd_kernel: str

    @staticmethod
    def _ramp(eff: float, work: float, half: float) -> float:
        return eff * work / (work + half) if half > 0 else eff

    def gemm_ns(self, flops: float, peak: float) -> float:
        """Duration of a dense BF16 GEMM."""
        return max(
            self.floor_ns, flops / (peak * self._ramp(self.gemm_eff, flops, self.gemm_half_flops)) * 1e9
        )

    def attn_ns(self, flops: float, peak: float, backward: bool) -> float:
        """Duration of fused causal attention (forward, or backward with its 2.5x FLOPs)."""
        eff = (
            self._ramp(self.attn_bwd_eff, flops, self.attn_bwd_half_flops)
            if backward
            else self._ramp(self.attn_fwd_eff, flops, self.attn_fwd_half_flops)
        )
        return max(self.floor_ns, flops / (peak * eff) * 1e9)

    def gdn_ns(self, flops: float, peak: float) -> float:
        """Duration of a chunked Gated DeltaNet kernel (constant efficiency)."""
        return max(self.floor_ns, flops / (peak * self.gdn_eff) * 1e9)

    def mem_ns(self, nbytes: float, gpu: GpuSpec) -> float:
        """Duration of a memory-bound kernel moving `nbytes` through HBM."""
        eff = self._ramp(self.hbm_eff, nbytes, self.hbm_half_bytes)
        return max(self.floor_ns, nbytes / (gpu.hbm_bw * eff) * 1e9)


def device_properties(gpu: GpuSpec, n_devices: int) -> list[dict]:
    """deviceProperties as Kineto writes them (libkineto MetadataFieldCatalog fields)."""
    return [
        {
            "id": i,
            "name": gpu.device_name,
            "totalGlobalMem": gpu.total_mem,
            "computeMajor": 9,
            "computeMinor": 0,
            "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": 2048,
            "regsPerBlock": 65536,
            "warpSize": 32,
            "sharedMemPerBlock": 49152,
            "numSms": gpu.num_sms,
            "regsPerMultiprocessor": 65536,
            "sharedMemPerBlockOptin": 232448,
            "sharedMemPerMultiprocessor": 233472,
        }
        for i in range(n_devices)
    ]


#: Collective algorithm factors (nccl-tests busbw convention): bytes moved per rank / message bytes.
def coll_factor(op: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def coll_ns(op: str, nbytes: float, n: int, cross_host: bool, gpu: GpuSpec) -> float:
    """Transfer time of a collective once every participant has arrived: latency + bytes / bus bandwidth."""
    bw = gpu.net_busbw if cross_host else gpu.nvlink_busbw
    lat = COLL_LATENCY_NS["inter" if cross_host else "intra"]
    return lat + coll_factor(op, n) * nbytes / bw * 1e9


def p2p_ns(nbytes: float, cross_host: bool, gpu: GpuSpec) -> float:
    bw = gpu.p2p_inter if cross_host else gpu.p2p_intra
    lat = COLL_LATENCY_NS["inter" if cross_host else "intra"]
    return lat + nbytes / bw * 1e9


# Kernel names (as they appear in real H100 traces of Megatron / TransformerEngine / FA2 / fla runs).
GEMM_FPROP = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
    "_kernel__5x_cublas"
)
GEMM_DGRAD = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_NNN"
GEMM_WGRAD = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
    "_kernel__5x_cublas"
)
RMSNORM_FWD = (
    "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<transformer_engine::normalization::"
    "Kernel_traits<float, __nv_bfloat16, __nv_bfloat16, float, unsigned int, 5120u, 1u, 4u, 1u, 16u, "
    "transformer_engine::normalization::Kernel_traits_base<5120u, float, __nv_bfloat16, __nv_bfloat16, "
    "float, unsigned int, 128u> > >(transformer_engine::normalization::FwdParams)"
)
RMSNORM_BWD = (
    "void transformer_engine::normalization::rmsnorm_bwd_tuned_kernel<transformer_engine::normalization::"
    "Kernel_traits<float, __nv_bfloat16, __nv_bfloat16, float, unsigned int, 5120u, 1u, 4u, 1u, 16u, "
    "transformer_engine::normalization::Kernel_traits_base<5120u, float, __nv_bfloat16, __nv_bfloat16, "
    "float, unsigned int, 128u> > >(transformer_engine::normalization::BwdParams)"
)
SWIGLU_FWD = (
    "void transformer_engine::gated_kernels::cast_gated_kernel<true, float, &transformer_engine::silu<float, "
    "float>, __nv_bfloat16, __nv_bfloat16>(CUtensorMap, CUtensorMap, CUtensorMap, float*, float const*, "
    "unsigned long, unsigned long)"
)
SWIGLU_BWD = (
    "void transformer_engine::gated_kernels::cast_dgated_kernel<true, float, "
    "&transformer_engine::dsilu<float, "
    "float>, &transformer_engine::silu<float, float>, __nv_bfloat16, __nv_bfloat16>(CUtensorMap, "
    "CUtensorMap, "
    "CUtensorMap, CUtensorMap, float*, float const*, unsigned long, unsigned long)"
)
FLASH_FWD = (
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<256, 128, 64, 8, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<256, 128, 64, 8, cutlass::bfloat16_t> >, false, true, false, false, true, true, "
    "false, false>(Flash_fwd_params)"
)
FLASH_BWD = (
    "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<256, 64, 64, 8, 4, 2, 2, "
    "false, false, cutlass::bfloat16_t, Flash_kernel_traits<256, 64, 64, 8, cutlass::bfloat16_t> >, false, "
    "true, false, false, true, true, false>(Flash_bwd_params)"
)
GDN_FWD = ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o")
GDN_BWD = ("chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64", "chunk_bwd_kernel_dqkwg")
CONV_FWD = (
    "void causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, true, at::BFloat16, "
    "at::BFloat16> >(ConvParamsBase)"
)
CONV_BWD = (
    "void causal_conv1d_bwd_kernel<Causal_conv1d_bwd_kernel_traits<128, 4, true, true, true, at::BFloat16, "
    "at::BFloat16> >(ConvParamsBwd)"
)
GATED_NORM_FWD = "layer_norm_gated_fwd_kernel"
GATED_NORM_BWD = "layer_norm_gated_bwd_kernel"
EMBED_FWD = (
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
    "-2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<"
    "c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<long, unsigned int>, int, int, unsigned int, "
    "unsigned int, long)"
)
EMBED_BWD = (
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>"
    "(long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)"
)
XENT_FWD = "cross_entropy_fwd_kernel"
XENT_BWD = "cross_entropy_bwd_kernel"
ADAM = (
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, float, long>, float, "
    "float, float, float, float, float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, "
    "AdamFunctor<float, float, float, long>, float, float, float, float, float, float, adamMode_t, float)"
)
L2NORM = (
    "void multi_tensor_apply_kernel<TensorListMetadata<1>, L2NormFunctor<float, 512, 1>, float*, float*, "
    "bool, int>(long, int volatile*, TensorListMetadata<1>, L2NormFunctor<float, 512, 1>, float*, float*, "
    "bool, int)"
)
NCCL_SIG = "(ncclDevKernelArgsStorage<4096ul>)"
NCCL_NAMES = {
    ("allreduce", "BFloat16"): "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + NCCL_SIG,
    ("allreduce", "Float"): "ncclDevKernel_AllReduce_Sum_f32_RING_LL" + NCCL_SIG,
    ("reduce_scatter", "BFloat16"): "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL" + NCCL_SIG,
    ("reduce_scatter", "Float"): "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL" + NCCL_SIG,
    ("all_gather", "BFloat16"): "ncclDevKernel_AllGather_RING_LL" + NCCL_SIG,
    ("all_gather", "Float"): "ncclDevKernel_AllGather_RING_LL" + NCCL_SIG,
    ("all_to_all", "BFloat16"): "ncclDevKernel_SendRecv" + NCCL_SIG,
    ("send", "BFloat16"): "ncclDevKernel_SendRecv" + NCCL_SIG,
    ("recv", "BFloat16"): "ncclDevKernel_SendRecv" + NCCL_SIG,
}
#: `Collective name` values as ProcessGroupNCCL records them in record_param_comms.
COLL_RECORD_NAME = {
    "allreduce": "allreduce",
    "reduce_scatter": "_reduce_scatter_base",
    "all_gather": "_allgather_base",
    "all_to_all": "all_to_all",
    "send": "send",
    "recv": "recv",
}
DTYPE_BYTES = {"BFloat16": 2, "Float": 4}


#: cuDNN's fused attention kernels on Hopper, as PyTorch 2.11 named them in the H200 recording.
CUDNN_ATTN_FWD = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x256_4x1x1_cga1x1x1_kernel0_0"
)
CUDNN_ATTN_BWD = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x256_1x4x1_cga1x1x1_kernel0_0"
)

KERNEL_COSTS = {
    "published": KernelCosts(
        "published",
        gemm_eff=EFF_GEMM,
        gemm_half_flops=EFF_GEMM_HALF_FLOPS,
        attn_fwd_eff=EFF_FLASH_FWD,
        attn_fwd_half_flops=0.0,
        attn_bwd_eff=EFF_FLASH_BWD,
        attn_bwd_half_flops=0.0,
        gdn_eff=EFF_GDN,
        hbm_eff=EFF_HBM,
        hbm_half_bytes=0.0,
        floor_ns=KERNEL_FLOOR_NS,
        attn_fwd_kernel=FLASH_FWD,
        attn_bwd_kernel=FLASH_BWD,
    ),
    # Least-squares fits (log error) to docs/calibration.md's H200 measurements: 42 GEMMs (median
    # measured/model 1.01, range 0.70-1.13), cuDNN attention at 4,096-262,144 tokens, an elementwise
    # kernel at 126 MB and 1 GB; the kernel floor is the H200 trace's 1st-percentile kernel duration.
    "h200-measured": KernelCosts(
        "h200-measured",
        gemm_eff=0.726,
        gemm_half_flops=19.9e9,
        attn_fwd_eff=0.622,
        attn_fwd_half_flops=66.2e9,
        attn_bwd_eff=0.387,
        attn_bwd_half_flops=76.2e9,
        gdn_eff=EFF_GDN,
        hbm_eff=0.879,
        hbm_half_bytes=49.6e6,
        floor_ns=800.0,
        attn_fwd_kernel=CUDNN_ATTN_FWD,
        attn_bwd_kernel=CUDNN_ATTN_BWD,
    ),
}
