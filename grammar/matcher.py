"""Per-request grammar state for the engine (implements runtime.constraint.TokenMatcher).

Each request gets its own `XGrammarMatcher` over a shared compiled grammar. Besides masking,
it drafts jump-forward tokens: the text the grammar forces from the current state, tokenized the
way the model's own tokenizer would, cut to the longest prefix the grammar accepts so the draft
is always grammar-valid (the engine then verifies it against the model).
"""

from __future__ import annotations

from collections.abc import Callable

import xgrammar as xgr

Encode = Callable[[str], list[int]]


class XGrammarMatcher:
    __slots__ = ("_matcher", "_encode", "_special_ids")

    def __init__(self, compiled: xgr.CompiledGrammar, encode: Encode, special_ids: frozenset[int]) -> None:
        # Rollback is unlimited in xgrammar >= 0.2 (max_rollback_tokens is deprecated), which
        # jump-forward verification relies on.
        self._matcher = xgr.GrammarMatcher(compiled)
        self._encode = encode
        self._special_ids = special_ids

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU tensor, xgrammar layout)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return self._matcher.accept_token(int(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def is_completed(self) -> bool:
        return self._matcher.is_completed()

    def jump_forward_string(self) -> str:
        """The text the grammar forces from here ('' when the model has a choice)."""
        if self._matcher.is_terminated():
            return ""
        return self._matcher.find_jump_forward_string()

    def jump_forward_tokens(self) -> list[int]:
        """Forced tokens, not accepted: the model tokenizer's encoding of the forced text, cut
        to the longest prefix the matcher accepts (checked by accepting, then rolling back)."""
        text = self.jump_forward_string()
        if not text:
            return []
        draft = self._encode(text)
        accepted = 0
        for token_id in draft:
            # a forced text that spells a special token (e.g. "<|im_end|>") is not that token
            if token_id in self._special_ids or not self._matcher.accept_token(token_id):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return draft[:accepted]
