"""Shortest-completion planning for strict JSON: how many tokens until the value is complete, and
which tokens lead there fastest.

The plan is greedy over token classes, tried in order at each state:
1. text the grammar forces (jump-forward) is followed as is;
2. *closers*: tokens made only of `"`, `]`, `}` (a string, array or object ends);
3. *minimal values*: `0`, `false`, `true`, `null`, `[]`, `{}`;
4. closers that also carry a comma (needed to reach the next required property);
5. any single-character token the grammar allows (a pattern, an enum, a minLength).
Counting the greedy path on a forked matcher gives an upper bound on the tokens needed; in closing
mode the mask keeps only the first non-empty class, and the model picks among those tokens.
"""

from __future__ import annotations

from typing import Callable

import torch
import xgrammar as xgr

MAX_PLAN_TOKENS = 256
_CLOSE_CHARS = set('"]}')
_FILLERS = ["0", "false", "true", "null", "[]", "{}"]


class ClosingVocab:
    """Token classes of one vocabulary, computed once per tokenizer."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_token_ids: list[int], special_ids: frozenset[int]):
        self.vocab_size = vocab_size
        self.stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.int64)
        pieces = hf_tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(hf_tokenizer)))))
        strong, comma, singles = [], [], []
        for i, p in enumerate(pieces):
            if p is None or i in special_ids:
                continue
            if p and set(p) <= _CLOSE_CHARS | {","}:
                (comma if "," in p else strong).append((len(p), i))
            if len(p) == 1:
                singles.append(i)
        vocab = hf_tokenizer.get_vocab()
        self.closers = _ids([i for _, i in sorted(strong, reverse=True)])  # longest (closes most) first
        self.comma_closers = _ids([i for _, i in sorted(comma)])
        self.fillers = _ids([vocab[f] for f in _FILLERS if f in vocab])
        self.singles = _ids(singles)
        self.classes = [self.closers, self.fillers, self.comma_closers, self.singles]
        self._closer_set = set(self.closers.tolist()) | set(self.comma_closers.tolist())

    def is_closer(self, token_id: int) -> bool:
        return token_id in self._closer_set


def _ids(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def allowed_subset(mask_row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The ids among `ids` whose bit is set in one bitmask row."""
    if ids.numel() == 0:
        return ids
    bits = (mask_row[ids >> 5] >> (ids & 31).to(torch.int32)) & 1
    return ids[bits.bool()]


_SHIFTS = torch.arange(32, dtype=torch.int64)


def _restrict(bitmask: torch.Tensor, row: int, ids: torch.Tensor) -> None:
    """Set `bitmask[row]` to allow exactly `ids`."""
    words = bitmask.shape[-1]
    allowed = torch.zeros(words * 32, dtype=torch.int64)
    allowed[ids] = 1
    packed = (allowed.view(words, 32) << _SHIFTS).sum(dim=1)
    bitmask[row] = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def completion_bound(matcher: xgr.GrammarMatcher, vocab: ClosingVocab, encode: Callable[[str], list[int]],
                     limit: int = MAX_PLAN_TOKENS) -> int | None:
    """Tokens the greedy plan needs to reach a complete value from `matcher`'s state (not changed);
    None if no plan was found within `limit`."""
    if matcher.is_terminated():
        return 0
    m = matcher.fork()
    buf = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    n = 0
    while n <= limit:
        if m.is_completed():
            return n
        forced = m.find_jump_forward_string()
        if forced:
            took = 0
            for t in encode(forced):
                if not m.accept_token(t):
                    break
                took += 1
            n += took
            if took:
                continue
        m.fill_next_token_bitmask(buf, 0)
        tok = _first_candidate(buf[0], vocab)
        if tok is None or not m.accept_token(tok):
            return None
        n += 1
    return None


def _first_candidate(mask_row: torch.Tensor, vocab: ClosingVocab) -> int | None:
    for ids in vocab.classes:
        allowed = allowed_subset(mask_row, ids)
        if allowed.numel():
            return int(allowed[0])
    return None


def fill_closing_bitmask(matcher: xgr.GrammarMatcher, vocab: ClosingVocab, encode: Callable[[str], list[int]],
                         bitmask: torch.Tensor, row: int, tight: bool = False) -> None:
    """Mask for closing mode: the stop token once complete; forced text in the plan's own
    tokenization; else the first non-empty token class (only the plan's token when `tight`)."""
    if matcher.is_completed():
        _restrict(bitmask, row, vocab.stop_ids)
        return
    matcher.fill_next_token_bitmask(bitmask, row)
    forced = matcher.find_jump_forward_string()
    if forced:
        first = encode(forced)[:1]
        if first and allowed_subset(bitmask[row], _ids(first)).numel():
            _restrict(bitmask, row, _ids(first))
        return
    for ids in vocab.classes:
        allowed = allowed_subset(bitmask[row], ids)
        if allowed.numel():
            _restrict(bitmask, row, allowed[:1] if tight else allowed)
            return


def fill_value_closing_bitmask(matcher: xgr.GrammarMatcher, vocab: ClosingVocab, bitmask: torch.Tensor,
                               row: int) -> bool:
    """Loop breaking: allow only tokens that end the current value; False if none is allowed now
    (the row then holds the grammar's plain mask)."""
    matcher.fill_next_token_bitmask(bitmask, row)
    for ids in (vocab.closers, vocab.comma_closers):
        allowed = allowed_subset(bitmask[row], ids)
        if allowed.numel():
            _restrict(bitmask, row, allowed)
            return True
    return False
