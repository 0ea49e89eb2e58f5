"""Log-probabilities of chosen tokens, for requests that ask for them (`SamplingParams.logprobs`).

What Jumpgate reports: the log-softmax of the logits row the token was chosen from, AFTER the
request's penalties, logit_bias and min_tokens (runtime/decode/penalties.py: they are part of the choice)
and the grammar mask (and a strict request's closing / loop-breaking mask) and BEFORE temperature,
top-k, top-p and min-p. So the values are the model's own log-probabilities renormalised over the
tokens the grammar allows: a masked-out token never appears in `top`, and a token the grammar
forces reports 0.0. Sampling settings do not change them (OpenAI reports the model's values too).

Computed only for rows of requests that asked (the default path costs nothing), in float32, with
one device-to-host copy per batch.
"""

from __future__ import annotations

import math

import torch

from runtime.api import TokenLogprob

# JSON has no -inf: a token of zero probability (only possible after a strict request's fallback
# choice) reports this instead, as OpenAI does.
LOGPROB_FLOOR = -9999.0


def masked_log_softmax(masked_logits: torch.Tensor) -> torch.Tensor:
    """[B, V] (already masked) logits -> float32 log-probabilities; a new tensor, so later in-place
    changes to the logits (strict vetting) do not touch it."""
    return torch.log_softmax(masked_logits.float(), dim=-1)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def token_logprobs(logp: torch.Tensor, chosen: list[int], top_counts: list[int]) -> list[TokenLogprob]:
    """The record of token `chosen[i]` from row i of `logp` [B, V], with its `top_counts[i]` most
    likely alternatives (masked-out tokens, whose log-probability is -inf, are left out)."""
    if not chosen:
        return []
    index = torch.tensor(chosen, device=logp.device, dtype=torch.int64).unsqueeze(1)
    picked = logp.gather(1, index).squeeze(1).tolist()
    k = min(max(top_counts), logp.shape[-1])
    if k > 0:
        values, ids = torch.topk(logp, k, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    records = []
    for i, tok in enumerate(chosen):
        top: tuple[tuple[int, float], ...] = ()
        if top_counts[i] > 0:
            top = tuple(
                (t, v) for t, v in zip(top_ids[i][: top_counts[i]], top_values[i][: top_counts[i]]) if math.isfinite(v)
            )
        records.append(TokenLogprob(token_id=int(tok), logprob=_finite(picked[i]), top=top))
    return records


def forced_logprob(token_id: int, top_count: int) -> TokenLogprob:
    """A direct-mode jump-forward token: no forward pass saw it, the grammar allowed nothing else."""
    return TokenLogprob(token_id=token_id, logprob=0.0, top=((token_id, 0.0),) if top_count > 0 else (), forced=True)
