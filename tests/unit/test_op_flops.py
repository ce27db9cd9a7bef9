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
