"""Linear-layer weights in one of the runtime's formats; each is a callable `y = x @ W.T`.

- `DenseLinear`: fp32 / bf16 / fp16 weights through `F.linear` (oneDNN or BLAS on CPU, cuBLAS on CUDA).
- `Int8Linear`: per-output-channel symmetric int8 (`aten._weight_int8pack_mm`, bf16 activations): q8's
  layers where the group kernels below do not fit (`make_q8_linear`).
- `Int4Linear`: group-wise asymmetric int4, w = (q - 8) * scale + zero (bf16 activations). A GGUF
  Q4_1 block (w = d * q + m) is exactly that with scale = d and zero = m + 8d, so a q4 model runs
  the GGUF's own 4-bit codes: through runtime/cpu_kernels/quant_linear.cpp where the CPU has
  AVX512-BF16 (on AMX tiles where it also has AMX), through
  `aten._weight_int4pack_mm_for_cpu` elsewhere.
- `Int8GroupLinear`: GGUF Q8_0 blocks (w = q * d, groups of 32) as they are, through the same
  file's int8 kernel: q4's logits layer, the tied embedding's own codes, and q8's layers (the float
  weights quantized the same way). Also a GGUF's Q8_0 layer codes (`make_wide_linear`), one int8
  code a weight, with per-group offsets where the blocks have mins. A K-quant file's Q4_K layers
  are 4-bit `Int4Codes` (scale d * sc, min -dmin * m, fp32) on the int4 kernels; its 5- and 6-bit
  ones (Q5_0, Q5_1, Q5_K; Q6_K in groups of 16) on `Int4Linear` too, read as stored
  (`pack_int5_tiles`, `pack_int6_tiles`) where the AVX512-BF16 kernels are built.
- `CodesLinearF32`: the same Q4_1 or Q8_0 codes with float32 activations, through
  runtime/cpu_kernels/quant_linear_f32.cpp (AVX2 + FMA), dequantized in registers to exactly the
  float32 reference's weights: q4's logits layer on CPUs without native bf16
  (`make_int8_group_linear` picks it where the AVX512-BF16 kernels are not built), and the exact
  reference the integer kernel is measured against.
- `Int4LinearI8`: the Q4_1 codes on integer dot products, through runtime/cpu_kernels/quant_linear_i8.cpp
  (AVX2 + FMA): each row coded per block of 32 inputs as two int8 digits (15 bits). q4's layers on
  CPUs without native bf16: at one row 1.8x faster than `CodesLinearF32` (`python -m
  bench.probes.quant_linear_bench`, layers_i8 against layers_f32, stop 25), equal at 16 and 64 rows, slower
  at 512; on the drift test's positions its greedy tokens all equal fp32's (`make_q4_linear` picks it).

Calling a layer keeps the caller's dtype (the residual stream stays in the engine dtype); the
quantized kernels other than `CodesLinearF32` compute in bf16, their fast CPU path (aten's
fp32-activation int4 path is ~20x slower).
`native(x)` skips both casts: x already in `act_dtype`, y returned in it (runtime/model/decoder.py's fused
CPU path feeds it the bf16 outputs of runtime/cpu_kernels/layer_ops.cpp).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.model.quant_codes import INT4_GROUP, Int4Codes, Int8Codes

TILE = 16  # output columns per vector in cpu_kernels/quant_linear.cpp
_GROUPS = {4: INT4_GROUP, 5: INT4_GROUP, 6: 16}  # code bits -> the group int4_linear takes them in
# How runtime/cpu_kernels/decoder_layers.cpp runs a layer (its LinearKind values): a kernel by name,
# or aten's int8 and dense matmuls. A layer's `loop_spec()` is (kind, a, b, bias), what that call
# takes, or None where only Python can run it.
LOOP_KINDS = {
    "jumpgate_cpu.int4_linear": 0,
    "jumpgate_cpu.int8_linear": 1,
    "jumpgate_cpu.int4_linear_f32": 2,
    "jumpgate_cpu.int8_linear_f32": 3,
    "jumpgate_cpu.int4_linear_i8": 4,
    "aten._weight_int8pack_mm": 5,
    "aten.linear": 6,
}


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        self.weight = weight.to(dtype).contiguous()
        self.bias = None if bias is None else bias.to(dtype)
        self.dtype = dtype

    @property
    def act_dtype(self) -> torch.dtype:
        return self.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def loop_spec(self):
        return LOOP_KINDS["aten.linear"], self.weight, None, self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.dtype:
            return self.native(x)
        return self.native(x.to(self.dtype)).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def numel(self) -> int:
        return self.weight.numel()


class Int8Linear:
    """Per-output-channel symmetric int8 quantization of a float weight (CPU kernel)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        w = weight.float()
        # Scales are rounded to bf16 (the kernel's dtype) before quantizing, so codes fit the scale used.
        self.scales = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(torch.bfloat16)
        scale = self.scales.float()
        self.qweight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    act_dtype = torch.bfloat16

    def native(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)
        return y if self.bias is None else y + self.bias

    def loop_spec(self):
        return LOOP_KINDS["aten._weight_int8pack_mm"], self.qweight, self.scales, self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x.to(torch.bfloat16)).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes

    def numel(self) -> int:
        return self.qweight.numel()


