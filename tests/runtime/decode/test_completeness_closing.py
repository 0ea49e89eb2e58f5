"""grammar/checks/closing.py: shortest completion plans and closing masks on real grammars, and the
guard on the real grammar with a scripted model (issue #16)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from grammar import GrammarSpec
from grammar.checks.closing import allowed_subset
from runtime.decode.completeness import CompletionGuard
from tests.runtime.decode.completeness_helpers import DATA, SCHEMAS, compile_schema, errors_of

REFUSED = {k for k in json.loads((DATA / "schema_corpus_refusals.json").read_text()) if not k.startswith("_")}
REGEXES = {r["name"]: r["pattern"] for r in json.loads((DATA / "regex_corpus.json").read_text())}


# ==== grammar/checks/closing.py ==========================================================================


def obj(props: dict, required=None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(required if required is not None else props),
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    "schema,minimal",
    [
        (obj({"a": {"type": "string"}}), '{"a":""}'),
        (obj({"n": {"type": "integer"}}), '{"n":0}'),
        (obj({"ok": {"type": "boolean"}}), '{"ok":false}'),
        (obj({"tags": {"type": "array", "items": {"type": "string"}}}), '{"tags":[]}'),
        (obj({"a": {"type": "string"}, "b": {"type": "string"}}), '{"a":"","b":""}'),
        (obj({"inner": obj({"x": {"type": "string"}})}), '{"inner":{"x":""}}'),
        (obj({"a": {"type": "string"}, "opt": {"type": "string"}}, required=["a"]), '{"a":""}'),
        (obj({"n": {"type": "integer", "minimum": 1}, "m": {"type": "integer"}}), '{"n":1,"m":0}'),
    ],
)
def test_completion_bound_is_the_minimal_instance(service, tokenizer, schema, minimal):
    """The bound is the token count of the path to the minimal instance (forced text in the
    tokenizer's own tokens, then closers such as `"}`): never more than the tokenizer's encoding
    of the whole minimal instance."""
    handle = compile_schema(service, schema)
    matcher = handle.new_matcher()
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == minimal
    assert matcher.completion_bound() == len(plan) == handle.min_completion_tokens()
    assert len(plan) <= len(tokenizer.encode(minimal, add_special_tokens=False))
    for t in plan:  # the path is the grammar's own
        assert matcher.accept(t)
    assert matcher.is_completed() and matcher.completion_bound() == 0


def test_completion_bound_of_one_string_property(service, tokenizer):
    matcher = compile_schema(service, obj({"a": {"type": "string"}})).new_matcher()
    pieces = tokenizer.convert_ids_to_tokens(matcher.completion_plan())
    assert pieces == ['{"', "a", '":"', '"}']  # forced `{"a":"`, then one closer
    assert matcher.completion_bound() == 4


def test_completion_bound_counts_from_the_current_state(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}, "b": {"type": "integer"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"hello world', add_special_tokens=False):
        assert matcher.accept(t)
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == '","b":0}'
    assert matcher.completion_bound() == len(plan)


@pytest.mark.parametrize("name", [n for n in SCHEMAS if n not in REFUSED])
def test_every_corpus_schema_has_a_valid_shortest_completion(service, tokenizer, name):
    handle = compile_schema(service, SCHEMAS[name])  # xgrammar's or llguidance's: the same planner
    plan = handle.new_matcher().completion_plan()
    assert plan is not None, name
    assert handle.min_completion_tokens() == len(plan)
    value = json.loads(tokenizer.decode(plan))
    if getattr(handle, "engine", "xgrammar") == "llguidance":  # exact: every keyword holds
        jsonschema.validators.validator_for(SCHEMAS[name], default=jsonschema.Draft202012Validator)(
            SCHEMAS[name]
        ).validate(value)
    assert not errors_of(name, SCHEMAS[name], value), (name, value)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_every_corpus_regex_has_a_matching_shortest_completion(service, tokenizer, name):
    plan = service.compile(GrammarSpec.regex(REGEXES[name])).new_matcher().completion_plan()
    assert plan is not None and re.fullmatch(REGEXES[name], tokenizer.decode(plan)), name


def allowed_ids(mask: torch.Tensor, vocab: int) -> set[int]:
    return set(allowed_subset(mask[0], torch.arange(vocab)).tolist())


def test_closing_mask_is_the_stop_token_once_complete(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"x"}', add_special_tokens=False):
        assert matcher.accept(t)
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    matcher.fill_closing_bitmask(mask, 0)
    assert allowed_ids(mask, len(tokenizer)) == set(service.stop_token_ids)


def test_closing_mask_inside_a_string_ends_it(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}, "b": {"type": "string"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"hello', add_special_tokens=False):
        assert matcher.accept(t)
    vocab = len(tokenizer)
    mask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_closing_bitmask(mask, 0)
    loose = allowed_ids(mask, vocab)
    quote = tokenizer.convert_tokens_to_ids('"')
    assert quote in loose
    assert all(tokenizer.convert_ids_to_tokens(t).startswith('"') for t in loose)
    matcher.fill_closing_bitmask(mask, 0, tight=True)
    assert allowed_ids(mask, vocab) == {matcher.completion_plan()[0]}


def test_value_closing_allows_the_quote_inside_a_free_string(service, tokenizer):
    handle = compile_schema(service, obj({"notes": {"type": "array", "items": {"type": "string"}}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"notes":["again and again', add_special_tokens=False):
        assert matcher.accept(t)
    vocab = len(tokenizer)
    mask = xgr.allocate_token_bitmask(1, vocab)
    assert matcher.fill_value_closing_bitmask(mask, 0)
    allowed = allowed_ids(mask, vocab)
    pieces = {tokenizer.convert_ids_to_tokens(t) for t in allowed}
    assert '"' in pieces and '"]' in pieces
    assert "]" not in pieces and "a" not in pieces  # inside the string `]` is just a character


def test_value_closing_ends_a_runaway_number(service, tokenizer):
    handle = compile_schema(service, obj({"xs": {"type": "array", "items": {"type": "integer"}}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"xs":[123456', add_special_tokens=False):
        assert matcher.accept(t)
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    assert matcher.fill_value_closing_bitmask(mask, 0)
    pieces = {tokenizer.convert_ids_to_tokens(t) for t in allowed_ids(mask, len(tokenizer))}
    assert "]" in pieces and "]}" in pieces
    assert not any(p.isdigit() for p in pieces)


# ==== the guard on the real grammar, a scripted model ===============================================

REFS = obj(
    {
        "refs": {"type": "array", "items": obj({k: {"type": "string"} for k in "abcdefgh"})},
        "spec": {"type": ["object", "null"], "properties": {"x": {"type": "string"}}},
    },
    required=["refs"],
)
REFS_ITEM = "{" + ",".join(f'"{k}":"lifecycle.k8s.io/v1alpha1.Lifecycle"' for k in "abcdefgh") + "}"


def scripted_strict_run(handle, tokenizer, script: list[int], max_new: int) -> list[int]:
    """Decode as runtime/decode/decoding.py does for a strict greedy request whose model wants to write
    `script` (then its plan's tokens): the guard's mask, its vetting of each choice (a refused
    choice falls back to the plan's next token), and its bookkeeping after each token."""
    matcher, guard, out = handle.new_matcher(), CompletionGuard(loop_breaking=False), []
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    while len(out) < max_new and not matcher.is_completed():
        guard.before_choice(matcher, len(out), max_new)
        mask.fill_(-1)
        guard.fill_mask(matcher, mask, 0)
        want = script[len(out)] if len(out) < len(script) else None
        ok = want is not None and bool(allowed_subset(mask[0], torch.tensor([want])).numel())
        tok = want if ok and guard.allows(matcher, want, max_new - len(out)) else guard.fallback_token(matcher)
        assert tok is not None and matcher.accept(tok), (tokenizer.decode(out), tok)
        out.append(tok)
        guard.after_token(out, "", matcher.closes_value(tok))
    return out


def test_strict_output_completes_when_the_model_opens_a_big_item_near_the_budget(service, tokenizer):
    """Issue #16: a model that keeps adding array items of eight required properties. Whatever
    the budget (above the smallest instance), the strict output is complete and valid: a new
    item raises the bound by ~30 tokens at once, and the guard now knows it at once."""
    handle = compile_schema(service, REFS)
    need = handle.min_completion_tokens()
    script = tokenizer.encode('{"refs":[' + ",".join([REFS_ITEM] * 20), add_special_tokens=False)
    for max_new in range(need + 40, need + 160, 7):
        out = scripted_strict_run(handle, tokenizer, script, max_new)
        text = tokenizer.decode(out)
        assert len(out) <= max_new and json.loads(text)["refs"], (max_new, text)
        assert not errors_of("refs", REFS, json.loads(text)), text
