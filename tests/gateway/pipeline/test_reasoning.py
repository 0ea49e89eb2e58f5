"""A request's think block in the gateway: its plan and budget, the request fields that shape it,
the stream split into block and answer, and what chat, Responses and Messages make of it (no
server, no model: a stub engine replays events)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from gateway.chat.bodies import chat_choice, usage_of
from gateway.errors import APIError
from gateway.messages.protocol import MessagesRequest, ThinkingOut
from gateway.messages.results import content_blocks
from gateway.messages.translate import to_chat_request
from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import EngineStream, Outcome, reasoning_of
from gateway.pipeline.reasoning import check_budget_fields, effort_kwargs, plan_reasoning
from gateway.responses.items import check_reasoning, output_items
from gateway.responses.protocol import OutputReasoning
from runtime.api import GenerateRequest, StreamEvent

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def qwen3_reasoning():
    """The served model writes Qwen3's think blocks (the formats are process-wide: restored after)."""
    before = (grammar_adapter.tool_call_format_name(), grammar_adapter.reasoning_format_name())
    grammar_adapter.use_formats(before[0], "qwen_3")
    yield
    grammar_adapter.use_formats(*before)


def test_no_block_without_a_think_format():
    assert grammar_adapter.reasoning_format_name() == "none"
    assert plan_reasoning(PROMPT, 100, None, None, True) is None
    assert effort_kwargs("none", None) is None  # nothing to turn off


def test_the_budget_by_request(qwen3_reasoning):
    assert plan_reasoning(PROMPT, 100, None, None, True).budget == 50  # constrained: half
    assert plan_reasoning(PROMPT, 100, None, None, False).budget is None  # free text: none
    assert plan_reasoning(PROMPT, 100, "low", None, False).budget == 25
    assert plan_reasoning(PROMPT, 100, "none", None, True).budget == 0
    given = plan_reasoning(PROMPT, 100, "low", 70, True)
    assert (given.budget, given.asked) == (70, True)
    assert plan_reasoning(PROMPT + "<think>\n", 100, None, None, True).state == "open"
    assert plan_reasoning(PROMPT + "<think>\n\n</think>\n\n", 100, None, None, True) is None


def test_effort_none_turns_thinking_off_in_the_template(qwen3_reasoning):
    assert effort_kwargs("none", None) == {"enable_thinking": False}
    assert effort_kwargs("none", {"enable_thinking": True}) == {"enable_thinking": True}  # the client's own
    assert effort_kwargs("low", {"x": 1}) == {"x": 1}


@pytest.mark.parametrize(("effort", "budget", "param"), [("huge", None, "reasoning_effort"), (None, -1, "b")])
def test_bad_budget_fields_are_refused(qwen3_reasoning, effort, budget, param):
    with pytest.raises(APIError) as info:
        check_budget_fields(effort, budget, "b")
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize(("effort", "budget", "param"), [("low", None, "reasoning_effort"), (None, 10, "b")])
def test_a_budget_for_a_model_that_does_not_think_is_refused(effort, budget, param):
    with pytest.raises(APIError) as info:
        check_budget_fields(effort, budget, "b")
    assert info.value.status == 400 and info.value.param == param
    check_budget_fields("none", None)  # neutral


class ReplayEngine:
    """Stands in for the engine: `submit` replays the given events."""

    tokenizer = None

    def __init__(self, events):
        self.events = events

    def submit(self, request):
        async def replay():
            for event in self.events:
                yield event

        return replay()

    def abort(self, rid):
        pass


def run_stream(pieces, state="to_come"):
    events = [StreamEvent(rid="r", text=t, token_ids=[i]) for i, t in enumerate(pieces)]
    events.append(StreamEvent(rid="r", finished=True, finish_reason="stop", completion_tokens=len(pieces)))
    plan = plan_reasoning(PROMPT + ("<think>" if state == "open" else ""), 100, None, None, True)
    stream = EngineStream(ReplayEngine(events), GenerateRequest(prompt_ids=[1], rid="r"), None, plan.splitter())

    async def collect():
        return [e async for e in stream]

    return stream.outcome, asyncio.run(collect())


def test_the_stream_splits_block_and_answer_and_counts_the_blocks_tokens(qwen3_reasoning):
    outcome, events = run_stream(["<think>", "\nweigh", " it</th", "ink>", "\n\n", '{"a"', ":1}"])
    assert outcome.reasoning == "\nweigh it" and outcome.text == '{"a":1}'
    assert outcome.reasoning_tokens == 5  # the markers and the blank line included
    assert "".join(reasoning_of(e) for e in events) == outcome.reasoning
    assert "".join(e.text for e in events) == outcome.text
    choice = chat_choice(0, outcome, False)
    assert choice.message.reasoning_content == "\nweigh it" and choice.message.content == '{"a":1}'
    assert usage_of([outcome]).completion_tokens_details.reasoning_tokens == 5


def test_no_block_written_means_no_reasoning(qwen3_reasoning):
    outcome, _ = run_stream(['{"a"', ":1}"])
    assert outcome.reasoning == "" and outcome.reasoning_tokens == 0 and outcome.text == '{"a":1}'
    assert chat_choice(0, outcome, False).message.reasoning_content is None
    assert usage_of([outcome]).completion_tokens_details.reasoning_tokens == 0


def test_a_request_that_could_have_no_block_shows_none():
    plain = Outcome(text="hi", completion_tokens=1)
    assert msgspec.json.encode(chat_choice(0, plain, False)).find(b"reasoning") < 0
    assert msgspec.json.encode(usage_of([plain])).find(b"completion_tokens_details") < 0


