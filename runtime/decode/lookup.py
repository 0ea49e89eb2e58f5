"""Prompt-lookup drafts: the next tokens guessed from an earlier occurrence of the last few.

Extraction copies spans of the document, tool arguments copy the user's words, multi-turn answers
repeat earlier turns. `NgramIndex` remembers, for each n-gram (n from `MAX_NGRAM` down to
`MIN_NGRAM`) of a request's tokens, where it last ended; the tokens that followed it there are the
draft. Drafts are verified like jump-forward's (decoding.py: exact under greedy, the rejection
rule under sampling), so they change how many passes an output takes, never the output.

`LookupDraft` decides how long a draft pays for its extra logits rows: it keeps a decayed estimate
of how often a drafted token is accepted, given the one before it was, and drafts the i-th token
only while the chance that it is accepted beats the cost of its row (`row_cost`: a share of what
a decode step spends per output token, measured by row_cost.py or fixed). A request whose drafts
stop paying drafts nothing, but tries one token every `PROBE_EVERY` steps, so a later stretch of
copying is still found.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.decode.row_cost import RowCost

MAX_NGRAM = 4
MIN_NGRAM = 2
PROBE_EVERY = 16
# Prior of the acceptance estimate: one accepted of two tried (rate 0.5), worth this many tries.
PRIOR_ACCEPTED, PRIOR_TRIED = 1.0, 2.0
DECAY = 0.9  # weight of the past per verified draft: the estimate follows the current stretch


class NgramIndex:
    """Where each n-gram of a growing token list last ended (the position of the token after it).

    Built incrementally: `update(tokens)` indexes the tokens appended since the last call (a list
    that shrank, a rewind, is indexed again from scratch)."""

    __slots__ = ("ends", "indexed")

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] are in `ends`

    def forget_from(self, length: int) -> None:
        """The list was cut to `length` tokens (a rewind): index it again from scratch, since
        positions past the cut may soon hold other tokens."""
        if length < self.indexed:
            self.ends.clear()
            self.indexed = 0

    def update(self, tokens: Sequence[int]) -> None:
        self.forget_from(len(tokens))
        # the n-grams followed by a known token: those ending at positions 1 .. len - 1
        for end in range(max(self.indexed, 1), len(tokens)):
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                if end >= n:
                    self.ends[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, len(tokens))

    def continuation(self, tokens: Sequence[int], tail: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the last occurrence of the longest n-gram ending
        `tokens + tail` (`tail`: a draft already queued after `tokens`, not indexed)."""
        if limit <= 0:
            return []
        context = list(tokens[-MAX_NGRAM:]) + list(tail)
        for n in range(min(MAX_NGRAM, len(context)), MIN_NGRAM - 1, -1):
            end = self.ends.get(tuple(context[-n:]))
            if end is not None:
                return list(tokens[end : end + limit])
        return []


class LookupDraft:
    """One request's prompt-lookup state: its n-gram index and how well its drafts do."""

    __slots__ = ("index", "accepted", "tried", "max_tokens", "cost", "idle_steps", "last_len")

    def __init__(self, max_tokens: int, row_cost: float | RowCost) -> None:
        self.index = NgramIndex()
        self.accepted = PRIOR_ACCEPTED
        self.tried = PRIOR_TRIED
        self.max_tokens = max_tokens
        # shared by the engine's requests, which it updates after each step (a float: fixed)
        self.cost = row_cost if isinstance(row_cost, RowCost) else RowCost.fixed(row_cost)
        self.idle_steps = 0  # steps since the last draft while drafts do not pay
        self.last_len = 0  # tokens of the draft now awaiting verification (0: none)

    @property
    def row_cost(self) -> float:
        return self.cost.share

    @property
    def rate(self) -> float:
        """Estimated chance that a drafted token is accepted, given the one before it was."""
        return self.accepted / self.tried

    def worth(self) -> int:
        """How many tokens a draft should have now: the i-th while rate**i > row_cost."""
        k, p, cost = 0, self.rate, self.cost.share
        while k < self.max_tokens and p > cost:
            k += 1
            p *= self.rate
        if k == 0:
            self.idle_steps += 1
            if self.idle_steps >= PROBE_EVERY:
                self.idle_steps = 0
                return 1
        return k

    def propose(self, tokens: Sequence[int], tail: Sequence[int], room: int) -> list[int]:
        """The draft to queue after `tokens + tail` (at most `room` tokens; may be empty)."""
        limit = min(room, self.worth())
        if limit <= 0:
            return []
        self.index.update(tokens)
        return self.index.continuation(tokens, tail, limit)

    def verified(self, drafted: int, accepted: int) -> None:
        """Learn from a verified draft: `accepted` of its `drafted` tokens, in order, were kept."""
        if drafted <= 0:
            return
        # each accepted token is a success; the first rejected one (if any) is the one failure
        self.accepted = DECAY * self.accepted + accepted
        self.tried = DECAY * self.tried + accepted + (1 if accepted < drafted else 0)
