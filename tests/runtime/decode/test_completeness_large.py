"""Strict completion, again (issue #16): repeated spans inside long strings, schemas with dozens
of required properties, and closing for json_object and regex outputs.

Unit tests of the text detectors in runtime/decode/completeness.py (loops caught, legitimate strings
left alone) and of plans on a ~44-required-property nested schema; then the real SmolLM2, greedy,
at budgets just above the smallest instance: outputs complete and validate.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar import GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.completeness import MAX_RUN, CompletionGuard, repetitive_text, runaway_run
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

LOOPING_STRINGS = [
    '{"url":"https://a.b/https://a.b/https://a.b/https://a.b/https://a.b/',
    '{"url":"https://example.com/https://example.com/https://example.com/https://example.com/',
    # near-copies: a counter changes from copy to copy
    '{"url":"https://example.com/items/1/https://example.com/items/2/https://example.com/items/3/'
    "https://example.com/items/4/https://example.com/items/5/",
    '{"p":"/home/user/docs/home/user/docs/home/user/docs/home/user/docs/home/user/docs',
    '{"t":"very very very very very very very very very very very very very',
    '{"u":"https://www.brightwave.io/about/team/maria-okafor/https://www.brightwave.io/about/team/'
    "maria-okafor/https://www.brightwave.io/about/team/maria-okafor/",
]
LEGIT_STRINGS = [
    '{"summary":"The harbour authority met on Monday to review the winter dredging plan. Silt levels rose 14 '
    "percent after the November storms, two berths are restricted to vessels under 9 metres draught, and the "
    "contractor asks for a six week extension.",
    '{"url":"https://www.example.com/products/electronics/audio/headphones/wireless/noise-cancelling/'
    "model-x1000?ref=homepage&utm_source=newsletter&utm_medium=email",
    '{"path":"/usr/local/lib/python3.11/site-packages/jumpgate/runtime/completeness/tests/data/schema_corpus/'
    "loop_prone.json",
    '{"x":"the cat and the dog and the bird and the fish and the horse and the cow and the pig and the hen',
    '{"notes":"budget approved for Q3; hiring freeze lifted in the support team; office move postponed to '
    "October; budget approved for Q4",
    '{"addr":"Rua Augusta 123, 1100-048 Lisboa, Portugal; Avenida da Liberdade 245, 1250-143 Lisboa, Portugal',
    '{"csv":"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30',
    '{"date":"2024-01-01, 2024-01-02, 2024-01-03, 2024-01-04, 2024-01-05, 2024-01-06',
]


@pytest.mark.parametrize("text", LOOPING_STRINGS)
def test_repeated_spans_inside_a_string_are_caught(text):
    assert repetitive_text(text)


@pytest.mark.parametrize("text", LEGIT_STRINGS)
def test_legitimate_strings_are_not_taken_for_loops(text):
    assert not repetitive_text(text) and not runaway_run(text)


def test_repetition_is_judged_within_the_current_string_only():
    loop = LOOPING_STRINGS[0]
    assert not repetitive_text(loop + '","next":"ok')  # that string ended; the new one is short
    assert not repetitive_text('{"u":"https://a.b/https://a.b/')  # too short to judge


def test_runaway_run_caps_strings_without_whitespace():
    assert runaway_run('{"u":"' + "x" * (MAX_RUN + 1))
    assert not runaway_run('{"u":"' + "x" * MAX_RUN)
    assert not runaway_run('{"u":"' + "word " * 60)  # prose of any length is not a run
    assert not runaway_run('{"u":"' + "x" * (MAX_RUN + 1) + '","v":"y')


def test_guard_breaks_a_url_loop_whose_tokens_never_repeat():
    """Token ids all differ (the token-level detector stays quiet); the text repeats."""
    g = CompletionGuard()
    text = LOOPING_STRINGS[2]
    g.after_token(list(range(100, 140)), text[:40], closed_value=False)
    assert not g.close_value
    g.after_token(list(range(100, 160)), text, closed_value=False)
    assert g.close_value and g.loops_broken == 1


# ==== large nested schemas ========================================================================


def obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def large_schema() -> dict:
    """48 required properties over three nesting levels, one a free-form URL string; its smallest
    instance needs more than 256 tokens (the plan's former cap)."""
    text, number = {"type": "string"}, {"type": "integer"}

    def group(prefix: str, n: int, **more) -> dict:
        return obj({f"{prefix}_field_{k}": text if k % 3 else number for k in range(n)} | more)

    return obj(
        {
            "record_identifier": text,
            "homepage_url": {"type": "string", "description": "free-form URL"},
            "owner_details": group("owner", 8, postal_address=group("address", 6)),
            "product_details": group("product", 8, related_links=obj({"documentation_url": text, "support_url": text})),
            "billing_details": group("billing", 8),
            "feature_flags": obj({f"feature_flag_{k}": {"type": "boolean"} for k in range(6)}),
        }
    )


def required_count(schema: dict) -> int:
    props = schema.get("properties", {})
    return len(schema.get("required", [])) + sum(required_count(p) for p in props.values())


def test_large_schema_plan_is_its_minimal_instance(service, tokenizer):
    schema = large_schema()
    assert required_count(schema) >= 40
    handle = service.compile(GrammarSpec.json_schema(schema))
    matcher = handle.new_matcher()
    plan = matcher.completion_plan()
    assert plan is not None and len(plan) > 256
    assert len(plan) == handle.min_completion_tokens()
    value = json.loads(tokenizer.decode(plan))
    jsonschema.validate(value, schema)
    # from the middle of the URL string, the plan closes it and every container after it
    for t in tokenizer.encode(
        '{"record_identifier":"r1","homepage_url":"https://a.b/https://a.b/', add_special_tokens=False
    ):
        assert matcher.accept(t)
    rest = matcher.completion_plan()
    assert rest is not None
    jsonschema.validate(
        json.loads('{"record_identifier":"r1","homepage_url":"https://a.b/https://a.b/' + tokenizer.decode(rest)),
        schema,
    )


def test_json_object_and_regex_plans(service, tokenizer):
    m = service.compile(GrammarSpec.json_object()).new_matcher()
    for t in tokenizer.encode('{"a":[{"b":"c', add_special_tokens=False):
        assert m.accept(t)
    rest = tokenizer.decode(m.completion_plan())
    assert isinstance(json.loads('{"a":[{"b":"c' + rest), dict)
    pattern = r"Items: [a-z]+(, [a-z]+)*\."
    m = service.compile(GrammarSpec.regex(pattern)).new_matcher()
    for t in tokenizer.encode("Items: apple, pear, plum", add_special_tokens=False):
        assert m.accept(t)
    assert re.fullmatch(pattern, "Items: apple, pear, plum" + tokenizer.decode(m.completion_plan()))


@pytest.mark.parametrize(
    "field",
    [{"response_format": {"type": "json_object"}}, {"regex": "[a-z]+"}, {"ebnf": 'root ::= "a"+'}],
    ids=["json_object", "regex", "ebnf"],
)
def test_gateway_sends_json_object_regex_and_ebnf_as_strict(gateway_client, fake_engine, field):
    """The gateway asks the engine for the guard on every kind (it used to send them unguarded)."""
    resp = gateway_client().post(
        "/v1/chat/completions",
        json={"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], **field},
    )
    assert resp.status_code == 200, resp.text
    assert fake_engine.submitted[-1].strict is True


# ==== the real SmolLM2 ============================================================================

SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
PROFILE = (
    "Fill in the full record for Brightwave Analytics (https://brightwave.io/about/team/maria-okafor/), "
    "owner Maria Okafor, Rua Augusta 123, Lisbon; product RiskBoard with docs at "
    "https://brightwave.io/docs/riskboard/ and support at https://brightwave.io/support/."
)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0)


@pytest.mark.e2e
def test_large_schema_completes_just_above_its_minimal_instance(engine_idle_check, service, tokenizer):
    schema = large_schema()
    handle = service.compile(GrammarSpec.json_schema(schema))
    need = handle.min_completion_tokens()
    ids = chat_ids(tokenizer, PROFILE, SYSTEM)
    specs = [GenerateRequest(ids, greedy(need + slack), constraint=handle, strict=True) for slack in (2, 24)]
    for spec, r in zip(specs, engine_idle_check.generate_many(specs, timeout=900)):
        assert r.finish_reason == "stop" and r.completion_tokens <= spec.sampling.max_new_tokens
        jsonschema.validate(json.loads(r.text), schema)  # complete and valid, whatever the finish


@pytest.mark.e2e
def test_strict_json_object_and_regex_complete_within_a_small_budget(engine_idle_check, service, tokenizer):
    story = chat_ids(tokenizer, "Describe the harbour authority's winter dredging plan in full detail.", SYSTEM)
    fruits = chat_ids(tokenizer, "List as many fruits as you can, separated by commas.")
    pattern = r"Fruits: [a-z ]+(, [a-z ]+)*\."
    cases = [(GrammarSpec.json_object(), story, 20), (GrammarSpec.regex(pattern), fruits, 16)]
    specs = [
        GenerateRequest(ids, greedy(budget), constraint=service.compile(spec), strict=strict)
        for spec, ids, budget in cases
        for strict in (True, False)
    ]
    strict_obj, loose_obj, strict_re, loose_re = engine_idle_check.generate_many(specs, timeout=900)
    assert isinstance(json.loads(strict_obj.text), dict) and strict_obj.completion_tokens <= 20
    assert re.fullmatch(pattern, strict_re.text) and strict_re.completion_tokens <= 16
    assert strict_obj.finish_reason == strict_re.finish_reason == "stop"
    assert strict_obj.closed_at_budget and strict_re.closed_at_budget
    # without strict mode the same budgets cut both outputs: closing is what completed them
    assert loose_obj.finish_reason == "length" and loose_re.finish_reason == "length"
    assert not re.fullmatch(pattern, loose_re.text)
