"""The q4 format's linear kernels (runtime/cpu_kernels/quant_linear.cpp, through runtime/model/linear.py's
Int4Linear and Int8GroupLinear): exact weights, every row computed alone, aten's kernel or a bf16
copy where ours does not apply."""

from __future__ import annotations

import pytest
import torch

import runtime.model.linear as linear
from runtime.model.linear import DenseLinear, Int4Linear, make_int8_group_linear, pack_int4_tiles
from runtime.model.quant_codes import INT4_GROUP, Int4Codes, Int8Codes


def codes(n: int, k: int, seed: int = 0) -> Int4Codes:
    g = torch.Generator().manual_seed(seed)
    return Int4Codes.quantize(torch.randn(n, k, generator=g) * 0.05)


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.fixture
def aten_only(monkeypatch):
    monkeypatch.setattr(linear, "quant_kernels", lambda: None)
    monkeypatch.setattr(linear, "f32_quant_kernels", lambda: None)


@pytest.fixture
def bf16_kernels(cpu_ops):
    """Our int4/int8 bf16 kernels, which need AVX512-BF16 (elsewhere Int4Linear is aten's, whose
    bf16 scales miss these bounds; tests/runtime/model/test_quant_linear_f32.py covers the AVX2 kernels)."""
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16: aten's int4 kernel runs")
    return cpu_ops


def test_the_kernel_runs_where_it_was_built(cpu_ops):
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16: aten's int4 kernel runs")
    assert Int4Linear(codes(64, 64), None).kernel == "jumpgate_cpu.int4_linear"


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (48, 64), (16, 32)])
@pytest.mark.parametrize("m", [1, 5, 7, 33])
def test_equals_the_dequantized_weights_within_the_output_rounding(bf16_kernels, n, k, m):
    w = codes(n, k)
    lin = Int4Linear(w, None)
    x = activations(m, k)
    exact = x.double() @ w.dequantize().double().t()
    got = lin.native(x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    # bf16 output rounding (half an ulp, 2^-9 relative) plus fp32 accumulation over k terms
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ w.dequantize().double().abs().t()) * 1e-6
    assert ((got.double() - exact).abs() <= bound).all()


