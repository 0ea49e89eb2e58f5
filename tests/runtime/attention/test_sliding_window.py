"""Sliding-window attention (a layer's `window`, runtime/attention/base.py) in every backend.

A token at position i sees keys j with i - window < j <= i, as transformers' sliding mask
(masking_utils.sliding_window_overlay) has it. Checked against float64 SDPA per request with that
mask, on mixed batches (decodes, drafts, prompt chunks after cached prefixes, long extends, windows
of 1 key up to more than a row sees); the cpu kernel's rows stay bitwise the same alone, in a
batch and inside an extend, and prefix groups still change no bit; the torch backend leaves its
cascade for windowed layers; the Triton kernels (under the interpreter on CPU) equal the reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.attention import TorchAttentionBackend
from runtime.attention.cascade import find_prefix_groups
from runtime.attention.cpu_backend import CpuPagedAttentionBackend
from tests.runtime.attention.test_cascade_attention import make_batch as make_shared_batch
from tests.runtime.attention.test_cpu_attention import MIXED, make_batch, pass_of, random_qkv, rows_of

TOL = 1e-5
WINDOWS = [1, 5, 32, 33, 100, 4096]  # 4096: more than any row sees (the same as no window)


def windowed_reference(batch, q, k, v, window: int) -> torch.Tensor:
    """Each request alone: float64 SDPA, bottom-right causal, keys within the window."""
    out, start = torch.empty_like(q), 0
    for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
        qe = q[start : start + ext].transpose(0, 1).unsqueeze(0).double()
        ke, ve = (c[slots].transpose(0, 1).unsqueeze(0).double() for c in (k, v))
        q_pos, k_pos = torch.arange(seq - ext, seq).unsqueeze(1), torch.arange(seq).unsqueeze(0)
        mask = (k_pos <= q_pos) & (k_pos > q_pos - window)
        o = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=mask, enable_gqa=True)
        out[start : start + ext] = o[0].transpose(0, 1).float()
        start += ext
    return out


def attend(backend, batch, q, k, v, window: int = 0) -> torch.Tensor:
    backend.prepare(batch)
    return backend.forward(q, k, v, window) if window else backend.forward(q, k, v)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 16), (8, 2, 24)])
def test_cpu_kernel_equals_the_windowed_reference(cpu_ops, heads, kv_heads, dim, window):
    batch = make_batch(MIXED)
    q, k, v = random_qkv(batch.num_tokens, heads, kv_heads, dim)
    out = attend(CpuPagedAttentionBackend(cpu_ops), batch, q, k, v, window)
    assert (out - windowed_reference(batch, q, k, v, window)).abs().max().item() <= TOL


@pytest.mark.parametrize("window", WINDOWS)
def test_torch_backend_equals_the_windowed_reference(window):
    batch = make_batch(MIXED)
    q, k, v = random_qkv(batch.num_tokens, 8, 2, 24)
    backend = TorchAttentionBackend()
    out = attend(backend, batch, q, k, v, window)
    assert (out - windowed_reference(batch, q, k, v, window)).abs().max().item() <= TOL
    # the same pass's global layers still see every key (the window's plan is its own)
    assert (backend.forward(q, k, v) - windowed_reference(batch, q, k, v, 1 << 30)).abs().max().item() <= TOL


def test_a_window_wider_than_every_row_is_no_window(cpu_ops):
    batch = make_batch(MIXED)
    q, k, v = random_qkv(batch.num_tokens, 9, 3, 64)
    backend = CpuPagedAttentionBackend(cpu_ops)
    assert torch.equal(attend(backend, batch, q, k, v, 4096), attend(backend, batch, q, k, v))
    assert not torch.equal(attend(backend, batch, q, k, v, 32), attend(backend, batch, q, k, v))


@pytest.mark.parametrize("window", [7, 32, 50])
def test_a_windowed_row_is_bitwise_the_same_alone_in_a_batch_and_inside_an_extend(cpu_ops, window):
    """The kernel's invariance under a window: a row's blocks are still aligned to position 0 and
    folded in one order, whatever else the pass holds; so a cached prefix longer than the window
    plus the rest equals the whole prompt in one go."""
    heads, kv_heads, dim = 9, 3, 64
    _, k, v = random_qkv(0, heads, kv_heads, dim)
    g = torch.Generator().manual_seed(7)
    total = 300
    slots = torch.randperm(4096, generator=g)[:total]
    q_all = torch.randn(total, heads, dim, generator=g)
    backend = CpuPagedAttentionBackend(cpu_ops)
    full = attend(backend, pass_of([total], [total], [slots]), q_all, k, v, window)
    others = make_batch([(1, 500), (40, 90), (3, 3), (2, 800)], seed=3)
    for prefix, ext_len in [(299, 1), (100, 50), (0, 300), (120, 5), (31, 2), (63, 65), (250, 50)]:
        rows = slots[: prefix + ext_len]
        q = q_all[prefix : prefix + ext_len]
        out_alone = attend(backend, pass_of([ext_len], [prefix + ext_len], [rows]), q, k, v, window)
        assert torch.equal(out_alone, full[prefix : prefix + ext_len]), (prefix, ext_len)
        mixed = pass_of(
            [others.extend_lens[0], ext_len, *others.extend_lens[1:]],
            [others.seq_lens[0], prefix + ext_len, *others.seq_lens[1:]],
            [others.slot_rows[0], rows, *others.slot_rows[1:]],
        )
        q_mixed = torch.cat([torch.randn(1, heads, dim), q, torch.randn(others.num_tokens - 1, heads, dim)])
        out_mixed = attend(backend, mixed, q_mixed, k, v, window)
        assert torch.equal(rows_of(out_mixed, mixed, 1), out_alone), (prefix, ext_len)


def grouped_batch():
    """Two prefix groups (tests/runtime/attention/test_cascade_attention.py's layout): A's 70 shared
    positions, B's 45, members with 0 to 90 private positions after them."""
    a, b = ("A", 70, True), ("B", 45, False)
    specs = [(a, 12, 1), (a, 3, 1), (a, 20, 5), (None, 30, 1), (b, 7, 1), (b, 15, 1), (b, 1, 1), (a, 90, 65)]
    specs += [(None, 100, 100), (a, 0, 1)] + [(a, i, 1) for i in range(40)]
    batch = make_shared_batch(specs)
    groups = find_prefix_groups(
        batch.extend_lens, batch.seq_lens, batch.slot_rows, TorchAttentionBackend.max_short_extend, 16, 0
    )
    return batch, groups


@pytest.mark.parametrize("window", [4, 40, 64, 200])
def test_prefix_groups_under_a_window(cpu_ops, window):
    """The cpu kernel's group tiles change no bit under a window (each row skips its own blocks);
    the torch backend's windowed plan leaves the cascade and equals the reference."""
    batch, groups = grouped_batch()
    q, k, v = random_qkv(batch.num_tokens, 8, 2, 24)
    want = windowed_reference(batch, q, k, v, window)
    plain = attend(CpuPagedAttentionBackend(cpu_ops), batch, q, k, v, window)
    plain_torch = attend(TorchAttentionBackend(), batch, q, k, v, window)
    batch.prefix_groups = groups
    assert len(groups) == 2
    assert torch.equal(attend(CpuPagedAttentionBackend(cpu_ops), batch, q, k, v, window), plain)
    grouped_torch = attend(TorchAttentionBackend(), batch, q, k, v, window)
    for out in (plain, plain_torch, grouped_torch):
        assert (out - want).abs().max().item() <= TOL


def test_the_kernel_refuses_a_negative_window(cpu_ops):
    batch = make_batch([(3, 10)])
    q, k, v = random_qkv(batch.num_tokens, 4, 2, 16)
    backend = CpuPagedAttentionBackend(cpu_ops)
    backend.prepare(batch)
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        cpu_ops.paged_attention(q, k, v, backend.slots, backend.meta, False, False, False, -1)


# ------------------------------------------------------------------- Triton (interpreter on CPU)

# (seq_len, extend_len): a prefill, decodes (one over 4 splits), extends after cached prefixes
TRITON_SPECS = [(20, 20), (37, 1), (45, 13), (1, 1), (70, 1), (9, 3), (64, 40)]


@pytest.mark.slow
@pytest.mark.parametrize("window", [1, 6, 16, 17, 100])
def test_triton_kernels_equal_the_windowed_reference(kernels, window):
    from bench.harness.device_cases import attention_case
    from tests.runtime.attention.triton_helpers import DEV, ON_GPU

    q, k, v, batch = attention_case(TRITON_SPECS, 4, 2, 16, torch.float32, DEV, slots=300, seed=window)
    want = windowed_reference(batch, q.cpu(), k.cpu(), v.cpu(), window)
    for splits in (1, 4):
        tri = kernels.attn.TritonAttentionBackend(max_kv_splits=splits, min_split_tokens=16, extend_blocks=(16, 16))
        got = attend(tri, batch, q, k, v, window).cpu()
        torch.testing.assert_close(got, want, atol=1e-4 if ON_GPU else TOL, rtol=0, msg=f"kv splits {splits}")


@pytest.mark.slow
def test_triton_windowed_decode_leaves_the_prefix_groups(kernels):
    """A windowed layer of a pass with shared-prefix groups: its decode takes no prefix kernel, each
    request from seq - window on; the pass's global layers keep their groups."""
    from tests.runtime.attention.triton_helpers import DEV

    batch, groups = grouped_batch()
    batch.slot_rows = [r.to(DEV) for r in batch.slot_rows]
    q, k, v = (t.to(DEV) for t in random_qkv(batch.num_tokens, 8, 2, 16))
    batch.prefix_groups = groups
    tri = kernels.attn.TritonAttentionBackend(max_kv_splits=4, min_split_tokens=16, extend_blocks=(16, 16))
    for window in (8, 60):
        got = attend(tri, batch, q, k, v, window).cpu()
        want = windowed_reference(batch, q.cpu(), k.cpu(), v.cpu(), window)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert tri.decode.prefix is not None  # the global layers' groups
    want = windowed_reference(batch, q.cpu(), k.cpu(), v.cpu(), 1 << 30)
    torch.testing.assert_close(tri.forward(q, k, v).cpu(), want, atol=1e-4, rtol=0)
