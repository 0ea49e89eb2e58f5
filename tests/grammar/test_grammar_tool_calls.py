"""Tool calls: prompt text, grammar per tool_choice (driven with real tokens), and parsers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import (
    HERMES_TOOL_CALL_FORMAT as FMT,
)
from grammar import (
    ContentDelta,
    GrammarSpecError,
    ToolCallArgumentsDelta,
    ToolCallStartDelta,
    ToolCallStreamParser,
    parse_tool_calls,
    render_tools_prompt,
    tool_calls_grammar_spec,
)

ROOT = Path(__file__).parents[2]
TOOLS = json.loads((ROOT / "schemas" / "agent_tools.json").read_text())
ENVELOPE = json.loads((ROOT / "schemas" / "tool_call_envelope.json").read_text())
WEATHER = FMT.render_call("get_weather", '{"city":"Paris","unit":"celsius"}')
SEARCH = FMT.render_call("web_search", '{"query":"xgrammar structural tags","num_results":3}')
CALC = FMT.render_call("calculator", '{"expression":"2*(3+4)"}')


@pytest.fixture(scope="module")
def grammar_for(service):
    def make(tool_choice, parallel=True, tools=TOOLS):
        return service.compile(tool_calls_grammar_spec(tools, tool_choice, parallel))

    return make


def accepts(handle, tokenizer, text: str) -> bool:
    """All tokens accepted and the output may end here (the stop token is allowed)."""
    matcher = handle.new_matcher()
    ok = all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return ok and matcher.is_completed() and matcher.accept(2)


def test_agent_tools_are_realistic():
    names = [t["function"]["name"] for t in TOOLS]
    assert names == [
        "web_search",
        "get_weather",
        "calculator",
        "read_file",
        "write_file",
        "send_email",
        "query_database",
        "create_calendar_event",
    ]
    for tool in TOOLS:
        params = tool["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and params["required"] and tool["function"]["description"]


def test_rendered_calls_match_the_envelope_schema():
    for call in (WEATHER, SEARCH, CALC):
        body = call.removeprefix(FMT.call_begin).removesuffix(FMT.call_end)
        jsonschema.validate(json.loads(body), ENVELOPE)


def test_auto_allows_text_or_text_then_calls(grammar_for, tokenizer):
    g = grammar_for("auto")
    assert accepts(g, tokenizer, "The capital of France is Paris.")
    assert accepts(g, tokenizer, "")
    assert accepts(g, tokenizer, WEATHER)
    assert accepts(g, tokenizer, "Let me check.\n" + WEATHER)
    assert accepts(g, tokenizer, WEATHER + "\n" + SEARCH + "\n" + CALC)
    assert not accepts(g, tokenizer, WEATHER + " and some trailing text")
    assert not accepts(g, tokenizer, FMT.render_call("launch_rocket", "{}"))
    assert not accepts(
        g, tokenizer, FMT.render_call("get_weather", '{"city": "Paris", "unit": "celsius"}')
    )  # not compact
    assert not accepts(g, tokenizer, FMT.render_call("get_weather", '{"city":"Paris"}'))  # unit is required
    assert not accepts(g, tokenizer, FMT.render_call("get_weather", '{"city":"Paris","unit":"kelvin"}'))
    assert not accepts(g, tokenizer, FMT.render_call("get_weather", '{"city":"Paris","unit":"celsius","x":1}'))


def test_auto_without_parallel_calls_allows_one_call(grammar_for, tokenizer):
    g = grammar_for("auto", parallel=False)
    assert accepts(g, tokenizer, "Sure.\n" + WEATHER)
    assert not accepts(g, tokenizer, WEATHER + "\n" + SEARCH)


def test_required_means_calls_only(grammar_for, tokenizer):
    g = grammar_for("required")
    assert accepts(g, tokenizer, CALC)
    assert accepts(g, tokenizer, CALC + "\n" + WEATHER)
    assert not accepts(g, tokenizer, "I'd rather chat.")
    assert not accepts(g, tokenizer, "")
    assert not accepts(g, tokenizer, "Calling: " + CALC)
    one = grammar_for("required", parallel=False)
    assert accepts(one, tokenizer, CALC)
    assert not accepts(one, tokenizer, CALC + "\n" + CALC)


def test_named_choice_forces_exactly_that_function(grammar_for, tokenizer):
    g = grammar_for({"type": "function", "function": {"name": "get_weather"}})
    assert accepts(g, tokenizer, WEATHER)
    assert not accepts(g, tokenizer, CALC)
    assert not accepts(g, tokenizer, "Hello")
    assert not accepts(g, tokenizer, WEATHER + "\n" + WEATHER)
    # everything up to the arguments' first free value is forced: jump-forward drafts it
    matcher = g.new_matcher()
    assert matcher.jump_forward_string() == '<tool_call>{"name":"get_weather","arguments":{"city":"'
    assert tokenizer.decode(matcher.jump_forward_tokens()) == matcher.jump_forward_string()


def test_required_drafts_the_envelope_up_to_the_name(grammar_for):
    assert grammar_for("required").new_matcher().jump_forward_string() == '<tool_call>{"name":"'


def test_tool_without_parameters_takes_any_compact_object(service, tokenizer):
    tools = [{"type": "function", "function": {"name": "ping"}}]
    g = service.compile(tool_calls_grammar_spec(tools, "required"))
    assert accepts(g, tokenizer, FMT.render_call("ping", "{}"))
    assert accepts(g, tokenizer, FMT.render_call("ping", '{"any":[1,"x"]}'))
    assert not accepts(g, tokenizer, FMT.render_call("ping", '"text"'))


def test_none_and_toolless_auto_need_no_grammar():
    assert tool_calls_grammar_spec(TOOLS, "none") is None
    assert tool_calls_grammar_spec([], "auto") is None
    assert tool_calls_grammar_spec(None, None) is None


@pytest.mark.parametrize(
    "tools, choice, param, pointer, fragment",
    [
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice", "/function/name", "not in tools"),
        (TOOLS, "sometimes", "tool_choice", "", "must be one of"),
        (TOOLS, {"type": "function"}, "tool_choice", "", "tool_choice must be"),
        ([], "required", "tool_choice", "", "at least one tool"),
        ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools", "/0/function/name", "1-64"),
        ([TOOLS[0], TOOLS[0]], "auto", "tools", "/1/function/name", "duplicate"),
        ([{"type": "retrieval"}], "auto", "tools", "/0/type", "'function'"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            "auto",
            "tools",
            "/0/function/parameters/type",
            "object",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"$ref": "https://x.test/a.json"}}},
                    },
                }
            ],
            "auto",
            "tools",
            "/0/function/parameters/properties/a/$ref",
            "outside",
        ),
    ],
)
def test_bad_tools_and_choices_are_refused_with_param_and_pointer(tools, choice, param, pointer, fragment):
    with pytest.raises(GrammarSpecError) as e:
        tool_calls_grammar_spec(tools, choice)
    assert (e.value.param, e.value.pointer) == (param, pointer)
    assert fragment in e.value.message


def test_tools_prompt_is_canonical_and_deterministic():
    shuffled = [json.loads(json.dumps({k: t[k] for k in reversed(list(t))})) for t in TOOLS]
    prompt = render_tools_prompt(TOOLS)
    assert prompt == render_tools_prompt(shuffled)
    assert "<tools>\n" in prompt and "<tool_call>" in prompt
    lines = prompt.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    assert len(lines) == len(TOOLS)
    for line, tool in zip(lines, TOOLS):
        assert json.loads(line) == tool
        assert line.startswith('{"function":{"description":')
    # property order inside the parameters is the order the grammar will generate
    assert lines[1].index('"city"') < lines[1].index('"country_code"') < lines[1].index('"unit"')


# -- parsing ----------------------------------------------------------------------------------

OUTPUT = "Let me look that up.\n" + WEATHER + "\n" + SEARCH


def test_parse_splits_content_and_calls():
    content, calls = parse_tool_calls(OUTPUT)
    assert content == "Let me look that up."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"Paris","unit":"celsius"}'),
        ("web_search", '{"query":"xgrammar structural tags","num_results":3}'),
    ]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)
    assert calls[0].id != calls[1].id
    assert calls[0].to_openai()["function"]["name"] == "get_weather"


def test_parse_plain_text_and_loose_or_broken_blocks():
    assert parse_tool_calls("Just text.  ") == ("Just text.  ", [])
    content, calls = parse_tool_calls(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    )
    assert content == "" and calls[0].name == "calculator" and json.loads(calls[0].arguments) == {"expression": "1+1"}
    content, calls = parse_tool_calls('<tool_call>{"arguments":{"x":1},"name":"f"}</tool_call>')  # other key order
    assert calls[0].name == "f" and calls[0].arguments == '{"x":1}'
    content, calls = parse_tool_calls("see <tool_call>not json</tool_call>")
    assert calls == [] and content == "see<tool_call>not json</tool_call>"
    content, calls = parse_tool_calls('<tool_call>{"name":"f","arguments":{"s":"}</tool_call>"}}</tool_call>')
    assert calls[0].arguments == '{"s":"}</tool_call>"}'  # the end marker inside a string is data


def test_stream_deltas_have_openai_shape():
    ids = iter(["call_a", "call_b"])
    parser = ToolCallStreamParser(id_factory=lambda: next(ids))
    deltas = []
    for i in range(0, len(OUTPUT), 5):
        deltas += parser.feed(OUTPUT[i : i + 5])
    deltas += parser.finish()
    starts = [d for d in deltas if isinstance(d, ToolCallStartDelta)]
    assert [(d.index, d.id, d.name) for d in starts] == [(0, "call_a", "get_weather"), (1, "call_b", "web_search")]
    first_call = deltas.index(starts[0])
    assert all(isinstance(d, ContentDelta) for d in deltas[:first_call])
    assert "".join(d.text for d in deltas[:first_call]) == "Let me look that up."
    for index, start in enumerate(starts):
        pieces = [d.arguments for d in deltas if isinstance(d, ToolCallArgumentsDelta) and d.index == index]
        assert deltas.index(start) < deltas.index(
            next(d for d in deltas if isinstance(d, ToolCallArgumentsDelta) and d.index == index)
        )
        assert json.loads("".join(pieces))
    assert starts[0].to_openai() == {
        "tool_calls": [
            {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        ]
    }
    assert ToolCallArgumentsDelta(1, '{"q').to_openai() == {
        "tool_calls": [{"index": 1, "function": {"arguments": '{"q'}}]
    }
    assert ContentDelta("hi").to_openai() == {"content": "hi"}


def _aggregate(deltas):
    content, calls = "", {}
    for d in deltas:
        if isinstance(d, ContentDelta):
            content += d.text
        elif isinstance(d, ToolCallStartDelta):
            calls[d.index] = [d.name, ""]
        else:
            calls[d.index][1] += d.arguments
    return content, [tuple(calls[i]) for i in sorted(calls)]


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.sampled_from(["", "Sure.\n", "Checking <tool", "a < b, so "]),
    calls=st.lists(st.sampled_from([WEATHER, SEARCH, CALC]), max_size=3),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40),
)
def test_any_chunking_streams_the_same_result_as_parse(prefix, calls, cuts):
    text = prefix + "\n".join(calls)
    expected_content, expected_calls = parse_tool_calls(text)
    parser = ToolCallStreamParser()
    deltas, pos, i = [], 0, 0
    while pos < len(text):
        step = cuts[i % len(cuts)]
        deltas += parser.feed(text[pos : pos + step])
        pos, i = pos + step, i + 1
    deltas += parser.finish()
    content, streamed = _aggregate(deltas)
    assert content == expected_content
    assert streamed == [(c.name, c.arguments) for c in expected_calls]
    assert len(streamed) == len(calls)
    if calls:
        assert content == prefix.rstrip()
    else:
        assert content == prefix


def test_grammar_outputs_round_trip_through_the_parser(grammar_for, tokenizer):
    g = grammar_for("auto")
    text = "On it.\n" + WEATHER + "\n" + CALC
    assert accepts(g, tokenizer, text)
    content, calls = parse_tool_calls(text)
    assert content == "On it."
    assert FMT.render_calls((c.name, c.arguments) for c in calls) == WEATHER + "\n" + CALC
