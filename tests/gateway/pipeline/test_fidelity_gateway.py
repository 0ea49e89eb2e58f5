"""Schema fidelity over HTTP (scripted fake engine, real grammar service): strict mode refuses every
keyword the mask does not enforce with a 400 naming it and its pointer; best effort generates and
says on each choice (and in a header) whether the value validated; strict-mode failures are counted
and logged; the registry and POST /v1/schemas/check return the fidelity report."""

from __future__ import annotations

import json
import logging

import pytest

from grammar.validation.fidelity import LLGUIDANCE, NEVER_MASKED, routed_schema_fidelity
from tests.gateway.chat.test_gateway_routes import CALL_TEXT, MODEL, WEATHER_TOOL, chat, sse_events
from tests.grammar.validation.fidelity_cases import NOT_MASKED_CASES

RF_PARAM = "response_format.json_schema.schema"
# bounded items: a repeated item may have no way to grow into a new one, so the value check does
# not claim uniqueItems here (grammar/checks/value_rules.py) and strict mode refuses it
UNIQUE = {
    "type": "object",
    "properties": {"ids": {"type": "array", "items": {"type": "integer", "maximum": 100}, "uniqueItems": True}},
    "required": ["ids"],
}
CLOSED = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
    "additionalProperties": False,
}
OPEN_MAP = {"type": "object", "additionalProperties": {"type": "integer"}}


# every case whose keyword is not masked under strict mode too (unevaluatedProperties is, in strict
# mode; dependentRequired is kept by the value check once strict mode closes the object), by the
# engine that compiles it (llguidance takes over some: tests/grammar/validation/test_llguidance_fidelity.py)
STRICT_CASES = [
    c
    for c in NOT_MASKED_CASES
    if c[5][:2] in {(k.pointer, k.keyword) for k in routed_schema_fidelity(c[1], strict=True).refused_in_strict}
]
LLGUIDANCE_CASES = {c[0] for c in NOT_MASKED_CASES if routed_schema_fidelity(c[1], strict=True).engine == LLGUIDANCE}


def json_schema(schema, **extra):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, **extra}}


def invalid_metric(client, mode: str, reason: str) -> float:
    prefix = f'jumpgate_structured_output_invalid_total{{mode="{mode}",reason="{reason}"}} '
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix) :]) if lines else 0.0


# ------------------------------------------------------------------ strict: refused


def test_every_not_masked_case_is_refused_in_strict_mode_unless_llguidance_enforces_it():
    assert {c[0] for c in NOT_MASKED_CASES} - {c[0] for c in STRICT_CASES} == {
        "unevaluatedProperties_not_strict",
        "dependentRequired_open_object",
    } | LLGUIDANCE_CASES


