"""GGUF K-quants (Q4_K, Q5_K, Q6_K) and the other block types a Q4_K_M file holds (Q5_0, Q5_1,
Q8_0 where rows are not whole super-blocks) run from their blocks as stored: the codes read equal
gguf's own dequantization bit for bit, the kernels (runtime/cpu_kernels/quant_linear.cpp through
runtime/model/linear.py) equal x @ dequantize(W).T within their output rounding, and a tiny
random llama written as a Q4_K_M file serves with greedy tokens agreeing with its dequantized
float32 weights on >= 97% of positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from gguf.quants import quantize as gguf_quantize

from runtime.model.gguf_blocks import layer_codes, quantize, symmetric_codes
from runtime.model.gguf_requantize import q4_k_m_type, use_more_bits
from runtime.model.linear import Int4Linear, Int8GroupLinear, make_int8_group_linear, make_q4_linear, make_wide_linear
from runtime.model.quant_codes import Int4Codes

K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
ALL_TYPES = (*K_QUANTS, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


def weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[::7] += 0.03  # rows whose minimum is above zero (a K-quant's min term at its limit)
    w[1, :40] = 0.0  # an all-zero sub-block
    return w


def blocks(kind, n: int, k: int, seed: int = 0) -> np.ndarray:
    w = weights(n, k, seed)
    return quantize(w, kind) if kind in K_QUANTS else gguf_quantize(w, kind)


def reference(kind, b: np.ndarray, n: int) -> torch.Tensor:
    """gguf's own dequantization of the blocks: what the GGUF file means."""
    return torch.from_numpy(np.asarray(dequantize(b, kind), dtype=np.float32).reshape(n, -1))


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.fixture
def bf16_kernels(cpu_ops):
    if not cpu_ops.int4_linear_available():
        pytest.skip("built without AVX512-BF16: wider codes run as a dense copy")
    return cpu_ops


@pytest.mark.parametrize("kind", ALL_TYPES, ids=lambda t: t.name)
def test_codes_read_equal_ggufs_dequantization_bit_for_bit(kind):
    n, k = 48, 512
    b = blocks(kind, n, k)
    w = reference(kind, b, n)
    codes = layer_codes(kind, b)
    assert torch.equal(codes.dequantize(), w)
    assert codes.codes.shape == (n, k) and int(codes.codes.max()) < (1 << codes.bits)
    assert (codes.group, codes.bits) == {T.Q6_K: (16, 6), T.Q4_K: (32, 4), T.Q4_1: (32, 4), T.Q8_0: (32, 8)}.get(
        kind, (32, 5)
    )
    sym = symmetric_codes(kind, b)
    assert (sym is not None) == (kind in (T.Q6_K, T.Q5_0, T.Q8_0))
    if sym is not None:
        assert torch.equal(sym.dequantize(), w)


def test_our_k_quant_blocks_hold_the_weights():
    """The writer's blocks (gguf-py has no K-quant quantizer): gguf reads them back near the input."""
    w = weights(32, 768)
    for kind, err in ((T.Q4_K, 0.08), (T.Q5_K, 0.04), (T.Q6_K, 0.03)):
        back = np.asarray(dequantize(quantize(w, kind), kind)).reshape(w.shape)
        assert np.abs(back - w).max() <= err * np.abs(w).max(), kind
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(w[:, :576], T.Q4_K)


