"""The value check end to end with the real SmolLM2 (greedy, strict): prompts that make the model
repeat an object name (under additionalProperties), repeat an array item (under uniqueItems; object
items too) or leave out a dependent property (dependentRequired). Each case runs twice in one batch: without
the value check (the control: the model really does break the schema, so the test can fail) and
with it (the output parses, has no repeated name at any level, and validates with jsonschema)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT
from grammar.kinds.tool_calls.parser import parse_tool_calls
from grammar.validation.fidelity import routed_schema_fidelity
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
ITEMS = "Make a JSON object: item=apple, item=pear, item=plum."


def unique_array(name: str, items: dict, **more) -> dict:
    array = {"type": "array", "items": items, "uniqueItems": True, **more}
    return {"type": "object", "properties": {name: array}, "required": [name]}


# name -> (schema, prompt)
CASES = {
    "names_of_strings": ({"type": "object", "additionalProperties": {"type": "string"}}, ITEMS),
    "names_of_anything": ({"type": "object", "additionalProperties": True}, ITEMS),
    "unique_strings": (
        unique_array("fruits", {"type": "string"}),
        "List the word apple three times: apple, apple, apple.",
    ),
    "unique_integers": (unique_array("numbers", {"type": "integer"}), "The numbers are 3, 3, 3 and 3."),
    "unique_enum": (
        unique_array("colors", {"enum": ["red", "green", "blue"]}, minItems=3),
        "Write red, red, red as a list of colors.",
    ),
    "dependent_required": (
        {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "credit_card": {"type": "string"},
                "billing_address": {"type": "string"},
            },
            "dependentRequired": {"credit_card": ["billing_address"]},
        },
        "Alice pays with credit card 4111 1111 1111 1111.",
    ),
}


def basket(**extra) -> dict:
    """An object that declares a property and admits others: strict mode leaves it open."""
    return {"type": "object", "properties": {"basket": {"type": "string"}}, "required": ["basket"], **extra}


BASKET = "basket=blue, item=apple, item=pear, item=plum."
# name -> (schema, prompt): declared properties beside additionalProperties, whose names the check
# did not follow in strict mode (issue #42 item 3), at the top, in array items and behind a $ref
CASES.update(
    {
        "declared_and_additional": (basket(additionalProperties={"type": "string"}), "Make a JSON object: " + BASKET),
        "declared_and_additional_in_items": (
            {
                "type": "object",
                "required": ["orders"],
                "properties": {"orders": {"type": "array", "items": basket(additionalProperties={"type": "string"})}},
            },
            "Make a JSON object with orders: " + BASKET,
        ),
        "declared_and_additional_behind_a_ref": (
            {
                "$defs": {"b": basket(additionalProperties={"type": "string"})},
                "type": "object",
                "properties": {"order": {"$ref": "#/$defs/b"}},
                "required": ["order"],
            },
            "Make a JSON object: order with " + BASKET,
        ),
    }
)


def repeated_names(text: str) -> list[str]:
    found: list[str] = []

    def hook(pairs):
        names = [k for k, _ in pairs]
        found.extend(n for i, n in enumerate(names) if n in names[:i])
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook)
    return found


def repeated_items(value) -> bool:
    """Does any array in `value` hold two equal items?"""
    if isinstance(value, dict):
        return any(repeated_items(v) for v in value.values())
    if isinstance(value, list):
        seen = {json.dumps(v, sort_keys=True) for v in value}
        return len(seen) < len(value) or any(repeated_items(v) for v in value)
    return False


@pytest.fixture(scope="module")
def runs(real_engine, service, tokenizer):
    """name -> (output without the value check, output with it), all in one batch."""
    requests = []
    for schema, prompt in CASES.values():
        handle = service.compile(GrammarSpec.json_schema(schema))
        assert handle.value_check is not None
        control = handle.without_value_check()
        ids = chat_ids(tokenizer, prompt, SYSTEM)
        requests += [
            GenerateRequest(
                ids,
                SamplingParams(max_new_tokens=64, temperature=0.0),
                constraint=h,
                jump_forward="verify",
                strict=True,
            )
            for h in (control, handle)
        ]
    results = real_engine.generate_many(requests, timeout=900)
    return {name: (results[2 * i], results[2 * i + 1]) for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_strict_report_accepts_the_case(name):
    assert routed_schema_fidelity(CASES[name][0]).refused_in_strict == ()


@pytest.mark.parametrize("name", list(CASES))
def test_without_the_check_the_model_breaks_the_schema(runs, name):
    control, _ = runs[name]
    value = json.loads(control.text)
    valid = jsonschema.Draft202012Validator(CASES[name][0]).is_valid(value)
    assert repeated_names(control.text) or not valid, control.text


@pytest.mark.parametrize("name", list(CASES))
def test_with_the_check_nothing_repeats_and_the_output_validates(runs, name):
    _, result = runs[name]
    schema = CASES[name][0]
    value = json.loads(result.text)  # complete JSON: strict closing still holds
    assert repeated_names(result.text) == [], result.text
    assert not repeated_items(value), result.text
    jsonschema.Draft202012Validator(schema).validate(value)


def test_tool_call_arguments_repeat_a_name_only_without_the_check(real_engine, service, tokenizer):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add_items",
                "description": "Add items to a basket",
                "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        }
    ]
    handle = service.compile(GrammarSpec.tool_calls(tools, "required"))
    # a prompt that leads the unchecked model to repeat a name under fp32 and q4 weights alike
    ids = chat_ids(
        tokenizer,
        "Call add_items with fruit=apple, fruit=pear, fruit=plum.",
        HERMES_TOOL_CALL_FORMAT.render_tools_prompt(tools),
    )
    control, checked = real_engine.generate_many(
        [
            GenerateRequest(
                ids,
                SamplingParams(max_new_tokens=64, temperature=0.0),
                constraint=h,
                jump_forward="verify",
                strict=True,
            )
            for h in (handle.without_value_check(), handle)
        ],
        timeout=900,
    )

    def calls(text: str) -> list[str]:
        """Each call's arguments as the gateway reads them (a string in them may hold the end
        marker: greedy q4 writes a name `...'}}</tool_call>You can use...`)."""
        return [call.arguments for call in parse_tool_calls(text, HERMES_TOOL_CALL_FORMAT)[1]]

    assert any(repeated_names(call) for call in calls(control.text)), control.text
    assert calls(checked.text) and not any(repeated_names(call) for call in calls(checked.text)), checked.text


def object_array(name: str, properties: dict) -> dict:
    items = {"type": "object", "required": list(properties), "properties": properties}
    return {
        "type": "object",
        "required": [name],
        "properties": {name: {"type": "array", "items": items, "uniqueItems": True, "minItems": 2, "maxItems": 3}},
    }


# name -> (schema, prompt): object items the unchecked model repeats (greedy, the default weights)
OBJECT_CASES = {
    "string_and_boolean": (
        object_array("fruits", {"fruit": {"type": "string"}, "ripe": {"type": "boolean"}}),
        "I bought a ripe apple, a ripe apple and a ripe apple.",
    ),
    "string_and_integer": (
        object_array("people", {"name": {"type": "string"}, "age": {"type": "integer"}}),
        "Bob is 30. Bob is 30. Bob is 30. List the people.",
    ),
}


@pytest.fixture(scope="module")
def object_runs(real_engine, service, tokenizer):
    """name -> (output without the value check, output with it), all in one batch, with room for
    the model's own end (maxItems closes the array)."""
    requests = []
    for schema, prompt in OBJECT_CASES.values():
        handle = service.compile(GrammarSpec.json_schema(schema))
        ids = chat_ids(tokenizer, prompt, SYSTEM)
        requests += [
            GenerateRequest(
                ids,
                SamplingParams(max_new_tokens=120, temperature=0.0),
                constraint=h,
                jump_forward="verify",
                strict=True,
            )
            for h in (handle.without_value_check(), handle)
        ]
    results = real_engine.generate_many(requests, timeout=900)
    return {name: (results[2 * i], results[2 * i + 1]) for i, name in enumerate(OBJECT_CASES)}


