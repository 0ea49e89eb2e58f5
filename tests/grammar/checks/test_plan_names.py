"""The completion planner's name hint (grammar/checks/plan_names.py through grammar/checks/closing.py):
where an object still misses a required name, the plan spells that name instead of the first
optional one a letter leads to, so schemas with many optional properties before their required
ones get a completion plan (and strict mode a closing and a minimum); and a plan stuck in a
pattern's free part searches for the run of characters that ends it. With the real SmolLM2
tokenizer and both engines; SchemaStore's schemas where check-jsonschema is installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr

from grammar import GrammarSpec
from grammar.checks.plan_names import required_names, scan
from tests.grammar.checks.plan_cases import FAR_REQUIRED

START = ("", False, False, False, False, None)


def plan_text(service, tokenizer, schema) -> str | None:
    plan = service.compile(GrammarSpec.json_schema(schema)).new_matcher().completion_plan()
    return None if plan is None else tokenizer.decode(plan)


def test_required_names_are_every_objects_required_list():
    schema = {
        "required": ["a"],
        "properties": {"b": {"items": {"required": ["c", 1]}}},
        "$defs": {"d": {"required": []}},
    }
    assert required_names(schema) == {"a", "c"}


def test_the_scan_tells_names_from_string_values():
    state = scan(START, b'{"ab')
    assert state[2] and state[5] == b"ab"  # inside a name
    assert scan(START, b'{"ab":"cd')[2] is False  # a value, not a name
    assert scan(START, b'{"ab":"c\\"d",')[4] is True  # the next string is a name
    assert scan(START, b'["ab')[2] is False  # an array item
    assert scan(START, b'{"a":["x",')[4] is False


def test_a_required_name_after_large_optional_ones_gets_a_short_plan(service, tokenizer):
    text = plan_text(service, tokenizer, FAR_REQUIRED)
    assert text is not None and json.loads(text).keys() == {"title"}


def test_the_plan_is_the_smallest_accepted_budget(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(FAR_REQUIRED))
    assert handle.min_completion_tokens() is not None and handle.min_completion_tokens() < 16


def test_a_pattern_whose_end_is_a_literal_is_planned_to_that_literal(service, tokenizer):
    uses = {"type": "string", "pattern": "^(.+\\/)+(.+)\\.(ya?ml)(@.+)?$"}  # github-workflows' `uses`
    schema = {"type": "object", "properties": {"uses": uses}, "required": ["uses"]}
    text = plan_text(service, tokenizer, schema)
    assert text is not None
    jsonschema.validate(json.loads(text), schema)


def test_a_requests_plans_reuse_the_way_out_found_once(service, tokenizer):
    """The way out of a pattern's free part is searched once per state of a request's matcher (its
    forks share the answers): plans from the same state, and from the states after it, are the
    same whole-valid paths with the answers kept as with none."""
    from grammar.engines.xgrammar.matcher import XGrammarPlanMatcher

    uses = {"type": "string", "pattern": "^(.+\\/)+(.+)\\.(ya?ml)(@.+)?$"}
    schema = {"type": "object", "properties": {"uses": uses}, "required": ["uses"]}
    handle = service.compile(GrammarSpec.json_schema(schema))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"uses":"a/b', add_special_tokens=False):
        assert matcher.accept(t)
    first, again = matcher.completion_plan(), matcher.completion_plan()
    assert first is not None and first == again
    cold = handle.new_matcher()  # a fresh request: nothing kept
    for t in tokenizer.encode('{"uses":"a/b', add_special_tokens=False):
        assert cold.accept(t)
    assert cold.completion_plan() == first
    jsonschema.validate(json.loads('{"uses":"a/b' + tokenizer.decode(first)), schema)
    plan = XGrammarPlanMatcher(xgr.GrammarMatcher(handle.compiled), None)
    assert plan.fork().way_outs() is plan.way_outs()


def test_llguidance_plans_with_the_hint_too(service, tokenizer):
    # a pattern beside a maxLength routes the schema to llguidance (xgrammar would drop one)
    word = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}
    schema = {**FAR_REQUIRED, "properties": {**FAR_REQUIRED["properties"], "title": word}}
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert handle.fidelity.engine == "llguidance"
    plan = handle.new_matcher().completion_plan()
    assert plan is not None and json.loads(tokenizer.decode(plan)).keys() == {"title"}


def _schemastore(name: str):
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None:
        pytest.skip("check-jsonschema is not installed (the corpus extra)")
    path = Path(spec.origin).parent / "builtin_schemas" / "vendor" / f"{name}.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ["citation-file-format", "github-workflows"])
def test_schemastore_schemas_that_had_no_plan_have_a_short_one(service, tokenizer, name):
    schema = _schemastore(name)
    plan = service.compile(GrammarSpec.json_schema(schema)).new_matcher().completion_plan()
    assert plan is not None and len(plan) <= 64  # before: none within 1,024 tokens (or 1,226)
    jsonschema.validators.validator_for(schema)(schema).validate(json.loads(tokenizer.decode(plan)))


@pytest.mark.parametrize("text", ['{"ti', '{"title":"a', '{"a0":{"field_', '{"a0":{"field_number_00":"x",'])
def test_the_live_state_is_the_scan_of_the_output(service, tokenizer, text):
    """A fork starts from the live matcher's state, read from its value check: the same as the scan."""
    matcher = service.compile(GrammarSpec.json_schema(FAR_REQUIRED)).new_matcher()
    assert all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    assert matcher.values.scan_state() == scan(START, text.encode())


# -- plans kept by exact state (grammar/checks/plan_state.py): a kept plan, or a walk that takes the rest
# kept after forced text, is the plan a fresh walk from that state makes

EXTRACT = json.loads((Path(__file__).resolve().parents[2] / "data/schema_corpus/extract_12_fields.json").read_text())


def _at(handle, tokenizer, text: str):
    matcher = handle.new_matcher()
    assert all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return matcher


def test_kept_plans_are_the_fresh_walks_from_the_same_state(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(EXTRACT))
    prefix = '{"full_name":"Ada Lovelace","job_title":"Engineer","company_name":"Analytical'
    live = _at(handle, tokenizer, prefix)
    first = live.completion_plan()
    assert first is not None and live.completion_plan() == first  # the second from the memo
    assert _at(handle, tokenizer, prefix).completion_plan() == first  # a fresh request's walk
    # a budget check walks from the state after a token (on a fork); the token taken, the re-plan
    # there is the fresh walk's; rolled back, the kept plan of the state before
    quote, comma = tokenizer.convert_tokens_to_ids('"'), tokenizer.convert_tokens_to_ids('",')
    assert all(live.completion_bound_after(t) is not None for t in (quote, comma))
    assert live.accept(comma)
    assert live.completion_plan() == _at(handle, tokenizer, prefix + '",').completion_plan()
    live.rollback(1)
    assert live.completion_plan() == first
    assert live.accept(quote) and live.completion_plan() == _at(handle, tokenizer, prefix + '"').completion_plan()


def test_walks_through_forced_names_take_the_kept_rest_as_a_fresh_walk(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(EXTRACT))
    text = '{"full_name":"Ada'
    live = _at(handle, tokenizer, text)
    # each token of the forced `","job_title":"` is checked from the state before it, as strict
    # decoding checks it: a walk through the same point after the forced name each time
    for t in tokenizer.encode('","job_title":"Eng', add_special_tokens=False):
        assert live.completion_bound_after(t) == _at(handle, tokenizer, text).completion_bound_after(t)
        assert live.accept(t)
        text += tokenizer.decode([t])
        assert live.completion_plan() == _at(handle, tokenizer, text).completion_plan()
