"""/v1/messages end to end: the official `anthropic` SDK and pydantic-ai's Anthropic model against
the session's one real `jumpgate serve` (SmolLM2-135M on CPU), greedy, small max_tokens."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from pydantic import BaseModel, Field

from bench.harness.server_process import MODEL

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0}  # an extra body field: the current SDK no longer sends temperature
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


class Capital(BaseModel):  # short strings: the agent's one call stays a few tokens long
    city: str = Field(max_length=12)


@pytest.fixture(scope="module")
def client(jumpgate_server) -> anthropic.Anthropic:
    # the session's one server (tests/conftest.py); the SDK appends /v1/messages to the root
    return anthropic.Anthropic(base_url=jumpgate_server.url, api_key="x", max_retries=0, timeout=180)


def test_plain_text(client):
    r = client.messages.create(
        model=MODEL,
        max_tokens=12,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body=GREEDY,
    )
    assert r.id.startswith("msg_") and r.role == "assistant" and r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and 0 < r.usage.output_tokens <= 12
    if r.stop_reason == "max_tokens":
        assert r.usage.output_tokens == 12


def test_tool_choice_any_and_the_tool_result_round_trip(client):
    r = client.messages.create(
        model=MODEL, max_tokens=40, tools=[WEATHER], tool_choice={"type": "any"}, messages=ASK, extra_body=GREEDY
    )
    assert r.stop_reason == "tool_use"
    [use] = [b for b in r.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and isinstance(use.input["city"], str)
    follow = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[WEATHER],
        extra_body=GREEDY,
        messages=ASK
        + [
            r.to_param(),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."}]},
        ],
    )
    assert follow.content and follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow.usage.cache_read_input_tokens > 0  # the first turn's prompt is a prefix of this one


def test_streamed_tool_input_joins_to_the_whole_input(client):
    args = dict(
        model=MODEL,
        max_tokens=40,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=ASK,
        extra_body=GREEDY,
    )
    whole = client.messages.create(**args)
    [use] = [b for b in whole.content if b.type == "tool_use"]
    partial: list[str] = []
    kinds: list[str] = []
    with client.messages.stream(**args) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert len(partial) > 1 and json.loads("".join(partial)) == use.input
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == use.input and final.stop_reason == "tool_use"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_output_config_format_is_valid_json(client):
    r = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": "Name a big city."}],
        output_config={"format": {"type": "json_schema", "schema": CITY_SCHEMA}},
        extra_body=GREEDY,
    )
    jsonschema.validate(json.loads(r.content[0].text), CITY_SCHEMA)
    parsed = client.messages.parse(
        model=MODEL,
        max_tokens=24,
        output_format=Capital,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert isinstance(parsed.parsed_output, Capital)


def test_count_tokens_and_the_cache_read_of_a_second_request(client):
    body = dict(
        model=MODEL,
        system="You answer in one word. Session 7f3a.",
        messages=[{"role": "user", "content": "Name a colour."}],
    )
    count = client.messages.count_tokens(**body)
    first = client.messages.create(max_tokens=4, extra_body=GREEDY, **body)
    u = first.usage
    assert count.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    second = client.messages.create(max_tokens=4, extra_body=GREEDY, **body)
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == count.input_tokens


def test_stop_sequence(client):
    r = client.messages.create(
        model=MODEL,
        max_tokens=12,
        stop_sequences=["3"],
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Count from 1 to 5: 1, 2,"}],
    )
    if r.stop_reason == "stop_sequence":
        assert r.stop_sequence == "3" and "3" not in r.content[0].text
    else:  # the model may not write a 3 at all; then it never names one
        assert r.stop_sequence is None


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), anthropic.BadRequestError, "'nope'"),
        (
            dict(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                            }
                        ],
                    }
                ]
            ),
            anthropic.BadRequestError,
            "'image'",
        ),
        (dict(thinking={"type": "enabled", "budget_tokens": 1024}), anthropic.BadRequestError, "no reasoning"),
        (dict(model="claude-not-here"), anthropic.NotFoundError, "claude-not-here"),
    ],
)
def test_bad_inputs_answer_in_anthropic_shape(client, kwargs, error, words):
    args = dict(model=MODEL, max_tokens=8, messages=ASK)
    args.update(kwargs)
    with pytest.raises(error) as info:
        client.messages.create(**args)
    body = info.value.body
    assert body["type"] == "error" and words in body["error"]["message"], body
    assert body["error"]["type"] == ("not_found_error" if error is anthropic.NotFoundError else "invalid_request_error")


def test_pydantic_ai_anthropic_model(jumpgate_server):
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.settings import ModelSettings

    # the API version that still carries temperature (pydantic-ai drops it for newer ones)
    sdk = anthropic.AsyncAnthropic(
        base_url=jumpgate_server.url,
        api_key="x",
        max_retries=0,
        timeout=180,
        default_headers={"anthropic-version": "2023-06-01"},
    )
    model = AnthropicModel(MODEL, provider=AnthropicProvider(anthropic_client=sdk))
    agent = Agent(model, output_type=Capital, model_settings=ModelSettings(temperature=0, max_tokens=40))
    result = agent.run_sync("What is the capital of France?")
    assert isinstance(result.output, Capital) and len(result.output.city) <= 12
