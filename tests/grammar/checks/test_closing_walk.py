"""grammar/checks/closing.py's walk over a stub `PlanMatcher` (one JSON string whose closing quote
the grammar allows only after `need` letters, and whose masks look alike until then, as
llguidance's do): a walk that goes round ends after MAX_STALE_STEPS tokens in a row from states it
met before, not at the 1,024-token limit; a counted repetition under that cap is still planned."""

from __future__ import annotations

import pytest

from grammar.checks.closing import MAX_PLAN_TOKENS, MAX_STALE_STEPS, ClosingVocab, completion_plan

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class LettersThenQuote:
    """The grammar `[a-z]{need,}"` from inside the string (need None: the quote never comes)."""

    def __init__(self, vocab: ClosingVocab, tokenizer, need: int | None, deepest: list[int], memo=None):
        self.vocab, self.tokenizer, self.need, self.deepest = vocab, tokenizer, need, deepest
        self.letters = {tokenizer.convert_tokens_to_ids(c) for c in LETTERS}
        self.quote = tokenizer.convert_tokens_to_ids('"')
        self.taken: list[int] = []
        self.memo = {} if memo is None else memo

    def fork(self):
        f = LettersThenQuote(self.vocab, self.tokenizer, self.need, self.deepest, self.memo)
        f.taken = list(self.taken)
        return f

    def _closable(self) -> bool:
        return self.need is not None and len(self.taken) >= self.need

    def fill_mask(self, bitmask, row: int) -> None:
        bitmask[row] = 0
        if self.is_completed():
            return
        for t in self.letters | ({self.quote} if self._closable() else set()):
            word = int(bitmask[row, t >> 5]) | (1 << (t & 31))
            bitmask[row, t >> 5] = word - (1 << 32) if word >= 1 << 31 else word

    def accept(self, token_id: int) -> bool:
        if self.is_completed() or not (token_id in self.letters or (token_id == self.quote and self._closable())):
            return False
        self.taken.append(token_id)
        self.deepest[0] = max(self.deepest[0], len(self.taken))
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.taken[len(self.taken) - num_tokens :]

    def is_completed(self) -> bool:
        return bool(self.taken) and self.taken[-1] == self.quote

    def forced_tokens(self) -> list[int]:
        return []

    def state_detail(self) -> bytes:
        return b""  # masks alone tell states apart, as with llguidance

    def names(self):
        return None

    def way_outs(self) -> dict:
        return self.memo


@pytest.fixture(scope="module")
def vocab(tokenizer) -> ClosingVocab:
    return ClosingVocab(tokenizer, len(tokenizer), [tokenizer.eos_token_id], frozenset(tokenizer.all_special_ids))


@pytest.mark.parametrize("need", [5, 40, 100])
def test_a_counted_repetition_under_the_cap_is_planned(vocab, tokenizer, need):
    deepest = [0]
    plan = completion_plan(LettersThenQuote(vocab, tokenizer, need, deepest), vocab)
    assert plan is not None and len(plan) == need + 1
    text = tokenizer.decode(plan)
    assert text.endswith('"') and set(text[:-1]) <= set(LETTERS)


@pytest.mark.parametrize("need", [None, 4 * MAX_STALE_STEPS])
def test_a_walk_that_goes_round_ends_at_the_cap_not_the_limit(vocab, tokenizer, need):
    deepest = [0]
    assert completion_plan(LettersThenQuote(vocab, tokenizer, need, deepest), vocab) is None
    # every walk (the plain one and the one taking the other way) stopped after the cap: the
    # first step meets the state, the next MAX_STALE_STEPS + 1 come back to it
    assert MAX_STALE_STEPS < deepest[0] <= MAX_STALE_STEPS + 3 < MAX_PLAN_TOKENS
