"""The fused layer ops (runtime/cpu_kernels/layer_ops.cpp) and the model's fused CPU path.

- each op equals its plain-torch form (rms_norm then a bf16 cast; silu(gate) * up in float32 then
  a bf16 cast: within one bf16 rounding step; rope: exactly, and K/V land in their slots only);
- a row's output is bitwise the same alone, in a batch, and with 1 or 2 threads;
- bad inputs raise instead of writing out of bounds;
- the float32-activation forms (q4 through the AVX2 kernel): the torch forms within float32
  rounding, the residual add + norm bit for bit, rope from float32 q/k/v exactly as from bf16 ones;
- a q4 model through the fused path gives the logits of its plain-torch path within bf16 noise,
  with the same greedy tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.decoder import rms_norm
from runtime.model.rope import RotaryEmbedding

BF16_STEP = 2.0**-7  # relative spacing of bf16 values: one rounding differs by at most this


def close_in_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.bfloat16
    err = (got.float() - want.float()).abs()
    assert (err <= want.float().abs() * BF16_STEP + 1e-30).all(), f"max err {err.max().item()}"


@pytest.mark.parametrize("dim", [576, 64, 40])  # 40: a partial last vector
def test_rms_norm_bf16_equals_the_torch_form(cpu_ops, dim):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(33, dim, generator=g) * 3, torch.randn(dim, generator=g)
    close_in_bf16(cpu_ops.rms_norm_bf16(x, w, 1e-5), rms_norm(x, w, 1e-5))


def test_silu_mul_bf16_equals_the_torch_form(cpu_ops):
    g = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(17, 2 * 1536, generator=g) * 4).bfloat16()
    gate, up = gate_up.float().chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = cpu_ops.silu_mul_bf16(gate_up)
    # the kernel's expf is within ~1 ulp of torch's: allow that on top of the bf16 rounding
    err = (got.float() - want).abs()
    assert (err <= want.abs() * (BF16_STEP + 1e-6) + 1e-6).all(), f"max err {err.max().item()}"


def rope_inputs(t, heads=9, kv_heads=3, dim=64, num_slots=512, seed=2):
    from runtime.model.config import ModelConfig

    g = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=10,
        hidden_size=heads * dim,
        intermediate_size=8,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=dim,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
    )
    rope = RotaryEmbedding(cfg, 4096, torch.device("cpu"), torch.float32)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, generator=g).bfloat16()
    positions = torch.randint(0, 4096, (t,), generator=g)
    slots = torch.randperm(num_slots, generator=g)[:t]
    caches = [torch.zeros(num_slots, kv_heads, dim) for _ in range(2)]
    return rope, qkv, positions, slots, caches


def test_rope_store_writes_a_head_major_pool_as_it_reads(cpu_ops):
    """KVPool's head-major layout (runtime/kvcache/pool.py): the same values at the same [slot, head]."""
    from runtime.kvcache.pool import KVPool

    heads, kv_heads, dim, t = 9, 3, 64, 21
    rope, qkv, positions, slots, (kc, vc) = rope_inputs(t, heads, kv_heads, dim)
    pool = KVPool(1, kc.shape[0] - 1, kv_heads, dim, head_major=True)
    assert pool.k[0].shape == kc.shape and pool.k[0].stride(1) == kc.shape[0] * dim
    cos, sin = rope.tables(positions)
    q = cpu_ops.rope_store(qkv, cos, sin, slots, kc, vc, heads)
    assert torch.equal(cpu_ops.rope_store(qkv, cos, sin, slots, pool.k[0], pool.v[0], heads), q)
    assert torch.equal(pool.k[0], kc) and torch.equal(pool.v[0], vc)


