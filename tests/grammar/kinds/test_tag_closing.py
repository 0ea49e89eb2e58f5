"""Budget-aware closing of the model formats' tool calls: the shortest completion plan of every
format closes the call, and the section around it, instead of opening another call. Kimi's
`<|tool_call` begins both the next call (`_begin|>`) and the section end (`s_section_end|>`): the
planner took the next call every time and found no plan, so a call cut by `max_tokens` ended
`length`."""

from __future__ import annotations

import json

import pytest

from grammar import GrammarSpec
from grammar.kinds.tool_calls.format import get_tool_call_format
from grammar.kinds.tool_calls.parser import parse_tool_calls
from grammar.kinds.tool_calls.tag_format import SUPPORTED_FORMATS

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": ADD, "strict": True}}
    for name in ("add", "get_weather")
]


def matcher(service, fmt: str, choice="required"):
    payload = {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": True, "format": fmt}
    return service.compile(GrammarSpec.of("tool_calls", payload, True)).new_matcher()


def calls(tokenizer, fmt: str, ids: list[int]) -> list[tuple[str, dict]]:
    _, parsed = parse_tool_calls(tokenizer.decode(ids), get_tool_call_format(fmt))
    return [(c.name, json.loads(c.arguments)) for c in parsed]


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_the_plan_writes_one_call_and_closes(service, tokenizer, fmt):
    m = matcher(service, fmt)
    plan = m.completion_plan()
    assert plan is not None, fmt
    assert len(calls(tokenizer, fmt, plan)) == 1, tokenizer.decode(plan)
    for token in plan:
        assert m.accept(token)
    assert m.is_completed()


def test_kimi_closes_the_section_after_the_call_it_is_writing(service, tokenizer):
    m = matcher(service, "kimi")
    written = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"
    for token in tokenizer.encode(written, add_special_tokens=False):
        assert m.accept(token)
    plan = m.completion_plan()
    assert plan is not None
    rest = tokenizer.decode(plan)
    assert rest.endswith("<|tool_call_end|><|tool_calls_section_end|>") and "<|tool_call_begin|>" not in rest
    assert calls(tokenizer, "kimi", tokenizer.encode(written, add_special_tokens=False) + plan) == [
        ("get_weather", {"a": 0})
    ]
    assert m.completion_bound() == len(plan)


def test_harmonys_final_message_may_end_at_the_stop_token(service, tokenizer):
    """gpt-oss ends its answer with `<|return|>`, its stop token, which the grammar never sees: a
    final-channel answer is complete where it stands, so closing can always stop it."""
    m = matcher(service, "harmony", choice="auto")
    text = "<|channel|>final<|message|>Sunny in Paris"
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert m.accept(token)
    assert m.is_completed() and m.completion_plan() == []
    content, parsed = parse_tool_calls(text, get_tool_call_format("harmony"))
    assert (content, parsed) == ("Sunny in Paris", [])


def test_a_harmony_call_may_end_at_the_stop_token(service, tokenizer):
    """gpt-oss stops on `<|call|>`: after its arguments a call is complete, so the stop token can
    end it; the parser reads the call without the marker."""
    m = matcher(service, "harmony")
    text = '<|channel|>commentary to=functions.add<|constrain|>json<|message|>{"a":3}'
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert m.accept(token)
    assert m.is_completed()
    assert calls(tokenizer, "harmony", tokenizer.encode(text, add_special_tokens=False)) == [("add", {"a": 3})]
