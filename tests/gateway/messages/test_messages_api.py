"""/v1/messages over HTTP without model compute: the scripted fake engine behind the real app
(error shapes, the event sequence, auth headers, count_tokens, cache_control pins)."""

from __future__ import annotations

import json
import time

import pytest

from runtime.api import EngineError

MODEL = "SmolLM2-135M-Instruct"
CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HEADERS = {"anthropic-version": "2023-06-01"}


def create(client, path="/v1/messages", headers=None, **body):
    body.setdefault("model", MODEL)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    if path == "/v1/messages":
        body.setdefault("max_tokens", 16)
    return client.post(path, json=body, headers={**HEADERS, **(headers or {})})


def events_of(resp) -> list[tuple[str, dict]]:
    assert resp.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in resp.text.split("\n\n"):
        if block.strip():
            head, _, data = block.partition("\ndata: ")
            assert head.startswith("event: "), block
            out.append((head[len("event: ") :], json.loads(data)))
    return out


def assert_error(resp, status: int, type_: str, words: str = "") -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == type_ and words in body["error"]["message"], body
    return body["error"]["message"]


def test_text_message_shape_and_usage(gateway_client, fake_engine):
    resp = create(gateway_client(), system="Be terse.")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert body["content"] == [{"type": "text", "text": "Hello there!"}]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    prompt = len(fake_engine.submitted[0].prompt_ids)
    assert body["usage"] == {
        "input_tokens": prompt - 3,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3,
    }


def test_tool_use_and_the_streamed_events(gateway_client, fake_engine):
    fake_engine.reply = lambda req: "Let me check. " + CALL_TEXT
    client = gateway_client()
    whole = create(client, tools=[WEATHER], tool_choice={"type": "any"}).json()
    assert whole["stop_reason"] == "tool_use"
    [use] = [b for b in whole["content"] if b["type"] == "tool_use"]
    assert use["id"].startswith("toolu_") and use["input"] == {"city": "Paris"}
    events = events_of(create(client, tools=[WEATHER], tool_choice={"type": "any"}, stream=True))
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [d["content_block"] for e, d in events if e == "content_block_start"]
    assert [b["type"] for b in starts] == [b["type"] for b in whole["content"]]
    tool_index = [
        d["index"] for e, d in events if e == "content_block_start" and d["content_block"]["type"] == "tool_use"
    ][0]
    joined = "".join(
        d["delta"]["partial_json"] for e, d in events if e == "content_block_delta" and d["index"] == tool_index
    )
    assert json.loads(joined) == use["input"]
    assert names.count("content_block_start") == names.count("content_block_stop")
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] > 0


def test_stream_error_after_start_is_an_error_event(gateway_client, fake_engine):
    fake_engine.finish_reason = "error"
    events = events_of(create(gateway_client(), stream=True))
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "'nope'"),
        ({"tool_choice": {"type": "maybe"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "no reasoning"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools[0].name"),
        (
            {
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
                    }
                }
            },
            "at 'output_config.format",
        ),
    ],
)
def test_bad_inputs_answer_in_anthropic_shape(gateway_client, fake_engine, body, words):
    assert_error(create(gateway_client(), **body), 400, "invalid_request_error", words)
    assert not fake_engine.submitted


