"""Check-and-roll-back with the real SmolLM2 (greedy, strict): keywords no token mask enforces
(a general `if`/`then`, `dependentSchemas`, a number's `not`, a decimal `multipleOf`, `contains`) kept by checking the
finished output and rewriting the value that breaks them (grammar/checks/rollback.py).

Each case runs twice: without the check (the control: the model really does break the schema on
this prompt, so the test can fail) and with it (the output validates with jsonschema and ends
`stop`, and the engine counted the rewrites). A case the model cannot fix within the rewrites fails
with `value_retries_exhausted`, holds no KV slot afterwards, and over HTTP is a 422. Through the
real server and the official client: the strict answer, whole and streamed (withheld until whole),
/v1/schemas/check's verdict and /metrics' counters.
"""

from __future__ import annotations

import dataclasses
import json

import httpx
import jsonschema
import openai
import pytest

from bench.harness.server_process import MODEL, parse_metrics
from grammar import GrammarSpec
from grammar.validation.fidelity import ROLLBACK, routed_schema_fidelity
from runtime.api import VALUE_RETRIES_EXHAUSTED, EngineError, GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids, openai_client

pytestmark = pytest.mark.e2e

SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
ADULT_NEEDS_LICENSE = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "license": {"type": "string"}},
    "if": {"properties": {"age": {"minimum": 18}}, "required": ["age"]},
    "then": {"required": ["license"]},
}
# name -> (schema, prompt)
CASES = {
    "if_then_on_a_number": (ADULT_NEEDS_LICENSE, "Bob is 30 years old."),
    "dependent_schemas": (
        {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "credit_card": {"type": "string"},
                "billing_address": {"type": "string"},
            },
            "dependentSchemas": {"credit_card": {"required": ["billing_address"]}},
        },
        "Alice pays with credit card 4111 1111 1111 1111.",
    ),
    "not_on_a_number": (
        {
            "type": "object",
            "required": ["name", "age"],
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "not": {"const": 30}}},
        },
        "Bob is 30 years old.",
    ),
    # the whole output is the failing value, so its rewrite reaches back into the cached prompt's KV;
    # jsonschema divides in floating point, and finds 19.99 no multiple of 0.01 (grammar/validation/fidelity.py)
    "cents_at_the_root": ({"type": "number", "multipleOf": 0.01}, "The price is 19.99 dollars. What is the price?"),
}
# the model keeps writing three small scores: no rewrite finds one of at least 10
NEVER_FIXED = (
    {
        "type": "object",
        "required": ["scores"],
        "properties": {"scores": {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}}},
    },
    "The scores are 1, 2 and 3.",
)


def validate(schema, text: str) -> None:
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(json.loads(text))


def request(handle, tokenizer, prompt: str, jump_forward: str = "verify") -> GenerateRequest:
    return GenerateRequest(
        chat_ids(tokenizer, prompt, SYSTEM),
        SamplingParams(max_new_tokens=96, temperature=0.0),
        constraint=handle,
        jump_forward=jump_forward,
        strict=True,
        refuse_unfit=True,
    )


