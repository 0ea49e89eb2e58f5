"""Triton kernel for grammar token masks: packed int32 bitmasks applied to logits in place.

`bitmask` is int32 `[B, ceil(V/32)]`: bit j of word i allows token 32*i + j. Only the rows listed
in `rows` are touched (the constrained requests of a batch). Callers go through
`runtime.sampler.apply_token_bitmask`, which picks this kernel for CUDA logits and the torch
version (`runtime.sampler.apply_bitmask_`) otherwise; this module is imported only then, so
CPU-only installs never load triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(Logits, Mask, Rows, vocab, stride_l, stride_m, BLOCK: tl.constexpr):
    row = tl.load(Rows + tl.program_id(0)).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab
    # Each word is loaded by the 32 lanes of its tokens (one cached line); logits are only written,
    # and only where a token is banned.
    words = tl.load(Mask + row * stride_m + offs // 32, mask=inside, other=-1)
    banned = ((words >> (offs % 32)) & 1) == 0
    tl.store(Logits + row * stride_l + offs, tl.full([BLOCK], float("-inf"), tl.float32), mask=inside & banned)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None,
                               block: int = 2048) -> None:
    """logits [B, V] (rows contiguous), bitmask int32 [B, >= ceil(V/32)], rows: indices into both
    (None = every row). The bitmask is moved to the logits' device if it is elsewhere."""
    if rows is None:
        rows = torch.arange(logits.shape[0], dtype=torch.int32, device=logits.device)
    else:
        rows = rows.to(device=logits.device, dtype=torch.int32)
    if rows.numel() == 0:
        return
    bitmask = bitmask.to(logits.device, non_blocking=True)
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("token bitmask: logits and bitmask rows must be contiguous")
    vocab = logits.shape[1]
    _bitmask_kernel[(rows.numel(), triton.cdiv(vocab, block))](
        logits, bitmask, rows, vocab, logits.stride(0), bitmask.stride(0), BLOCK=block, num_warps=4,
    )
