"""The q4 format's float32-activation kernels (runtime/cpu_kernels/quant_linear_f32.cpp, through
runtime/model/linear.py's CodesLinearF32): exactly the float32 reference's weights, every row computed
alone whatever the row count, the thread count or the path (codes in registers for up to 4 rows, a
dequantized tile beyond), bad inputs refused, and where make_int8_group_linear picks it (q4's
logits layer; q4's layers run the integer kernel, tests/runtime/model/test_quant_linear_i8.py)."""

from __future__ import annotations

import pytest
import torch

import runtime.model.linear as linear
from runtime.model.linear import CodesLinearF32, make_int8_group_linear, pack_int4_pairs
from runtime.model.quant_codes import INT4_GROUP, Int4Codes, Int8Codes


@pytest.fixture
def f32_ops(cpu_ops):
    if not cpu_ops.quant_linear_f32_available():
        pytest.skip("the CPU kernels were built without AVX2 + FMA")
    return cpu_ops


def q4_1(n: int, k: int, seed: int = 0) -> Int4Codes:
    """Codes with fp16 scales and mins, as a GGUF's Q4_1 blocks hold them."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // INT4_GROUP, generator=g) * 0.02 + 1e-3).half()
    m = (-torch.rand(n, k // INT4_GROUP, generator=g) * 0.1).half()
    return Int4Codes.from_q4_1(d, m, torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8))


def q8_0(n: int, k: int, seed: int = 0) -> Int8Codes:
    g = torch.Generator().manual_seed(seed)
    return Int8Codes(
        torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
        (torch.rand(n, k // INT4_GROUP, generator=g) * 0.01 + 1e-4).half().float(),
    )


def reference_weights(w: Int4Codes) -> torch.Tensor:
    """What gguf's numpy dequantization (the loader's float32 model) gives: d * q + m in float32."""
    n, k = w.codes.shape
    q = w.codes.float().reshape(n, k // w.group, w.group)
    return (w.scales[..., None] * q + w.mins[..., None]).reshape(n, k)


@pytest.mark.parametrize("make,reference", [(q4_1, reference_weights), (q8_0, lambda w: w.dequantize())])
def test_the_kernels_weights_are_the_float32_references_bit_for_bit(f32_ops, make, reference):
    w = make(48, 96)
    lin = CodesLinearF32(w, None, f32_ops)
    for rows in (4, 96):  # codes expanded in registers, then through the tile buffer
        eye = torch.eye(96)[:rows]
        assert torch.equal(lin(eye), reference(w).T[:rows])  # y = e_i @ W.T is column i of W.T, exactly


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (32, 64)])
def test_equals_the_float32_product(f32_ops, n, k):
    w = q4_1(n, k)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ reference_weights(w).double().T
    y = CodesLinearF32(w, None, f32_ops)(x)
    assert y.dtype == torch.float32
    assert (y.double() - ref).abs().max().item() < 1e-4 * ref.abs().max().item()


def test_a_row_is_bitwise_the_same_alone_in_any_batch_and_with_any_thread_count(f32_ops):
    lin4 = CodesLinearF32(q4_1(96, 128), None, f32_ops)
    lin8 = CodesLinearF32(q8_0(96, 128), None, f32_ops)
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    for lin in (lin4, lin8):
        alone = torch.cat([lin(x[i : i + 1]) for i in range(40)])
        for m in (2, 4, 5, 7, 13, 40):  # both paths, every remainder of the 4- and 6-row steps
            assert torch.equal(lin(x[:m]), alone[:m]), m
        try:
            torch.set_num_threads(1)
            assert torch.equal(lin(x), alone)
        finally:
            torch.set_num_threads(threads)


def test_a_bias_and_the_callers_dtype(f32_ops):
    w = q4_1(32, 64)
    bias = torch.randn(32)
    x = torch.randn(3, 64)
    lin = CodesLinearF32(w, bias, f32_ops)
    assert torch.equal(lin(x), CodesLinearF32(w, None, f32_ops)(x) + bias)
    assert lin(x.double()).dtype == torch.float64
    assert lin.kernel == "jumpgate_cpu.int4_linear_f32" and lin.act_dtype == torch.float32
    assert lin.numel() == 32 * 64 and lin.nbytes == 32 * 64 // 2 + 2 * 32 * 2 * 4


def test_packing_puts_each_code_in_its_nibble():
    c = torch.arange(16 * 4, dtype=torch.uint8).reshape(16, 4) % 16
    p = pack_int4_pairs(c)
    assert p.shape == (1, 2, 16)
    for col in range(16):
        for j in range(2):
            assert p[0, j, col] == c[col, 2 * j] | (c[col, 2 * j + 1] << 4)


def test_bad_inputs_raise(f32_ops):
    lin = CodesLinearF32(q4_1(32, 64), None, f32_ops)
    with pytest.raises(RuntimeError, match="float32"):
        f32_ops.int4_linear_f32(torch.zeros(1, 64, dtype=torch.bfloat16), lin.packed, lin.scales)
    with pytest.raises(RuntimeError, match="inputs"):
        f32_ops.int4_linear_f32(torch.zeros(1, 96), lin.packed, lin.scales)
    with pytest.raises(RuntimeError, match="scales"):
        f32_ops.int4_linear_f32(torch.zeros(1, 64), lin.packed, lin.scales[:, :, :1])
    with pytest.raises(RuntimeError, match="packed codes"):
        f32_ops.int8_linear_f32(torch.zeros(1, 64), lin.packed, lin.scales)
    with pytest.raises(ValueError, match="groups of 32"):
        CodesLinearF32(Int4Codes.quantize(torch.randn(32, 64), group=16), None, f32_ops)
    assert f32_ops.int4_linear_f32(torch.zeros(0, 64), lin.packed, lin.scales).shape == (0, 32)


def test_where_make_int8_group_linear_picks_it(f32_ops, monkeypatch):
    monkeypatch.setattr(linear, "quant_kernels", lambda: None)  # no AVX512-BF16 build
    assert isinstance(make_int8_group_linear(q8_0(32, 64)), CodesLinearF32)
    monkeypatch.setattr(linear, "f32_quant_kernels", lambda: None)
    assert isinstance(make_int8_group_linear(q8_0(32, 64)), linear.DenseLinear)  # a bf16 copy
