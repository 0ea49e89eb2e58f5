"""Every registered constraint kind round-trips: validate -> canonical key -> compile -> matcher;
a bad payload of each kind is refused at its own request parameter; an unknown kind is refused."""

from __future__ import annotations

import copy

import pytest

from gateway.pipeline import grammar_adapter
from grammar import KINDS, GrammarService, GrammarSpec, GrammarSpecError, kind_for, validate_spec

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# kind -> (payload, text the grammar accepts whole, text it refuses, a payload the kind refuses)
EXAMPLES = {
    "json_schema": (
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        '{"name":"Ada"}',
        '{"name": "Ada"}',
        {"type": "strng"},
    ),
    "json_object": (None, '{"a":1}', "[1]", {"type": "object"}),
    "regex": ("[a-c]+x", "abcx", "abd", "(unclosed"),
    "ebnf": ('root ::= "yes" | "no"', "yes", "maybe", "   "),
    "choice": (["yes", "no", "not sure"], "not sure", "maybe", []),
    "structural_tag": (
        {
            "format": {
                "type": "sequence",
                "elements": [
                    {"type": "const_string", "value": "Answer: "},
                    {
                        "type": "json_schema",
                        "json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                    },
                ],
            }
        },
        'Answer: {"n": 3}',
        "Answer: 3",
        {"format": {"type": "no_such_format"}},
    ),
    "tool_calls": (
        {"tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
        "Hello",
        {"tools": [WEATHER_TOOL], "tool_choice": "sometimes"},
    ),
}


@pytest.fixture(scope="module")
def service(tokenizer, smollm_dir):
    """A grammar service whose compile limit leaves room for a loaded machine (no timing here)."""
    from runtime.model.loader import read_config

    svc = GrammarService(tokenizer, read_config(smollm_dir).vocab_size, compile_timeout_s=120)
    yield svc
    svc.close()


def test_every_registered_kind_has_an_example():
    assert set(EXAMPLES) == set(KINDS)  # a new kind must be added to EXAMPLES too


def matcher_accepts(matcher, tokenizer, text: str) -> bool:
    return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_kind_round_trips_from_spec_to_matcher(name, service, tokenizer):
    payload, good, bad, _ = EXAMPLES[name]
    spec = GrammarSpec.of(name, payload)
    assert spec.kind == name and spec.param == kind_for(name).param
    validate_spec(spec)
    # the key depends on the meaning only: an equal payload (another object) gives the same key
    twin = GrammarSpec.of(name, copy.deepcopy(payload))
    assert twin.key("fp") == spec.key("fp") != spec.key("other tokenizer")

    handle = service.compile(spec)
    assert handle.kind == name and service.compile(twin) is handle
    matcher = handle.new_matcher()
    assert matcher_accepts(matcher, tokenizer, good) and matcher.is_completed()
    assert not matcher_accepts(handle.new_matcher(), tokenizer, bad)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_bad_payload_is_refused_at_the_kinds_own_parameter(name):
    *_, refused = EXAMPLES[name]
    with pytest.raises(GrammarSpecError) as e:
        validate_spec(GrammarSpec(name, refused))  # type: ignore[arg-type]
    expected_param = "tool_choice" if name == "tool_calls" else kind_for(name).param
    assert e.value.param == expected_param
    assert grammar_adapter.error_code(name) == kind_for(name).error_code


def test_a_refused_json_schema_names_the_bad_part():
    with pytest.raises(GrammarSpecError) as e:
        validate_spec(GrammarSpec.of("json_schema", {"properties": {"age": {"minimum": "ten"}}}))
    assert e.value.pointer == "/properties/age/minimum" and e.value.param == "response_format"


def test_strict_changes_the_key_only_where_the_kind_uses_it():
    schema = EXAMPLES["json_schema"][0]
    assert GrammarSpec.of("json_schema", schema, False).key("fp") != GrammarSpec.of("json_schema", schema).key("fp")
    assert GrammarSpec.of("regex", "a+", False).key("fp") == GrammarSpec.of("regex", "a+").key("fp")


def test_every_kind_runs_under_the_strict_completion_guard():
    # issue #16: json_object, regex and EBNF outputs are closed within the budget too
    assert {n for n, k in KINDS.items() if k.strict_closing} == set(KINDS)
    assert grammar_adapter.strict_closing("json_schema") and grammar_adapter.strict_closing("regex")
    assert not grammar_adapter.strict_closing("no_such_kind")


def test_prompt_instructions_come_from_the_kind():
    schema = {"type": "object", "required": ["b"], "properties": {"b": {"type": "integer"}}}
    text = grammar_adapter.prompt_instructions("json_schema", schema)
    assert text == (
        "Respond with only a JSON value that conforms to this JSON schema:\n"
        '{"properties":{"b":{"type":"integer"}},"required":["b"],"type":"object"}'
    )
    assert grammar_adapter.prompt_instructions("json_object", None) == "Respond with only a JSON object."
    assert grammar_adapter.prompt_instructions("regex", "a+") is None
    assert grammar_adapter.prompt_instructions("tools", [WEATHER_TOOL]) is None  # a registry kind, not a grammar


@pytest.mark.parametrize(
    "build",
    [
        lambda: kind_for("yaml"),
        lambda: GrammarSpec.of("yaml", "a: 1"),
        lambda: GrammarSpec("yaml", "a: 1").key("fp"),  # type: ignore[arg-type]
        lambda: grammar_adapter.make_spec("yaml", "a: 1"),
    ],
)
def test_an_unknown_kind_is_refused_clearly(build):
    with pytest.raises(
        GrammarSpecError,
        match=r"unknown grammar kind 'yaml'; expected one of json_schema, "
        r"json_object, regex, ebnf, choice, structural_tag, tool_calls",
    ):
        build()


def test_an_unknown_kind_never_reaches_the_compiler(service):
    with pytest.raises(GrammarSpecError, match="unknown grammar kind"):
        service.compile(GrammarSpec("yaml", "a: 1"))  # type: ignore[arg-type]
