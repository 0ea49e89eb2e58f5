"""/v1/responses end to end: the official `openai` client against one real `jumpgate serve`
(SmolLM2-135M on CPU), small max_output_tokens throughout."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from bench.harness.server_process import MODEL
from tests.conftest import openai_client

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class City(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


@pytest.fixture(scope="module")
def client(jumpgate_server) -> openai.OpenAI:
    return openai_client(jumpgate_server)  # the session's one server (tests/conftest.py)


def test_text_response_store_and_delete(client):
    r = client.responses.create(
        model=MODEL, input="Say hello.", instructions="You are terse.", max_output_tokens=12, temperature=0
    )
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 12
    again = client.responses.retrieve(r.id)
    assert again.output_text == r.output_text and again.usage.output_tokens == r.usage.output_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_structured_output_parses(client):
    r = client.responses.parse(
        model=MODEL, input="Name a big city and its country.", text_format=City, max_output_tokens=60, temperature=0
    )
    assert isinstance(r.output_parsed, City)


def test_chained_turns_reuse_the_cached_prefix(client):
    """Turn n+1 extends turn n's exact prompt + output ids: all of it but the last generated token
    (whose KV was never computed) comes from the radix cache."""
    prev = None
    for question in ["My name is Ada.", "What is my name?", "Thank you."]:
        r = client.responses.create(
            model=MODEL,
            input=question,
            instructions="You are terse.",
            temperature=0,
            max_output_tokens=16,
            previous_response_id=prev.id if prev else None,
        )
        if prev is not None:
            reused = prev.usage.input_tokens + prev.usage.output_tokens - 1
            assert r.usage.input_tokens_details.cached_tokens >= reused
            assert r.usage.input_tokens > reused
        prev = r


def test_tool_call_round_trip(client):
    r = client.responses.create(
        model=MODEL,
        input="What's the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    )
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    follow = client.responses.create(
        model=MODEL,
        tools=[WEATHER],
        previous_response_id=r.id,
        max_output_tokens=16,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}],
    )
    assert follow.output and follow.usage.input_tokens_details.cached_tokens >= (
        r.usage.input_tokens + r.usage.output_tokens - 1
    )


def test_tools_with_output_format_give_a_call_or_a_parsed_answer(client):
    """The Agents SDK sends function tools and the output type's schema together."""
    fmt = {"type": "json_schema", "name": "city", "strict": True, "schema": City.model_json_schema()}
    fmt["schema"]["additionalProperties"] = False
    r = client.responses.create(
        model=MODEL,
        input="Name a big city.",
        tools=[WEATHER],
        text={"format": fmt},
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    if calls:
        assert calls[0].name == "get_weather" and json.loads(calls[0].arguments)
    else:
        City.model_validate_json(r.output_text)


@pytest.mark.parametrize("text", [None, {"format": {"type": "json_object"}}])
def test_stream_deltas_equal_the_whole_response(client, text):
    kwargs = dict(
        model=MODEL,
        input="Describe Paris in one sentence.",
        max_output_tokens=24,
        temperature=0.8,
        extra_body={"seed": 11},
        **({"text": text} if text else {}),
    )
    whole = client.responses.create(**kwargs)
    deltas, types, numbers = [], [], []
    for event in client.responses.create(stream=True, **kwargs):  # the raw events (the stream helper
        types.append(event.type)  # expects response.completed; this may end in response.incomplete)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = event.response
    assert "".join(deltas) == whole.output_text == final.output_text
    assert types[0] == "response.created" and types[-1] == f"response.{whole.status}"
    assert numbers == list(range(len(numbers)))
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == whole.status


def test_streamed_tool_call(client):
    with client.responses.stream(
        model=MODEL,
        input="Weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    [call] = [o for o in final.output if o.type == "function_call"]
    assert "".join(pieces) == call.arguments and json.loads(call.arguments)["city"]


def test_refusals(jumpgate_server, client):
    with httpx.Client(base_url=jumpgate_server.url, timeout=60) as http:
        resp = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools[0].type"
        resp = http.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "previous_response_id": "resp_" + "0" * 32}
        )
        assert resp.status_code == 404 and resp.json()["error"]["param"] == "previous_response_id"
        resp = http.post("/v1/responses", json={"model": "nope", "input": "hi"})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_logprobs_whole_and_streamed(client):
    kwargs = dict(
        model=MODEL,
        input="Name a colour.",
        max_output_tokens=12,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    whole = client.responses.create(**kwargs)
    [part] = whole.output[0].content
    assert part.logprobs and "".join(lp.token for lp in part.logprobs) == whole.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    streamed = []
    for event in client.responses.create(stream=True, **kwargs):
        if event.type == "response.output_text.delta":
            streamed += event.logprobs
    # the same tokens and alternatives; values equal up to float noise (the second request reads the
    # prompt from the radix cache, so its forward pass has a different shape)
    assert [(lp.token, lp.bytes) for lp in streamed] == [(lp.token, lp.bytes) for lp in part.logprobs]
    assert [[t.token for t in lp.top_logprobs] for lp in streamed] == [
        [t.token for t in lp.top_logprobs] for lp in part.logprobs
    ]
    assert [lp.logprob for lp in streamed] == pytest.approx([lp.logprob for lp in part.logprobs], abs=1e-3)
    final = event.response.output[0].content[0].logprobs  # (the client types it apart from a delta's)
    assert [lp.model_dump() for lp in final] == [lp.model_dump() for lp in streamed]