@pytest.mark.parametrize("name,schema,strict,valid,violating,expected", STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
def test_strict_refuses_each_keyword_the_mask_does_not_enforce(
    gateway_client, fake_engine, name, schema, strict, valid, violating, expected
):
    pointer, keyword, _ = expected
    resp = chat(gateway_client(), response_format=json_schema(schema, strict=True))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "schema_not_enforceable" and error["param"] == RF_PARAM
    assert error["type"] == "invalid_request_error"
    assert f"'{keyword}' at '{pointer}'" in error["message"]
    assert '"schema_mode": "best_effort"' in error["message"]
    assert fake_engine.submitted == []  # nothing was generated


OBJ_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}
# Refusals the classifier's table (NOT_MASKED_CASES: a violating instance fed to xgrammar) has no
# case for, mostly because llguidance would take the table's form over, or jsonschema cannot show
# the violation: (name, schema, every (pointer, keyword) the 400 must name).
REFUSED_BEYOND_THE_TABLE = [
    # dependentRequired spelled as draft-7 dependencies, but the dependent comes first: once "a" is
    # written the grammar cannot go back for "b" (the spelling in order is enforced: test_name_dependencies.py)
    (
        "dependencies_names_dependent_first",
        {
            "type": "object",
            "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
            "dependencies": {"a": ["b"]},
        },
        [("/dependencies", "dependencies")],
    ),
    (
        "dependencies_schema",
        {"type": "object", "properties": OBJ_AB, "dependencies": {"a": {"required": ["b"]}}},
        [("/dependencies", "dependencies")],
    ),
    (
        "unevaluatedItems_schema",
        {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}},
        [("/unevaluatedItems", "unevaluatedItems")],
    ),
    ("minLength_beside_format", {"type": "string", "format": "email", "minLength": 8}, [("/minLength", "minLength")]),
    # two listed values cannot fill three unique items: no valid instance, refused rather than cut or repeated
    (
        "uniqueItems_exhausted_by_minItems",
        {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 3, "uniqueItems": True},
        [("/uniqueItems", "uniqueItems")],
    ),
    (
        "format_unenforced",
        {"type": "object", "properties": {"tel": {"type": "string", "format": "phone"}}},
        [("/properties/tel/format", "format")],
    ),
    # llguidance does not implement `not`, so nobody takes the allOf over
    ("allOf_with_not", {"allOf": [{"type": "integer"}, {"not": {"const": 1}}]}, [("/allOf", "allOf")]),
    # llguidance refuses a multipleOf with too many digits (here 1/3)
    ("multipleOf_of_a_third", {"type": "number", "multipleOf": 1 / 3}, [("/multipleOf", "multipleOf")]),
    (
        "siblings_of_an_overlapping_oneOf",
        {"type": "integer", "minimum": 0, "oneOf": [{"type": "integer"}, {"type": "number"}]},
        [("/oneOf", "oneOf"), ("/type", "type"), ("/minimum", "minimum")],
    ),
    # `if` tests a property that is not listed values: no discriminator, so not lowered to anyOf
    (
        "if_then_else_without_discriminator",
        {
            "type": "object",
            "properties": OBJ_AB,
            "if": {"required": ["a"]},
            "then": {"required": ["b"]},
            "else": {"required": ["a"]},
        },
        [("/if", "if"), ("/then", "then"), ("/else", "else")],
    ),
    # two patterns a name could match both of: llguidance refuses them, so nobody enforces them
    (
        "patternProperties_overlapping",
        {"type": "object", "patternProperties": {"^I_": {"type": "integer"}, "_X$": {"type": "integer"}}},
        [("/patternProperties", "patternProperties")],
    ),
    # a discriminator, but its branch holds a keyword llguidance does not implement
    (
        "if_on_a_discriminator_with_contains",
        {
            "type": "object",
            "required": ["k"],
            "properties": {"k": {"enum": ["x", "y"]}, "v": {"type": "array", "items": {"type": "integer"}}},
            "if": {"properties": {"k": {"const": "x"}}},
            "then": {"properties": {"v": {"items": {"type": "integer"}, "contains": {"const": 1}}}},
        },
        [("/if", "if"), ("/then", "then"), ("/then/properties/v/contains", "contains")],
    ),
    # a pattern opening with a lookahead, but under an anyOf, which grammar/rewrites/string_algebra.py's Lark form
    # does not cover (it is enforced on the way through closed objects and arrays only)
    (
        "lookahead_pattern_under_anyOf",
        {
            "type": "object",
            "required": ["h"],
            "properties": {"h": {"anyOf": [{"type": "string", "pattern": "^(?!@@)[\\w@]+$"}, {"type": "null"}]}},
        },
        [("/properties/h/anyOf/0/pattern", "pattern")],
    ),
]
# Keywords strict mode can refuse for reasons of their own (any keyword can also be refused as a
# sibling of a combinator or of enum/const): each has a 400 test above or below.
REFUSABLE = set(NEVER_MASKED) | {
    "required",
    "unevaluatedItems",
    "allOf",
    "oneOf",
    "multipleOf",
    "minLength",
    "maxLength",
    "format",
    "type",
    "pattern",
}


