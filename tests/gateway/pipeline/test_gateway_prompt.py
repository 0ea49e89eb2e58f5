"""Prompt rendering with the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import msgspec
import pytest

from gateway.pipeline.prompt import PromptRenderer, schema_instructions
from gateway.protocol import Message

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_REORDERED = {
    "function": {
        "parameters": {"required": ["city"], "properties": {"city": {"type": "string"}}, "type": "object"},
        "description": "Weather in a city",
        "name": "get_weather",
    },
    "type": "function",
}


def msgs(*items: dict) -> list:
    return msgspec.convert(list(items), list[Message])


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return PromptRenderer(tokenizer)


def test_order_system_tools_schema_conversation(renderer):
    out = renderer.render_chat(
        msgs({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}),
        tools=[TOOL],
        instructions=schema_instructions("json_object", None),
    )
    text = out.text
    i_sys, i_tools = text.index("You are terse."), text.index("<tools>")
    i_schema, i_user = text.index("Respond with only a JSON object."), text.index("Weather in Paris?")
    assert i_sys < i_tools < i_schema < i_user
    assert text.count("<|im_start|>system") == 1  # one system block
    assert text.endswith("<|im_start|>assistant\n")
    assert out.token_ids == renderer.encode(text)


def test_same_system_and_tools_share_the_prefix(renderer, tokenizer):
    a = renderer.render_chat(
        msgs({"role": "system", "content": "S"}, {"role": "user", "content": "first question"}), tools=[TOOL]
    )
    b = renderer.render_chat(
        msgs(
            {"role": "system", "content": "S"},
            {"role": "user", "content": "other"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ),
        tools=[TOOL_REORDERED],
    )
    system_turn = renderer.encode(a.text[: a.text.index("<|im_start|>user")])
    assert a.token_ids[: len(system_turn)] == system_turn
    assert b.token_ids[: len(system_turn)] == system_turn
    assert a.system_text == b.system_text  # key order of the tool did not matter


def test_schema_text_is_canonical_and_keeps_property_order(renderer):
    s1 = {"type": "object", "required": ["b"], "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    s2 = {"properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b"], "type": "object"}
    t1, t2 = schema_instructions("json_schema", s1), schema_instructions("json_schema", s2)
    assert t1 == t2
    assert t1.index('"b"') < t1.index('"a"')
    assert ", " not in t1.split("\n", 1)[1] and ": " not in t1.split("\n", 1)[1]  # compact separators


def test_tool_calls_and_results_round_trip(renderer):
    out = renderer.render_chat(
        msgs(
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        ),
        tools=[TOOL],
    )
    text = out.text
    # the assistant's call is written exactly as the model is asked to write one (compact JSON)
    assert (
        '<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call><|im_end|>'
        in text
    )
    # SmolLM2's template has no tool role: results go back as one user turn
    assert "<|im_start|>tool" not in text
    assert (
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>"
        in text
    )


def test_no_system_message_keeps_template_default(renderer):
    out = renderer.render_chat(msgs({"role": "user", "content": "hi"}))
    assert "You are a helpful AI assistant named SmolLM" in out.text and out.system_text is None


def test_tools_without_system_message(renderer):
    out = renderer.render_chat(msgs({"role": "user", "content": "hi"}), tools=[TOOL])
    assert out.text.startswith("<|im_start|>system\n# Tools")


def test_developer_and_multipart_content(renderer):
    out = renderer.render_chat(
        msgs(
            {"role": "developer", "content": "D1"},
            {"role": "system", "content": "S2"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        )
    )
    assert out.system_text == "D1\n\nS2" and "<|im_start|>user\nab<|im_end|>" in out.text


def test_boundary_context(renderer):
    ids = renderer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    before, after = renderer.boundary_context(ids, 12)
    assert renderer.decode(ids[:12]).endswith(before) and renderer.decode(ids[12:]).startswith(after)
    assert len(before) <= 40 and len(after) <= 40
    assert renderer.boundary_context(ids, 0)[0] == "" and renderer.boundary_context(ids, len(ids))[1] == ""
