"""Strict completeness on llguidance-compiled grammars (grammar/engines/llguidance/matcher.py over grammar/checks/closing.py's
planner), with the real SmolLM2 tokenizer: for schemas the fidelity report routes to llguidance, the
completion plan from every state along a valid value completes it to a value jsonschema accepts,
within the bound; the smallest budget is the start state's plan, the smallest value; the closing masks and the budget
check of one token do what the runtime's guard relies on; and the runtime's own guard, driving an
llguidance matcher for a tiny random model (tests/conftest.py), ends every strict output complete
and valid at budgets from the smallest one up, where the same requests without strict mode are cut.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from grammar import GrammarService, GrammarSpec
from grammar.checks.closing import allowed_subset
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams


def closed(properties: dict, required: list[str], **more) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False, **more}


MEDIA = {"kind": {"enum": ["book", "movie"]}, "author": {"type": "string"}, "director": {"type": "string"}}
SHORT = {"type": "string", "maxLength": 16}
LINE = {"name": SHORT, "sku": SHORT, "id": SHORT}

# name -> (schema, a valid value written compactly (every state along it is planned from), the start
# state's plan: the smallest value as the planner writes it (a name or a pattern's characters one
# token each where the grammar does not force them))
CASES = {
    "multipleOf_quarter": (
        closed({"price": {"type": "number", "multipleOf": 0.25}}, ["price"]),
        '{"price":19.75}',
        '{"price":0}',
    ),
    "if_then_else_discriminator": (
        {
            **closed(MEDIA, ["kind"]),
            "if": {"properties": {"kind": {"const": "book"}}},
            "then": {"required": ["author"], "properties": {"director": False}},
            "else": {"required": ["director"], "properties": {"author": False}},
        },
        '{"kind":"movie","director":"Steven Spielberg"}',
        '{"kind":"book","author":""}',
    ),
    "required_beside_anyOf": (
        closed(
            {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": LINE,
                        "required": ["sku"],
                        # (a `not` in one branch keeps this with llguidance: plain branches would be
                        # merged with the keywords beside them for xgrammar, grammar/rewrites/all_of.py)
                        "anyOf": [{"required": ["name"]}, {"required": ["id"], "not": {"required": ["name"]}}],
                    },
                }
            },
            ["items"],
        ),
        '{"items":[{"name":"apples","sku":"A-1"},{"sku":"B","id":"x"}]}',
        '{"items":[{"sku":"","id":""}]}',  # required names spelled shortest first (plan_names.py)
    ),
    "pattern_with_maxLength": (
        closed({"word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}}, ["word"]),
        '{"word":"abcde"}',
        '{"word":"a"}',
    ),
    "pattern_with_minLength": (  # twelve letters, one token each (`false` is five letters here)
        closed({"code": {"type": "string", "pattern": "^[a-z]+$", "minLength": 12}}, ["code"]),
        '{"code":"abcdefghijklmnop"}',
        '{"code":"abcdefgfalse"}',
    ),
    "counted_repetition": (  # `[0-9]{5}`: states whose masks are equal (llguidance shows no more),
        # walked by the plain walk: the first digit not yet taken from such a state
        closed({"zip": {"type": "string", "pattern": "^[0-9]{5}-[a-z]+$", "maxLength": 20}}, ["zip"]),
        '{"zip":"12345-abc"}',
        '{"zip":"01230-a"}',
    ),
    "unique_items_beside_multipleOf": (  # the value check repairs the plan's second "" to "x"
        closed(
            {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
                "price": {"type": "number", "multipleOf": 0.25},
            },
            ["tags", "price"],
        ),
        '{"tags":["red","blue","green"],"price":2.75}',
        '{"tags":["","x"],"price":0}',
    ),
}


@pytest.fixture(scope="module")
def handles(service) -> dict[str, LLGuidanceHandle]:
    out = {}
    for name, (schema, _, _) in CASES.items():
        handle = service.compile(GrammarSpec("json_schema", schema, True))
        assert isinstance(handle, LLGuidanceHandle), name  # routed to llguidance by the fidelity report
        out[name] = handle
    return out


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name", list(CASES))
def test_the_plan_from_every_state_completes_a_valid_value_within_the_bound(handles, tokenizer, name):
    schema, text, _ = CASES[name]
    handle = handles[name]
    written = ids(tokenizer, text)
    matcher = handle.new_matcher()
    assert matcher.supports_strict
    for i in range(len(written) + 1):
        plan = matcher.completion_plan()
        assert plan is not None, (name, tokenizer.decode(written[:i]))
        assert matcher.completion_bound() >= len(plan)
        follower = handle.new_matcher()  # the plan is the grammar's own path from this state
        assert all(follower.accept(t) for t in written[:i] + plan)
        assert follower.is_completed() and follower.accept(tokenizer.eos_token_id)
        value = json.loads(tokenizer.decode(written[:i] + plan))
        validator(schema).validate(value)
        if i < len(written):
            assert matcher.accept(written[i])
    assert matcher.completion_plan() == [] and matcher.completion_bound() == 0


@pytest.mark.parametrize("name", list(CASES))
def test_the_smallest_budget_is_the_start_plan(handles, tokenizer, name):
    _, _, smallest = CASES[name]
    plan = handles[name].new_matcher().completion_plan()
    assert tokenizer.decode(plan) == smallest
    assert handles[name].min_completion_tokens() == len(plan)


def allowed(matcher, fill, vocab: int, *args) -> set[int]:
    mask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    fill(mask, 0, *args)
    return set(allowed_subset(mask[0], torch.arange(vocab)).tolist())


def test_closing_masks_follow_the_plan_and_end_with_the_stop_token(handles, tokenizer):
    handle = handles["required_beside_anyOf"]
    vocab = len(tokenizer)
    matcher = handle.new_matcher()
    for t in ids(tokenizer, '{"items":[{"name":"apples","sku":"A-1'):
        assert matcher.accept(t)
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == '"}]}'
    assert allowed(matcher, matcher.fill_plan_bitmask, vocab, plan[0]) == {plan[0]}
    assert allowed(matcher, matcher.fill_closing_bitmask, vocab, True) == {plan[0]}  # tight: the plan only
    loose = allowed(matcher, matcher.fill_closing_bitmask, vocab)
    plain = allowed(matcher, matcher.fill_bitmask, vocab)
    assert plan[0] in loose and len(loose) > 1 and loose < plain  # closers only (`"}`, `"}]`, ...)
    for t in plan:
        assert t in allowed(matcher, matcher.fill_closing_bitmask, vocab, False, t)
        assert matcher.accept(t)
    assert allowed(matcher, matcher.fill_closing_bitmask, vocab) == {tokenizer.eos_token_id}
    assert matcher.accept(tokenizer.eos_token_id) and matcher.is_terminated()
    assert matcher.completion_plan() == []


def test_loop_breaking_mask_ends_the_current_string(handles, tokenizer):
    handle = handles["if_then_else_discriminator"]
    matcher = handle.new_matcher()
    for t in ids(tokenizer, '{"kind":"movie","director":"la la la la'):
        assert matcher.accept(t)
    mask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
    assert matcher.fill_value_closing_bitmask(mask, 0)
    closers = allowed_subset(mask[0], torch.arange(len(tokenizer))).tolist()
    assert closers and all(tokenizer.convert_ids_to_tokens(t).startswith('"') for t in closers)
    assert all(matcher.closes_value(t) for t in closers)
    assert not matcher.closes_value(ids(tokenizer, "la")[0])


def test_the_budget_check_of_one_token_leaves_the_state_as_it_was(handles, tokenizer):
    handle = handles["unique_items_beside_multipleOf"]
    vocab = len(tokenizer)
    matcher = handle.new_matcher()
    for t in ids(tokenizer, '{"tags":["red"'):
        assert matcher.accept(t)
    before = allowed(matcher, matcher.fill_bitmask, vocab)
    comma = ids(tokenizer, ',"')[0]
    assert matcher.may_expand(comma)
    after = matcher.completion_bound_after(comma)
    assert allowed(matcher, matcher.fill_bitmask, vocab) == before
    fork = handle.new_matcher()
    for t in ids(tokenizer, '{"tags":["red"') + [comma]:
        assert fork.accept(t)
    assert after == fork.completion_bound() >= len(fork.completion_plan())
    # the stop token: refused before the value is complete, nothing left to write after it
    assert matcher.completion_bound_after(tokenizer.eos_token_id) is None
    for t in ids(tokenizer, ',"blue"],"price":1}'):
        assert matcher.accept(t)
    assert matcher.completion_bound_after(tokenizer.eos_token_id) == 0
    assert not matcher.is_terminated()  # the check never hands the stop token to llguidance


def test_plans_kept_by_exact_state_follow_rollbacks_and_the_stop_token(handles, tokenizer):
    """Plans are kept by the tokens llguidance accepted (grammar/checks/plan_state.py): after a
    rollback, a different token, the stop token and a rollback over it, each state's plan is the
    one a fresh matcher fed the same tokens makes (a stale key would give an earlier state's)."""
    handle = handles["required_beside_anyOf"]
    written = ids(tokenizer, '{"items":[{"name":"apples","sku":"A-1"}]}')

    def fresh_plan(tokens: list[int]) -> list[int] | None:
        m = handle.new_matcher()
        assert all(m.accept(t) for t in tokens)
        return m.completion_plan()

    matcher = handle.new_matcher()
    for t in written[:8]:
        assert matcher.accept(t)
    at8 = matcher.completion_plan()
    matcher.rollback(3)
    assert matcher.completion_plan() == fresh_plan(written[:5]) != at8
    choices = allowed(matcher, matcher.fill_bitmask, len(tokenizer)) - {written[5], tokenizer.eos_token_id}
    other = min(t for t in choices if matcher.completion_bound_after(t) is not None)
    assert matcher.accept(other)
    assert matcher.completion_plan() == fresh_plan(written[:5] + [other])
    matcher.rollback(1)
    for t in written[5:]:
        assert matcher.accept(t)
    assert matcher.completion_plan() == [] and matcher.accept(tokenizer.eos_token_id)
    matcher.rollback(4)  # the stop token and three before it
    assert matcher.completion_plan() == fresh_plan(written[:-3])


# -- the runtime's guard, unchanged, on llguidance matchers ----------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from runtime.engine.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_pool_tokens=8192).start()
    svc = GrammarService(engine.tokenizer, engine.model_config.vocab_size)
    yield engine, svc
    engine.shutdown()
    svc.close()


@pytest.mark.parametrize(
    "name",
    ["multipleOf_quarter", "if_then_else_discriminator", "required_beside_anyOf", "unique_items_beside_multipleOf"],
)
def test_strict_outputs_of_a_random_model_complete_at_every_tight_budget(tiny_engine, name):
    """A random model writes on and on; strict mode must close every value by its budget (the
    smallest one the schema allows, and a few more), where the same requests unguarded are cut."""
    engine, svc = tiny_engine
    schema = CASES[name][0]
    handle = svc.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    need = handle.min_completion_tokens()
    budgets = [need, need + 1, need + 3, need + 8, need + 20]
    prompts = [[1, 2, 3 + k] for k in range(2)]
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=b, temperature=0.0), constraint=handle, strict=strict)
        for strict in (True, False)
        for b in budgets
        for p in prompts
    ]
    results = engine.generate_many(reqs)
    strict_results, loose_results = results[: len(results) // 2], results[len(results) // 2 :]
    for req, r in zip(reqs, strict_results):
        assert r.completion_tokens <= req.sampling.max_new_tokens
        validator(schema).validate(json.loads(r.text))
    assert all(r.finish_reason == "stop" for r in strict_results)  # every value completed ...
    assert any(r.closed_at_budget for r in strict_results)  # ... some closed by the guard, not the model
    cut = 0
    for r in loose_results:
        try:
            json.loads(r.text)
        except ValueError:
            cut += 1
    assert cut > 0  # the control: without strict mode the random model runs into the budget