@pytest.mark.parametrize("name", list(OBJECT_CASES))
def test_unique_object_items_are_answered_unique_in_strict_mode(object_runs, name):
    schema = OBJECT_CASES[name][0]
    assert routed_schema_fidelity(schema).refused_in_strict == ()  # was a 400: uniqueItems over objects
    control, result = object_runs[name]
    assert repeated_items(json.loads(control.text)), control.text  # the model does repeat an object
    value = json.loads(result.text)
    assert not repeated_items(value), result.text
    jsonschema.Draft202012Validator(schema).validate(value)
    assert result.finish_reason == "stop", (result.finish_reason, result.text)


def test_unique_object_items_close_validly_at_every_budget_from_the_smallest(real_engine, service, tokenizer):
    """Budget closing writes distinct items too (its plans are repaired around repeats), and the
    smallest budget strict mode accepts counts them (intake refuses less)."""
    requests, schemas = [], []
    for schema, prompt in OBJECT_CASES.values():
        handle = service.compile(GrammarSpec.json_schema(schema))
        least = handle.min_completion_tokens()
        ids = chat_ids(tokenizer, prompt, SYSTEM)
        for budget in range(least, least + 6):
            requests.append(
                GenerateRequest(
                    ids,
                    SamplingParams(max_new_tokens=budget, temperature=0.0),
                    constraint=handle,
                    jump_forward="verify",
                    strict=True,
                )
            )
            schemas.append(schema)
    for schema, result in zip(schemas, real_engine.generate_many(requests, timeout=900)):
        value = json.loads(result.text)
        assert not repeated_items(value), result.text
        jsonschema.Draft202012Validator(schema).validate(value)
