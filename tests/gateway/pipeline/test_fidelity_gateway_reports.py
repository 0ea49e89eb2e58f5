"""Schema fidelity over HTTP, reported (scripted fake engine, real grammar service): best effort says on
each choice (and in a header) whether the value validated; strict-mode failures are counted and
logged; the registry and POST /v1/schemas/check return the fidelity report."""

from __future__ import annotations

import json
import logging

import pytest

from tests.gateway.chat.test_gateway_routes import CALL_TEXT, MODEL, WEATHER_TOOL, chat, sse_events
from tests.gateway.pipeline.fidelity_gateway_helpers import UNIQUE, json_schema

CLOSED = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
    "additionalProperties": False,
}


def invalid_metric(client, mode: str, reason: str) -> float:
    prefix = f'jumpgate_structured_output_invalid_total{{mode="{mode}",reason="{reason}"}} '
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix) :]) if lines else 0.0


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
