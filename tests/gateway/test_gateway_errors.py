"""Every class of bad request comes back as an OpenAI error body with the right status and param."""

from __future__ import annotations

import pytest

from runtime.api import ENGINE_STOPPED, EngineError
from tests.conftest import MODEL, USER, WEATHER_TOOL, chat


def assert_error(resp, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


# ------------------------------------------------------------------ body parsing


def test_malformed_json_is_400(gateway_client):
    client = gateway_client()
    resp = client.post("/v1/chat/completions", content=b'{"model": "x", ', headers={"content-type": "application/json"})
    assert_error(resp, 400, None, "invalid_json")


def test_empty_body_is_400(gateway_client):
    client = gateway_client()
    resp = client.post("/v1/chat/completions", content=b"", headers={"content-type": "application/json"})
    assert_error(resp, 400, None)


def test_deeply_nested_body_is_400(gateway_client):
    deep = b'{"model":"m","messages":[],"metadata":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}"
    resp = gateway_client().post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert_error(resp, 400, None, "invalid_json")


def test_body_not_an_object_is_400(gateway_client):
    resp = gateway_client().post("/v1/chat/completions", json=[1, 2])
    assert_error(resp, 400, None)


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": "hello"}, "messages"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stop": 5}, "stop"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tool_choice": "sometimes", "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"jump_forward": "sideways"}, "jump_forward"),
        ({"min_p": 2}, "min_p"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_wrong_types_name_the_parameter(gateway_client, patch, param):
    client = gateway_client()
    err = assert_error(chat(client, **patch), 400, param)
    assert param in err["message"]


def test_missing_model_is_400(gateway_client):
    resp = gateway_client().post("/v1/chat/completions", json={"messages": USER})
    assert_error(resp, 400, "model")


def test_sampling_validation_names_parameter(gateway_client):
    assert_error(chat(gateway_client(), top_k=0), 400, "top_k")


# ------------------------------------------------------------------ semantic checks


def test_unknown_model_is_404(gateway_client):
    assert_error(chat(gateway_client(), model="gpt-5"), 404, "model", "model_not_found")


def test_empty_messages_is_400(gateway_client):
    assert_error(chat(gateway_client(), messages=[]), 400, "messages")


def test_n_over_limit_is_400(gateway_client):
    assert_error(chat(gateway_client(max_n=2), n=3), 400, "n")


def test_max_tokens_over_limit_is_400(gateway_client):
    assert_error(chat(gateway_client(max_tokens_limit=100), max_tokens=101), 400, "max_tokens")


def test_bad_penalties_and_biases_are_400(gateway_client):
    client = gateway_client()
    assert_error(chat(client, logit_bias={"seven": 1.0}), 400, "logit_bias")  # keys are token ids
    assert_error(chat(client, logit_bias={"7": 101.0}), 400, "logit_bias")  # OpenAI's range: [-100, 100]
    assert_error(chat(client, logit_bias={str(i): 1.0 for i in range(301)}), 400, "logit_bias")
    assert_error(chat(client, frequency_penalty=2.5), 400, "frequency_penalty")
    assert_error(chat(client, presence_penalty=-3), 400, "presence_penalty")
    assert_error(chat(client, repetition_penalty=0), 400, "repetition_penalty")
    assert_error(chat(client, min_tokens=50, max_tokens=10), 400, "min_tokens")
    assert_error(chat(client, stop_token_ids=[-1]), 400, "stop_token_ids[0]")


def test_invalid_schema_has_pointer_in_message(gateway_client):
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 5, "maximum": 1}}}
    resp = chat(
        gateway_client(), response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    )
    err = assert_error(resp, 400, "response_format", "invalid_schema")
    assert "/properties/age" in err["message"]


def test_unsupported_schema_is_400(gateway_client):
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/x.json"}}}
    resp = chat(
        gateway_client(), response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    )
    err = assert_error(resp, 400, "response_format", "invalid_schema")
    assert "/properties/a" in err["message"]


