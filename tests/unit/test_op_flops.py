"""Per-op FLOPs and bytes (tracelens.models.op_flops) against hand-computed values (docs/ops.md formulas)."""

from __future__ import annotations

import pytest

from tracelens.models.op_flops import op_cost, op_family

BF, F32, I64 = "c10::BFloat16", "float", "long int"


def cost(name, dims, types, concrete=None):
    c = op_cost(name, dims, types, concrete)
    assert c is not None, name
    return c.flops, c.bytes


def test_mm_addmm_bmm_baddbmm():
    # [64,128] x [128,32] bf16: 2*64*128*32 FLOPs; (64*128 + 128*32 + 64*32) * 2 bytes
    assert cost("aten::mm", [[64, 128], [128, 32]], [BF, BF]) == (524288.0, 28672.0)
    # + bias [32] (fp32): +64*32 adds, bias read once
    assert cost("aten::addmm", [[32], [64, 128], [128, 32], [], []], [F32, F32, F32, "Scalar", "Scalar"]) == (
        526336.0,
        4.0 * (8192 + 4096 + 2048 + 32),
    )
    # [4,16,8] x [4,8,32] fp32: 2*4*16*8*32; 4*(512 + 1024 + 2048)
    assert cost("aten::bmm", [[4, 16, 8], [4, 8, 32]], [F32, F32]) == (32768.0, 14336.0)
    assert cost(
        "aten::baddbmm", [[4, 16, 32], [4, 16, 8], [4, 8, 32], [], []], [F32] * 3 + ["Scalar"] * 2
    ) == (
        32768.0 + 2048,
        4.0 * (512 + 1024 + 2048 + 2048),
    )
    assert op_cost("aten::mm", [[64, 128], [127, 32]], [BF, BF]) is None  # inner dims differ: no guess


def test_matmul_and_linear():
    # [2,3,16,8] @ [8,32]: batch 6; 2*6*16*8*32; (768 + 256 + 6*16*32) * 2
    assert cost("aten::matmul", [[2, 3, 16, 8], [8, 32]], [BF, BF]) == (49152.0, 8192.0)
    # linear x[2,10,64] W[128,64] b[128]: M=20: 2*20*64*128 + 20*128; 2*(20*64 + 64*128 + 20*128 + 128)
    assert cost("aten::linear", [[2, 10, 64], [128, 64], [128]], [BF, BF, BF]) == (330240.0, 24320.0)


def test_attention_forward_and_backward():
    q = [2, 4, 128, 64]  # B, H, S, D
    fwd_full = 2.0 * 2 * 4 * 128 * 128 * (64 + 64)  # QK^T + PV
    dims = [q, q, q, [], [], [], []]
    types = [BF, BF, BF, "Scalar", "Scalar", "Scalar", "Scalar"]
    f, b = cost(
        "aten::_scaled_dot_product_flash_attention", dims, types, ["", "", "", "0.", "True", "False", ""]
    )
    assert f == fwd_full / 2 and b == 2.0 * 4 * (2 * 4 * 128 * 64)  # causal halving; q, k, v, o
    f, _ = cost(
        "aten::_scaled_dot_product_flash_attention", dims, types, ["", "", "", "0.", "False", "False", ""]
    )
    assert f == fwd_full
    # is_causal not recorded: unknown, not guessed
    assert op_cost("aten::_scaled_dot_product_flash_attention", dims, types, None) is None
    # flash backward, [B, S, H, D] layout, grad_out first, is_causal at 11: 2.5x forward; 5 read + 3 written
    t = [2, 128, 4, 64]
    conc = [""] * 11 + ["False"]
    f, b = cost("aten::_flash_attention_backward", [t] * 6 + [[]] * 6, [BF] * 6 + ["Scalar"] * 6, conc)
    assert f == 2.5 * fwd_full and b == 2.0 * (2 * 3 * 65536 + 2 * 65536)
    # cuDNN forward: is_causal at 10
    conc = [""] * 10 + ["True"]
    f, _ = cost("aten::_cudnn_attention_forward", [q] * 3 + [[]] * 10, [BF] * 3 + ["Scalar"] * 10, conc)
    assert f == fwd_full / 2
    # efficient attention: custom_mask_type 1 = causal
    conc = [""] * 9 + ["1"]
    f, _ = cost("aten::_efficient_attention_forward", [t] * 3 + [[]] * 10, [BF] * 3 + ["Scalar"] * 10, conc)
    assert f == fwd_full / 2


