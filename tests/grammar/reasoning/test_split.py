"""The think block split from the answer: whole and streamed alike, markers in neither part."""

from __future__ import annotations

import pytest

from grammar.reasoning.markers import CLOSED, OPEN, TO_COME, block_state, think_markers, think_tag
from grammar.reasoning.split import ReasoningSplitter, split_reasoning

QWEN = think_markers("qwen_3")
R1 = think_markers("deepseek_r1")
HARMONY = think_markers("harmony")


def streamed(markers, state, pieces):
    s = ReasoningSplitter(markers, state)
    out = [s.feed(p) for p in pieces] + [s.finish()]
    return "".join(r for r, _ in out), "".join(c for _, c in out)


@pytest.mark.parametrize(
    ("state", "text", "expected"),
    [
        (TO_COME, '<think>\nweigh it\n</think>\n\n{"a":1}', ("\nweigh it\n", '{"a":1}')),
        (TO_COME, '\n<think>x</think>\n\n{"a":1}', ("x", '{"a":1}')),
        (TO_COME, '{"a":1}', ("", '{"a":1}')),  # no block written: all of it is the answer
        (OPEN, "weigh it</think>\n\nanswer", ("weigh it", "answer")),
        (OPEN, "cut in the middle", ("cut in the middle", "")),  # max_tokens inside the block
        (CLOSED, "<think>not a block here</think>", ("", "<think>not a block here</think>")),
        (TO_COME, "<think>a</think>no blank line", ("a", "no blank line")),
    ],
)
def test_whole_outputs(state, text, expected):
    assert split_reasoning(QWEN, state, text) == expected


def test_every_split_of_the_stream_gives_the_whole_answer():
    text = '<think>\nfirst </thi no, then</think>\n\n{"a":"</think>"}'
    whole = split_reasoning(QWEN, TO_COME, text)
    assert whole == ("\nfirst </thi no, then", '{"a":"</think>"}')
    for cut in range(1, len(text)):
        assert streamed(QWEN, TO_COME, [text[:cut], text[cut:]]) == whole
    assert streamed(QWEN, TO_COME, list(text)) == whole  # a character at a time


def test_a_held_back_marker_start_is_not_sent_until_decided():
    s = ReasoningSplitter(QWEN, OPEN)
    assert s.feed("thinking </th") == ("thinking ", "")
    assert s.feed("ere") == ("</there", "")
    assert s.thinking
    assert s.feed("</think>\n\nok") == ("", "ok")
    assert not s.thinking


def test_deepseek_r1_has_no_blank_line_after_the_block():
    assert split_reasoning(R1, OPEN, "why</think>because") == ("why", "because")


def test_the_prompts_end_says_where_the_block_stands():
    assert block_state(QWEN, "<|im_start|>assistant\n") == TO_COME
    assert block_state(QWEN, "<|im_start|>assistant\n<think>\n") == OPEN
    assert block_state(QWEN, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == CLOSED
    assert think_markers("none") is None


def test_the_blocks_tag_opens_only_where_the_prompt_did_not():
    to_come = think_tag(QWEN, TO_COME)["format"]
    assert to_come["elements"][0]["begin"] == "<think>"
    assert to_come["elements"][1] == {"type": "const_string", "value": "\n\n"}
    assert think_tag(R1, OPEN)["format"]["begin"] == ""


def test_harmonys_analysis_channel_is_the_block_and_the_final_channel_the_answer():
    text = '<|channel|>analysis<|message|>Paris, 3 days.<|end|><|start|>assistant<|channel|>final<|message|>{"a":1}'
    whole = split_reasoning(HARMONY, TO_COME, text)
    assert whole == ("Paris, 3 days.", '{"a":1}')
    assert streamed(HARMONY, TO_COME, list(text)) == whole
    # with tools the way out stops at the next message's start: the tool grammar writes the channel
    calls = HARMONY.for_answer(tools=True)
    call = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{}<|call|>"
    assert split_reasoning(calls, TO_COME, f"<|channel|>analysis<|message|>x<|end|><|start|>assistant{call}") == (
        "x",
        call,
    )
    assert HARMONY.for_answer(tools=False) == HARMONY and R1.for_answer(tools=True) == R1


def test_a_harmony_prompt_that_opened_the_final_channel_has_no_block():
    prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    assert block_state(HARMONY, prompt) == TO_COME
    assert block_state(HARMONY, prompt + "<|channel|>analysis<|message|>") == OPEN
    assert block_state(HARMONY, prompt + "<|channel|>final<|message|>") == CLOSED
