"""Triton kernel for grammar token masks: packed int32 bitmasks applied to logits in place.

`bitmask` is int32 `[B, ceil(V/32)]`: bit j of word i allows token 32*i + j. Only the rows listed
in `rows` are touched (the constrained requests of a batch). Callers go through
`runtime.decode.sampler.apply_token_bitmask`, which picks this kernel for CUDA logits and the torch
version (`runtime.decode.sampler.apply_bitmask_`) otherwise; this module is imported only then, so
CPU-only installs never load triton.

Two layouts of the same work, chosen by `WORDS`: `WORDS=False` has each lane load the word of its
own token (32 lanes share one cached word); `WORDS=True` loads each word once and unpacks it into a
`[BLOCK // 32, 32]` tile (as XGrammar's kernel does). `bench/probes/device_check.py` times both at several
block sizes on the GPU; `DEFAULT_CONFIG` is the fastest it measured on an H200 (one run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The fastest of `bash bench/device_check.sh`'s sweep on an H200, 64 x 128256 float32 logits, graph-
# replayed: 16.8 us, against 20.9 for the configuration used before any GPU had run it (block 2048,
# 4 warps, lane words) and 17.3-25.2 for the others (bench/results/gpu_h200_device_check_d2b2619.jsonl).
DEFAULT_CONFIG = dict(block=1024, num_warps=4, words=True)


@triton.jit
def bitmask_kernel(Logits, Mask, Rows, vocab, stride_l, stride_m, BLOCK: tl.constexpr, WORDS: tl.constexpr):
    row = tl.load(Rows + tl.program_id(0)).to(tl.int64)
    start = tl.program_id(1) * BLOCK
    # Logits are only written, and only where a token is banned.
    if WORDS:
        w = start // 32 + tl.arange(0, BLOCK // 32)
        words = tl.load(Mask + row * stride_m + w, mask=w * 32 < vocab, other=-1)
        bits = tl.arange(0, 32)
        banned = ((words[:, None] >> bits[None, :]) & 1) == 0
        offs = w[:, None] * 32 + bits[None, :]
        inside = offs < vocab
        tl.store(
            Logits + row * stride_l + offs, tl.full([BLOCK // 32, 32], float("-inf"), tl.float32), mask=inside & banned
        )
    else:
        offs = start + tl.arange(0, BLOCK)
        inside = offs < vocab
        words = tl.load(Mask + row * stride_m + offs // 32, mask=inside, other=-1)
        banned = ((words >> (offs % 32)) & 1) == 0
        tl.store(Logits + row * stride_l + offs, tl.full([BLOCK], float("-inf"), tl.float32), mask=inside & banned)


def apply_token_bitmask_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    words: bool | None = None,
) -> None:
    """logits [B, V] (rows contiguous), bitmask int32 [B, >= ceil(V/32)], rows: indices into both
    (None = every row). The bitmask is moved to the logits' device if it is elsewhere. `block`,
    `num_warps`, `words`: launch configuration (default `DEFAULT_CONFIG`)."""
    if rows is None:
        rows = torch.arange(logits.shape[0], dtype=torch.int32, device=logits.device)
    else:
        rows = rows.to(device=logits.device, dtype=torch.int32)
    if rows.numel() == 0:
        return
    bitmask = bitmask.to(logits.device, non_blocking=True)
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("token bitmask: logits and bitmask rows must be contiguous")
    block = block or DEFAULT_CONFIG["block"]
    vocab = logits.shape[1]
    bitmask_kernel[(rows.numel(), triton.cdiv(vocab, block))](
        logits,
        bitmask,
        rows,
        vocab,
        logits.stride(0),
        bitmask.stride(0),
        BLOCK=block,
        WORDS=DEFAULT_CONFIG["words"] if words is None else words,
        num_warps=num_warps or DEFAULT_CONFIG["num_warps"],
    )
