"""LLGuidanceMatcher against the runtime's matcher protocol, with the real SmolLM2 tokenizer: the
mask agrees with accept, refused tokens leave the state as it was, rollback restores the mask,
termination is the stop token, jump-forward drafts are forced and not accepted, and the strict
methods plan (more in tests/grammar/engines/test_llg_closing.py)."""

from __future__ import annotations

import pytest
import torch

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle

WORD = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
    "required": ["name"],
}


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


def test_strict_methods_plan_the_smallest_value(handle, tokenizer):
    # grammar/checks/closing.py's planner through LLGuidancePlanMatcher (tests/grammar/engines/test_llg_closing.py has more)
    matcher = handle.new_matcher()
    assert matcher.supports_strict is True
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == '{"name":"a"}'
    assert handle.min_completion_tokens() == len(plan)
    assert handle.without_value_check().min_completion_tokens() == len(plan)
    assert handle.fidelity.engine == "llguidance" and handle.memory_size_bytes > 0


# -- the direct-write mask and the one-call accept (grammar/engines/token_mask.py row_address) ------------

RECORD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "tags", "score"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "score": {"type": "number", "minimum": -5, "maximum": 5},
    },
}


class ReferenceMatcher:
    """The previous LLGuidanceMatcher path, kept here to compare against: llguidance.torch's
    fill_next_token_bitmask, and validate_tokens then consume_token."""

    def __init__(self, handle):
        self.m = handle.start.deep_copy()

    def fill_bitmask(self, bitmask, row):
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.m, bitmask, row)

    def accept(self, token_id):
        return self.m.validate_tokens([token_id]) == 1 and self.m.consume_token(token_id)


