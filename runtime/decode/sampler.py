"""Token choice from logits: grammar mask, then greedy or temperature/top-k/top-p/min-p sampling.

Rows are sampled one by one with each request's own generator, so a seeded request gives the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from runtime.decode.sampling import SamplingParams

_BIT = torch.arange(32, dtype=torch.int32)


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Set logits of tokens whose bit is 0 to -inf, in place (the torch version, used on CPU).
    logits [B, V], bitmask int32 [B, ceil(V/32)]; `rows` limits it to those rows (None = all)."""
    vocab = logits.shape[-1]
    if (
        logits.device.type == "cpu"
        and bitmask.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.is_contiguous()
        and sys.byteorder == "little"
    ):
        # In numpy, single-threaded: unpacking the bits of a [B, W, 32] tensor took ~50% longer,
        # and torch's multi-threaded masked_fill stalls for tens of ms on a loaded machine.
        out = logits.numpy()
        words = bitmask.contiguous().numpy()
        for r in range(logits.shape[0]) if rows is None else rows.tolist():
            banned = np.unpackbits(words[r].view(np.uint8), bitorder="little")[:vocab] == 0
            np.putmask(out[r], banned, -np.inf)
        return
    bits = _BIT if bitmask.device.type == "cpu" else _BIT.to(bitmask.device)
    if rows is None:
        allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(-2)[..., :vocab]
        logits.masked_fill_(~allowed.to(logits.device), float("-inf"))
        return
    rows = rows.to(device=logits.device, dtype=torch.int64)
    if rows.numel() == 0:
        return
    words = bitmask.index_select(0, rows.to(bitmask.device))
    allowed = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(-2)[..., :vocab]
    logits.index_copy_(0, rows, logits.index_select(0, rows).masked_fill_(~allowed.to(logits.device), float("-inf")))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """The one entry point for grammar masks: -inf for disallowed tokens of `rows` (None = all),
    in place. Triton kernel for CUDA logits, `apply_bitmask_` otherwise."""
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"token bitmask: logits {tuple(logits.shape)} and bitmask {tuple(bitmask.shape)} "
            "must be [B, V] and [B, ceil(V/32)]"
        )
    if bitmask.dtype != torch.int32 or bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError(
            f"token bitmask: need int32 words covering {logits.shape[1]} tokens, "
            f"got {bitmask.dtype} {tuple(bitmask.shape)}"
        )
    if logits.device.type == "cuda":
        from runtime.decode.triton_bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, rows)
    else:
        apply_bitmask_(logits, bitmask, rows)


def sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p filtering (one row, [V])."""
    logits = logits / max(p.temperature, 1e-5)
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = cum - sorted_p > p.top_p  # keep the smallest set whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs / probs.sum()


def sample_token(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from one row of (already masked) logits."""
    if p.greedy:
        return int(torch.argmax(logits))
    probs = sampling_probs(logits, p)
    return int(torch.multinomial(probs, 1, generator=generator))