def test_gated_deltanet_chunked_scan():
    # q, k [1,128,2,16], v [1,128,2,32], g, beta [1,128,2] fp32; chunk 64:
    # per token and head 2*64*(3*16 + 2*32) + 6*16*32 = 17408; x 128 tokens x 2 heads
    dims = [[1, 128, 2, 16], [1, 128, 2, 16], [1, 128, 2, 32], [1, 128, 2], [1, 128, 2]]
    f, b = cost("fla::chunk_gated_delta_rule_fwd", dims, [F32] * 5)
    assert f == 17408.0 * 128 * 2
    assert b == 4.0 * (4096 + 4096 + 8192 + 256 + 256) + 4.0 * 8192  # inputs read, o written
    assert op_family("ChunkGatedDeltaRuleFunction") is None  # (no chunk_gated_delta_rule in the name)
    f2, _ = cost("fla::chunk_gated_delta_rule_bwd", dims, [F32] * 5)
    assert f2 == 2 * f


def test_convolutions():
    # depthwise conv1d through aten::convolution: input [1,8,100], weight [8,1,4], padding 3, groups 8:
    # out length 100 + 6 - 3 = 103; 2 * 8 * 103 * 1 * 4 FLOPs; bf16 bytes (800 + 32 + 824) * 2
    dims = [[1, 8, 100], [8, 1, 4], [], [], [], [], [], [], []]
    types = [BF, BF, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]
    conc = ["", "", "", "[1]", "[3]", "[1]", "False", "[0]", "8"]
    assert cost("aten::convolution", dims, types, conc) == (6592.0, 3312.0)
    # conv2d [2,3,32,32] * [16,3,3,3] + bias, stride 2, padding 1: out 16x16; 2*8192*27 + 8192
    dims = [[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], [], [], []]
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    assert cost("aten::convolution", dims, [F32, F32, F32] + ["ScalarList"] * 6, conc) == (
        450560.0,
        4.0 * (6144 + 432 + 8192 + 16),
    )
    conc_t = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[0, 0]", "1"]  # transposed: not modelled
    assert op_cost("aten::convolution", dims, [F32] * 3 + ["ScalarList"] * 6, conc_t) is None


def test_norms_softmax_embedding():
    # LayerNorm [4,256] fp32 with weight and bias [256]: 5 FLOPs/element; in + out + params
    assert cost(
        "aten::native_layer_norm", [[4, 256], [], [256], [256], []], [F32, "", F32, F32, "Scalar"]
    ) == (
        5120.0,
        8192.0 + 2048.0,
    )
    assert cost("aten::_fused_rms_norm", [[4, 256], [], [256], []], [BF, "", BF, "Scalar"]) == (
        4096.0,
        4608.0,
    )
    assert cost("aten::_softmax", [[8, 128], [], []], [F32, "Scalar", "Scalar"]) == (5120.0, 8192.0)
    assert cost(
        "aten::_softmax_backward_data", [[8, 128], [8, 128], [], []], [F32, F32, "Scalar", "Scalar"]
    ) == (
        4096.0,
        12288.0,
    )
    # embedding: 64 rows of 64 bf16 gathered (read + written) + 64 int64 indices
    assert cost(
        "aten::embedding", [[1000, 64], [4, 16], [], [], []], [BF, I64, "Scalar", "Scalar", "Scalar"]
    ) == (
        0.0,
        16896.0,
    )
    dims = [[4, 16, 64], [4, 16], [], [], []]
    conc = ["", "", "1000", "-1", "False"]
    assert cost("aten::embedding_dense_backward", dims, [BF, I64, "Scalar", "Scalar", "Scalar"], conc) == (
        4096.0,
        8192.0 + 512.0 + 1000 * 64 * 2,
    )


