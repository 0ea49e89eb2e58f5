"""Presence, frequency and repetition penalties, logit biases and `min_tokens`, on one logits row.

Penalties and biases run before the grammar mask (`adjust_logits_`), so a masked token stays
masked (-inf plus a bias, or times a penalty, is still -inf); sampling and logprobs see what they
leave. `min_tokens` runs after the mask (`hold_stop_`), so a grammar that allows only its end
still ends. Each uses the request's own tokens only: a row's result does not depend on its batch.
"""

from __future__ import annotations

import torch

from runtime.decode.sampling import SamplingParams


def adjust_logits_(row: torch.Tensor, p: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> None:
    """Apply `p`'s penalties and biases to `row` ([V] logits) in place."""
    vocab = row.shape[-1]
    if p.logit_bias:
        ids = torch.tensor([i for i in p.logit_bias if i < vocab], dtype=torch.int64)
        if ids.numel():
            bias = torch.tensor([p.logit_bias[i] for i in ids.tolist()], dtype=row.dtype, device=row.device)
            row.index_add_(0, ids.to(row.device), bias)
    if (p.presence_penalty or p.frequency_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.int64), minlength=vocab)[:vocab]
        counts = counts.to(device=row.device, dtype=row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    if p.repetition_penalty != 1.0:
        seen = torch.unique(torch.tensor(prompt_ids + output_ids, dtype=torch.int64))
        seen = seen[seen < vocab].to(row.device)
        if seen.numel():
            logits = row[seen]
            row[seen] = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)


def hold_stop_(row: torch.Tensor, p: SamplingParams, produced: int, stop_ids: set[int] | frozenset[int]) -> None:
    """`min_tokens`: forbid the stop tokens in `row` (masked already) while fewer than that many
    tokens are out, unless nothing else is left (a grammar that must end here ends)."""
    if produced >= p.min_tokens or p.ignore_eos:
        return
    vocab = row.shape[-1]
    stops = torch.tensor([i for i in {*stop_ids, *p.stop_token_ids} if i < vocab], dtype=torch.int64, device=row.device)
    if not stops.numel():
        return
    kept = row[stops].clone()
    row[stops] = float("-inf")
    if not torch.isfinite(row).any():
        row[stops] = kept