def test_the_direct_mask_and_accept_match_llguidances_helpers_along_a_walk(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", RECORD, True))
    assert isinstance(handle, LLGuidanceHandle)
    fast, ref = handle.new_matcher(), ReferenceMatcher(handle)
    words = (len(tokenizer) + 31) // 32
    refused_probes = ids(tokenizer, '7"}],zz{')
    for token_id in ids(tokenizer, '{"name":"abc","tags":["red","green"],"score":-4.5}'):
        for row in (0, 2, -1):  # negative rows count from the end, as in llguidance.torch
            got = torch.full((3, words), 7, dtype=torch.int32)
            want = got.clone()
            fast.fill_bitmask(got, row)
            ref.fill_bitmask(want, row)
            assert torch.equal(got, want)  # the same row written, the others untouched
        for probe in refused_probes + [token_id]:
            ok = fast.accept(probe)
            assert ok is ref.accept(probe)
            r = ref.m
            assert not r.is_error()
            assert fast.is_completed() is r.is_accepting()
            forced = [] if r.is_stopped() else r.compute_ff_tokens()
            assert fast.jump_forward_tokens() == forced[: r.validate_tokens(forced)]
            if ok and probe != token_id:
                fast.rollback(1)
                r.rollback(1)
    assert fast.is_completed()


def test_row_address_refuses_what_the_direct_write_cannot_take():
    from grammar.engines.token_mask import row_address

    bitmask = torch.zeros((2, 5), dtype=torch.int32)
    assert row_address(bitmask, 1) == (bitmask.data_ptr() + 20, 20)
    assert row_address(bitmask, -2) == (bitmask.data_ptr(), 20)
    for row in (2, -3):
        with pytest.raises(IndexError):
            row_address(bitmask, row)
    for bad in (
        torch.zeros((2, 5), dtype=torch.int64),
        torch.zeros((2, 10), dtype=torch.int32)[:, ::2],
        torch.zeros(5, dtype=torch.int32),
        torch.zeros((1, 2, 5), dtype=torch.int32),
    ):
        with pytest.raises(ValueError):
            row_address(bad, 0)


# -- the forced path's masks, computed once per grammar (grammar/engines/llguidance/matcher.py ForcedPath) -------


def _row(matcher, words: int) -> torch.Tensor:
    bitmask = torch.zeros((1, words), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    return bitmask[0].clone()


def test_only_token_reads_a_singleton_row():
    import numpy as np

    from grammar.engines.llguidance.matcher import only_token

    row = np.zeros(4, dtype=np.uint32)
    assert only_token(row.tobytes()) is None
    row[2] = 1 << 31
    assert only_token(row.tobytes()) == 2 * 32 + 31
    row[2] |= 1
    assert only_token(row.tobytes()) is None
    row[2], row[0] = 0, 4
    row[3] = 1
    assert only_token(row.tobytes()) is None


def test_forced_path_masks_equal_llguidances_own_and_stop_at_the_first_choice(service, tokenizer):
    """Matchers of one handle copy the masks along the forced path (`{"`, `id`) and compute the
    rest; every mask equals a matcher's without the shared path, through walks that leave the
    path, roll back onto it and take path tokens without a mask (as jump-forward does)."""
    from grammar.engines.llguidance.matcher import ForcedPath, LLGuidanceMatcher

    tag = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "tag": tag},
        "required": ["id", "tag"],
        "additionalProperties": False,
    }
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    words = (len(tokenizer) + 31) // 32

    def plain():
        return LLGuidanceMatcher(handle.start, handle.stop_ids)

    first, reference = handle.new_matcher(), plain()
    text = ids(tokenizer, '{"id":12,"tag":"b"}') + [tokenizer.eos_token_id]
    for token in text:
        assert torch.equal(_row(first, words), _row(reference, words)), tokenizer.decode([token])
        assert first.accept(token) and reference.accept(token)
    path = handle.forced_path
    assert isinstance(path, ForcedPath)
    # `{"` and `id` are forced, one token each (`":` is not: it might merge with what follows)
    depth = next(d for d in sorted(path.only) if path.only[d] is None)
    assert [path.only[d] for d in range(depth)] == text[:depth] and depth >= 2
    assert {d for d, _ in path.rows} == set(range(depth + 1))

    # a second matcher copies the path's rows and computes past them; each mask equals llguidance's
    second, reference = handle.new_matcher(), plain()
    other = ids(tokenizer, '{"id":7,"tag":"a"}')
    for token in other:
        assert torch.equal(_row(second, words), _row(reference, words))
        assert second.accept(token) and reference.accept(token)
    second.rollback(len(other) - 1)  # back onto the path, then along the first answer
    reference.rollback(len(other) - 1)
    for token in text[1:]:
        assert torch.equal(_row(second, words), _row(reference, words))
        assert second.accept(token) and reference.accept(token)
    assert second.is_terminated()

    # path tokens taken without a mask (jump-forward) keep a fresh matcher on the path
    third, reference = handle.new_matcher(), plain()
    for token in text[:depth]:
        assert third.accept(token) and reference.accept(token)
    assert third.forced_path_depth == depth
    assert torch.equal(_row(third, words), _row(reference, words))
    rows_before = dict(path.rows)
    assert third.accept(text[depth]) and reference.accept(text[depth])
    assert third.forced_path_depth == depth  # the model's choice leaves the path
    assert torch.equal(_row(third, words), _row(reference, words))
    assert path.rows == rows_before  # nothing off the path is kept


def test_the_forced_path_is_kept_to_a_bounded_depth(service, tokenizer, monkeypatch):
    import grammar.engines.llguidance.matcher as module

    monkeypatch.setattr(module, "FORCED_DEPTH_KEPT", 1)
    name = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}
    schema = {
        "type": "object",
        "properties": {"code": {"type": "integer"}, "name": name},
        "required": ["code", "name"],
        "additionalProperties": False,
    }
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    matcher, words = handle.new_matcher(), (len(tokenizer) + 31) // 32
    for token in ids(tokenizer, '{"code":4,"name":"ab"}'):
        _row(matcher, words)
        assert matcher.accept(token)
    assert {depth for depth, _ in handle.forced_path.rows} == {0}


def test_valid_prefix_counts_the_tokens_the_grammar_takes_and_leaves_the_state(handle, tokenizer):
    """A prompt-lookup draft is cut where the grammar would refuse it; checking changes nothing."""
    vocab = len(tokenizer)
    matcher = handle.new_matcher()
    for token in ids(tokenizer, '{"name":"'):
        assert matcher.accept(token)
    before = mask_of(matcher, vocab).clone()
    word = ids(tokenizer, "abc")
    assert matcher.valid_prefix(word) == len(word)
    assert matcher.valid_prefix(word + ids(tokenizer, "DEF")) == len(word)  # ^[a-z]+$
    assert matcher.valid_prefix([]) == 0
    assert torch.equal(mask_of(matcher, vocab), before)
