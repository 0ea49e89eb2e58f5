"""XGrammarMatcher: masks, accept/rollback, termination, and grammar-valid jump-forward drafts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

from grammar import GrammarService, GrammarSpec

DATA = Path(__file__).parents[2] / "data"
NAME_ONLY = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def vocab_size(smollm_dir):
    from runtime.model.loader import read_config

    return read_config(smollm_dir).vocab_size


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def allowed(matcher, vocab_size):
    bitmask = torch.zeros((2, math.ceil(vocab_size / 32)), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 1)
    assert not bitmask[0].any()  # only the requested row is written
    words = bitmask[1].tolist()
    return {i for i in range(vocab_size) if (words[i // 32] >> (i % 32)) & 1}


def test_valid_instance_is_accepted_and_completes(service, tokenizer):
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    for token in encode(tokenizer, '{"name":"Ada Lovelace"}'):
        assert not matcher.is_completed()
        assert matcher.accept(token)
    assert matcher.is_completed() and not matcher.is_terminated()
    assert matcher.accept(2) and matcher.is_terminated()  # <|im_end|>
    assert matcher.jump_forward_tokens() == []


def test_forbidden_token_is_rejected_and_leaves_the_state(service, tokenizer):
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    before = matcher.jump_forward_string()
    assert not matcher.accept(encode(tokenizer, "[")[0])
    assert matcher.jump_forward_string() == before


def test_bitmask_allows_only_grammar_tokens(service, tokenizer, vocab_size):
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    start = allowed(matcher, vocab_size)
    assert start and all(tokenizer.decode([t]).startswith("{") for t in start)
    assert 2 not in start
    for token in encode(tokenizer, '{"name":"'):
        matcher.accept(token)
    inside = allowed(matcher, vocab_size)
    # inside a free string: plenty of text, but never a chat marker or <|endoftext|>
    assert len(inside) > 10000
    assert not inside & {0, 1, 2}


def test_jump_forward_gives_the_forced_prefix(service, tokenizer):
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    assert matcher.jump_forward_string() == '{"name":"'
    draft = matcher.jump_forward_tokens()
    assert tokenizer.decode(draft) == '{"name":"'
    assert draft == encode(tokenizer, '{"name":"')  # the model tokenizer's own encoding
    assert matcher.jump_forward_tokens() == draft  # drafting accepted nothing
    for token in draft + encode(tokenizer, "Ada"):
        assert matcher.accept(token)
    assert matcher.jump_forward_tokens() == []  # the model chooses inside a string
    assert matcher.accept(encode(tokenizer, '"')[0])
    assert matcher.jump_forward_string() == "}"


def test_jump_forward_through_consts_and_fixed_keys(service, tokenizer):
    schema = json.loads((DATA / "schema_corpus" / "const_version_tag.json").read_text())
    matcher = service.compile(GrammarSpec.json_schema(schema)).new_matcher()
    assert matcher.jump_forward_string() == '{"version":"v1","payload":"'
    assert tokenizer.decode(matcher.jump_forward_tokens()) == '{"version":"v1","payload":"'


def test_jump_forward_on_a_regex(service, tokenizer):
    matcher = service.compile(GrammarSpec.regex("ID-[0-9]{3}-END")).new_matcher()
    assert tokenizer.decode(matcher.jump_forward_tokens()) == "ID-"
    for token in encode(tokenizer, "ID-123"):
        assert matcher.accept(token)
    assert tokenizer.decode(matcher.jump_forward_tokens()) == "-END"


def test_rollback_restores_the_state(service, tokenizer, vocab_size):
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    prefix = encode(tokenizer, '{"name":"A')
    for token in prefix[:2]:
        matcher.accept(token)
    mask_before, jump_before = allowed(matcher, vocab_size), matcher.jump_forward_string()
    for token in prefix[2:]:
        assert matcher.accept(token)
    matcher.rollback(len(prefix) - 2)
    assert allowed(matcher, vocab_size) == mask_before
    assert matcher.jump_forward_string() == jump_before
    matcher.rollback(0)  # no-op


def test_forced_text_spelling_a_special_token_is_not_drafted_as_that_token(service, tokenizer):
    matcher = service.compile(GrammarSpec.regex("ab<\\|im_end\\|>c")).new_matcher()
    draft = matcher.jump_forward_tokens()
    assert 2 not in draft
    assert tokenizer.decode(draft) == "ab"


@pytest.mark.parametrize("name", ["extract_12_fields", "kubernetes_pod_minimal", "recursive_tree_node", "oneof_shape"])
def test_every_draft_along_a_valid_output_is_accepted(name, service, tokenizer):
    """Walk an example token by token; at each step the draft must be acceptable as a whole."""
    schema = json.loads((DATA / "schema_corpus" / f"{name}.json").read_text())
    instance = json.loads((DATA / "schema_corpus_examples.json").read_text())[name][-1]
    matcher = service.compile(GrammarSpec.json_schema(schema)).new_matcher()
    drafted = 0
    for token in encode(tokenizer, json.dumps(instance, separators=(",", ":"), ensure_ascii=False)):
        draft = matcher.jump_forward_tokens()
        drafted += len(draft)
        assert all(matcher.accept(t) for t in draft)
        matcher.rollback(len(draft))
        assert matcher.accept(token)
    assert matcher.is_completed()
    assert drafted > 0


def test_terminated_matcher_masks_everything_but_the_stop_token(service, tokenizer, vocab_size):
    matcher = service.compile(GrammarSpec.regex("ok")).new_matcher()
    for token in encode(tokenizer, "ok"):
        assert matcher.accept(token)
    assert matcher.accept(2) and matcher.is_terminated()
    assert allowed(matcher, vocab_size) == {2}
    assert not matcher.accept(encode(tokenizer, "o")[0])


def test_terminated_mask_sets_the_sign_bit_for_a_stop_token_at_bit_31(tokenizer, vocab_size):
    svc = GrammarService(tokenizer, vocab_size, stop_token_ids=[31])
    try:
        matcher = svc.compile(GrammarSpec.regex("x")).new_matcher()
        assert matcher.accept(encode(tokenizer, "x")[0]) and matcher.accept(31)
        assert allowed(matcher, vocab_size) == {31}
    finally:
        svc.close()


def test_valid_prefix_counts_the_tokens_the_grammar_takes_and_leaves_the_state(service, tokenizer, vocab_size):
    """A prompt-lookup draft is cut where the grammar would refuse it; checking changes nothing."""
    matcher = service.compile(GrammarSpec.json_schema(NAME_ONLY)).new_matcher()
    for token in encode(tokenizer, '{"name":"'):
        assert matcher.accept(token)
    before = allowed(matcher, vocab_size)
    good = encode(tokenizer, 'Ada"}')
    assert matcher.valid_prefix(good) == len(good)
    assert matcher.valid_prefix(good + encode(tokenizer, " more")) == len(good)  # nothing after the object
    assert matcher.valid_prefix([tokenizer.eos_token_id]) == 0  # a special token is never drafted
    assert matcher.valid_prefix([]) == 0
    assert allowed(matcher, vocab_size) == before
    for token in good:
        assert matcher.accept(token)
    assert matcher.is_completed()


# past closing.py's MAX_STALE_STEPS (128) either way; the pattern's walk takes ~30 s (300 characters:
# 48 s), so it runs in the second tier
@pytest.mark.parametrize(
    "length", [{"minLength": 200}, pytest.param({"pattern": "^[a-z]{160}$"}, marks=pytest.mark.slow)]
)
def test_a_long_string_whose_masks_look_alike_is_still_planned(service, tokenizer, length):
    """A walk that has gone round MAX_STALE_STEPS states it met before (closing.py) goes on where
    the state then changes: these strings have plans, as before the cap."""
    schema = {"type": "object", "properties": {"c": {"type": "string", **length}}, "required": ["c"]}
    plan = service.compile(GrammarSpec("json_schema", schema, True)).new_matcher().completion_plan()
    assert plan is not None
    value = json.loads(tokenizer.decode(plan))
    jsonschema.validate(value, schema)
    assert len(value["c"]) >= 160