def test_optimizer_and_elementwise():
    lists = [[[10, 10], [5]]] * 5
    dims = lists + [[[], []]] + [[]] * 9
    types = ["TensorList"] * 6 + ["Scalar"] * 9
    # AdamW over 105 elements: 13 FLOPs each; bytes unknown (the lists' element dtype is not recorded)
    assert cost("aten::_fused_adamw_", dims, types) == (1365.0, None)
    # broadcast add [4,8] + [8]: 32 outputs; inputs read, output written
    assert cost("aten::add", [[4, 8], [8], []], [F32, F32, "Scalar"]) == (32.0, 4.0 * (32 + 8) + 128.0)
    assert cost("aten::mul_", [[4, 8], [4, 8]], [BF, BF]) == (32.0, 2.0 * 64 + 64.0)
    # mul(self, scalar, out=...): the out tensor is written, not read (32 fp32 read + 32 written + the scalar)
    assert cost("aten::mul", [[4, 8], [], [4, 8]], [F32, "double", F32]) == (32.0, 128.0 + 8.0 + 128.0)
    assert cost("aten::copy_", [[4, 8], [4, 8], []], [BF, F32, "Scalar"]) == (0.0, 64.0 + 128.0)
    assert cost("aten::fill_", [[4, 8], []], [F32, "Scalar"]) == (0.0, 128.0)
    assert cost("aten::sum", [[4, 8], [], [], []], [F32, "", "Scalar", ""]) == (32.0, 132.0)
    assert cost("aten::_foreach_add_", [[[4], [6]], [[4], [6]]], ["TensorList", "TensorList"]) == (10.0, None)
    assert cost("aten::cat", [[[4, 8], [4, 8]], []], ["TensorList", "Scalar"]) == (0.0, None)


def test_no_model_and_bad_shapes():
    assert op_cost("aten::linalg_solve_triangular", [[4, 4], [4, 4]], [F32, F32]) is None
    assert op_family("aten::linalg_solve_triangular") is None
    assert op_cost("aten::mm", [], []) is None
    assert op_cost("aten::mm", "[[1, 2]]", None) is None
    assert op_cost("aten::add", [[4, 8], [5]], [F32, F32]) is None  # not broadcastable
    c = op_cost("aten::mm", [[2, 2], [2, 2]], [BF, BF])
    assert c is not None and c.model == "gemm" and c.dtype == "bf16"


@pytest.mark.parametrize(
    "name,family",
    [
        ("aten::addmm", "gemm"),
        ("aten::_cudnn_attention_backward", "attention"),
        ("aten::silu", "elementwise"),
        ("aten::native_layer_norm_backward", "norm"),
        ("aten::_fused_adam_", "optimizer"),
    ],
)
def test_families(name, family):
    assert op_family(name) == family


# ------------------------------------------------------------------------------ inference and modern training ops
FP8, I32 = "c10::Float8_e4m3fn", "int"


def test_scaled_mm_fp8():
    # a [64,128] x b [128,32] fp8, per-tensor scales (fp32 0-d), out_dtype 15 (bf16):
    # 2*64*128*32 FLOPs; 64*128 + 128*32 (1 byte) + 2 scales * 4 + 64*32*2 bytes
    dims = [[64, 128], [128, 32], [], [], [], [], [], []]
    types = [FP8, FP8, F32, F32, "", "", "Scalar", "Scalar"]
    c = op_cost("aten::_scaled_mm", dims, types, ["", "", "", "", "", "", "15", "False"])
    assert c is not None and c.model == "gemm" and c.dtype == "fp8"
    assert (c.flops, c.bytes) == (524288.0, 8192 + 4096 + 8 + 4096.0)
    # no out_dtype recorded: the output in a's type (1 byte)
    assert cost("aten::_scaled_mm", dims, types, [""] * 8)[1] == 8192 + 4096 + 8 + 2048.0