def test_bad_regex_is_400(gateway_client):
    err = assert_error(chat(gateway_client(), regex="(ab"), 400, "regex", "invalid_regex")
    assert "(ab" in err["message"]


def test_bad_ebnf_is_400(gateway_client):
    assert_error(chat(gateway_client(), ebnf="root ::= ("), 400, "ebnf")


def test_two_constraints_is_400(gateway_client):
    resp = chat(gateway_client(), regex="a+", response_format={"type": "json_object"})
    assert_error(resp, 400, "regex")


def test_unknown_registry_id_is_404(gateway_client):
    client = gateway_client()
    assert_error(chat(client, schema_id="sch_" + "0" * 24), 404, "schema_id", "schema_not_found")
    assert_error(chat(client, schema_id="../../etc/passwd"), 404, "schema_id", "schema_not_found")
    assert_error(client.get("/v1/schemas/sch_" + "1" * 24), 404, None, "schema_not_found")
    assert_error(client.delete("/v1/schemas/sch_" + "1" * 24), 404, None, "schema_not_found")


def test_tool_choice_naming_unknown_tool_is_400(gateway_client):
    resp = chat(gateway_client(), tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
    err = assert_error(resp, 400, "tool_choice")
    assert "nope" in err["message"]


def test_tool_choice_without_tools_is_400(gateway_client):
    assert_error(chat(gateway_client(), tool_choice="required"), 400, "tool_choice")


def test_bad_tool_name_and_duplicates_are_400(gateway_client):
    client = gateway_client()
    bad = {"type": "function", "function": {"name": "get weather!"}}
    assert_error(chat(client, tools=[bad]), 400, "tools[0].function.name")
    assert_error(chat(client, tools=[WEATHER_TOOL, WEATHER_TOOL]), 400, "tools[1].function.name")


def test_bad_tool_parameters_schema_is_400(gateway_client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
    err = assert_error(chat(gateway_client(), tools=[tool]), 400, "tools", "invalid_tools")
    assert "/0/function/parameters" in err["message"]


# ------------------------------------------------------------------ context and size


def test_prompt_longer_than_context_is_400(gateway_client, fake_engine):
    fake_engine.max_context = 64
    resp = chat(gateway_client(), messages=[{"role": "user", "content": "word " * 200}])
    assert_error(resp, 400, "messages", "context_length_exceeded")
    assert fake_engine.submitted == []


def test_prompt_longer_than_kv_pool_is_400(gateway_client, fake_engine):
    fake_engine.kv_pool_tokens = 64
    resp = chat(gateway_client(), messages=[{"role": "user", "content": "word " * 200}])
    err = assert_error(resp, 400, "messages", "context_length_exceeded")
    assert "KV" in err["message"]


def test_max_tokens_beyond_context_is_400(gateway_client, fake_engine):
    fake_engine.max_context = 100
    assert_error(chat(gateway_client(), max_tokens=95), 400, "max_tokens", "context_length_exceeded")


def test_engine_context_refusal_is_400(gateway_client, fake_engine):
    fake_engine.refuse = EngineError("prompt too long for the pool", code="context_length_exceeded", param="messages")
    assert_error(chat(gateway_client()), 400, "messages", "context_length_exceeded")


def test_body_too_large_is_413(gateway_client):
    client = gateway_client(max_body_bytes=2048)
    resp = chat(client, messages=[{"role": "user", "content": "x" * 5000}])
    assert_error(resp, 413, None, "request_too_large")


# ------------------------------------------------------------------ server state


def test_queue_full_is_503_with_retry_after(gateway_client, fake_engine):
    fake_engine.refuse = EngineError("queue full", code="overloaded")
    resp = chat(gateway_client(retry_after_s=3))
    assert_error(resp, 503, None, "overloaded")
    assert resp.headers["retry-after"] == "3"


def test_gateway_concurrency_guard_is_503(gateway_client, fake_engine):
    client = gateway_client(max_concurrent_requests=1)
    services = client.app.state.services
    permit = services.limiter.acquire()  # one request in flight
    try:
        resp = chat(client)
        assert_error(resp, 503, None, "overloaded")
        assert int(resp.headers["retry-after"]) >= 1
    finally:
        permit.release()
    assert chat(client).status_code == 200


def test_engine_stopped_is_503(gateway_client, fake_engine):
    fake_engine.refuse = EngineError("engine stopped", code="engine_stopped")
    assert_error(chat(gateway_client()), 503, None, "engine_stopped")


def test_a_request_the_engine_stopped_under_is_503(gateway_client, fake_engine):
    """A lost tensor-parallel rank (or a shutdown) ends the requests in flight with ENGINE_STOPPED:
    a 503 engine_stopped that says why, not a 500."""
    fake_engine.finish_reason, fake_engine.error = "error", f"{ENGINE_STOPPED}: tensor-parallel rank 1 exited (code -9)"
    err = assert_error(chat(gateway_client()), 503, None, "engine_stopped")
    assert "tensor-parallel rank 1 exited" in err["message"]


def test_stream_refusal_is_http_error_not_sse(gateway_client, fake_engine):
    fake_engine.refuse = EngineError("queue full", code="overloaded")
    resp = chat(gateway_client(), stream=True)
    assert_error(resp, 503, None, "overloaded")


# ------------------------------------------------------------------ routing and auth


def test_unknown_route_is_404(gateway_client):
    assert_error(gateway_client().get("/v1/nothing-here"), 404, None, "not_found")


def test_wrong_method_is_405(gateway_client):
    assert_error(gateway_client().get("/v1/chat/completions"), 405, None, "method_not_allowed")


def test_unknown_model_id_is_404(gateway_client):
    assert_error(gateway_client().get("/v1/models/gpt-4"), 404, "model", "model_not_found")


def test_missing_api_key_is_401(gateway_client):
    client = gateway_client(api_keys=["sk-good"])
    assert_error(chat(client), 401, None, "invalid_api_key")


def test_wrong_api_key_is_401_before_body_checks(gateway_client):
    client = gateway_client(api_keys=["sk-good"])
    resp = client.post(
        "/v1/chat/completions",
        content=b"{bad",
        headers={"authorization": "Bearer sk-bad", "content-type": "application/json"},
    )
    assert_error(resp, 401, None, "invalid_api_key")


def test_completions_errors(gateway_client):
    client = gateway_client()
    assert_error(client.post("/v1/completions", json={"model": MODEL}), 400, "prompt")
    assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": [1, "a"]}), 400, "prompt")
    assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": [10**9]}), 400, "prompt")
    assert_error(client.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "model", "model_not_found")
    assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "regex": "[a-"}), 400, "regex")


def test_schema_upload_errors(gateway_client):
    client = gateway_client()
    assert_error(client.post("/v1/schemas", json={}), 400, "schema")
    assert_error(client.post("/v1/schemas", json={"regex": "a", "ebnf": 'root ::= "a"'}), 400, "ebnf")
    err = assert_error(
        client.post("/v1/schemas", json={"schema": {"type": "string", "minLength": 5, "maxLength": 2}}),
        400,
        "schema",
        "invalid_schema",
    )
    assert "/minLength" in err["message"]
    assert_error(client.post("/v1/schemas", json={"regex": "(("}), 400, "regex", "invalid_regex")
    assert_error(client.post("/v1/schemas", json={"schema": "not a dict"}), 400, "schema")


def test_internal_error_is_openai_shaped(gateway_client, fake_engine):
    def boom(req):
        raise RuntimeError("kaput")

    fake_engine.reply = boom
    err = assert_error(chat(gateway_client()), 500, None, "internal_error")
    assert "kaput" not in err["message"]  # internals stay in the log


def test_health_reports_a_stopped_engine_as_503(gateway_client, fake_engine):
    client = gateway_client()
    assert client.get("/health").status_code == 200
    fake_engine.is_running = False
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "engine_stopped"