@pytest.fixture(scope="module")
def runs(real_engine, service, tokenizer):
    """name -> (output without the check, output with it), all in one batch; and the rewrites counted."""
    before = real_engine.stats().value_rewrites
    requests = []
    for schema, prompt in CASES.values():
        handle = service.compile(GrammarSpec.json_schema(schema))
        assert handle.rollback_rules is not None
        control = dataclasses.replace(handle, rollback_rules=None, _memo={})
        requests += [request(h, tokenizer, prompt) for h in (control, handle)]
    results = real_engine.generate_many(requests, timeout=900)
    return (
        {name: (results[2 * i], results[2 * i + 1]) for i, name in enumerate(CASES)},
        real_engine.stats().value_rewrites - before,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_strict_mode_takes_the_keyword_only_with_the_check(service, name):
    schema = CASES[name][0]
    assert routed_schema_fidelity(schema).refused_in_strict  # the mask alone does not enforce it
    report = service.compile(GrammarSpec.json_schema(schema)).fidelity
    assert report.refused_in_strict == ()
    assert any(k.engine == ROLLBACK for k in report.keywords)


@pytest.mark.parametrize("name", list(CASES))
def test_without_the_check_the_model_breaks_the_schema(runs, name):
    control, _ = runs[0][name]
    with pytest.raises(jsonschema.ValidationError):
        validate(CASES[name][0], control.text)


@pytest.mark.parametrize("name", list(CASES))
def test_with_the_check_the_output_validates(runs, name):
    _, result = runs[0][name]
    assert result.finish_reason == "stop", result
    validate(CASES[name][0], result.text)


def test_the_engine_counts_the_rewrites_and_keeps_no_slot(runs, engine_idle_check):
    assert runs[1] >= len(CASES)


@pytest.mark.parametrize("jump_forward", ["direct", "off"])
def test_every_jump_forward_mode_rewrites_alike(runs, engine_idle_check, service, tokenizer, jump_forward):
    """Direct jump-forward writes forced tokens unverified, `off` writes none: a rewrite is the same."""
    _, verified = runs[0]["if_then_on_a_number"]
    schema, prompt = CASES["if_then_on_a_number"]
    handle = service.compile(GrammarSpec.json_schema(schema))
    result = engine_idle_check.generate_many([request(handle, tokenizer, prompt, jump_forward)], timeout=600)[0]
    assert result.finish_reason == "stop"
    validate(schema, result.text)
    if jump_forward == "off":
        assert result.text == verified.text  # verification makes jump-forward exact


def test_a_value_never_fixed_fails_the_request_and_frees_its_slots(engine_idle_check, service, tokenizer):
    schema, prompt = NEVER_FIXED
    handle = service.compile(GrammarSpec.json_schema(schema))
    before = engine_idle_check.stats().value_rewrites_exhausted
    with pytest.raises(EngineError, match=VALUE_RETRIES_EXHAUSTED):
        engine_idle_check.generate_many([request(handle, tokenizer, prompt)], timeout=600)
    assert engine_idle_check.stats().value_rewrites_exhausted == before + 1
    # best effort: the last output goes out, for validation after generation to flag
    lenient = dataclasses.replace(request(handle, tokenizer, prompt), refuse_unfit=False)
    result = engine_idle_check.generate_many([lenient], timeout=600)[0]
    assert result.finish_reason in ("stop", "length")  # not an error
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        validate(schema, result.text)


# -- through the real server -------------------------------------------------------------------


def ask(schema, prompt: str, **more) -> dict:
    return {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 96,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        **more,
    }


def rewrite_counters(server) -> dict[str, float]:
    metrics = parse_metrics(httpx.get(f"{server.url}/metrics").text)
    return {
        "rewrites": metrics["jumpgate_value_rewrites_total"],
        "tokens": metrics["jumpgate_value_rewritten_tokens_total"],
        "exhausted": metrics["jumpgate_value_rewrites_exhausted_total"],
    }


def test_the_server_answers_whole_and_streamed(jumpgate_server):
    client = openai_client(jumpgate_server)
    schema, prompt = CASES["if_then_on_a_number"]
    whole = client.chat.completions.create(**ask(schema, prompt))
    assert whole.choices[0].finish_reason == "stop"
    validate(schema, whole.choices[0].message.content)

    chunks = list(client.chat.completions.create(**ask(schema, prompt), stream=True))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == whole.choices[0].message.content
    assert len(texts) == 1  # withheld until whole: nothing sent could be taken back


def test_the_schema_check_says_strict_takes_it_by_rollback(jumpgate_server):
    response = httpx.post(
        f"{jumpgate_server.url}/v1/schemas/check",
        timeout=120,
        json={"kind": "json_schema", "schema": ADULT_NEEDS_LICENSE},
    )
    assert response.status_code == 200, response.text
    check = response.json()
    assert check["strict_accepted"] is True
    engines = {k["keyword"]: k.get("engine") for k in check["fidelity"]["keywords"]}
    assert engines["if"] == engines["then"] == ROLLBACK


def test_a_value_never_fixed_is_a_422_and_the_server_goes_on(jumpgate_server):
    client = openai_client(jumpgate_server)
    before = rewrite_counters(jumpgate_server)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(**ask(*NEVER_FIXED))
    assert caught.value.code == VALUE_RETRIES_EXHAUSTED
    assert "max_tokens" in caught.value.message
    after = rewrite_counters(jumpgate_server)
    assert after["exhausted"] == before["exhausted"] + 1
    assert after["rewrites"] >= before["rewrites"] + 4 and after["tokens"] > before["tokens"]
    schema, prompt = CASES["dependent_schemas"]
    validate(schema, client.chat.completions.create(**ask(schema, prompt)).choices[0].message.content)


# -- tool calls: each call's arguments checked against its function's parameters ----------------

# name -> (function, prompt): a tool whose parameters hold a keyword only the check keeps
TOOL_CASES = {
    # a pydantic `set[Guest]` field: unique items that are objects
    "unique_objects": (
        {
            "name": "invite",
            "description": "",
            "parameters": {
                "type": "object",
                "required": ["people"],
                "properties": {
                    "people": {
                        "type": "array",
                        "uniqueItems": True,
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}, "role": {"type": "string"}},
                        },
                    }
                },
            },
        },
        "Invite Ann and Ann as guests.",
    ),
    "if_then": (
        {
            "name": "get_weather",
            "description": "",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {"city": {"type": "string"}, "units": {"type": "string"}},
                "if": {"required": ["city"]},
                "then": {"required": ["units"]},
            },
        },
        "What is the weather in Paris?",
    ),
}


def tool_request(handle, tokenizer, name: str) -> GenerateRequest:
    from grammar.kinds.tool_calls.format import render_tools_prompt

    function, prompt = TOOL_CASES[name]
    tools_prompt = render_tools_prompt([{"type": "function", "function": function}])
    return GenerateRequest(
        chat_ids(tokenizer, prompt, tools_prompt),
        SamplingParams(max_new_tokens=128, temperature=0.0),
        constraint=handle,
        strict=True,
        refuse_unfit=True,
    )


