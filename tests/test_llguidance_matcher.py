"""LLGuidanceMatcher against the runtime's matcher protocol, with the real SmolLM2 tokenizer: the
mask agrees with accept, refused tokens leave the state as it was, rollback restores the mask,
termination is the stop token, jump-forward drafts are forced and not accepted, and the strict
methods say they are not implemented."""

from __future__ import annotations

import pytest
import torch

from grammar import GrammarSpec
from grammar.llg_matcher import LLGuidanceHandle

WORD = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
        "required": ["name"]}


@pytest.fixture(scope="module")
def handle(service) -> LLGuidanceHandle:
    compiled = service.compile(GrammarSpec("json_schema", WORD, True))
    assert isinstance(compiled, LLGuidanceHandle)
    return compiled


def mask_of(matcher, vocab: int) -> torch.Tensor:
    bitmask = torch.zeros((2, (vocab + 31) // 32), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 1)
    assert bitmask[0].eq(0).all()  # only its own row is written
    bits = (bitmask[1].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab].bool()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_mask_allows_exactly_what_accept_takes(handle, tokenizer):
    matcher = handle.new_matcher()
    for token_id in ids(tokenizer, '{"name":"abcde'):
        assert matcher.accept(token_id)
    allowed = mask_of(matcher, len(tokenizer))
    sample = sorted(set(range(0, len(tokenizer), 97)) | set(allowed.nonzero().flatten().tolist()))
    for token_id in sample:
        probe = handle.new_matcher()
        for t in ids(tokenizer, '{"name":"abcde'):
            probe.accept(t)
        assert probe.accept(token_id) is bool(allowed[token_id]), tokenizer.decode([token_id])
    assert not allowed[ids(tokenizer, "f")[0]]  # a sixth letter
    assert allowed[ids(tokenizer, '"}')[0]]


def test_special_tokens_are_never_text(handle, tokenizer):
    matcher = handle.new_matcher()
    for token_id in ids(tokenizer, '{"name":"a'):
        matcher.accept(token_id)
    allowed = mask_of(matcher, len(tokenizer))
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert not allowed[im_start] and not allowed[tokenizer.eos_token_id]


def test_a_refused_token_leaves_the_state_unchanged(handle, tokenizer):
    matcher = handle.new_matcher()
    for token_id in ids(tokenizer, '{"name":"ab'):
        assert matcher.accept(token_id)
    assert not matcher.accept(ids(tokenizer, "7")[0])
    assert all(matcher.accept(t) for t in ids(tokenizer, 'c"}'))
    assert matcher.is_completed() and not matcher.is_terminated()


def test_rollback_restores_the_mask(handle, tokenizer):
    matcher = handle.new_matcher()
    prefix = ids(tokenizer, '{"name":"')
    for token_id in prefix:
        matcher.accept(token_id)
    before = mask_of(matcher, len(tokenizer))
    for token_id in ids(tokenizer, "abc"):
        assert matcher.accept(token_id)
    matcher.rollback(len(ids(tokenizer, "abc")))
    assert torch.equal(mask_of(matcher, len(tokenizer)), before)


def test_termination_is_the_stop_token_and_rolls_back(handle, tokenizer):
    matcher = handle.new_matcher()
    eos = tokenizer.eos_token_id
    assert not matcher.accept(eos)  # nothing complete yet
    for token_id in ids(tokenizer, '{"name":"abc"}'):
        assert matcher.accept(token_id)
    assert matcher.is_completed() and not matcher.is_terminated()
    assert matcher.accept(eos) and matcher.is_terminated()
    allowed = mask_of(matcher, len(tokenizer))
    assert allowed.nonzero().flatten().tolist() == [eos]
    assert not matcher.accept(ids(tokenizer, "a")[0])
    matcher.rollback(1)
    assert not matcher.is_terminated() and matcher.accept(eos)


def test_jump_forward_drafts_the_forced_text_without_accepting_it(handle, tokenizer):
    matcher = handle.new_matcher()
    draft = matcher.jump_forward_tokens()
    assert tokenizer.decode(draft) == '{"name":"'
    assert all(matcher.accept(t) for t in draft)  # still at the start: the draft was not accepted
    assert matcher.jump_forward_tokens() == []  # the model chooses the letters


def test_strict_methods_are_declared_unavailable(handle):
    matcher = handle.new_matcher()
    assert matcher.supports_strict is False
    assert handle.min_completion_tokens() is None
    assert handle.fidelity.engine == "llguidance" and handle.memory_size_bytes > 0
