"""Shared-prefix (cascade) attention: the parts every backend can reuse.

Requests admitted from one cached prompt (a long system prompt, a tool list) hold the same KV
slots for it. Reading those slots once per layer for all of them, instead of once per request,
turns B copies of the prefix into one matmul of all their queries against it; each request's own
suffix is attended separately, and the two partial results are merged by log-sum-exp (the merge
of FlashInfer's cascade attention / SGLang's `merge_state`).

- find_prefix_groups: which requests of a pass share which prefix (from their slot rows)
- attention_with_lse: attention that also returns the log-sum-exp of its scores
- merge_by_lse:       the exact softmax over the union of two key sets, from the two halves
"""

from __future__ import annotations

import torch

from runtime.forward_batch import PrefixGroup

# When grouping pays (measured with `python -m bench cascade --attention-only`, torch backend, CPU):
# a group costs one extra matmul and a merge per layer, and its suffixes go through a matmul
# attention that is slower than SDPA on long rows; it saves reading the prefix (members - 1)
# times. So a group must save at least MIN_SAVED_TOKENS prefix reads and at least as many as its
# members' suffixes hold.
MIN_SHARED_TOKENS = 64
MIN_SAVED_TOKENS = 1024


def find_prefix_groups(
    extend_lens: list[int],
    seq_lens: list[int],
    slot_rows: list[torch.Tensor],
    max_extend: int,
    min_shared: int = MIN_SHARED_TOKENS,
    min_saved: int = MIN_SAVED_TOKENS,
) -> list[PrefixGroup]:
    """Groups of >= 2 requests with <= `max_extend` new tokens whose rows start with the same
    `min_shared` or more slots, where grouping saves reading `min_saved` prefix tokens or more and
    no fewer than the members' suffixes hold (see MIN_SAVED_TOKENS).

    In the radix cache a slot holds one token after one prefix, so rows with the same slot at
    position min_shared - 1 share all positions up to it: bucketing by that slot (not the first
    one) keeps a request that shares only a chat template's first tokens with a group out of it. A bucket's shared length is the longest common prefix of its rows (checked,
    not assumed), capped so it holds only cached positions (every member's new tokens see it all)."""
    buckets: dict[int, list[int]] = {}
    for i, (ext, seq, row) in enumerate(zip(extend_lens, seq_lens, slot_rows)):
        if ext <= max_extend and seq - ext >= min_shared:
            buckets.setdefault(int(row[min_shared - 1]), []).append(i)
    groups = []
    for members in buckets.values():
        if len(members) < 2:
            continue
        cap = min(seq_lens[i] - extend_lens[i] for i in members)
        rows = torch.stack([slot_rows[i][:cap] for i in members])
        same = (rows == rows[0]).all(dim=0)
        shared = cap if bool(same.all()) else int(same.to(torch.int8).argmin())  # first mismatch
        saved = (len(members) - 1) * shared
        suffixes = sum(seq_lens[i] for i in members) - len(members) * shared
        if shared >= min_shared and saved >= max(min_saved, suffixes):
            groups.append(PrefixGroup(shared, members))
    return groups


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, Q, D]; k, v: [B, KVH, L, D]; mask: [B, 1, Q, L] bool (True = attend) or None ->
    (out [B, H, Q, D] in q's dtype, lse [B, H, Q] float32). Query head h uses KV head
    h // (H // KVH), as SDPA's enable_gqa does; scores and softmax run in float32. `sinks` [H]
    (gpt-oss): a logit per head in each softmax's denominator, with no value (the lse includes it)."""
    b, h, nq, d = q.shape
    kvh = k.shape[1]
    group = h // kvh
    # heads kv*group .. kv*group+group-1 share KV head kv: fold them into the query axis
    scores = torch.matmul(q.reshape(b, kvh, group * nq, d), k.transpose(-1, -2)).float() * d**-0.5
    if mask is not None:
        scores = scores.view(b, kvh, group, nq, -1).masked_fill(~mask.unsqueeze(1), float("-inf"))
        scores = scores.view(b, kvh, group * nq, -1)
    lse = torch.logsumexp(scores, dim=-1)
    if sinks is not None:  # [H] -> the scores' row order (kv head, group, query)
        sink = sinks.float().view(kvh, group, 1).expand(kvh, group, nq).reshape(1, kvh, group * nq)
        lse = torch.logaddexp(lse, sink)
    probs = torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype)
    out = torch.matmul(probs, v)
    return out.reshape(b, h, nq, d), lse.reshape(b, h, nq)


def merge_by_lse(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """o: [..., D] attention over two disjoint key sets, lse: [...] their log-sum-exps -> the
    attention over both (in o1's dtype)."""
    top = torch.maximum(lse1, lse2)
    w1 = torch.exp(lse1 - top).unsqueeze(-1)
    w2 = torch.exp(lse2 - top).unsqueeze(-1)
    return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(o1.dtype)
