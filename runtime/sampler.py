"""Token choice from logits: grammar mask, then greedy or temperature/top-k/top-p/min-p sampling.

Rows are sampled one by one with each request's own generator, so a seeded request gives the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from runtime.sampling import SamplingParams

_BIT = torch.arange(32, dtype=torch.int32)


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits of tokens whose bit is 0 to -inf, in place. logits [B, V], bitmask int32 [B, ceil(V/32)]."""
    vocab = logits.shape[-1]
    allowed = ((bitmask.unsqueeze(-1) >> _BIT) & 1).bool().flatten(-2)[..., :vocab]
    logits.masked_fill_(~allowed, float("-inf"))


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
