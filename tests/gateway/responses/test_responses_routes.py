"""/v1/responses over HTTP without model compute (the scripted fake engine behind the real app): shapes,
storage, chaining, tools, streaming, errors; and tools with a format on chat completions."""

from __future__ import annotations

import json

import pytest

from tests.gateway.responses.responses_helpers import MODEL, WEATHER, create, events_of

CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
CITY_FORMAT = {
    "type": "json_schema",
    "name": "city",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


# ------------------------------------------------------------------ HTTP over the fake engine


def test_response_shape_and_usage(gateway_client, fake_engine):
    resp = create(
        gateway_client(), instructions="Be brief.", max_output_tokens=20, temperature=0, seed=3, metadata={"k": "v"}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    assert body["output"][0]["type"] == "message" and body["output"][0]["role"] == "assistant"
    assert body["output"][0]["content"] == [
        {"type": "output_text", "text": "Hello there!", "annotations": [], "logprobs": []}
    ]
    assert body["metadata"] == {"k": "v"} and body["instructions"] == "Be brief."
    req = fake_engine.submitted[0]
    assert body["usage"] == {
        "input_tokens": len(req.prompt_ids),
        "output_tokens": 4,
        "total_tokens": len(req.prompt_ids) + 4,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert req.sampling.max_new_tokens == 20 and req.sampling.seed == 3
    assert "Be brief." in fake_engine.tokenizer.decode(req.prompt_ids)


def test_empty_tools_list_means_no_tools(gateway_client, fake_engine):
    """The Agents SDK sends `tools: []` for an agent without tools (chat would refuse an empty list)."""
    resp = create(gateway_client(), tools=[])
    assert resp.status_code == 200, resp.text
    assert fake_engine.submitted[0].constraint is None


def test_max_output_tokens_gives_incomplete(gateway_client, fake_engine):
    fake_engine.finish_reason = "length"
    body = create(gateway_client()).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_store_retrieve_delete_and_tenants(gateway_client):
    client = gateway_client(api_keys=["alice", "bob"])
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    created = client.post("/v1/responses", json={"model": MODEL, "input": "hi"}, headers=alice).json()
    rid = created["id"]
    assert client.get(f"/v1/responses/{rid}", headers=alice).json() == created
    other = client.get(f"/v1/responses/{rid}", headers=bob)
    assert other.status_code == 404 and other.json()["error"]["code"] == "response_not_found"
    chained = client.post(
        "/v1/responses", json={"model": MODEL, "input": "more", "previous_response_id": rid}, headers=bob
    )
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"
    assert client.delete(f"/v1/responses/{rid}", headers=bob).status_code == 404
    assert client.delete(f"/v1/responses/{rid}", headers=alice).json() == {
        "id": rid,
        "deleted": True,
        "object": "response.deleted",
    }
    assert client.get(f"/v1/responses/{rid}", headers=alice).status_code == 404


def test_store_false_is_not_kept(gateway_client):
    client = gateway_client()
    rid = create(client, store=False).json()["id"]
    assert client.get(f"/v1/responses/{rid}").status_code == 404


def test_previous_response_prompt_extends_the_stored_ids(gateway_client, fake_engine):
    client = gateway_client()
    first = create(client, input="My name is Ada.", instructions="Be brief.").json()
    create(client, input="What is my name?", instructions="Be brief.", previous_response_id=first["id"])
    one, two = fake_engine.submitted
    assert two.prompt_ids[: len(one.prompt_ids)] == one.prompt_ids
    text = fake_engine.tokenizer.decode(two.prompt_ids)
    assert "My name is Ada." in text and "Hello there!" in text and text.count("Be brief.") == 1


def test_function_call_output_and_tool_call_items(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    client = gateway_client()
    body = create(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required").json()
    [call] = body["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    fake_engine.reply = lambda req: "Sunny."
    follow = create(
        client,
        tools=[WEATHER],
        previous_response_id=body["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21C"}],
    )
    assert follow.status_code == 200, follow.text
    assert "sunny, 21C" in fake_engine.tokenizer.decode(fake_engine.submitted[-1].prompt_ids)


def test_tools_with_a_format_answer_as_a_message(gateway_client, fake_engine):
    """Agents SDK shape: function tools plus a JSON schema; the final answer is a message."""
    fake_engine.reply = lambda req: '<tool_call>{"name":"final_answer","arguments":{"city":"Paris"}}</tool_call>'
    body = create(gateway_client(), tools=[WEATHER], text={"format": CITY_FORMAT}).json()
    [message] = body["output"]
    assert message["type"] == "message" and json.loads(message["content"][0]["text"]) == {"city": "Paris"}
    prompt = fake_engine.tokenizer.decode(fake_engine.submitted[0].prompt_ids)
    assert "final_answer" in prompt and "get_weather" in prompt


def test_stream_events(gateway_client):
    resp = create(gateway_client(), stream=True)
    events = events_of(resp)
    types = [t for t, _ in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for t, e in events if t == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert deltas == "Hello there!" == final["output"][0]["content"][0]["text"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 4


def test_stream_tool_call_events(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    events = events_of(create(gateway_client(), stream=True, tools=[WEATHER], tool_choice="required"))
    types = [t for t, _ in events]
    assert "response.output_text.delta" not in types
    args = "".join(e["delta"] for t, e in events if t == "response.function_call_arguments.delta")
    [done] = [e for t, e in events if t == "response.function_call_arguments.done"]
    assert args == done["arguments"] and json.loads(args) == {"city": "Paris"} and done["name"] == "get_weather"
    [call] = events[-1][1]["response"]["output"]
    assert call["type"] == "function_call" and call["arguments"] == args


def test_engine_failure_in_stream_is_response_failed(gateway_client, fake_engine):
    fake_engine.finish_reason = "error"
    events = events_of(create(gateway_client(), stream=True))
    kind, last = events[-1]
    assert kind == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "engine_error"


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("tools", [{"type": "web_search"}], "tools[0].type"),
        ("tools", [{"type": "file_search", "name": "x"}], "tools[0].type"),
        ("reasoning", {"effort": "high"}, "reasoning"),
        ("background", True, "background"),
        ("include", ["file_search_call.results"], "include"),
        ("conversation", "conv_1", "conversation"),
        ("truncation", "auto", "truncation"),
        ("max_output_tokens", 0, "max_output_tokens"),
        (
            "input",
            [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0].type",
        ),
        ("input", [{"type": "computer_call_output", "call_id": "c"}], "input[0].type"),
        ("input", [{"type": "function_call", "name": "f"}], "input[0].call_id"),
        ("input", [], "input"),
    ],
)
def test_unsupported_and_bad_fields_name_the_param(gateway_client, field, value, param):
    resp = create(gateway_client(), **{field: value})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_chat_errors_use_responses_names(gateway_client):
    resp = create(gateway_client(max_tokens_limit=10), max_output_tokens=50)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_output_tokens"
    assert "'max_output_tokens'" in resp.json()["error"]["message"]


# ------------------------------------------------------------------ tools + format on chat completions


ANSWER_TEXT = '<tool_call>{"name":"final_answer","arguments":{"city":"Paris"}}</tool_call>'
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {k: v for k, v in CITY_FORMAT.items() if k != "type"}}


def test_chat_tools_with_a_format_answer_as_content(gateway_client, fake_engine):
    """OpenAIChatCompletionsModel with an output_type and tools sends both to chat completions."""
    fake_engine.reply = lambda req: ANSWER_TEXT
    client = gateway_client()
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
        },
    ).json()
    choice = body["choices"][0]
    assert json.loads(choice["message"]["content"]) == {"city": "Paris"} and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    fake_engine.reply = lambda req: CALL_TEXT  # a real tool call stays a tool call
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
        },
    ).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_tools_with_a_format_stream_the_answer_as_content(gateway_client, fake_engine):
    fake_engine.reply = lambda req: ANSWER_TEXT
    resp = gateway_client().post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
            "stream": True,
        },
    )
    chunks = [json.loads(b[len("data: ") :]) for b in resp.text.split("\n\n") if b.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    assert json.loads("".join(d.get("content", "") for d in deltas)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tools_with_a_non_object_format_are_refused(gateway_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    resp = gateway_client().post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": fmt,
        },
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format"
