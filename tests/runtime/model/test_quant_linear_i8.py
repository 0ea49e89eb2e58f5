"""The q4 format's integer kernel (runtime/cpu_kernels/quant_linear_i8.cpp, through runtime/model/linear.py's
Int4LinearI8): each row coded per block of 32 inputs as two int8 digits, the sums of code x digit
products exact. Checked against a float64 model of that coding, against the exact product within the
coding's error bound, row by row whatever the row count or thread count, with bad inputs refused,
and where make_q4_linear picks it."""

from __future__ import annotations

import pytest
import torch

import runtime.model.linear as linear
from runtime.model.linear import CodesLinearF32, Int4Linear, Int4LinearI8, make_q4_linear, pack_int4_quads
from runtime.model.quant_codes import Int4Codes
from tests.runtime.model.test_quant_linear_f32 import q4_1, reference_weights


@pytest.fixture
def i8_ops(cpu_ops):
    if not cpu_ops.quant_linear_i8_available():
        pytest.skip("the CPU kernels were built without AVX2 + FMA")
    return cpu_ops


def coded(x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """The kernel's coding of x [M, K] in float32 arithmetic: per block of 32, the digits q1, q2 and
    their scales dx, dx / 254 (the second digit codes the first one's rounding error), and the sum."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = amax / 127
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    digits, scales, rest = [], [], blocks
    for _ in range(2):
        r = torch.round(rest * inv)  # round half to even, as the kernel's rounding mode
        digits.append(r)
        scales.append(scale)
        rest = rest - r * scale
        scale, inv = scale / 254, inv * 254
    return digits, scales, blocks


def modelled(w: Int4Codes, x: torch.Tensor) -> torch.Tensor:
    """float64: sum over blocks of d * (dx1 * S1 + dx2 * S2) + m * sum(x), S_p the integer sums."""
    n, k = w.codes.shape
    digits, scales, blocks = coded(x)
    q = w.codes.double().reshape(n, k // 32, 32)
    terms = sum(
        torch.einsum("ngk,mgk->mng", q, dig.double()) * s.double().reshape(len(x), 1, -1)
        for dig, s in zip(digits, scales)
    )
    offsets = torch.einsum("ng,mg->mng", w.offsets().double(), blocks.double().sum(-1))
    return (terms * w.scales.double()[None] + offsets).sum(-1)


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (32, 64)])
def test_equals_its_coding_and_the_exact_product_within_the_codings_bound(i8_ops, n, k):
    w = q4_1(n, k)
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(1)) * 3
    y = Int4LinearI8(w, None, i8_ops)(x)
    assert y.dtype == torch.float32 and y.shape == (7, n)
    model = modelled(w, x)
    assert (y.double() - model).abs().max().item() < 1e-5 * model.abs().max().item()
    # against the exact product: each input is off by at most max|x of its block| / 64516
    weights = reference_weights(w).double()
    exact = x.double() @ weights.T
    block_max = x.abs().reshape(7, k // 32, 32).amax(-1).double().repeat_interleave(32, dim=1)
    bound = (block_max / 64516) @ weights.abs().T
    assert ((y.double() - exact).abs() <= bound * 1.01 + 1e-5 * exact.abs().max()).all()


def test_one_digit_would_be_far_coarser(i8_ops):
    """Why two digits: the second one takes the error from max|x| / 254 to max|x| / 64516."""
    w = q4_1(64, 256)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2))
    exact = x.double() @ reference_weights(w).double().T
    digits, scales, _ = coded(x)
    one_digit = (digits[0] * scales[0]).reshape(3, 256).double() @ reference_weights(w).double().T
    y = Int4LinearI8(w, None, i8_ops)(x).double()
    assert (y - exact).abs().max() * 50 < (one_digit - exact).abs().max()


def test_a_row_is_the_same_in_any_batch_and_thread_count(i8_ops):
    w = q4_1(96, 192)
    lin = Int4LinearI8(w, None, i8_ops)
    x = torch.randn(11, 192, generator=torch.Generator().manual_seed(3))
    whole = lin(x)
    for rows in (1, 2, 3, 4, 5):  # every remainder of the three-row step
        assert torch.equal(lin(x[:rows]), whole[:rows])
    assert torch.equal(lin(x[7:8]), whole[7:8])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(lin(x), whole)
    finally:
        torch.set_num_threads(threads)


def test_zero_blocks_large_values_and_bias(i8_ops):
    w = q4_1(32, 64)
    x = torch.zeros(2, 64)
    x[1, 32:] = torch.linspace(-3e4, 3e4, 32)  # the first block of row 1 all zero, the second large
    bias = torch.randn(32)
    lin = Int4LinearI8(w, bias, i8_ops)
    y = lin(x)
    assert torch.equal(y[0], bias)
    exact = x.double() @ reference_weights(w).double().T + bias.double()
    assert (y[1].double() - exact[1]).abs().max() < 1e-4 * exact[1].abs().max()
    assert lin.kernel == "jumpgate_cpu.int4_linear_i8" and lin.act_dtype == torch.float32
    assert lin(torch.zeros(2, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16  # keeps the caller's dtype


def test_bad_inputs_are_refused(i8_ops):
    lin = Int4LinearI8(q4_1(32, 64), None, i8_ops)
    with pytest.raises(RuntimeError, match="float32"):
        i8_ops.int4_linear_i8(torch.zeros(1, 64, dtype=torch.bfloat16), lin.packed, lin.scales)
    with pytest.raises(RuntimeError, match="inputs"):
        i8_ops.int4_linear_i8(torch.zeros(1, 96), lin.packed, lin.scales)
    with pytest.raises(RuntimeError, match="scales"):
        i8_ops.int4_linear_i8(torch.zeros(1, 64), lin.packed, lin.scales[:, :, :1])
    with pytest.raises(RuntimeError, match="packed codes"):
        i8_ops.int4_linear_i8(torch.zeros(1, 64), lin.packed[..., :16], lin.scales)
    with pytest.raises(ValueError, match="groups of 32"):
        Int4LinearI8(Int4Codes.quantize(torch.randn(32, 64), group=16), None, i8_ops)
    assert i8_ops.int4_linear_i8(torch.zeros(0, 64), lin.packed, lin.scales).shape == (0, 32)


def test_packing_puts_four_inputs_of_a_column_side_by_side():
    codes = torch.arange(32 * 8).reshape(32, 8) % 16
    packed = pack_int4_quads(codes)
    assert packed.shape == (2, 2, 32)
    # tile 1, inputs 4..7, byte 4c + e: column 16 + c (low nibble) and 24 + c (high nibble), input 4 + e
    for c in range(8):
        for e in range(4):
            byte = int(packed[1, 1, 4 * c + e])
            assert byte & 15 == codes[16 + c, 4 + e] and byte >> 4 == codes[24 + c, 4 + e]


def test_where_make_q4_linear_picks_it(i8_ops, monkeypatch):
    w = q4_1(32, 64)
    monkeypatch.setattr(linear, "quant_kernels", lambda: None)  # no AVX512-BF16 build
    assert isinstance(make_q4_linear(w, None), Int4LinearI8)
    monkeypatch.setattr(linear, "i8_quant_kernels", lambda: None)
    assert isinstance(make_q4_linear(w, None), Int4Linear)  # aten's kernel, bf16 activations
    monkeypatch.undo()
    if i8_ops.int4_linear_available():  # the bf16 kernels first where they are built
        assert make_q4_linear(w, None).kernel == "jumpgate_cpu.int4_linear"
    else:
        assert isinstance(make_q4_linear(w, None), Int4LinearI8)
        assert not isinstance(make_q4_linear(w, None), CodesLinearF32)