@pytest.mark.parametrize("name,schema,expected", REFUSED_BEYOND_THE_TABLE, ids=[c[0] for c in REFUSED_BEYOND_THE_TABLE])
def test_strict_refuses_the_keywords_the_table_does_not_reach(gateway_client, fake_engine, name, schema, expected):
    assert {(k.pointer, k.keyword) for k in routed_schema_fidelity(schema, strict=True).refused_in_strict} == set(
        expected
    )
    resp = chat(gateway_client(), response_format=json_schema(schema, strict=True))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "schema_not_enforceable" and error["param"] == RF_PARAM
    for pointer, keyword in expected:
        assert f"'{keyword}' at '{pointer}'" in error["message"], (keyword, pointer)
    assert '"schema_mode": "best_effort"' in error["message"]
    assert fake_engine.submitted == []


def test_every_keyword_strict_mode_can_refuse_has_a_400_test():
    shown = {c[5][1] for c in STRICT_CASES} | {k for c in REFUSED_BEYOND_THE_TABLE for _, k in c[2]}
    assert REFUSABLE <= shown, REFUSABLE - shown


@pytest.mark.parametrize(
    "schema,reply",
    [
        (
            {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                "required": ["tags"],
            },
            '{"tags":["a","b"]}',
        ),
        (
            {
                "type": "object",
                "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
                "required": ["ids"],
            },
            '{"ids":[1,2]}',
        ),
        (OPEN_MAP, '{"a":1,"b":2}'),
        (
            {
                "type": "object",
                "required": ["xs"],
                "properties": {
                    "xs": {
                        "type": "array",
                        "uniqueItems": True,
                        "items": {
                            "type": "object",
                            "properties": {"a": {"type": "integer"}, "on": {"type": "boolean"}},
                        },
                    }
                },
            },
            '{"xs":[{"a":1},{"a":1,"on":true}]}',
        ),
        (
            {
                "type": "object",
                "properties": {"card": {"type": "string"}, "address": {"type": "string"}},
                "dependentRequired": {"card": ["address"]},
            },
            '{"card":"1","address":"x"}',
        ),
    ],
)
def test_strict_accepts_what_the_value_check_enforces(gateway_client, fake_engine, schema, reply):
    fake_engine.reply = lambda req: reply
    resp = chat(gateway_client(), response_format=json_schema(schema, strict=True))
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["jumpgate"]["schema_valid"] is True


def test_strict_refusal_names_every_keyword_and_unenforced_formats(gateway_client):
    schema = {
        "type": "object",
        "properties": {
            "phone": {"type": "string", "format": "phone"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True},
        },
    }
    error = chat(gateway_client(), response_format=json_schema(schema)).json()["error"]
    assert "'format' at '/properties/phone/format'" in error["message"]
    assert "'uniqueItems' at '/properties/tags/uniqueItems'" in error["message"]


def test_strict_tools_refuse_with_the_tool_pointer_and_non_strict_tools_pass(gateway_client, fake_engine):
    tool = {"type": "function", "function": {"name": "f", "parameters": UNIQUE}}
    client = gateway_client()
    error = chat(client, tools=[tool]).json()["error"]
    assert error["code"] == "schema_not_enforceable" and error["param"] == "tools"
    assert "'uniqueItems' at '/0/function/parameters/properties/ids/uniqueItems'" in error["message"]
    loose = {"type": "function", "function": {**tool["function"], "strict": False}}
    fake_engine.reply = lambda req: '<tool_call>{"name":"f","arguments":{"ids":[1,1]}}</tool_call>'
    resp = chat(client, tools=[loose])
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["jumpgate"]["schema_valid"] is False and choice["jumpgate"]["schema_mode"] == "best_effort"
    assert choice["jumpgate"]["schema_errors"][0]["pointer"] == "/tool_calls/0/function/arguments/ids"
    assert resp.headers["x-jumpgate-schema-valid"] == "false"


