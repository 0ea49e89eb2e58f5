"""The msgspec wire structs: OpenAI request shapes decode, responses encode as OpenAI's do."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.errors import describe_validation, from_msgspec_error, param_from_path
from gateway.protocol import (
    AssistantMessage,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
    CompletionRequest,
    NamedToolChoice,
    ResponseFormatJsonSchema,
    SystemMessage,
    ToolMessage,
    UserMessage,
    content_text,
    make_usage,
)


def decode(body: dict, type_=ChatCompletionRequest):
    return msgspec.json.decode(json.dumps(body).encode(), type=type_)


def test_full_chat_request_decodes():
    req = decode(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ],
            "max_completion_tokens": 10,
            "temperature": 0.5,
            "top_p": 0.9,
            "n": 2,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            },
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "parallel_tool_calls": False,
            "regex": None,
            "jump_forward": "direct",
            "cache_salt": "s",
            "top_k": 5,
            "min_p": 0.1,
            "user": "u",
            "some_future_field": {"ignored": True},
        }
    )
    assert [type(m) for m in req.messages] == [SystemMessage, UserMessage, AssistantMessage, ToolMessage]
    assert content_text(req.messages[1].content) == "ab"
    assert req.messages[2].tool_calls[0].function.arguments == '{"x":1}'
    assert req.messages[3].tool_call_id == "call_1"
    assert isinstance(req.response_format, ResponseFormatJsonSchema)
    assert req.response_format.json_schema.schema == {"type": "object"}
    assert isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name == "f"
    assert req.stream_options.include_usage and req.jump_forward == "direct" and req.top_k == 5


def test_tool_choice_strings_and_stop_list():
    req = decode({"model": "m", "messages": [], "tool_choice": "required", "stop": ["a", "b"]})
    assert req.tool_choice == "required" and req.stop == ["a", "b"]


def test_completion_prompt_shapes_decode():
    for prompt in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert decode({"model": "m", "prompt": prompt}, CompletionRequest).prompt == prompt
    assert decode({"model": "m", "prompt": "x"}, CompletionRequest).max_tokens == 16


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
        ({"model": "m", "messages": [], "n": -1}, "n"),
        (
            {"model": "m", "messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
            "response_format.json_schema.schema",
        ),
        ({"messages": []}, "model"),
        (
            {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_validation_errors_map_to_param(body, param):
    with pytest.raises(msgspec.ValidationError) as info:
        decode(body)
    err = from_msgspec_error(info.value)
    assert err.status == 400 and err.param == param, (str(info.value), err.param)


def test_decode_error_is_invalid_json():
    with pytest.raises(msgspec.DecodeError) as info:
        msgspec.json.decode(b"{nope", type=ChatCompletionRequest)
    err = from_msgspec_error(info.value)
    assert err.status == 400 and err.code == "invalid_json" and err.param is None


def test_param_from_path_forms():
    assert param_from_path("$.messages[0].role") == "messages[0].role"
    assert param_from_path("data.messages[0].role") == "messages[0].role"
    assert param_from_path("$.data.n") == "n"
    assert param_from_path("$") is None and param_from_path("data") is None
    assert describe_validation("Object missing required field `content` - at `$.messages[1]`", None) == (
        "Missing required parameter: 'messages[1].content'.",
        "messages[1].content",
    )


def test_responses_encode_like_openai():
    message = msgspec.json.decode(msgspec.json.encode(ChatMessage(content="hi")))
    assert message == {"content": "hi", "role": "assistant"}  # no tool_calls key when there are none
    chunk = ChatCompletionChunk(
        id="c", created=1, model="m", choices=[ChunkChoice(index=0, delta=ChoiceDelta(content="x"))]
    )
    data = msgspec.json.decode(msgspec.json.encode(chunk))
    assert data["object"] == "chat.completion.chunk" and "usage" not in data
    assert data["choices"][0] == {"index": 0, "delta": {"content": "x"}, "finish_reason": None, "logprobs": None}
    usage = msgspec.json.decode(msgspec.json.encode(make_usage(10, 5, 4)))
    assert usage == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