def test_missing_max_tokens_unknown_model_and_bad_json(gateway_client):
    client = gateway_client()
    resp = client.post("/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert_error(resp, 400, "invalid_request_error", "'max_tokens'")
    assert_error(create(client, model="claude-nope"), 404, "not_found_error", "claude-nope")
    resp = client.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(resp, 400, "invalid_request_error")
    assert_error(client.get("/v1/messages"), 405, "invalid_request_error")


def test_overloaded_and_too_long(gateway_client, fake_engine):
    client = gateway_client()
    fake_engine.refuse = EngineError("queue full", code="overloaded")
    resp = create(client)
    assert_error(resp, 503, "overloaded_error")
    assert resp.headers["retry-after"]
    fake_engine.refuse = None
    assert_error(create(client, max_tokens=100_000), 400, "invalid_request_error", "max_tokens")


def test_api_keys_x_api_key_and_bearer(gateway_client):
    client = gateway_client(api_keys=["sekret"])
    assert_error(create(client), 401, "authentication_error", "x-api-key")
    assert_error(create(client, headers={"x-api-key": "wrong"}), 401, "authentication_error")
    assert create(client, headers={"x-api-key": "sekret"}).status_code == 200
    assert create(client, headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert_error(create(client, "/v1/messages/count_tokens"), 401, "authentication_error")


def test_count_tokens_is_the_prompt_the_engine_gets(gateway_client, fake_engine):
    client = gateway_client()
    body = dict(system="Be terse.", tools=[WEATHER], messages=[{"role": "user", "content": "Weather in Paris?"}])
    count = create(client, "/v1/messages/count_tokens", **body)
    assert count.status_code == 200, count.text
    create(client, **body)
    assert count.json() == {"input_tokens": len(fake_engine.submitted[0].prompt_ids)}
    assert_error(create(client, "/v1/messages/count_tokens", model="nope"), 404, "not_found_error")
    assert_error(
        create(client, "/v1/messages/count_tokens", messages=[{"role": "user", "content": [{"type": "x"}]}]),
        400,
        "invalid_request_error",
        "'x'",
    )


def test_stop_sequence_is_reported(gateway_client, fake_engine, tokenizer):
    fake_engine.reply = lambda req: "Hello "
    client = gateway_client()
    ids = tokenizer.encode("Hello END", add_special_tokens=False)
    submit = fake_engine.submit

    def ending_on_the_stop_string(req):  # the engine's ids run on past the text: the stop string's
        async def events():
            async for event in submit(req):
                if event.finished:
                    event.token_ids = ids
                yield event

        return events()

    fake_engine.submit = ending_on_the_stop_string
    body = create(client, stop_sequences=["END"]).json()
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    events = events_of(create(client, stop_sequences=["END"], stream=True))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_cache_control_breakpoint_is_pinned(gateway_client, fake_engine):
    fake_engine.pin_budget = 10_000
    client = gateway_client()
    system = [
        {"type": "text", "text": "You answer questions about the weather.", "cache_control": {"type": "ephemeral"}}
    ]
    assert create(client, system=system).status_code == 200
    deadline = time.monotonic() + 10
    while not fake_engine.pins and time.monotonic() < deadline:
        time.sleep(0.02)
    [(key, tokens)] = fake_engine.pins.items()
    assert key[1].startswith("messages:")
    prompt = fake_engine.submitted[0].prompt_ids
    assert 0 < tokens < len(prompt)  # the system block, not the user turn


def test_breakpoint_pins_make_room_and_expire(fake_engine, monkeypatch):
    import asyncio

    from gateway.messages import cache_pins

    fake_engine.pin_budget = 10
    pins = cache_pins.MessagePins(fake_engine)

    async def run():
        await pins.pin(lambda: [1] * 6, "", "5m")
        await pins.pin(lambda: [2] * 6, "", "5m")  # does not fit beside the first: the first gives way
        assert sorted(fake_engine.pins.values()) == [6] and len(pins.expiry) == 1
        monkeypatch.setitem(cache_pins.TTL_S, "5m", 0.0)  # what is pinned from now on expires at once
        await pins.pin(lambda: [3] * 2, "", "5m")
        await pins.release_expired()
        assert len(fake_engine.pins) == 1 and len(pins.expiry) == 1  # the 6-token pin is left, not expired
        fake_engine.pin_budget = None  # an engine without a prefix cache: stop asking
        await pins.pin(lambda: [4] * 2, "ns", "5m")
        assert pins.off

    asyncio.run(run())


def test_sampling_extensions_reach_the_engine(gateway_client, fake_engine):
    resp = create(
        gateway_client(),
        temperature=0.5,
        top_k=4,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        logit_bias={"42": -100},
        min_tokens=2,
        stop_token_ids=[7],
        ignore_eos=True,
        stop_sequences=["END"],
    )
    assert resp.status_code == 200, resp.text
    p = fake_engine.submitted[0].sampling
    assert (p.temperature, p.top_k, p.seed, p.max_new_tokens, p.stop) == (0.5, 4, 3, 16, ["END"])
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, 0.25, 1.1)
    assert (p.logit_bias, p.min_tokens, p.stop_token_ids, p.ignore_eos) == ({42: -100.0}, 2, [7], True)
    assert_error(create(gateway_client(), logit_bias={"x": 1}), 400, "invalid_request_error", "logit_bias")


def test_a_body_over_the_limit_is_request_too_large(gateway_client):
    client = gateway_client(max_body_bytes=2048)
    assert_error(create(client, system="x" * 4096), 413, "request_too_large")