# ------------------------------------------------------------------ best effort: generated and reported


def test_best_effort_reports_an_invalid_value(gateway_client, fake_engine):
    fake_engine.reply = lambda req: '{"ids":[3,3]}'
    client = gateway_client()
    resp = chat(client, response_format=json_schema(UNIQUE), schema_mode="best_effort")
    assert resp.status_code == 200, resp.text
    verdict = resp.json()["choices"][0]["jumpgate"]
    assert verdict["schema_valid"] is False and verdict["schema_mode"] == "best_effort"
    assert verdict["schema_errors"] == [
        {
            "pointer": "/ids",
            "message": "[3, 3] has non-unique elements",
            "schema_pointer": "/properties/ids/uniqueItems",
        }
    ]
    assert resp.headers["x-jumpgate-schema-valid"] == "false"
    assert invalid_metric(client, "best_effort", "schema") == 1


def test_best_effort_and_strict_false_report_a_valid_value(gateway_client, fake_engine):
    fake_engine.reply = lambda req: '{"ids":[1,2]}'
    client = gateway_client()
    for extra in ({"schema_mode": "best_effort"}, {}):
        strict = {} if extra else {"strict": False}
        resp = chat(client, response_format=json_schema(UNIQUE, **strict), **extra)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["jumpgate"] == {
            "schema_valid": True,
            "schema_mode": "best_effort",
            "schema_errors": [],
        }
        assert resp.headers["x-jumpgate-schema-valid"] == "true"


def test_each_streamed_choice_carries_its_verdict_on_its_final_chunk(gateway_client, fake_engine):
    replies = iter(['{"ids":[1,2]}', '{"ids":[5,5]}'])
    fake_engine.reply = lambda req: next(replies)
    events = sse_events(
        chat(gateway_client(), response_format=json_schema(UNIQUE), schema_mode="best_effort", n=2, stream=True)
    )
    finals = {c["index"]: c for e in events[:-1] for c in e["choices"] if c["finish_reason"]}
    assert {i: c["jumpgate"]["schema_valid"] for i, c in finals.items()} == {0: True, 1: False}
    early = [c for e in events[:-1] for c in e["choices"] if not c["finish_reason"]]
    assert all("jumpgate" not in c for c in early)  # the verdict comes once, with the final chunk