def bound(codes: Int4Codes, x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """bf16 output rounding (2^-9 relative, with margin) plus float32 sums over the kernel's terms
    (codes times scale, and the offsets) of k inputs."""
    n, k = codes.codes.shape
    terms = (codes.codes.double().reshape(n, -1, codes.group) * codes.scales.double()[..., None]).abs()
    terms = terms + codes.offsets().double().abs()[..., None]
    return exact.abs() * 2.0**-8 + (x.double().abs() @ terms.reshape(n, k).t()) * 1e-6


@pytest.mark.parametrize("kind", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n,k", [(48, 256), (80, 768), (576, 1536)])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_the_kernel_equals_x_times_the_dequantized_weights(bf16_kernels, kind, n, k, m):
    b = blocks(kind, n, k)
    codes = layer_codes(kind, b)
    lin = make_q4_linear(codes, None)
    # 4- to 6-bit codes on the int4 kernel (the high bits beside the nibbles), Q8_0's on int8
    assert isinstance(lin, Int4Linear if codes.bits <= 6 else Int8GroupLinear)
    x = activations(m, k)
    exact = x.double() @ reference(kind, b, n).double().t()
    got = lin.native(x)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert ((got.double() - exact).abs() <= bound(codes, x, exact)).all()


def test_a_q4_k_m_fallback_width_runs_from_its_blocks_too(bf16_kernels):
    """SmolLM2's rows are 576 wide, not whole super-blocks: llama.cpp writes Q5_0 and Q8_0 there."""
    for kind in (T.Q5_0, T.Q8_0):
        b = blocks(kind, 64, 576)
        codes = layer_codes(kind, b)
        x = activations(3, 576)
        exact = x.double() @ reference(kind, b, 64).double().t()
        got = make_q4_linear(codes, None).native(x)
        assert ((got.double() - exact).abs() <= bound(codes, x, exact)).all()


def test_5_bit_codes_stream_5_bits_and_q5_0_keeps_its_fp16_scales(bf16_kernels):
    q5_0 = make_q4_linear(layer_codes(T.Q5_0, blocks(T.Q5_0, 64, 576)), None)
    q5_k = make_q4_linear(layer_codes(T.Q5_K, blocks(T.Q5_K, 64, 512)), None)
    assert q5_0.packed.nbytes * 8 == 5 * 64 * 576 and q5_0.scale_offset.dtype == torch.float16  # d and -16d
    assert q5_k.packed.nbytes * 8 == 5 * 64 * 512 and q5_k.scale_offset.dtype == torch.float32  # d * sc


def test_6_bit_codes_stream_8_bits_with_their_scales_alone(bf16_kernels):
    """Q6_K: 6-bit codes as stored and one fp32 scale per 16 (the kernel makes the offset -160 * scale)."""
    lin = make_q4_linear(layer_codes(T.Q6_K, blocks(T.Q6_K, 64, 512)), None)
    assert lin.packed.nbytes * 8 == 6 * 64 * 512 and lin.scale_offset.shape == (4, 32, 1, 16)
    assert lin.nbytes * 8 == 8 * 64 * 512


@pytest.fixture(params=["amx", "vector"])
def path(request, bf16_kernels):
    """Runs a test on the AMX path (where the CPU has it) and on the vector path."""
    if request.param == "amx" and not bf16_kernels.int4_linear_amx():
        pytest.skip("no AMX tiles on this CPU")
    before = bf16_kernels.quant_linear_use_amx(request.param == "amx")
    yield request.param
    bf16_kernels.quant_linear_use_amx(before)


@pytest.mark.parametrize("n,k", [(48, 256), (96, 768), (576, 1536)])
def test_6_bit_codes_on_both_paths(path, bf16_kernels, n, k):
    """Q6_K on the int4 kernel's AMX and vector paths: x @ dequantize(W).T within output rounding for
    1, 5 and 17 rows (odd and even numbers of column vectors), a row's bits the same alone and in a
    batch, and the made offset's bits those of the same offsets stored."""
    b = blocks(T.Q6_K, n, k)
    codes = layer_codes(T.Q6_K, b)
    lin = make_q4_linear(codes, None)
    x = activations(17, k)
    exact = x.double() @ reference(T.Q6_K, b, n).double().t()
    stored = torch.cat([lin.scale_offset, -160 * lin.scale_offset], 2)
    alone = torch.cat([lin.native(x[i : i + 1]) for i in range(17)])
    for m in (1, 5, 17):
        got = lin.native(x[:m])
        assert ((got.double() - exact[:m]).abs() <= bound(codes, x[:m], exact[:m])).all(), m
        assert torch.equal(got, alone[:m]), m
        assert torch.equal(bf16_kernels.int4_linear(x[:m], lin.packed, stored), got), m


def test_the_int4_kernel_refuses_bad_6_bit_inputs(bf16_kernels):
    lin = make_q4_linear(layer_codes(T.Q6_K, blocks(T.Q6_K, 16, 256)), None)
    x = activations(1, 256)
    with pytest.raises(RuntimeError, match=r"int4_linear: scale_offset \[N/16, K/16, 1, 16\], Float"):
        bf16_kernels.int4_linear(x, lin.packed, lin.scale_offset.half())
    with pytest.raises(RuntimeError, match="int4_linear: K must be a multiple of 16"):
        bf16_kernels.int4_linear(activations(1, 258), lin.packed, lin.scale_offset)
    c = layer_codes(T.Q6_K, blocks(T.Q6_K, 16, 256))
    in_32 = Int4Codes(c.codes, c.scales[:, ::2], c.zeros[:, ::2], 32, c.mins[:, ::2], 6)
    with pytest.raises(ValueError, match="6-bit codes in groups of 32"):
        Int4Linear(in_32, None)


def test_layers_stacking_different_types_run_as_one(bf16_kernels):
    """A fused qkv of Q4_K q and k beside a Q6_K v (Q4_K_M's more-bits layers): one 6-bit layer in
    groups of 16 with stored offsets, each part's own weights."""
    parts = [(T.Q4_K, 64), (T.Q4_K, 32), (T.Q6_K, 32)]
    k = 256
    raw = [blocks(kind, n, k, seed=i) for i, (kind, n) in enumerate(parts)]
    codes = Int4Codes.cat([layer_codes(kind, b) for (kind, _), b in zip(parts, raw)])
    assert (codes.group, codes.bits) == (16, 6)
    want = torch.cat([reference(kind, b, n) for (kind, n), b in zip(parts, raw)])
    assert torch.equal(codes.dequantize(), want)
    bias = torch.randn(128)
    lin = make_q4_linear(codes, bias)
    assert isinstance(lin, Int4Linear) and lin.packed.shape[2] == 48 and lin.scale_offset.shape[2] == 2
    x = activations(9, k)
    product = x.double() @ want.double().t()
    exact = product + bias.bfloat16().double()
    got = lin.native(x).double()
    # the product's bound, then the bf16 sum with the bias rounded once more
    assert ((got - exact).abs() <= bound(codes, x, product) + exact.abs() * 2.0**-8).all()


@pytest.mark.parametrize("kind", [T.Q6_K, T.Q5_K, T.Q5_0], ids=lambda t: t.name)
def test_a_row_is_bitwise_the_same_alone_and_in_any_batch(bf16_kernels, kind):
    lin = make_q4_linear(layer_codes(kind, blocks(kind, 96, 512)), None)
    x = activations(40, 512)
    alone = torch.cat([lin.native(x[i : i + 1]) for i in range(40)])
    for m in (2, 4, 5, 8, 9, 16, 17, 40):
        assert torch.equal(lin.native(x[:m]), alone[:m]), m


def test_a_q6_k_logits_layer_runs_its_codes(bf16_kernels):
    b = blocks(T.Q6_K, 64, 256)
    lin = make_int8_group_linear(symmetric_codes(T.Q6_K, b))
    assert isinstance(lin, Int4Linear) and lin.nbytes * 8 == 8 * 64 * 256  # 6-bit codes, fp32 scales per 16
    x = activations(2, 256)
    exact = x.double() @ reference(T.Q6_K, b, 64).double().t()
    assert ((lin.native(x).double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-5).all()


def test_the_int8_kernel_refuses_a_bad_group(bf16_kernels):
    codes = layer_codes(T.Q6_K, blocks(T.Q6_K, 16, 256))
    lin = make_wide_linear(codes, None)
    with pytest.raises(RuntimeError, match="int8_linear"):
        bf16_kernels.int8_linear(activations(1, 256), lin.packed, lin.scales[:, :5])


def test_q4_k_m_types_follow_llama_cpp():
    n = 30
    assert [i for i in range(n) if use_more_bits(i, n)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert q4_k_m_type("blk.0.attn_q.weight", n, 512, False) == T.Q4_K
    assert q4_k_m_type("blk.2.attn_v.weight", n, 512, False) == T.Q6_K
    assert q4_k_m_type("blk.3.ffn_down.weight", n, 1536, False) == T.Q4_K
    assert q4_k_m_type("blk.5.ffn_down.weight", n, 1536, False) == T.Q6_K
    assert q4_k_m_type("token_embd.weight", n, 512, False) == T.Q6_K  # tied: the output's type
    assert q4_k_m_type("token_embd.weight", n, 512, True) == T.Q4_K
    assert q4_k_m_type("blk.0.attn_q.weight", n, 576, False) == T.Q5_0  # not whole super-blocks
    assert q4_k_m_type("token_embd.weight", n, 576, False) == T.Q8_0


# ---- a Q4_K_M model -----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JUMPGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_q4_k_m_llama_serves_from_its_blocks(tmp_path, cache_dir, smollm_dir, cpu_ops):
    """A random 4-layer llama (rows 256 and 512 wide: whole super-blocks) written as float32 GGUF,
    rewritten as Q4_K_M (Q4_K, with Q6_K v and down in layers 2 and 3 and the tied embedding):
    `auto` picks q4 and runs every layer's blocks as stored; greedy tokens, teacher-forced along
    float32's, agree with the dequantized weights' on >= 97% of positions."""
    import transformers as tf
    from gguf import GGUFReader

    from runtime.model.decoder import DecoderModel, load_model, load_weights
    from runtime.model.gguf_requantize import write_q4_k_m
    from runtime.model.loader import read_config, read_gguf_codes, resolve_model_dir, source_gguf
    from tests.runtime.model.test_gguf_families import write_gguf
    from tests.runtime.model.test_model_families import run_ours, save_tiny
    from tests.runtime.model.test_moe_families import MIN_AGREEMENT

    shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    folder = save_tiny(tmp_path / "hf", smollm_dir, tf.LlamaConfig, tf.LlamaForCausalLM, **shape)
    f32 = write_gguf(folder, tmp_path / "tiny-llama-f32.gguf", "llama", smollm_dir)
    path = write_q4_k_m(f32, tmp_path / "tiny-llama-Q4_K_M.gguf")
    types = {t.name: t.tensor_type for t in GGUFReader(str(path)).tensors}
    assert types["blk.0.attn_q.weight"] == T.Q4_K and types["blk.3.attn_v.weight"] == T.Q6_K
    assert types["blk.2.ffn_down.weight"] == T.Q6_K and types["token_embd.weight"] == T.Q6_K

    converted = resolve_model_dir(path)  # the dequantized float32 folder
    cfg = read_config(converted)
    weights = load_weights(converted)
    codes = read_gguf_codes(source_gguf(converted))
    for name, c in codes.items():
        assert torch.equal(c.dequantize(), weights[name]), name
    assert codes["model.layers.3.self_attn.v_proj.weight"].bits == 6
    model = load_model(converted, cfg, "auto", torch.device("cpu"), torch.float32, invariant_attention=True)
    assert model.weights == "q4", model.weights_reason
    if cpu_ops.int4_linear_available():
        kinds = {type(lin).__name__ for layer in model.layers for lin in (layer.qkv, layer.down)}
        assert kinds == {"Int4Linear"}  # Q4_K, Q6_K and qkv stacking both: codes as stored
        assert model.layers[3].down.packed.shape[2] == 48  # Q6_K: 6-bit codes
        assert isinstance(model.lm_head, Int4Linear)  # the Q6_K embedding's own codes
    ref = DecoderModel(cfg, weights, torch.device("cpu"), torch.float32)
    ids = list(range(20, 44))
    for _ in range(40):  # float32's greedy continuation
        ids.append(int(run_ours(ref, cfg, ids, len(ids))[-1].argmax()))
    exact = run_ours(ref, cfg, ids, 24)
    ours = run_ours(model, cfg, ids, 24)
    agree = float((ours.argmax(-1) == exact.argmax(-1)).float().mean())
    print(f"tiny llama Q4_K_M, q4: greedy agreement with its dequantized fp32 {agree:.4f} over {len(ids)} positions")
    assert agree >= MIN_AGREEMENT
