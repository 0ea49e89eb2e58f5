"""End to end: every kind of bad input through the real server gets an OpenAI-shaped error with the
right status, param and code, and leaves the server serving (the session's one server, conftest.py)."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from bench.harness.server_process import MODEL
from tests.conftest import openai_client
from tests.e2e.e2e_server_helpers import CORPUS, TOOLS, WEATHER_Q, assert_openai_error, chat_body

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def http(jumpgate_server):
    with httpx.Client(base_url=jumpgate_server.url, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def client(jumpgate_server) -> openai.OpenAI:
    return openai_client(jumpgate_server)


# --------------------------------------------------------------------------- bad input


def test_malformed_json(http):
    resp = http.post(
        "/v1/chat/completions", content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"}
    )
    assert_openai_error(resp, 400, param=None, code="invalid_json")


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_tokens", "ten"),
        ("messages", "hi"),
        ("temperature", 5),
        ("stream", "yes"),
        ("n", 0),
    ],
)
def test_wrong_types_name_the_param(http, field, value):
    err = assert_openai_error(http.post("/v1/chat/completions", json=chat_body(**{field: value})), 400, param=field)
    assert field in err["message"]


def test_missing_model_field(http):
    body = chat_body()
    del body["model"]
    err = assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param="model")
    assert "model" in err["message"]


def test_unknown_model(http, client):
    assert_openai_error(
        http.post("/v1/chat/completions", json=chat_body(model="gpt-imaginary")),
        404,
        param="model",
        code="model_not_found",
    )
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-imaginary", messages=WEATHER_Q)
    assert info.value.code == "model_not_found"


def test_empty_messages(http):
    assert_openai_error(http.post("/v1/chat/completions", json=chat_body(messages=[])), 400, param="messages")


def test_invalid_schema_points_at_the_problem(http):
    schema = {"type": "object", "properties": {"age": {"type": "integr"}}}
    body = chat_body(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    err = assert_openai_error(http.post("/v1/chat/completions", json=body), 400, code="invalid_schema")
    assert err["param"].startswith("response_format")
    assert "/properties/age/type" in err["message"]
    # the registry refuses it the same way
    err = assert_openai_error(http.post("/v1/schemas", json={"schema": schema}), 400, param="schema")
    assert "/properties/age/type" in err["message"]


def test_bad_regex(http):
    assert_openai_error(
        http.post("/v1/chat/completions", json=chat_body(regex="(ab")), 400, param="regex", code="invalid_regex"
    )


def test_unknown_registry_id(http):
    missing = "sch_" + "0" * 24
    assert_openai_error(
        http.post("/v1/chat/completions", json=chat_body(schema_id=missing)),
        404,
        param="schema_id",
        code="schema_not_found",
    )
    assert_openai_error(http.get(f"/v1/schemas/{missing}"), 404, code="schema_not_found")
    assert_openai_error(http.delete(f"/v1/schemas/{missing}"), 404, code="schema_not_found")


def test_tool_choice_naming_a_missing_tool(http, client):
    choice = {"type": "function", "function": {"name": "teleport"}}
    err = assert_openai_error(
        http.post("/v1/chat/completions", json=chat_body(tools=TOOLS, tool_choice=choice)), 400, param="tool_choice"
    )
    assert "teleport" in err["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=TOOLS, tool_choice=choice)
    assert info.value.param == "tool_choice"


def test_prompt_too_long(http):
    body = chat_body(messages=[{"role": "user", "content": "hello " * 9000}])
    err = assert_openai_error(
        http.post("/v1/chat/completions", json=body), 400, param="messages", code="context_length_exceeded"
    )
    assert "tokens" in err["message"]


def test_body_too_large(http):
    body = chat_body(messages=[{"role": "user", "content": "x" * (5 * 1024 * 1024)}])
    assert_openai_error(http.post("/v1/chat/completions", json=body), 413, code="request_too_large")


def test_max_tokens_below_strict_schema_minimum(http):
    schema = json.loads((CORPUS / "extract_12_fields.json").read_text())
    body = chat_body(
        max_tokens=5,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}},
    )
    err = assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param="max_tokens")
    assert "tokens" in err["message"] and re.search(r"at least \d+", err["message"])