def test_text_completions_are_validated_too(gateway_client, fake_engine):
    fake_engine.reply = lambda req: '{"ids":[2,2]}'
    client = gateway_client()
    body = {"model": MODEL, "prompt": "ids:", "response_format": json_schema(UNIQUE), "schema_mode": "best_effort"}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["jumpgate"]["schema_valid"] is False
    assert resp.headers["x-jumpgate-schema-valid"] == "false"
    events = sse_events(client.post("/v1/completions", json={**body, "stream": True}))
    finals = [c for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    assert finals[0]["jumpgate"]["schema_valid"] is False
    assert client.post("/v1/completions", json={**body, "schema_mode": None}).status_code == 400


# ------------------------------------------------------------------ strict: validated, failures counted


def test_a_strict_output_that_fails_is_counted_and_logged(gateway_client, fake_engine, caplog):
    fake_engine.reply = lambda req: '{"n":-1}'  # the fake engine ignores the mask: a simulated fidelity bug
    client = gateway_client()
    with caplog.at_level(logging.ERROR, logger="jumpgate.gateway.validation"):
        resp = chat(client, response_format=json_schema(CLOSED))
    verdict = resp.json()["choices"][0]["jumpgate"]
    assert verdict["schema_valid"] is False and verdict["schema_mode"] == "strict"
    assert verdict["schema_errors"][0]["pointer"] == "/n"
    assert invalid_metric(client, "strict", "schema") == 1
    assert any("fidelity bug" in r.getMessage() and "'/n'" in r.getMessage() for r in caplog.records)


def test_strict_valid_output_says_so(gateway_client, fake_engine):
    fake_engine.reply = lambda req: '{"n":4}'
    resp = chat(gateway_client(), response_format=json_schema(CLOSED))
    assert resp.json()["choices"][0]["jumpgate"] == {"schema_valid": True, "schema_mode": "strict", "schema_errors": []}
    assert resp.headers["x-jumpgate-schema-valid"] == "true"


def test_duplicate_keys_are_detected_and_counted(gateway_client, fake_engine):
    fake_engine.reply = lambda req: '{"a":1,"b":{"x":1},"a":2}'
    client = gateway_client()
    resp = chat(client, response_format=json_schema({"type": "object", "additionalProperties": True}))
    assert resp.status_code == 200, resp.text  # an open object is reported, not refused
    verdict = resp.json()["choices"][0]["jumpgate"]
    assert verdict["schema_valid"] is False
    assert verdict["schema_errors"] == [{"pointer": "", "message": "duplicate key 'a'"}]
    assert invalid_metric(client, "strict", "duplicate_key") == 1


def test_a_cut_off_output_is_reported_but_not_a_fidelity_bug(gateway_client, fake_engine, caplog):
    fake_engine.reply, fake_engine.finish_reason = (lambda req: '{"n":12'), "length"
    client = gateway_client()
    with caplog.at_level(logging.ERROR, logger="jumpgate.gateway.validation"):
        verdict = chat(client, response_format=json_schema(CLOSED)).json()["choices"][0]["jumpgate"]
    assert verdict["schema_valid"] is False and "cut off" in verdict["schema_errors"][0]["message"]
    assert invalid_metric(client, "strict", "truncated") == 1
    assert not [r for r in caplog.records if "fidelity bug" in r.getMessage()]


def test_a_value_closed_at_the_budget_ends_stop_and_says_so(gateway_client, fake_engine):
    """Strict closing's answers are whole and valid: `stop` (OpenAI's parse() refuses `length`),
    with `jumpgate.closed_at_budget` on the choice, whole or streamed, content or tool call."""
    fake_engine.reply, fake_engine.closed_at_budget = (lambda req: '{"n":1}'), True
    client = gateway_client()
    choice = chat(client, response_format=json_schema(CLOSED)).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["jumpgate"] == {
        "schema_valid": True,
        "schema_mode": "strict",
        "schema_errors": [],
        "closed_at_budget": True,
    }
    events = sse_events(chat(client, response_format=json_schema(CLOSED), stream=True))
    (final,) = [c for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    assert final["finish_reason"] == "stop" and final["jumpgate"]["closed_at_budget"] is True
    fake_engine.reply = lambda req: '<tool_call>\n{"name": "lookup", "arguments": {"n": 1}}\n</tool_call>'
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": CLOSED}}]
    choice = chat(client, tools=tools, tool_choice="required").json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["jumpgate"]["closed_at_budget"] is True
    fake_engine.closed_at_budget = False  # the model ended it: no flag at all
    assert "closed_at_budget" not in chat(client, response_format=json_schema(CLOSED)).json()["choices"][0]["jumpgate"]


def test_free_text_and_regex_carry_no_verdict(gateway_client, fake_engine):
    client = gateway_client()
    resp = chat(client)
    assert "jumpgate" not in resp.json()["choices"][0] and "x-jumpgate-schema-valid" not in resp.headers
    fake_engine.reply = lambda req: "123"
    assert "jumpgate" not in chat(client, regex="[0-9]{3}").json()["choices"][0]


def test_tool_call_arguments_are_validated(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    resp = chat(gateway_client(), tools=[WEATHER_TOOL], tool_choice="required")
    assert resp.json()["choices"][0]["jumpgate"] == {"schema_valid": True, "schema_mode": "strict", "schema_errors": []}
    fake_engine.reply = lambda req: '<tool_call>{"name":"get_weather","arguments":{"town":"Paris"}}</tool_call>'
    events = sse_events(chat(gateway_client(), tools=[WEATHER_TOOL], stream=True))
    final = [c for e in events[:-1] for c in e["choices"] if c["finish_reason"]][0]
    assert final["jumpgate"]["schema_valid"] is False
    assert final["jumpgate"]["schema_errors"][0]["pointer"] == "/tool_calls/0/function/arguments"


# ------------------------------------------------------------------ registry and check


def test_registry_refuses_strict_and_stores_best_effort_with_its_report(gateway_client, fake_engine):
    client = gateway_client()
    refused = client.post("/v1/schemas", json={"schema": UNIQUE})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "schema_not_enforceable"
    assert "'/properties/ids/uniqueItems'" in refused.json()["error"]["message"]
    assert client.get("/v1/schemas").json()["data"] == []  # nothing stored

    created = client.post("/v1/schemas", json={"schema": UNIQUE, "schema_mode": "best_effort"})
    assert created.status_code == 201, created.text
    entry = created.json()
    assert entry["schema_mode"] == "best_effort"
    assert entry["fidelity"]["guaranteed"] is False
    unique = next(k for k in entry["fidelity"]["keywords"] if k["keyword"] == "uniqueItems")
    assert (unique["pointer"], unique["status"]) == ("/properties/ids/uniqueItems", "checked")
    assert unique["reason"].startswith("uniqueItems is kept by the mask only for free strings")

    fake_engine.reply = lambda req: '{"ids":[1,1]}'
    verdict = chat(client, schema_id=entry["id"]).json()["choices"][0]["jumpgate"]  # the entry's mode applies
    assert verdict["schema_valid"] is False and verdict["schema_mode"] == "best_effort"
    assert chat(client, schema_id=entry["id"], schema_mode="strict").status_code == 400


def test_guaranteed_uploads_report_it(gateway_client):
    client = gateway_client()
    entry = client.post("/v1/schemas", json={"schema": CLOSED}).json()
    assert entry["fidelity"]["guaranteed"] is True and entry["fidelity"]["counts"]["checked"] == 0
    tools = client.post("/v1/schemas", json={"tools": [WEATHER_TOOL]}).json()
    assert tools["fidelity"]["guaranteed"] is True
    assert "fidelity" not in client.post("/v1/schemas", json={"regex": "[0-9]+"}).json()


def test_schema_check_reports_without_storing(gateway_client):
    client = gateway_client()
    resp = client.post("/v1/schemas/check", json={"schema": UNIQUE})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "schema.check" and body["strict_accepted"] is False
    assert "'uniqueItems' at '/properties/ids/uniqueItems'" in body["strict_refusal"]
    # enforced: type, properties, required; ids: type, items; items: type, maximum
    assert body["fidelity"]["counts"] == {"enforced": 7, "checked": 1, "unenforced": 0}
    ok = client.post("/v1/schemas/check", json={"schema": CLOSED}).json()
    assert ok["strict_accepted"] is True and ok["strict_refusal"] is None and ok["fidelity"]["guaranteed"]
    tools = client.post("/v1/schemas/check", json={"tools": [WEATHER_TOOL]}).json()
    assert tools["strict_accepted"] is True
    assert client.get("/v1/schemas").json()["data"] == []


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "schema"),
        ({"schema": CLOSED, "tools": [WEATHER_TOOL]}, "tools"),
        ({"schema": {"type": "nope"}}, "schema"),
    ],
)
def test_schema_check_refuses_bad_bodies(gateway_client, body, param):
    resp = gateway_client().post("/v1/schemas/check", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_schema_mode_must_be_known(gateway_client):
    resp = chat(gateway_client(), response_format=json_schema(CLOSED), schema_mode="lenient")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "schema_mode"


def test_report_is_cached_with_the_compiled_grammar(gateway_client, gateway_grammar, fake_engine):
    fake_engine.reply = lambda req: '{"n":1}'
    chat(gateway_client(), response_format=json_schema(CLOSED))
    handle = fake_engine.submitted[-1].constraint
    assert handle.fidelity is not None and handle.fidelity.guaranteed
    assert json.dumps(handle.fidelity.as_dict())  # plain JSON data


# ------------------------------------------------------------------ strict with check-and-roll-back (the default)


@pytest.fixture(scope="module")
def rollback_grammar(tokenizer):
    """The grammar service as `jumpgate serve` starts it: check-and-roll-back on."""
    from grammar.service.service import GrammarService

    service = GrammarService(tokenizer, len(tokenizer))
    yield service
    service.close()


@pytest.fixture
def rollback_client(fake_engine, rollback_grammar, tmp_path):
    from litestar.testing import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    with TestClient(create_app(fake_engine, rollback_grammar, Settings(registry_dir=str(tmp_path)))) as client:
        yield client


@pytest.mark.parametrize("name,schema,strict,valid,violating,expected", STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
def test_strict_takes_every_checkable_keyword_by_rollback(
    rollback_client, fake_engine, name, schema, strict, valid, violating, expected
):
    """What validation detects (`checked`) strict mode now takes: the finished output is checked and
    a failing value rewritten (tests/grammar/checks/test_rollback_e2e.py runs it); only `unenforced` stays refused."""
    pointer, keyword, status = expected
    fake_engine.reply = lambda req: valid
    resp = chat(rollback_client, response_format=json_schema(schema, strict=True))
    if status == "unenforced":
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "schema_not_enforceable", resp.text
        assert f"'{keyword}' at '{pointer}'" in resp.json()["error"]["message"]
        return
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["jumpgate"]["schema_valid"] is True
    check = rollback_client.post("/v1/schemas/check", json={"schema": schema}).json()
    assert check["strict_accepted"] is True
    entry = next(k for k in check["fidelity"]["keywords"] if (k["pointer"], k["keyword"]) == (pointer, keyword))
    assert entry["status"] == "enforced" and entry["engine"] == "check_and_rollback"


def test_strict_tools_take_what_a_check_detects_and_refuse_what_none_does(rollback_client, fake_engine):
    """Each call's arguments are checked against its function's parameters and a failing value
    rewritten (tests/grammar/checks/test_rollback_e2e.py runs it): strict tools take `uniqueItems`; a format no
    check detects is still a 400 naming the tool's pointer."""
    tool = {"type": "function", "function": {"name": "f", "parameters": UNIQUE}}
    fake_engine.reply = lambda req: '<tool_call>{"name":"f","arguments":{"ids":[1,2]}}</tool_call>'
    resp = chat(rollback_client, tools=[tool])
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["jumpgate"]["schema_valid"] is True
    phone = {
        "type": "function",
        "function": {
            "name": "g",
            "parameters": {
                "type": "object",
                "properties": {"phone": {"type": "string", "format": "phone"}},
                "required": ["phone"],
            },
        },
    }
    error = chat(rollback_client, tools=[tool, phone]).json()["error"]
    assert error["code"] == "schema_not_enforceable" and error["param"] == "tools"
    assert "'format' at '/1/function/parameters/properties/phone/format'" in error["message"]
    assert "uniqueItems" not in error["message"]


def test_strict_still_refuses_a_keyword_no_check_detects(rollback_client):
    schema = {"type": "object", "properties": {"phone": {"type": "string", "format": "phone"}}, "required": ["phone"]}
    error = chat(rollback_client, response_format=json_schema(schema)).json()["error"]
    assert error["code"] == "schema_not_enforceable"
    assert "'format' at '/properties/phone/format'" in error["message"]