def test_engine_gemms_and_transformer_engine_linear():
    # vLLM rocm_unquantized_gemm x [32,2880], W [5120,2880], bias [5120]: 2*32*2880*5120 + 32*5120
    f, b = cost("vllm::rocm_unquantized_gemm", [[32, 2880], [5120, 2880], [5120]], [BF] * 3)
    assert f == 2.0 * 32 * 2880 * 5120 + 32 * 5120
    assert b == 2.0 * (32 * 2880 + 5120 * 2880 + 32 * 5120 + 5120)
    # aiter gemm_a16w16 (the trace's arguments: A, B, then non-tensors): no bias
    f, b = cost("aiter::gemm_a16w16", [[15360, 4096], [6144, 4096], [], [], []], [BF, BF, "", "Scalar", ""])
    assert f == 2.0 * 15360 * 4096 * 6144 and b == 2.0 * (15360 * 4096 + 6144 * 4096 + 15360 * 6144)
    # vLLM cutlass_scaled_mm(out [16,64] bf16, a [16,32] fp8, b [32,64] fp8, a_scales [16,1], b_scales [1,64])
    f, b = cost(
        "_C::cutlass_scaled_mm",
        [[16, 64], [16, 32], [32, 64], [16, 1], [1, 64], []],
        [BF, FP8, FP8, F32, F32, ""],
    )
    assert f == 2.0 * 16 * 32 * 64 and b == 16 * 32 + 32 * 64 + 4 * (16 + 64) + 2 * 16 * 64
    # TransformerEngine te_gemm_ts: A [N=64, K=32] fp8, B [M=16, K=32] fp8, D [16, 64] bf16
    dims = [[64, 32], [1], [], [], [], [16, 32], [1], [], [], [], [16, 64]]
    types = [FP8, F32, "Scalar", "Scalar", "Scalar", FP8, F32, "Scalar", "Scalar", "Scalar", BF]
    assert cost("tex_ts::te_gemm_ts", dims, types) == (2.0 * 16 * 64 * 32, 64 * 32 + 16 * 32 + 2.0 * 16 * 64)
    # TE _Linear(weight [64,32], weight_fp8 [64,32], inp [2,8,32], bias [64]): M = 16, the input is the last
    f, b = cost("_Linear", [[64, 32], [64, 32], [2, 8, 32], [64]], [BF, FP8, BF, BF])
    assert f == 2.0 * 16 * 32 * 64 + 16 * 64 and b == 2.0 * (16 * 32 + 64 * 32 + 16 * 64 + 64)


def test_grouped_gemm_and_fused_moe_experts():
    # _grouped_mm 2-D x 3-D: 96 routed rows [96,64] x 4 experts [4,64,128], offs [4]: 2*96*64*128
    f, b = cost("aten::_grouped_mm", [[96, 64], [4, 64, 128], [4]], [BF, BF, I32])
    assert f == 2.0 * 96 * 64 * 128 and b == 2.0 * (96 * 64 + 4 * 64 * 128 + 96 * 128)
    # 3-D x 3-D: [4,24,64] x [4,64,128]
    assert cost("aten::_grouped_mm", [[4, 24, 64], [4, 64, 128]], [BF, BF])[0] == 2.0 * 4 * 24 * 64 * 128
    # 2-D x 2-D (weight gradient, K split by offs into 4 groups): out [4, 64, 128]
    f, b = cost("aten::_grouped_mm", [[64, 96], [96, 128], [4]], [BF, BF, I32])
    assert f == 2.0 * 64 * 96 * 128 and b == 2.0 * (64 * 96 + 96 * 128 + 4 * 64 * 128)
    # vLLM fused_experts: T=8 tokens, H=64, E=4 experts, I=32 (w1 [4,64,64] gate+up, w2 [4,64,32]), k=2:
    # 16 routed rows: 2*16*(64*64 + 64*32); touched experts min(4, 16) = 4
    dims = [[8, 64], [4, 64, 64], [4, 64, 32], [8, 2], [8, 2]]
    f, b = cost("vllm::outplace_fused_experts", dims, [BF, BF, BF, F32, I32])
    assert f == 2.0 * 16 * (64 * 64 + 64 * 32)
    assert b == 2 * 8 * 64 * 2 + 4 * (64 * 64 * 2 + 64 * 32 * 2) + 16 * 4 + 16 * 4


