"""Schema fidelity over HTTP in strict mode (scripted fake engine, real grammar service): every keyword
the mask does not enforce is refused with a 400 naming it and its pointer, or taken by check-and-roll-back."""

from __future__ import annotations

import pytest

from grammar.validation.fidelity import LLGUIDANCE, NEVER_MASKED, routed_schema_fidelity
from tests.gateway.chat.test_gateway_routes import chat
from tests.gateway.pipeline.fidelity_gateway_helpers import UNIQUE, json_schema
from tests.grammar.validation.fidelity_cases import NOT_MASKED_CASES

RF_PARAM = "response_format.json_schema.schema"
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