def arguments_of(text: str, name: str) -> str:
    from grammar.kinds.tool_calls.parser import parse_tool_calls

    _, calls = parse_tool_calls(text)
    assert len(calls) == 1 and calls[0].name == TOOL_CASES[name][0]["name"], text
    return calls[0].arguments


@pytest.mark.parametrize("name", list(TOOL_CASES))
def test_a_tool_calls_arguments_are_checked_and_rewritten(real_engine, service, tokenizer, engine_idle_check, name):
    """The tools report keeps the keyword by check-and-roll-back (strict mode takes it); without the
    check the model's call breaks it, with it the call's arguments validate."""
    function = TOOL_CASES[name][0]
    spec = GrammarSpec.tool_calls([{"type": "function", "function": function}], "required", parallel_tool_calls=False)
    handle = service.compile(spec)
    assert handle.rollback_rules is not None and handle.fidelity.refused_in_strict == ()
    assert any(k.engine == ROLLBACK for k in handle.fidelity.keywords)
    control = dataclasses.replace(handle, rollback_rules=None, _memo={})
    without, checked = real_engine.generate_many(
        [tool_request(h, tokenizer, name) for h in (control, handle)], timeout=900
    )
    with pytest.raises(jsonschema.ValidationError):
        validate(function["parameters"], arguments_of(without.text, name))
    assert checked.finish_reason == "stop", checked
    validate(function["parameters"], arguments_of(checked.text, name))


def test_the_server_answers_a_checked_tool_call_whole_and_streamed(jumpgate_server):
    client = openai_client(jumpgate_server)
    function, prompt = TOOL_CASES["unique_objects"]
    ask_tool = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 128,
        "tool_choice": "required",
        "tools": [{"type": "function", "function": function}],
        "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": prompt}],
    }
    whole = client.chat.completions.create(**ask_tool)
    assert whole.choices[0].finish_reason == "tool_calls"
    call = whole.choices[0].message.tool_calls[0]
    validate(function["parameters"], call.function.arguments)
    chunks = list(client.chat.completions.create(**ask_tool, stream=True))
    streamed = "".join(
        tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []
    )
    assert streamed == call.function.arguments


def test_a_tool_call_never_fixed_fails_the_request_and_frees_its_slots(engine_idle_check, service, tokenizer):
    """The bad input of this path: a strict tool whose checked keyword the model cannot satisfy
    within the rewrites fails `value_retries_exhausted` (a 422 over HTTP) and keeps no KV slot."""
    from grammar.kinds.tool_calls.format import render_tools_prompt

    schema, prompt = NEVER_FIXED
    tool = {"type": "function", "function": {"name": "record_scores", "description": "", "parameters": schema}}
    handle = service.compile(GrammarSpec.tool_calls([tool], "required", parallel_tool_calls=False))
    assert handle.rollback_rules is not None
    before = engine_idle_check.stats().value_rewrites_exhausted
    request = GenerateRequest(
        chat_ids(tokenizer, prompt, render_tools_prompt([tool])),
        SamplingParams(max_new_tokens=128, temperature=0.0),
        constraint=handle,
        strict=True,
        refuse_unfit=True,
    )
    with pytest.raises(EngineError, match=VALUE_RETRIES_EXHAUSTED):
        engine_idle_check.generate_many([request], timeout=600)
    assert engine_idle_check.stats().value_rewrites_exhausted == before + 1


# SchemaStore's bitbucket-pipelines `image` (its definitions, trimmed): the grammar writes an
# object's names in declared order, so after `username` the object must close; reopening it there
# only wrote the same text again (a wasted rewrite each answer)
IMAGE_BASE = {"type": "object", "properties": {"name": {"type": "string"}, "run-as-user": {"type": "integer"}}}
IMAGE = {
    "type": "object",
    "required": ["image"],
    "additionalProperties": False,
    "properties": {
        "image": {
            "oneOf": [
                {"allOf": [IMAGE_BASE, {"properties": {"password": {"not": {}}, "username": {"not": {}}}}]},
                {
                    "allOf": [
                        IMAGE_BASE,
                        {
                            "properties": {"password": {"type": "string"}, "username": {"type": "string"}},
                            "required": ["username", "password"],
                        },
                    ]
                },
                {"type": "string"},
            ]
        }
    },
}


@pytest.mark.parametrize(
    "text,rewritten",
    [
        ('{"image":{"name":"a","username":"b"}}', '{"name":"a","username":"b"}}'),  # must close: whole
        ('{"image":{"name":"a","password":"p"}}', "}}"),  # `,"username"` may follow: reopened
    ],
)
def test_a_failing_container_is_reopened_only_where_the_grammar_lets_it_go_on(service, tokenizer, text, rewritten):
    matcher = service.compile(GrammarSpec("json_schema", IMAGE, True)).new_matcher()
    written = tokenizer.encode(text, add_special_tokens=False)
    assert all(matcher.accept(t) for t in written) and matcher.accept(tokenizer.eos_token_id)
    back = matcher.output_verdict()
    assert back is not None and back > 0
    assert tokenizer.decode(written[len(written) + 1 - back :]) == rewritten
