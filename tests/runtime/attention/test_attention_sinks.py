"""Attention sinks (gpt-oss; `sinks`, runtime/attention/base.py): a logit per query head in each
row's softmax denominator, with no value. Checked against a float64 reference written as
transformers' eager_attention_forward has it (the sink appended as one more score, dropped after the
softmax), on mixed batches with and without a window, in the torch backend and the cpu kernel; the
kernel's rows stay bitwise the same alone and inside a batch or a longer extend; a backend without
sinks refuses them in one line; the Triton kernels (under the interpreter on CPU) equal the reference."""

from __future__ import annotations

import pytest
import torch

from runtime.attention import TorchAttentionBackend
from runtime.attention.base import refuse_sinks
from runtime.attention.cpu_backend import CpuPagedAttentionBackend
from tests.runtime.attention.test_cpu_attention import make_batch, pass_of, random_qkv, rows_of

TOL = 1e-5


def sink_reference(batch, q, k, v, sinks, window: int = 0) -> torch.Tensor:
    """Each request alone in float64: scores, the sink as one more column, softmax, the sink dropped."""
    out, start = torch.empty_like(q), 0
    heads, kv_heads = q.shape[1], k.shape[1]
    for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
        qe = q[start : start + ext].double().transpose(0, 1)  # [H, E, D]
        ke, ve = (c[slots].double().transpose(0, 1).repeat_interleave(heads // kv_heads, 0) for c in (k, v))
        scores = qe @ ke.transpose(1, 2) * q.shape[-1] ** -0.5  # [H, E, L]
        q_pos, k_pos = torch.arange(seq - ext, seq).unsqueeze(1), torch.arange(seq).unsqueeze(0)
        mask = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)
        scores = scores.masked_fill(~mask, float("-inf"))
        sink = sinks.double().view(heads, 1, 1).expand(heads, ext, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        out[start : start + ext] = (probs @ ve).transpose(0, 1).float()
        start += ext
    return out


def attend(backend, batch, q, k, v, sinks, window: int = 0) -> torch.Tensor:
    backend.prepare(batch)
    return backend.forward(q, k, v, window, sinks)


def sinks_for(heads: int, seed: int = 5) -> torch.Tensor:
    return 2.0 * torch.randn(heads, generator=torch.Generator().manual_seed(seed))  # some above the scores


# (new tokens, visible length): decodes, short extends after cached prefixes, a prompt, a long extend
SPECS = [(1, 1), (1, 37), (5, 40), (17, 17), (70, 90)]


@pytest.mark.parametrize("heads,kv_heads,dim,window", [(9, 3, 64, 0), (8, 2, 24, 5), (8, 2, 24, 33)])
def test_cpu_kernel_and_torch_backend_equal_the_reference(cpu_ops, heads, kv_heads, dim, window):
    batch = make_batch(SPECS)
    q, k, v = random_qkv(batch.num_tokens, heads, kv_heads, dim)
    sinks = sinks_for(heads)
    want = sink_reference(batch, q, k, v, sinks, window)
    assert (want - sink_reference(batch, q, k, v, sinks - 100, window)).abs().max() > 1e-2  # the sinks matter
    for backend in (CpuPagedAttentionBackend(cpu_ops), TorchAttentionBackend()):
        out = attend(backend, batch, q, k, v, sinks, window)
        assert (out - want).abs().max().item() <= TOL, backend.name
    torch_backend = TorchAttentionBackend()
    attend(torch_backend, batch, q, k, v, sinks, window)
    # the pass's layers without sinks keep their own plan
    assert torch.equal(torch_backend.forward(q, k, v), attend(TorchAttentionBackend(), batch, q, k, v, None))


def test_bf16_output_is_the_float32_output_rounded(cpu_ops):
    batch = make_batch(SPECS)
    q, k, v = random_qkv(batch.num_tokens, 8, 2, 32)
    backend = CpuPagedAttentionBackend(cpu_ops)
    out = attend(backend, batch, q, k, v, sinks_for(8), 7)
    assert torch.equal(backend.forward_as(q, k, v, torch.bfloat16, 7, sinks_for(8)), out.to(torch.bfloat16))


@pytest.mark.parametrize("window", [0, 7])
def test_a_row_with_sinks_is_bitwise_the_same_alone_in_a_batch_and_inside_an_extend(cpu_ops, window):
    """The sink is each row's starting point, the same whatever the batch, tile or thread split."""
    heads, kv_heads, dim = 8, 2, 32
    _, k, v = random_qkv(0, heads, kv_heads, dim)
    g = torch.Generator().manual_seed(7)
    total, sinks = 120, sinks_for(heads)
    slots = torch.randperm(4096, generator=g)[:total]
    q_all = torch.randn(total, heads, dim, generator=g)
    backend = CpuPagedAttentionBackend(cpu_ops)
    full = attend(backend, pass_of([total], [total], [slots]), q_all, k, v, sinks, window)
    others = make_batch([(1, 500), (40, 90), (3, 3)], seed=3)
    for prefix, ext_len in [(119, 1), (50, 40), (0, 120), (31, 2)]:
        rows = slots[: prefix + ext_len]
        q = q_all[prefix : prefix + ext_len]
        alone = attend(backend, pass_of([ext_len], [prefix + ext_len], [rows]), q, k, v, sinks, window)
        assert torch.equal(alone, full[prefix : prefix + ext_len]), (prefix, ext_len)
        mixed = pass_of(
            [others.extend_lens[0], ext_len, *others.extend_lens[1:]],
            [others.seq_lens[0], prefix + ext_len, *others.seq_lens[1:]],
            [others.slot_rows[0], rows, *others.slot_rows[1:]],
        )
        q_mixed = torch.cat([torch.randn(1, heads, dim), q, torch.randn(others.num_tokens - 1, heads, dim)])
        assert torch.equal(rows_of(attend(backend, mixed, q_mixed, k, v, sinks, window), mixed, 1), alone)


def test_the_kernel_checks_the_sinks_shape(cpu_ops):
    batch = make_batch([(3, 10)])
    q, k, v = random_qkv(batch.num_tokens, 4, 2, 16)
    backend = CpuPagedAttentionBackend(cpu_ops)
    with pytest.raises(RuntimeError, match=r"sinks must be float32 \[heads\]"):
        attend(backend, batch, q, k, v, torch.zeros(3))


def test_a_backend_without_sinks_refuses_them_in_one_line():
    class NoSinks(TorchAttentionBackend):
        name = "no-sinks"
        supports_sinks = False

    refuse_sinks(NoSinks(), None)  # a layer without sinks passes
    with pytest.raises(ValueError, match=r"^attention backend 'no-sinks' has no attention sinks \(gpt-oss\)"):
        refuse_sinks(NoSinks(), torch.zeros(4))


# ------------------------------------------------------------------- Triton (interpreter on CPU)

# (seq_len, extend_len): a prefill, decodes (one over 4 splits), extends after cached prefixes
TRITON_SPECS = [(20, 20), (37, 1), (45, 13), (70, 1), (9, 3)]


def test_triton_kernels_equal_the_reference(kernels):
    """In a windowed layer, the extend rows start from the sink and the decode merge folds it in
    first, with 1 and 4 KV splits."""
    window = 6
    from bench.harness.device_cases import attention_case
    from tests.runtime.attention.triton_helpers import DEV, ON_GPU

    q, k, v, batch = attention_case(TRITON_SPECS, 4, 2, 16, torch.float32, DEV, slots=200, seed=window)
    sinks = sinks_for(4)
    want = sink_reference(batch, q.cpu(), k.cpu(), v.cpu(), sinks, window)
    for splits in (1, 4):
        tri = kernels.attn.TritonAttentionBackend(max_kv_splits=splits, min_split_tokens=16, extend_blocks=(16, 16))
        got = attend(tri, batch, q, k, v, sinks.to(DEV), window).cpu()
        torch.testing.assert_close(got, want, atol=1e-4 if ON_GPU else TOL, rtol=0, msg=f"kv splits {splits}")