def test_responses_and_messages_put_the_block_first():
    items = output_items('{"a":1}', False, None, "completed", reasoning="why")
    assert isinstance(items[0], OutputReasoning) and items[0].content[0].text == "why"
    assert not isinstance(output_items("x", False, None, "completed", reasoning="")[0], OutputReasoning)
    blocks = content_blocks("answer", False, None, "why")
    assert blocks[0] == ThinkingOut(thinking="why") and blocks[1].text == "answer"


def test_responses_reasoning_is_refused_for_a_model_that_does_not_think():
    with pytest.raises(APIError) as info:
        check_reasoning({"effort": "low"})
    assert info.value.param == "reasoning"
    check_reasoning({"effort": None, "summary": None})  # neutral values pass


def test_responses_reasoning_fields(qwen3_reasoning):
    check_reasoning({"effort": "high", "summary": "auto"})
    for bad, param in (({"effort": "max"}, "reasoning.effort"), ({"summary": "concise"}, "reasoning.summary")):
        with pytest.raises(APIError) as info:
            check_reasoning(bad)
        assert info.value.param == param


def messages_request(**body) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **body}
    return msgspec.convert(body, MessagesRequest)


def test_messages_thinking_in_chats_terms(qwen3_reasoning):
    assert to_chat_request(messages_request()).chat.reasoning_effort == "none"  # not enabled: no block
    enabled = to_chat_request(messages_request(thinking={"type": "enabled", "budget_tokens": 20})).chat
    assert (enabled.thinking_budget, enabled.reasoning_effort) == (20, None)
    adaptive = to_chat_request(messages_request(thinking={"type": "adaptive"}, output_config={"effort": "max"})).chat
    assert (adaptive.thinking_budget, adaptive.reasoning_effort) == (None, "high")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 64}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ],
)
def test_messages_thinking_refusals(qwen3_reasoning, body, param):
    with pytest.raises(APIError) as info:
        to_chat_request(messages_request(**body))
    assert info.value.status == 400 and info.value.param == param


@pytest.fixture
def harmony_reasoning():
    """The served model is gpt-oss-like: harmony tool calls and its analysis channel."""
    before = (grammar_adapter.tool_call_format_name(), grammar_adapter.reasoning_format_name())
    grammar_adapter.use_formats("harmony", "harmony")
    yield
    grammar_adapter.use_formats(*before)


def test_harmonys_analysis_channel_is_planned_as_a_block(harmony_reasoning):
    prompt = "<|start|>user<|message|>hi<|end|><|start|>assistant"
    plan = plan_reasoning(prompt, 100, None, None, True)
    assert (plan.state, plan.budget, plan.markers.begin) == ("to_come", 50, "<|channel|>analysis<|message|>")
    assert plan.markers.after == "<|start|>assistant<|channel|>final<|message|>"  # response_format: final channel
    assert plan_reasoning(prompt, 100, None, None, True, tools=True).markers.after == "<|start|>assistant"
    assert plan_reasoning(prompt + "<|channel|>final<|message|>", 100, None, None, True) is None
    assert effort_kwargs("high", None) == {"reasoning_effort": "high"}  # gpt-oss's template variable
    assert effort_kwargs("low", {"reasoning_effort": "medium"}) == {"reasoning_effort": "medium"}
    check_budget_fields("low", 10)  # the model thinks: effort and budget are taken


def test_harmonys_analysis_streams_as_reasoning_and_final_as_content(harmony_reasoning):
    pieces = ["<|channel|>", "analysis", "<|message|>", "Paris,", " 3 days", "<|end|>", "<|start|>", "assistant"]
    pieces += ["<|channel|>", "final", "<|message|>", '{"a"', ":1}"]
    events = [StreamEvent(rid="r", text=t, token_ids=[i]) for i, t in enumerate(pieces)]
    events.append(StreamEvent(rid="r", finished=True, finish_reason="stop", completion_tokens=len(pieces)))
    plan = plan_reasoning("<|start|>user<|message|>hi<|end|><|start|>assistant", 100, None, None, True)
    stream = EngineStream(ReplayEngine(events), GenerateRequest(prompt_ids=[1], rid="r"), None, plan.splitter())

    async def collect():
        return [e async for e in stream]

    streamed = asyncio.run(collect())
    outcome = stream.outcome
    assert (outcome.reasoning, outcome.text) == ("Paris, 3 days", '{"a":1}')
    assert "".join(reasoning_of(e) for e in streamed) == outcome.reasoning
    choice = chat_choice(0, outcome, False)
    assert choice.message.reasoning_content == "Paris, 3 days" and choice.message.content == '{"a":1}'
    items = output_items(outcome.text, False, None, "completed", reasoning=outcome.reasoning)
    assert isinstance(items[0], OutputReasoning) and items[0].content[0].text == "Paris, 3 days"


def test_an_auto_answer_without_calls_shows_harmonys_final_channel_without_its_markers(harmony_reasoning):
    # with tools the block's way out stops at <|start|>assistant: the final channel's markers reach
    # the tool parser, which reads them as content (the whole answer as the streamed one)
    outcome = Outcome(text="<|channel|>final<|message|>Sunny in Paris.", completion_tokens=5)
    assert chat_choice(0, outcome, True).message.content == "Sunny in Paris."
    assert chat_choice(0, Outcome(text="", completion_tokens=1), True).message.content == ""