class Int4Linear:
    """Group-wise int4 weights with bf16 activations. Where the CPU kernels build with AVX512-BF16,
    runtime/cpu_kernels/quant_linear.cpp runs them (the codes in bf16 dot products, scale and zero in
    fp32, one fixed order per row for every row count); elsewhere `aten._weight_int4pack_mm_for_cpu`
    over packed codes and bf16 (scale, zero) pairs. `kernel` says which."""

    def __init__(self, w: Int4Codes, bias: torch.Tensor | None, kernels: bool = True):
        """`kernels` False: aten's kernel even where ours is built (a reference for benches)."""
        n, k = w.codes.shape
        if k % w.group or w.scales.shape != (n, k // w.group) or w.zeros.shape != w.scales.shape:
            raise ValueError(f"int4 weight [{n}, {k}]: scales/zeros must be [{n}, {k // w.group}] (group {w.group})")
        self.group = w.group
        self.shape = (n, k)
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self._ops = quant_kernels() if kernels and w.group == _GROUPS.get(w.bits) and n % TILE == 0 else None
        if w.bits > 4 and self._ops is None:
            raise ValueError(
                f"{w.bits}-bit codes in groups of {w.group}: the int4 kernel takes 5-bit ones in groups of 32 and"
                " 6-bit ones in groups of 16, where it is built"
            )
        if self._ops is not None:
            self.kernel = "jumpgate_cpu.int4_linear"
            self.packed = {4: pack_int4_tiles, 5: pack_int5_tiles, 6: pack_int6_tiles}[w.bits](w.codes)
            # the kernel's codes are 128 + q: w = (q - 8) * scale + zero = (128 + q) * scale + (zero - 136 * scale)
            if w.bits == 6:
                # w = q * scale + min = (128 + q) * scale + (min - 128 * scale); Q6_K's scales alone
                # (min = -32 * scale) where the kernel's own -160 * scale gives the same bits
                scales, mins = w.scales.float(), w.offsets().float()
                offsets = mins - 128 * scales
                pair = [scales] if torch.equal(offsets, -160 * scales) else [scales, offsets]
            elif _q4_1_halves(w):
                # a GGUF's Q4_1 blocks: their own fp16 (d, m), half the bytes a decode streams with
                # the codes; the kernel forms zero - 136 * scale = (m + 8d) - 136d with the same
                # float32 roundings as the line below
                pair = [w.scales.half(), w.mins.half()]
            else:
                scales = w.scales.float()
                pair = [scales, w.zeros.float() - 136 * scales]
            # [N / 16, K / group, 2, 16]: a column vector's scales and offsets group after group
            self.scale_offset = (
                torch.stack(pair).reshape(len(pair), n // TILE, TILE, -1).permute(1, 3, 0, 2).contiguous()
            )
            self.scales_zeros = None
        else:
            self.kernel = "aten._weight_int4pack_mm_for_cpu"
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.codes.to(torch.int32).contiguous(), 1)
            # The kernel's layout: [K / group, N, 2] of (scale, zero).
            self.scales_zeros = torch.stack([w.scales.t(), w.zeros.t()], dim=-1).to(torch.bfloat16).contiguous()

    act_dtype = torch.bfloat16

    def native(self, x: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            y = self._ops.int4_linear(x, self.packed, self.scale_offset)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_zeros)
        return y if self.bias is None else y + self.bias

    def loop_spec(self):
        if self._ops is None:
            return None  # aten's int4 kernel takes a group size: not one of the loop's kinds
        return LOOP_KINDS[self.kernel], self.packed, self.scale_offset, self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x.to(torch.bfloat16)).to(x.dtype)

    @property
    def nbytes(self) -> int:
        extra = self.scales_zeros.nbytes if self.scales_zeros is not None else self.scale_offset.nbytes
        return self.packed.nbytes + extra

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


