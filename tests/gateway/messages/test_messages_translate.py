"""Messages request → chat request, and outcomes → content blocks (no server, no engine)."""

from __future__ import annotations

import msgspec
import pytest

from gateway.errors import APIError
from gateway.messages.cache_pins import breakpoint_end
from gateway.messages.protocol import CountTokensRequest, MessagesRequest, TextOut, ToolUseOut
from gateway.messages.results import content_blocks, matched_stop, message, usage_of
from gateway.messages.translate import renamed, to_chat_request
from gateway.pipeline.generation import Outcome
from gateway.protocol import AssistantMessage, NamedToolChoice, SystemMessage, ToolMessage, UserMessage

MODEL = "m"
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'


def request(**body) -> MessagesRequest:
    body.setdefault("model", MODEL)
    body.setdefault("max_tokens", 16)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return msgspec.convert(body, MessagesRequest)


def refused(**body) -> APIError:
    with pytest.raises(APIError) as info:
        to_chat_request(request(**body))
    assert info.value.status == 400
    return info.value


def test_system_blocks_text_and_sampling_fields():
    plan = to_chat_request(
        request(
            system=[{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Be kind."}],
            stop_sequences=["END"],
            temperature=0,
            top_k=5,
            metadata={"user_id": "u1"},
            presence_penalty=0.5,
            logit_bias={"42": -100},
            min_tokens=2,
            stop_token_ids=[7],
            ignore_eos=True,
        )
    )
    chat = plan.chat
    assert chat.messages[0] == SystemMessage(content="Be terse.\n\nBe kind.")
    assert chat.messages[1] == UserMessage(content="hi")
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_k, chat.user) == (16, ["END"], 0, 5, "u1")
    assert (chat.presence_penalty, chat.logit_bias, chat.min_tokens, chat.stop_token_ids, chat.ignore_eos) == (
        0.5,
        {"42": -100},
        2,
        [7],
        True,
    )
    assert plan.answer_tool is None and chat.tools is None


def test_tool_use_and_tool_result_round_trip():
    plan = to_chat_request(
        request(
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "another model's", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "Sunny"}],
                        },
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                        {"type": "text", "text": "Thanks."},
                    ],
                },
            ],
        )
    )
    _, assistant, first, second, thanks = plan.chat.messages
    assert isinstance(assistant, AssistantMessage) and assistant.content == "Checking."
    [call] = assistant.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == ("toolu_1", "get_weather", '{"city":"Paris"}')
    assert first == ToolMessage(content="Sunny", tool_call_id="toolu_1")
    assert second == ToolMessage(content="Error: boom", tool_call_id="toolu_2")
    assert thanks == UserMessage(content="Thanks.")
    tool = plan.chat.tools[0].function
    assert tool.parameters == WEATHER["input_schema"] and tool.strict is None  # strict unless told otherwise


@pytest.mark.parametrize(
    "choice, expected, parallel",
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", None),
    ],
)
def test_tool_choice(choice, expected, parallel):
    chat = to_chat_request(request(tools=[WEATHER], tool_choice=choice)).chat
    assert (chat.tool_choice, chat.parallel_tool_calls) == (expected, parallel)


def test_named_tool_choice_and_unknown_tool():
    chat = to_chat_request(request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})).chat
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "get_weather"
    err = refused(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"})
    assert "'nope'" in err.message and err.param == "tool_choice.name"


def test_auto_without_tools_means_no_tools():
    chat = to_chat_request(request(tool_choice={"type": "auto"})).chat
    assert chat.tools is None and chat.tool_choice is None
    assert refused(tool_choice={"type": "any"}).param == "tool_choice"


def test_output_config_format_and_with_tools_the_answer_tool():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    plan = to_chat_request(request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert plan.chat.response_format.json_schema.schema == schema and plan.answer_tool is None
    plan = to_chat_request(
        request(tools=[WEATHER], output_config={"format": {"type": "json_schema", "schema": schema}})
    )
    assert plan.answer_tool == "final_answer" and plan.chat.response_format is None
    assert plan.chat.tool_choice == "required" and plan.chat.tools[0].function.parameters == schema


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking", "no reasoning"),
        ({"thinking": {"type": "adaptive"}}, "thinking", "no reasoning"),
        ({"output_config": {"effort": "low"}}, "output_config.effort", "no reasoning"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
            "'image'",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "n", "input": {}}]}]},
            "messages[0].content[0].type",
            "assistant",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]},
            "messages[1].role",
            "Prefill",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type", "web_search"),
        ({"tools": [{"name": "t", "input_schema": {"type": "string"}}]}, "tools[0].input_schema", "object"),
        ({"tools": [{"name": "t"}]}, "tools[0].input_schema", "input_schema"),
        ({"messages": []}, "messages", "at least one"),
    ],
)
def test_bad_inputs_are_refused_by_name(body, param, words):
    err = refused(**body)
    assert err.param == param and words in err.message, err.message