def test_moe_layer_needs_top_k_and_expert_size():
    from tracelens.models.op_flops import OpContext

    dims, types = [[32, 3072], [32, 32], [], []], [BF, BF, "", ""]
    assert op_cost("vllm::moe_forward", dims, types) is None  # the shapes alone do not say k or I
    ctx = OpContext(moe_top_k=4, moe_intermediate=2880)
    c = op_cost("vllm::moe_forward", dims, types, None, ctx)
    # 128 routed rows x SwiGLU expert (3 GEMMs of H x I); 32 experts touched of 32
    assert c is not None and c.model == "moe"
    assert c.flops == 2.0 * 128 * 3072 * 2880 * 3
    assert c.bytes == 2.0 * 2 * 32 * 3072 + 32 * 3072 * 2880 * 3 * 2.0


def test_flash_attn_ops_and_aiter_batch_prefill():
    # flash_attn forward [B=2, S=128, H=4, D=64], causal at 5: as SDPA causal
    q = [2, 128, 4, 64]
    fwd_full = 2.0 * 2 * 4 * 128 * 128 * (64 + 64)
    conc = ["", "", "", "0.", "0.125", "True"]
    f, b = cost("flash_attn::_flash_attn_forward", [q, q, q, [], [], []], [BF] * 3 + ["Scalar"] * 3, conc)
    assert f == fwd_full / 2 and b == 2.0 * 4 * 65536
    # varlen: 3 sequences of 100 tokens packed [300, 4, 64], cu_seqlens [4], max 100 / 100, causal at 9
    qv = [300, 4, 64]
    dims = [qv, qv, qv, [4], [4], [], [], [], [], []]
    types = [BF] * 3 + [I32, I32] + ["Scalar"] * 5
    conc = ["", "", "", "", "", "100", "100", "0.", "0.125", "True"]
    f, b = cost("flash_attn::_flash_attn_varlen_forward", dims, types, conc)
    assert f == 2.0 * 4 * 128 * 3 * (100 * 100 - 100 * 100 / 2) and b == 2.0 * 4 * 300 * 256
    # unequal lengths (max 150 > 300/3): the shapes cannot say the pairs -> unknown
    conc2 = ["", "", "", "", "", "150", "150", "0.", "0.125", "True"]
    assert op_cost("flash_attn::_flash_attn_varlen_forward", dims, types, conc2) is None
    # aiter mha_batch_prefill (the SGLang Qwen3 trace): 15 x 1024 tokens, 32 q / 8 kv heads x 128, paged
    # cache [835874, 8, 128]; causal at 12: pairs 15*(1024^2 - 1024^2/2)
    dims = [[15360, 32, 128], [835874, 8, 128], [835874, 8, 128], [16], [16], [15616]] + [[]] * 13
    types = [BF] * 3 + [I32] * 3 + ["Scalar"] * 13
    conc = [""] * 6 + ["1024", "1024", "0.", "0.088", "0.", "False", "True"] + [""] * 6
    f, b = cost("aiter::mha_batch_prefill", dims, types, conc)
    assert f == 2.0 * 32 * 256 * 15 * 524288
    assert b == 2.0 * (15360 * 32 * 128 + 2 * 15360 * 8 * 128 + 15360 * 32 * 128)