def _q4_1_halves(w: Int4Codes) -> bool:
    """Whether `w`'s scales and offsets are a Q4_1 block's fp16 d and m (zero = m + 8d, as
    Int4Codes.from_q4_1 makes it), so the int4 kernel can take them as stored."""
    if w.mins is None:
        return False
    d, m = w.scales.float(), w.mins.float()
    return (
        torch.equal(d.half().float(), d)
        and torch.equal(m.half().float(), m)
        and torch.equal(w.zeros.float(), m + 8 * d)
    )


def pack_int4_tiles(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> uint8 [N / 16, K / 4, 32], quant_linear.cpp's int4 layout: per tile of 16
    output columns and per 4 inputs k = 4j + 2h + e, byte 2c + e holds column c's code of input
    4j + e in its low nibble (h = 0) and of input 4j + 2 + e in its high nibble (h = 1)."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n // TILE, TILE, k // 4, 2, 2)  # [tile, col, j, h, e]
    quads = c[:, :, :, 0, :] | (c[:, :, :, 1, :] << 4)  # [tile, col, j, e]
    return quads.permute(0, 2, 1, 3).reshape(n // TILE, k // 4, 2 * TILE).contiguous()


def _bit_masks(codes: torch.Tensor, bit: int) -> torch.Tensor:
    """Bit `bit` of codes [N, K] -> uint8 [N / 16, K / 4, 8]: per tile and 4 inputs, two little-endian
    32-bit masks, bit 2c + e of mask h for column c's code of input 4j + 2h + e."""
    n, k = codes.shape
    high = ((codes >> bit) & 1).to(torch.int64).reshape(n // TILE, TILE, k // 4, 2, 2)  # [tile, col, j, h, e]
    words = high.permute(0, 2, 3, 1, 4).reshape(n // TILE, k // 4, 2, 2 * TILE)  # [tile, j, h, word]
    masks = (words << torch.arange(2 * TILE)).sum(-1)  # [tile, j, h]
    le = torch.stack([(masks >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8)  # [tile, j, h, 4]
    return le.reshape(n // TILE, k // 4, 8)


def pack_int5_tiles(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..31 -> uint8 [N / 16, K / 4, 40], quant_linear.cpp's Packed5: per tile and 4
    inputs, `pack_int4_tiles`' 32 bytes of low nibbles, then the fifth bits' two masks (`_bit_masks`)."""
    return torch.cat([pack_int4_tiles(codes & 15), _bit_masks(codes, 4)], -1).contiguous()


def pack_int6_tiles(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..63 -> uint8 [N / 16, K / 4, 48], quant_linear.cpp's Packed6: `pack_int5_tiles`'
    40 bytes, then the sixth bits' two masks."""
    return torch.cat([pack_int4_tiles(codes & 15), _bit_masks(codes, 4), _bit_masks(codes, 5)], -1).contiguous()


def pack_int8_tiles(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] int8 -> int8 [N / 16, K / 2, 32], quant_linear.cpp's int8 layout: per tile of 16
    output columns and per pair of inputs, column c's two codes at 2c, 2c + 1."""
    n, k = codes.shape
    c = codes.to(torch.int8).reshape(n // TILE, TILE, k // 2, 2)  # [tile, col, pair, e]
    return c.permute(0, 2, 1, 3).reshape(n // TILE, k // 2, 2 * TILE).contiguous()


class Int8GroupLinear:
    """GGUF Q8_0 weights as they are, through quant_linear.cpp's int8_linear (bf16 activations, the
    codes exact in bf16 dot products, the scales fp32). `make_int8_group_linear` falls back to a
    bf16 copy where the kernel is not built. Groups of 32 or 16 inputs (Q6_K's sub-blocks);
    `offsets` [N, K / group]: w = q * scale + offset (the kernel's S = 2)."""

    kernel = "jumpgate_cpu.int8_linear"
    act_dtype = torch.bfloat16

    def __init__(self, w: Int8Codes, ops, offsets: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        n, k = w.codes.shape
        if w.group not in (16, INT4_GROUP) or k % w.group or n % TILE:
            raise ValueError(
                f"int8 codes [{n}, {k}]: {self.kernel} takes groups of 16 or 32, whole tiles of 16 columns"
            )
        self.shape = (n, k)
        self._ops = ops
        self.packed = pack_int8_tiles(w.codes)
        parts = [w.scales] if offsets is None else [w.scales, offsets]
        # [N / 16, K / group, parts, 16]: a column vector's scales (then offsets) group after group
        self.scales = (
            torch.stack([p.float() for p in parts])
            .reshape(len(parts), n // TILE, TILE, -1)
            .permute(1, 3, 0, 2)
            .contiguous()
        )
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        y = self._ops.int8_linear(x, self.packed, self.scales)
        return y if self.bias is None else y + self.bias

    def loop_spec(self):
        return LOOP_KINDS[self.kernel], self.packed, self.scales, self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.native(x.to(torch.bfloat16)).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


def make_int8_group_linear(w: Int8Codes):
    """The int8 kernel over `w` where it runs (AVX512-BF16, group 32 or 16, whole vectors of 16
    columns), else the float32-activation one (AVX2 + FMA, group 32); elsewhere a bf16 copy of the
    dequantized weights. Q6_K's codes (groups of 16, -32..31: a Q4_K_M file's output or tied
    embedding) as 6-bit ones on the int4 kernel: 8 bits a weight streamed instead of 10."""
    n, k = w.codes.shape
    fits = w.group in (16, INT4_GROUP) and n % TILE == 0 and k % w.group == 0
    ops = quant_kernels() if fits else None
    if ops is not None and w.group == 16 and -32 <= int(w.codes.min()) and int(w.codes.max()) < 32:
        s = w.scales.float()
        return Int4Linear(Int4Codes((w.codes.to(torch.int16) + 32).to(torch.uint8), s, -24 * s, 16, -32 * s, 6), None)
    if ops is not None:
        return Int8GroupLinear(w, ops)
    ops = f32_quant_kernels() if fits and w.group == INT4_GROUP else None
    if ops is not None:
        return CodesLinearF32(w, None, ops)
    return DenseLinear(w.dequantize(), None, torch.bfloat16)


def make_q8_linear(w: torch.Tensor, bias: torch.Tensor | None):
    """A q8 layer: `w` quantized per group of 32 inputs (Q8_0's rule) through the int8 group kernels
    where its shape fits them; per-output-channel int8 (`Int8Linear`) where it does not or has a bias.
    One scale per 32 weights instead of per 576-wide row: on the drift test's positions (`pytest -s -k
    drift tests/runtime/model/test_weight_formats.py`) the per-channel form agreed with fp32's top token on 94.9%
    (an AVX512-BF16 + AMX CPU, under the test's 95% bar) and 95.7% (an AVX2 one); this form on 97.7%
    (the AMX one)."""
    n, k = w.shape
    if bias is not None or k % INT4_GROUP or n % TILE:
        return Int8Linear(w, bias)
    return make_int8_group_linear(Int8Codes.quantize(w))


def make_q4_linear(w: Int4Codes, bias: torch.Tensor | None):
    """A q4 layer: the bf16 int4 kernel where it is built (AVX512-BF16), else the integer one (AVX2 +
    FMA), else aten's int4 kernel. 5-bit codes (Q5_0, Q5_1, Q5_K) and 6-bit ones in groups of 16
    (Q6_K, and layers stacking it with 4- or 5-bit parts) on the bf16 int4 kernel too, their high bits
    beside the nibbles; wider ones (Q8_0 and layers stacking it): `make_wide_linear`."""
    n, k = w.codes.shape
    if w.bits in (5, 6) and w.group == _GROUPS[w.bits] and n % TILE == 0 and quant_kernels() is not None:
        return Int4Linear(w, bias)  # 5- and 6-bit codes as stored (Q5_0, Q5_1, Q5_K; Q6_K)
    if w.bits > 4:
        return make_wide_linear(w, bias)
    ops = None if quant_kernels() is not None or w.group != INT4_GROUP or n % TILE else i8_quant_kernels()
    return Int4LinearI8(w, bias, ops) if ops is not None else Int4Linear(w, bias)


def make_wide_linear(w: Int4Codes, bias: torch.Tensor | None):
    """Codes of 5 to 8 bits (5 and 6: where `make_q4_linear` cannot give them to the int4 kernel)
    (w = q * scale + min, groups of 32 or 16) on the int8 kernel, widened
    losslessly to one int8 code a weight: q - 2^(bits-1) with no offset where every min is
    -2^(bits-1) * scale (Q5_0, Q6_K, Q8_0: the kernel's S = 1), else q with the blocks' own mins
    (Q5_1, Q5_K, layers stacking them; 8-bit codes less 128, the offset rounded once). Where the
    AVX512-BF16 kernels are not built, a dense copy of the dequantized weights, in the activation
    dtype of that CPU's q4 layers."""
    n, k = w.codes.shape
    ops = quant_kernels() if w.group in (16, INT4_GROUP) and k % w.group == 0 and n % TILE == 0 else None
    if ops is None:
        return DenseLinear(w.dequantize(), bias, torch.float32 if i8_quant_kernels() is not None else torch.bfloat16)
    center = 1 << (w.bits - 1)
    mins = w.offsets().float()
    symmetric = torch.equal(mins, -center * w.scales.float())
    shift = center if symmetric or w.bits == 8 else 0
    codes = (w.codes.to(torch.int16) - shift).to(torch.int8)
    offsets = None if symmetric else mins + shift * w.scales.float()
    return Int8GroupLinear(Int8Codes(codes, w.scales, w.group), ops, offsets, bias)


class PackedCodesLinear:
    """A GGUF code kernel over float32 activations: `packed` codes and `scales` in the kernel's tile
    layout, `_op(x, packed, scales)` -> y (runtime/cpu_kernels/quant_linear_f32.cpp, quant_linear_i8.cpp)."""

    act_dtype = torch.float32
    kernel: str
    packed: torch.Tensor
    scales: torch.Tensor

    def __init__(self, w: Int4Codes | Int8Codes, bias: torch.Tensor | None, scale_parts: list[torch.Tensor]):
        n, k = w.codes.shape
        if k % w.group or w.group != INT4_GROUP or n % TILE:
            raise ValueError(f"codes [{n}, {k}]: {self.kernel} takes groups of 32 and whole tiles of 16 columns")
        self.shape = (n, k)
        self.bias = None if bias is None else bias.float()
        # [N / 16, K / 32, len(parts), 16]: a tile's scales (then offsets) group after group
        parts = len(scale_parts)
        self.scales = (
            torch.stack([p.float() for p in scale_parts])
            .reshape(parts, n // TILE, TILE, -1)
            .permute(1, 3, 0, 2)
            .contiguous()
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._op(x if x.dtype == torch.float32 else x.float(), self.packed, self.scales)
        y = y if self.bias is None else y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)

    native = __call__

    def loop_spec(self):  # float32 activations in, float32 out: the casts of __call__ do nothing there
        return LOOP_KINDS[self.kernel], self.packed, self.scales, self.bias

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


class CodesLinearF32(PackedCodesLinear):
    """GGUF Q4_1 or Q8_0 codes with float32 activations (runtime/cpu_kernels/quant_linear_f32.cpp):
    the kernel makes w = q * d + m (Q8_0: q * d) with one rounding, which is exactly the float32
    reference's weight (the loader's dequantization), and sums each row in input order, the same
    for every row count."""

    def __init__(self, w: Int4Codes | Int8Codes, bias: torch.Tensor | None, ops):
        int4 = isinstance(w, Int4Codes)
        self.kernel = "jumpgate_cpu.int4_linear_f32" if int4 else "jumpgate_cpu.int8_linear_f32"
        super().__init__(w, bias, [w.scales, w.offsets()] if int4 else [w.scales])
        self.packed = pack_int4_pairs(w.codes) if int4 else pack_int8_pairs(w.codes)
        self._op = ops.int4_linear_f32 if int4 else ops.int8_linear_f32


class Int4LinearI8(PackedCodesLinear):
    """GGUF Q4_1 codes on integer dot products (runtime/cpu_kernels/quant_linear_i8.cpp, AVX2): the
    kernel codes each row per block of 32 inputs as two int8 digits (a 15-bit code, error at most
    max|x| / 64516) plus the block's exact sum for the offset term, and sums code x digit products in
    integers. The weights are the GGUF's own; a row's bits do not depend on the other rows."""

    kernel = "jumpgate_cpu.int4_linear_i8"

    def __init__(self, w: Int4Codes, bias: torch.Tensor | None, ops):
        super().__init__(w, bias, [w.scales, w.offsets()])
        self.packed = pack_int4_quads(w.codes)
        self._op = ops.int4_linear_i8


def pack_int4_quads(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> uint8 [N / 16, K / 4, 32], quant_linear_i8.cpp's layout: per tile of 16
    columns and 4 inputs 4j + e, byte 4c + e holds column c's code (low nibble) and column 8 + c's
    (high nibble), so one AND and one shift give two vectors of 8 columns x 4 consecutive inputs."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n // TILE, 2, TILE // 2, k // 4, 4)  # [tile, half, col, j, e]
    both = c[:, 0] | (c[:, 1] << 4)  # [tile, col, j, e]
    return both.permute(0, 2, 1, 3).reshape(n // TILE, k // 4, 2 * TILE).contiguous()


def pack_int4_pairs(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> uint8 [N / 16, K / 2, 16], quant_linear_f32.cpp's int4 layout: per tile
    of 16 columns and pair of inputs, byte c holds column c's code of the first input (low nibble)
    and of the second (high nibble)."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n // TILE, TILE, k // 2, 2)  # [tile, col, pair, e]
    return (c[..., 0] | (c[..., 1] << 4)).permute(0, 2, 1).contiguous()


def pack_int8_pairs(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] int8 -> int8 [N / 16, K / 2, 32], quant_linear_f32.cpp's int8 layout: per tile of
    16 columns and pair of inputs, column c's code of the first input at byte c, of the second at 16 + c."""
    n, k = codes.shape
    c = codes.to(torch.int8).reshape(n // TILE, TILE, k // 2, 2)  # [tile, col, pair, e]
    return c.permute(0, 2, 3, 1).reshape(n // TILE, k // 2, 2 * TILE).contiguous()


def _kernels_built(probe: str):
    """torch.ops.jumpgate_cpu where the kernels behind `probe` (an op saying whether its source was
    compiled with the instructions it needs) were built, else None."""
    from runtime.cpu_kernels import load_cpu_kernels

    ops = load_cpu_kernels()
    return ops if ops is not None and getattr(ops, probe)() else None


def quant_kernels():
    """The quantized kernels on bf16 dot products (AVX512-BF16), or None."""
    return _kernels_built("int4_linear_available")


def i8_quant_kernels():
    """The integer int4 kernel (AVX2 + FMA), or None."""
    return _kernels_built("quant_linear_i8_available")


def f32_quant_kernels():
    """The float32-activation quantized kernels (AVX2 + FMA), or None."""
    return _kernels_built("quant_linear_f32_available")
