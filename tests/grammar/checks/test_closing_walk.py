"""grammar/checks/closing.py's walk over a stub `PlanMatcher` (one JSON string whose closing quote
the grammar allows only after `need` letters, and whose masks look alike until then): a walk that
goes round costs one try a token past MAX_STALE_STEPS tokens in a row from states it met before,
not a step's dozens, and ends with no plan; a string that ends before the limit is planned, under
the cap or over it. The same through the real grammars: tests/grammar/engines/test_grammar_matcher.py."""

from __future__ import annotations

import pytest

from grammar.checks.closing import MAX_PLAN_TOKENS, MAX_STALE_STEPS, ClosingVocab, completion_plan

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class LettersThenQuote:
    """The grammar `[a-z]{need,}"` from inside the string (need None: the quote never comes)."""

    def __init__(self, vocab: ClosingVocab, tokenizer, need: int | None, tries: list[int], memo=None):
        self.vocab, self.tokenizer, self.need, self.tries = vocab, tokenizer, need, tries
        self.letters = {tokenizer.convert_tokens_to_ids(c) for c in LETTERS}
        self.quote = tokenizer.convert_tokens_to_ids('"')
        self.taken: list[int] = []
        self.memo = {} if memo is None else memo

    def fork(self):
        f = LettersThenQuote(self.vocab, self.tokenizer, self.need, self.tries, self.memo)
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
        self.tries[0] += 1
        if self.is_completed() or not (token_id in self.letters or (token_id == self.quote and self._closable())):
            return False
        self.taken.append(token_id)
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


@pytest.mark.parametrize("need", [5, 40, 100, 4 * MAX_STALE_STEPS])
def test_a_string_that_ends_before_the_limit_is_planned(vocab, tokenizer, need):
    plan = completion_plan(LettersThenQuote(vocab, tokenizer, need, [0]), vocab)
    assert plan is not None and len(plan) == need + 1
    text = tokenizer.decode(plan)
    assert text.endswith('"') and set(text[:-1]) <= set(LETTERS)


def test_a_walk_that_goes_round_costs_one_try_a_token_past_the_cap(vocab, tokenizer):
    tries = [0]
    assert completion_plan(LettersThenQuote(vocab, tokenizer, None, tries), vocab) is None
    # two walks (the plain one, the one taking the other way), each: up to the cap a step tries
    # every letter twice (to end the text, then for progress), then one try a token to the limit;
    # walked in full to the limit, a walk tries 2 x 27 a token (over 100,000 in all)
    per_walk = (MAX_STALE_STEPS + 2) * 2 * (len(LETTERS) + 1) + MAX_PLAN_TOKENS
    assert tries[0] <= 2 * per_walk < 2 * MAX_PLAN_TOKENS * 2 * len(LETTERS) // 4