def test_engine_attention_from_the_iteration_context():
    from tracelens.models.op_flops import OpContext

    # vLLM unified_attention_with_output: a mixed batch of 1 prefill of 100 new tokens on 28 cached (sk 128)
    # and 4 decodes (sq 1, sk 50 each); q [104, 8, 64], k/v [104, 2, 64]
    ctx = OpContext(c_sq=100, c_sk=128, c_sqsq=100 * 100, c_sqsk=100 * 128, g_sq=4, g_sk=200, g_sqsk=200)
    dims = [[104, 8, 64], [104, 2, 64], [104, 2, 64], [104, 8, 64], [], [], [], [0]]
    types = [BF] * 4 + ["", "", "", BF]
    assert op_cost("vllm::unified_attention_with_output", dims, types) is None  # no iteration: unknown
    c = op_cost("vllm::unified_attention_with_output", dims, types, None, ctx)
    pairs = 100 * 128 - 100 * 100 / 2 + 200  # causal within the new tokens; decode rows see all their keys
    assert c is not None and c.flops == 2.0 * 8 * 128 * pairs
    assert c.bytes == 2.0 * (104 * 8 * 64 + 328 * 2 * 128 + 104 * 8 * 64)
    # a padded CUDA graph (q of 128 rows for the iteration's 104 tokens): not the iteration's work, unknown
    padded = [[128, 8, 64], [128, 2, 64], [128, 2, 64], [128, 8, 64], [], [], [], [0]]
    assert op_cost("vllm::unified_attention_with_output", padded, types, None, ctx) is None


def test_fused_norm_activation_rotary_and_kv_cache():
    # aiter rmsnorm(out, input, weight, eps) [15360,4096]: 4 per element; in + out + weight
    n = 15360 * 4096
    f, b = cost("aiter::rmsnorm", [[15360, 4096], [15360, 4096], [4096], []], [BF, BF, BF, "Scalar"])
    assert (f, b) == (4.0 * n, 2.0 * 2 * n + 2 * 4096)
    # with a residual (out, input, residual_in, residual_out, weight): 5 per element, 2 read + 2 written
    f, b = cost("aiter::add_rmsnorm", [[15360, 4096]] * 4 + [[4096], []], [BF] * 5 + ["Scalar"])
    assert (f, b) == (5.0 * n, 4.0 * 2 * n + 2 * 4096)
    # vLLM in-place fused_add_rms_norm(input, residual, weight, eps): the same traffic
    assert cost("_C::fused_add_rms_norm", [[8, 16], [8, 16], [16], []], [BF] * 3 + ["Scalar"]) == (
        640.0,
        1056.0,
    )
    # silu_and_mul(out [15360,12288], input [15360,24576]): 2 per output element; input read, out written
    f, b = cost("sgl_kernel::silu_and_mul", [[15360, 12288], [15360, 24576]], [BF, BF])
    assert (f, b) == (2.0 * 15360 * 12288, 2.0 * (15360 * 24576 + 15360 * 12288))
    # rotary_embedding(positions [T=4], q [4, 4*64], k [4, 2*64], head 64, cache [1000, 32], neox):
    # (4 + 2) heads x 4 tokens x 32 rotated dims x 3 FLOPs; q, k read + written, positions, 4 cache rows
    dims = [[4], [4, 256], [4, 128], [], [1000, 32], []]
    types = [I64, BF, BF, "Scalar", BF, "Scalar"]
    f, b = cost("sgl_kernel::rotary_embedding", dims, types, ["", "", "", "64", "", "True"])
    assert (f, b) == (3.0 * 24 * 32, 2 * 2.0 * (1024 + 512) + 4 * 8 + 4 * 32 * 2)
    # SGLang store_cache(k [T,1024], v, k_cache, v_cache, loc [T]): k, v read and written, slots read
    dims = [[16, 1024], [16, 1024], [1000, 1024], [1000, 1024], [16], [], []]
    f, b = cost("sglang::store_cache", dims, [BF] * 4 + [I64, "Scalar", "Scalar"])
    assert (f, b) == (0.0, 2.0 * 2 * 16 * 1024 * 2 + 16 * 8)


def test_new_families():
    assert op_family("aten::_scaled_mm") == "gemm"
    assert op_family("aten::_grouped_mm") == "grouped_gemm"
    assert op_family("vllm::moe_forward") == "moe"
    assert op_family("flash_attn::_flash_attn_varlen_backward") == "attention"
    assert op_family("flashinfer::batch_prefill_with_paged_kv_cache") == "attention"
    assert op_family("sgl_kernel::silu_and_mul") == "activation"
    assert op_family("_C::rotary_embedding") == "rotary"
    assert op_family("_C_cache_ops::reshape_and_cache_flash") == "kv_cache"
    assert op_family("aiter::rmsnorm2d_fwd_with_add_ck") == "norm"