def q4_1_blocks(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF's Q4_1 blocks: fp16 d and m per group of 32, codes 0..15."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // INT4_GROUP, generator=g) * 0.01 + 1e-4).half()
    m = (-torch.rand(n, k // INT4_GROUP, generator=g) * 0.08).half()
    return d, m, torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("m", [1, 4, 7, 16, 40])
def test_q4_1_scales_kept_as_fp16_give_the_float32_layouts_bits(bf16_kernels, m):
    """Q4_1 blocks keep their own fp16 (d, m) (half the scale bytes); the kernel forms the offset
    with the roundings linear.py uses for float32 storage, so every row count gives the same bits."""
    d, mins, q = q4_1_blocks(96, 576)
    half = Int4Linear(Int4Codes.from_q4_1(d, mins, q), None)
    w = Int4Codes.from_q4_1(d, mins, q)
    float32 = Int4Linear(Int4Codes(w.codes, w.scales, w.zeros, w.group, None), None)  # no mins: float32 storage
    assert half.scale_offset.dtype == torch.float16 and float32.scale_offset.dtype == torch.float32
    assert half.nbytes < float32.nbytes
    x = activations(m, 576, seed=m)
    assert torch.equal(half.native(x), float32.native(x))
    exact = x.double() @ w.dequantize().double().t()
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ w.dequantize().double().abs().t()) * 1e-6
    assert ((half.native(x).double() - exact).abs() <= bound).all()


def test_amx_tiles_run_where_the_cpu_has_them(bf16_kernels):
    from runtime.cpu_kernels import cpu_flags
    from runtime.model.weight_format import AMX_TILES

    # the AMX flags and a kernel that grants tiles (Linux 5.16+): the int4 kernel uses them
    assert bf16_kernels.int4_linear_amx() == all(f in cpu_flags() for f in AMX_TILES)


def test_no_less_exact_than_aten(bf16_kernels):
    """Scale and zero stay fp32 (aten's kernel rounds them to bf16), so the error is smaller."""
    w, x = codes(576, 1536), activations(16, 1536)
    exact = x.double() @ w.dequantize().double().t()
    ours = Int4Linear(w, None)
    theirs = Int4Linear(w, None, kernels=False)
    assert theirs.kernel.startswith("aten")
    err = {
        name: (lin.native(x).double() - exact).abs().mean().item() for name, lin in (("ours", ours), ("aten", theirs))
    }
    assert err["ours"] < err["aten"], err


def test_a_row_is_bitwise_the_same_alone_in_any_batch_and_with_any_thread_count(bf16_kernels):
    """Batch sizes on both sides of the expansion threshold (16 rows), in steps of 8 rows with each
    remainder, and on both sides of the register block (a row alone, on the vector path, runs over
    four column vectors at once where the rest run over two: 960 columns are 60 vectors); with
    AMX, of the tile sizes (1, 4, 8 and 16 rows expanding codes per group, then several tiles over
    an expanded buffer, the last one padded)."""
    w = codes(960, 576)
    lin = Int4Linear(w, None)
    x = activations(40, 576)
    alone = torch.cat([lin.native(x[i : i + 1]) for i in range(40)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (2, 3, 6, 7, 13, 14, 15, 16, 17, 33, 40):  # steps of 8 rows, every remainder
                assert torch.equal(lin.native(x[:m]), alone[:m]), (threads, m)
    finally:
        torch.set_num_threads(before)


def test_an_odd_number_of_column_vectors_and_a_bias(cpu_ops):
    w = codes(48, 96)  # 3 vectors of 16 columns: one-vector tiles
    bias = torch.randn(48)
    lin = Int4Linear(w, bias)
    x = activations(3, 96)
    want = x.double() @ w.dequantize().double().t() + bias.bfloat16().double()
    assert torch.allclose(lin.native(x).double(), want, rtol=2e-2, atol=2e-2)
    assert lin(x.float()).dtype == torch.float32  # __call__ keeps the caller's dtype


def test_other_group_sizes_go_to_aten(cpu_ops):
    g = torch.Generator().manual_seed(2)
    w = Int4Codes.quantize(torch.randn(32, 128, generator=g) * 0.05, group=64)  # GGUF blocks are 32
    lin = Int4Linear(w, None)
    assert lin.kernel.startswith("aten")
    x = activations(2, 128)
    assert torch.allclose(lin.native(x).float(), (x.float() @ w.dequantize().t()), rtol=3e-2, atol=3e-2)


def test_bad_inputs_raise(cpu_ops):
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16")
    lin = Int4Linear(codes(32, 64), None)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_ops.int4_linear(torch.zeros(2, 64), lin.packed, lin.scale_offset)
    with pytest.raises(RuntimeError, match="match the weights"):
        cpu_ops.int4_linear(torch.zeros(2, 96).bfloat16(), lin.packed, lin.scale_offset)
    with pytest.raises(RuntimeError, match="scale_offset"):
        cpu_ops.int4_linear(torch.zeros(2, 64).bfloat16(), lin.packed, lin.scale_offset[:1])
    with pytest.raises(RuntimeError, match="packed"):
        cpu_ops.int4_linear(torch.zeros(2, 64).bfloat16(), lin.packed.int(), lin.scale_offset)
    assert cpu_ops.int4_linear(torch.zeros(0, 64).bfloat16(), lin.packed, lin.scale_offset).shape == (0, 32)


def test_packing_puts_each_code_in_its_nibble():
    c = torch.randint(0, 16, (32, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    packed = pack_int4_tiles(c)
    assert packed.shape == (2, 16, 32)
    for tile, col, k in ((0, 0, 0), (0, 3, 5), (1, 15, 63), (1, 7, 34)):
        j, h, e = k // 4, (k % 4) // 2, k % 2
        byte = int(packed[tile, j, 2 * col + e])
        assert (byte >> (4 * h)) & 15 == int(c[tile * 16 + col, k])


def test_aten_path_unchanged(aten_only):
    w = codes(64, 64)
    lin = Int4Linear(w, None)
    assert lin.kernel == "aten._weight_int4pack_mm_for_cpu" and lin.group == INT4_GROUP
    x = activations(4, 64)
    assert torch.allclose(lin.native(x).float(), x.float() @ w.dequantize().t(), rtol=3e-2, atol=3e-2)


def int8_codes(n: int, k: int, seed: int = 0) -> Int8Codes:
    g = torch.Generator().manual_seed(seed)
    return Int8Codes(
        torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g),
        torch.rand(n, k // INT4_GROUP, generator=g) * 0.01,
    )


@pytest.mark.parametrize("n,k", [(1536, 576), (48, 64)])
def test_int8_codes_equal_their_dequantized_weights_and_rows_stand_alone(cpu_ops, n, k):
    w = int8_codes(n, k)
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16")
    lin = make_int8_group_linear(w)
    assert lin.kernel == "jumpgate_cpu.int8_linear"
    x = activations(20, k)  # with AMX: tiles of 1, 4 and 16 rows, two tiles of 16
    exact = x.double() @ w.dequantize().double().t()
    got = lin.native(x)
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ w.dequantize().double().abs().t()) * 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    alone = torch.cat([lin.native(x[i : i + 1]) for i in range(20)])
    assert torch.equal(alone, got)
    for m in (2, 3, 16):
        assert torch.equal(lin.native(x[:m]), alone[:m]), m


def test_int8_falls_back_to_bf16_without_the_kernel(aten_only):
    w = int8_codes(32, 64)
    lin = make_int8_group_linear(w)
    assert isinstance(lin, DenseLinear) and lin.weight.dtype == torch.bfloat16
    assert torch.equal(lin.weight, w.dequantize().bfloat16())


def test_int8_bad_inputs_raise(cpu_ops):
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16")
    lin = make_int8_group_linear(int8_codes(32, 64))
    with pytest.raises(RuntimeError, match="int8_linear: packed codes"):
        cpu_ops.int8_linear(torch.zeros(2, 64).bfloat16(), lin.packed.view(torch.uint8), lin.scales)
    with pytest.raises(RuntimeError, match="int8_linear: scale_offset"):
        cpu_ops.int8_linear(torch.zeros(2, 64).bfloat16(), lin.packed, lin.scales[:, :1])
