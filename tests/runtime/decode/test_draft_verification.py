"""Unit tests of the decoder's greedy shortcut (runtime/decode/decoding.py): one unmasked argmax
over every greedy row of a pass, a row masked only where the mask refuses that argmax (or a strict
re-choice needs the masked row). Each choice must equal the reference: mask, then argmax, then
the strict vetting from the masked row. Fakes stand in for the request, its matcher and guard."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from runtime.counters import EngineCounters
from runtime.decode.decoding import Decoder, allows_bit, top_suffices
from runtime.decode.sampling import SamplingParams

VOCAB = 70  # not a multiple of 32: the last mask word is partial


class ListMatcher:
    """Allows the tokens of `allowed` (the same at every step)."""

    def __init__(self, allowed: set[int]):
        self.allowed = allowed
        self.fills = 0

    def fill_bitmask(self, mask: torch.Tensor, row: int) -> None:
        self.fills += 1
        words = [0] * mask.shape[1]
        for t in self.allowed:
            words[t >> 5] |= 1 << (t & 31)
        mask[row] = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


class RefusingGuard:
    """Refuses the tokens of `refused` (a choice that would overrun the budget); its fallback is
    `fallback`. Records every token it was asked about."""

    def __init__(self, refused: set[int], fallback: int | None = None):
        self.refused = refused
        self.fallback = fallback
        self.asked: list[int] = []

    def before_choice(self, matcher, produced: int, max_new: int) -> None:
        pass

    def fill_mask(self, matcher, mask: torch.Tensor, row: int) -> None:
        matcher.fill_bitmask(mask, row)

    def allows(self, matcher, token_id: int, remaining: int) -> bool:
        self.asked.append(token_id)
        return token_id not in self.refused

    def fallback_token(self, matcher) -> int | None:
        return self.fallback


@dataclass
class FakeSpec:
    sampling: SamplingParams
    rid: str
    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class FakeReq:
    spec: FakeSpec
    matcher: ListMatcher | None = None
    guard: RefusingGuard | None = None
    draft: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def prompt_ids(self) -> list[int]:
        return self.spec.prompt_ids


def decoder() -> Decoder:
    return Decoder({0}, 8, EngineCounters(), lambda *a: None, lambda *a: None)


def req(rid: str, allowed: set[int] | None, refused: set[int] | None = None, draft=(), **sampling) -> FakeReq:
    params = SamplingParams(**{"max_new_tokens": 64, "temperature": 0.0, **sampling})
    matcher = ListMatcher(allowed) if allowed is not None else None
    guard = RefusingGuard(refused) if refused is not None else None
    return FakeReq(FakeSpec(params, rid), matcher, guard, list(draft))


def reference(r: FakeReq, row: torch.Tensor) -> int:
    """The choice as made before the shortcut: the masked row's argmax, vetted from the masked row."""
    row = row.clone()
    if r.matcher is not None:
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[list(r.matcher.allowed)] = True
        row[~keep] = float("-inf")
    tok = int(row.argmax())
    while r.guard is not None and tok in r.guard.refused:
        row[tok] = float("-inf")
        tok = int(row.argmax())
    return tok


def test_bits_and_which_requests_may_skip_the_mask():
    mask = torch.full((1, 3), 0, dtype=torch.int32)
    ListMatcher({0, 31, 32, 69}).fill_bitmask(mask, 0)
    assert [t for t in range(VOCAB) if allows_bit(mask, 0, t)] == [0, 31, 32, 69]
    assert top_suffices(req("a", None))
    assert not top_suffices(req("b", None, logprobs=2))  # its record needs the masked row
    assert not top_suffices(req("c", None, presence_penalty=0.5))  # its argmax is of the adjusted row
    assert not top_suffices(req("d", None, temperature=0.7))


def test_first_choices_equal_the_masked_argmax_whether_or_not_the_mask_allows_the_top():
    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        logits = torch.randn(4, VOCAB, generator=g)
        tops = logits.argmax(-1).tolist()
        reqs = [
            req("free", None),
            req("top-allowed", {tops[1], 5, 6}),
            req("top-refused", set(range(VOCAB)) - {tops[2]}),
            req("strict", {tops[3], 1, 2, 3}, refused={tops[3]} if trial % 2 else set()),
        ]
        d = decoder()
        chosen = d.first_choices(logits, [(r, i) for i, r in enumerate(reqs)], {})
        for i, r in enumerate(reqs):
            assert chosen[r.rid] == reference(r, logits[i]), (trial, r.rid)


def test_a_strict_re_choice_draws_from_the_masked_row():
    """The unmasked row's runner-up is a token the grammar refuses: re-choosing from an unmasked
    row would take it."""
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 10], logits[0, 11], logits[0, 12] = 9.0, 8.0, 7.0  # 11: second best, refused by the grammar
    r = req("s", {10, 12, 40}, refused={10})
    chosen = decoder().first_choices(logits, [(r, 0)], {})
    assert chosen["s"] == 12 == reference(r, logits[0])
    assert r.guard.asked == [10, 12]


def test_the_fallback_token_when_every_allowed_choice_is_refused():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    r = req("s", {3, 4}, refused={3, 4})
    r.guard.fallback = 4
    assert decoder().first_choices(logits, [(r, 0)], {})["s"] == 4


def test_draft_rows_get_their_unmasked_argmax_in_the_same_call():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(7, VOCAB, generator=g)
    a = req("a", None, draft=[1, 2])  # rows 0-2
    b = req("b", None, draft=[3], logprobs=1)  # rows 3-4: asks for logprobs, verified the long way
    c = req("c", None, draft=[4])  # rows 5-6
    d = decoder()
    d.first_choices(logits, [(a, 0), (b, 3), (c, 5)], {})
    assert d.draft_tops == {"a": logits[1:3].argmax(-1).tolist(), "c": [int(logits[6].argmax())]}
    d.first_choices(None, [], {})
    assert d.draft_tops == {}  # never left over from an earlier pass


@pytest.mark.parametrize("strict", [False, True])
def test_choose_with_the_top_equals_choose_without_it(strict):
    g = torch.Generator().manual_seed(7)
    for _ in range(60):
        row = torch.randn(VOCAB, generator=g)
        top = int(row.argmax())
        allowed = set(torch.randperm(VOCAB, generator=g)[:20].tolist()) | (
            {top} if torch.rand(1, generator=g) < 0.5 else set()
        )
        best = reference(req("x", allowed), row)
        refused = {best} if strict else None
        fast, slow = req("f", allowed, refused), req("s", allowed, refused)
        before = row.clone()
        tok_fast, _ = decoder().choose(fast, row, top)
        tok_slow, _ = decoder().choose(slow, row)
        assert tok_fast == tok_slow == reference(slow, row)
        assert torch.equal(row, before)  # the pass's logits are left as they were
        assert fast.matcher.fills == slow.matcher.fills == 1  # one mask a row, either way