def test_rope_store_rotates_like_torch_and_writes_only_its_slots(cpu_ops):
    heads, kv_heads, dim, t = 9, 3, 64, 21
    rope, qkv, positions, slots, (kc, vc) = rope_inputs(t, heads, kv_heads, dim)
    cos, sin = rope.tables(positions)
    q = cpu_ops.rope_store(qkv, cos, sin, slots, kc, vc, heads)
    x = qkv.float()
    q_ref = rope.rotate(x[:, : heads * dim].view(t, heads, dim), cos, sin)
    k_ref = rope.rotate(x[:, heads * dim : (heads + kv_heads) * dim].view(t, kv_heads, dim), cos, sin)
    v_ref = x[:, (heads + kv_heads) * dim :].view(t, kv_heads, dim)
    torch.testing.assert_close(q, q_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(kc[slots], k_ref, rtol=0, atol=1e-6)
    assert torch.equal(vc[slots], v_ref)
    untouched = torch.ones(kc.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert not kc[untouched].any() and not vc[untouched].any()


def test_a_row_is_bitwise_the_same_alone_in_a_batch_and_with_any_thread_count(cpu_ops):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(40, 576, generator=g), torch.randn(576, generator=g)
    gate_up = torch.randn(40, 3072, generator=g).bfloat16()
    rope, qkv, positions, slots, (kc, vc) = rope_inputs(40)
    cos, sin = rope.tables(positions)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(
                (
                    cpu_ops.rms_norm_bf16(x, w, 1e-5),
                    cpu_ops.silu_mul_bf16(gate_up),
                    cpu_ops.rope_store(qkv, cos, sin, slots, kc, vc, 9),
                )
            )
        alone = (
            cpu_ops.rms_norm_bf16(x[7:8], w, 1e-5),
            cpu_ops.silu_mul_bf16(gate_up[7:8]),
            cpu_ops.rope_store(qkv[7:8], cos[7:8], sin[7:8], slots[7:8], kc, vc, 9),
        )
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)
    for a, b in zip(alone, results[0]):
        assert torch.equal(a[0], b[7])


def test_bad_inputs_raise_instead_of_writing_out_of_bounds(cpu_ops):
    rope, qkv, positions, slots, (kc, vc) = rope_inputs(4)
    cos, sin = rope.tables(positions)
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_ops.rope_store(qkv, cos, sin, torch.tensor([0, 1, 2, kc.shape[0]]), kc, vc, 9)
    with pytest.raises(RuntimeError, match="qkv width"):
        cpu_ops.rope_store(qkv, cos, sin, slots, kc, vc, 8)
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        cpu_ops.rope_store(qkv.half(), cos, sin, slots, kc, vc, 9)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_ops.rms_norm_bf16(torch.zeros(2, 8).bfloat16(), torch.zeros(8), 1e-5)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_ops.silu_mul_bf16(torch.zeros(2, 8))


def test_q4_model_fused_path_matches_its_torch_path(cpu_ops, smollm_dir, tokenizer):
    from runtime.attention import make_attention_backend
    from runtime.model.decoder import load_model
    from runtime.model.loader import read_config
    from tests.conftest import chat_ids

    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, "q4", torch.device("cpu"), torch.float32)
    assert model.fused_ops is not None
    attn = make_attention_backend("auto", torch.device("cpu"))
    ids = chat_ids(tokenizer, "Name three rivers in Europe and say which is longest.")
    t = len(ids)
    slots = torch.arange(t)
    batch = ForwardBatch(torch.tensor(ids), torch.arange(t), slots, [t], [t], [slots], torch.arange(t))
    logits = {}
    for path in ("fused", "torch"):
        kept = model.fused_ops
        if path == "torch":
            model.fused_ops = None
        try:
            kv = KVPool(cfg.num_layers, t + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
            logits[path] = model.forward(batch, kv, attn)
        finally:
            model.fused_ops = kept
    diff = (logits["fused"] - logits["torch"]).abs().max().item()
    agree = (logits["fused"].argmax(-1) == logits["torch"].argmax(-1)).float().mean().item()
    assert diff < 1.5, diff  # bf16 noise: the formats' drift vs fp32 is ~0.6 (test_weight_formats.py)
    assert agree >= 0.95, agree


def test_add_rms_norm_is_the_residual_add_then_the_norm_bit_for_bit(cpu_ops):
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(13, 576, generator=g), torch.randn(576, generator=g)
    delta = torch.randn(13, 576, generator=g).bfloat16()
    want_h = h.clone()
    want_h += delta
    want = cpu_ops.rms_norm_bf16(want_h, w, 1e-5)
    got = cpu_ops.add_rms_norm_bf16(h, delta, w, 1e-5)
    assert torch.equal(h, want_h) and torch.equal(got, want)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_ops.add_rms_norm_bf16(torch.zeros(576, 4).t(), delta[:4], w, 1e-5)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_ops.add_rms_norm_bf16(h, delta.float(), w, 1e-5)


def test_float32_forms(cpu_ops):
    """rms_norm_f32 / silu_mul_f32 / add_rms_norm_f32 / rope_store over float32 qkv: the ops q4 runs
    with float32 activations (runtime/model/decoder.py, where quant_linear_f32.cpp runs the layers)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(13, 576, generator=g) * 3, torch.randn(576, generator=g)
    got = cpu_ops.rms_norm_f32(x, w, 1e-5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    gate_up = torch.randn(13, 2 * 96, generator=g) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_ops.silu_mul_f32(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    h, delta = torch.randn(13, 576, generator=g), torch.randn(13, 576, generator=g)
    want_h = h.clone()
    want_h += delta
    got = cpu_ops.add_rms_norm_f32(h, delta, w, 1e-5)
    assert torch.equal(h, want_h) and torch.equal(got, cpu_ops.rms_norm_f32(want_h, w, 1e-5))
    with pytest.raises(RuntimeError, match="float32"):
        cpu_ops.add_rms_norm_f32(h, delta.bfloat16(), w, 1e-5)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_ops.silu_mul_f32(gate_up.bfloat16())
    rope, qkv, positions, slots, (kc, vc) = rope_inputs(7)
    cos, sin = rope.tables(positions)
    k32, v32 = kc.clone(), vc.clone()
    q_bf16 = cpu_ops.rope_store(qkv, cos, sin, slots, kc, vc, 9)
    q_f32 = cpu_ops.rope_store(qkv.float(), cos, sin, slots, k32, v32, 9)  # the same values, widened
    assert torch.equal(q_bf16, q_f32) and torch.equal(kc, k32) and torch.equal(vc, v32)