def test_thinking_disabled_and_default_effort_are_served():
    chat = to_chat_request(request(thinking={"type": "disabled"}, output_config={"effort": "high"})).chat
    assert chat.messages[-1] == UserMessage(content="hi")


def test_count_tokens_request_has_no_sampling():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    plan = to_chat_request(msgspec.convert(body, CountTokensRequest))
    assert plan.chat.max_tokens is None and plan.chat.tools[0].function.name == "get_weather"


def test_errors_of_the_chat_path_name_messages_fields():
    err = renamed(APIError(400, "Invalid tool name 'a b'.", param="tools[0].function.name"))
    assert err.param == "tools[0].name"
    err = renamed(APIError(400, "'stop' may hold at most 16 sequences.", param="stop"))
    assert err.param == "stop_sequences" and "'stop_sequences'" in err.message


# --------------------------------------------------------------------------- outcomes → blocks


def test_tool_calls_become_tool_use_blocks():
    blocks = content_blocks("Sure. " + CALL_TEXT, True, None)
    assert blocks[0] == TextOut(text="Sure.")  # the parser trims the text around calls
    assert isinstance(blocks[1], ToolUseOut) and blocks[1].id.startswith("toolu_")
    assert (blocks[1].name, blocks[1].input) == ("get_weather", {"city": "Paris"})
    msg = message(
        "msg_1",
        MODEL,
        Outcome(text=CALL_TEXT, finish_reason="stop", prompt_tokens=9, cached_tokens=4, completion_tokens=5),
        True,
        None,
        None,
    )
    assert msg.stop_reason == "tool_use" and [type(b) for b in msg.content] == [ToolUseOut]
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (5, 4, 5)


def test_answer_tool_call_is_text():
    text = '<tool_call>{"name":"final_answer","arguments":{"a":1}}</tool_call>'
    assert content_blocks(text, True, "final_answer") == [TextOut(text='{"a":1}')]


def test_stop_reasons_and_the_matched_stop_sequence(tokenizer):
    ids = tokenizer.encode("Hello END there", add_special_tokens=False)
    outcome = Outcome(text="Hello ", finish_reason="stop", token_ids=ids, prompt_tokens=3, completion_tokens=len(ids))
    assert matched_stop(tokenizer, outcome, ["there", "END"]) == "END"
    assert matched_stop(tokenizer, outcome, ["nowhere"]) is None
    msg = message("msg_1", MODEL, outcome, False, None, "END")
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "END")
    assert message("m", MODEL, Outcome(text="x", finish_reason="length"), False, None, None).stop_reason == "max_tokens"
    assert message("m", MODEL, Outcome(text="x", finish_reason="stop"), False, None, None).stop_reason == "end_turn"
    assert usage_of(Outcome(prompt_tokens=10, cached_tokens=10)).input_tokens == 0


def test_breakpoints_locate_their_text_in_the_prompt():
    plan = to_chat_request(
        request(
            system=[{"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "first question", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
                    ],
                },
                {"role": "assistant", "content": "answer"},
                {"role": "user", "content": "second"},
            ],
        )
    )
    prompt = "<s>SYS</s><u>first question</u><a>answer</a><u>second</u><a>"
    assert plan.cache_ttl == "1h" and len(plan.breakpoints) == 2
    assert prompt[: breakpoint_end(prompt, plan)] == "<s>SYS</s><u>first question"
    plan.breakpoints = plan.breakpoints[:1]  # the system block alone: up to where the conversation starts
    assert prompt[: breakpoint_end(prompt, plan)] == "<s>SYS</s><u>"
