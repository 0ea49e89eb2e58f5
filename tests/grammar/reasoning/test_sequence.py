"""A think block, then a grammar: the block is free, the answer constrained after it, plans and
bounds count the block's way out, and a spent thinking budget closes the block."""

from __future__ import annotations

import json

import pytest
import torch

from grammar import GrammarSpec
from grammar.reasoning.markers import OPEN, TO_COME, think_markers, think_tag
from grammar.reasoning.sequence import ThinkThenConstraint

QWEN = think_markers("qwen_3")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def encode(tokenizer):
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


def constraint(service, encode, state=TO_COME, answer=True, budget=None):
    think = service.compile(GrammarSpec.of("structural_tag", think_tag(QWEN, state), True))
    json_handle = service.compile(GrammarSpec.of("json_schema", SCHEMA, True)) if answer else None
    opening = QWEN.begin if state == TO_COME else ""
    return ThinkThenConstraint(think, json_handle, opening, QWEN.end + QWEN.after, encode, budget)


def allowed(matcher, vocab: int) -> set[int]:
    mask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    matcher.fill_bitmask(mask, 0)
    bits = [(int(mask[0, i // 32]) >> (i % 32)) & 1 for i in range(vocab)]
    return {i for i, b in enumerate(bits) if b}


def feed(matcher, ids):
    for t in ids:
        assert matcher.accept(t), t


def test_the_plan_is_the_blocks_way_out_then_the_answers_shortest(service, encode, tokenizer):
    c = constraint(service, encode)
    m = c.new_matcher()
    assert tokenizer.decode(m.completion_plan()) == '<think></think>\n\n{"a":0}'
    assert c.min_completion_tokens() == len(m.completion_plan())
    feed(m, encode("<think>\nweighing it up </thi"))
    assert tokenizer.decode(m.way_out()) == "nk>\n\n"  # the marker already begun is finished
    assert not m.is_completed() and not m.may_expand(encode(" more")[0])


def test_the_answer_is_constrained_only_after_the_block(service, encode, tokenizer):
    m = constraint(service, encode).new_matcher()
    feed(m, encode("<think>anything at all: not JSON"))
    assert m.accept(encode(" {{")[0])  # inside the block, anything goes
    feed(m, encode("</think>\n\n"))
    assert not m.in_block
    assert not m.accept(encode("hello")[0])  # after it, the schema
    feed(m, encode('{"a":12}'))
    assert m.is_completed()
    assert tokenizer.eos_token_id in allowed(m, len(tokenizer))


def test_the_stop_token_is_refused_inside_the_block(service, encode, tokenizer):
    m = constraint(service, encode, state=OPEN, answer=False).new_matcher()
    feed(m, encode("a thought"))
    assert tokenizer.eos_token_id not in allowed(m, len(tokenizer))
    feed(m, encode("</think>\n\n"))
    assert tokenizer.eos_token_id in allowed(m, len(tokenizer))  # free text after the block


def test_a_spent_budget_allows_only_the_way_out(service, encode, tokenizer):
    m = constraint(service, encode, budget=6).new_matcher()
    opening = encode("<think>")
    written = opening + encode(" one two three four five six seven")
    for i, token in enumerate(written[:6]):
        if i >= len(opening):
            assert len(allowed(m, len(tokenizer))) > 1  # free while the budget lasts
        assert m.accept(token)
    forced = []
    while m.in_block:
        mask = allowed(m, len(tokenizer))
        assert len(mask) == 1  # closed by force
        forced.append(mask.pop())
        assert m.accept(forced[-1])
    assert tokenizer.decode(forced) == "</think>\n\n"
    assert m.closes_value(forced[-1])  # loop breaking stops steering once the block is closed


def test_bounds_count_the_block(service, encode, tokenizer):
    c = constraint(service, encode, state=OPEN)
    m = c.new_matcher()
    answer = c.answer_plan_length()
    assert answer == len(encode('{"a":0}'))
    out = len(encode("</think>\n\n"))
    assert m.completion_bound_after(encode(" idea")[0]) == out + answer
    assert m.completion_bound_after(encode("</think>")[0]) < out + answer
    assert m.block_tokens == 0 and m.in_block  # bounds leave the state alone


def test_valid_prefix_runs_through_the_block_into_the_answer(service, encode):
    m = constraint(service, encode, state=OPEN).new_matcher()
    good = encode('why</think>\n\n{"a":1}')
    assert m.valid_prefix(good) == len(good)
    block = encode("why</think>\n\n")
    assert m.valid_prefix(block + encode("nope")) == len(block)
    assert m.in_block and m.block_tokens == 0


def test_the_answers_report_is_the_requests(service, encode):
    c = constraint(service, encode)
    assert c.fidelity is c.answer.fidelity  # what the output check reads
    json.dumps(c.min_completion_tokens())


class Part:
    """A picklable stand-in for a compiled handle (the cluster's SharedConstraint travels as its spec)."""

    def __init__(self, name):
        self.name = name
        self.fidelity = f"{name}'s report"


def test_the_constraint_travels_by_pickle_without_its_tokenizer():
    import pickle

    c = ThinkThenConstraint(Part("think"), Part("answer"), "<think>", "</think>\n\n", lambda text: [len(text)], 7)
    copy = pickle.loads(pickle.dumps(c))
    assert (copy.think.name, copy.answer.name, copy.budget) == ("think", "answer", 7)
    assert copy.fidelity == "answer's report"


def test_a_draft_stops_where_the_budget_is_spent(service, encode):
    m = constraint(service, encode, state=OPEN, budget=3).new_matcher()
    assert m.valid_prefix(encode(" one two three four five")) == 3


HARMONY = think_markers("harmony")
ADD = {"type": "function", "function": {"name": "add", "parameters": SCHEMA, "strict": True}}


def harmony_constraint(service, encode, answer_spec, tools: bool):
    markers = HARMONY.for_answer(tools)
    think = service.compile(GrammarSpec.of("structural_tag", think_tag(markers, TO_COME), True))
    answer = service.compile(answer_spec)
    return ThinkThenConstraint(think, answer, markers.begin, markers.end + markers.after, encode, None)


def test_harmony_answers_in_the_final_channel_after_the_analysis_one(service, encode, tokenizer):
    c = harmony_constraint(service, encode, GrammarSpec.of("json_schema", SCHEMA, True), tools=False)
    m = c.new_matcher()
    assert tokenizer.decode(m.completion_plan()) == (
        '<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>{"a":0}'
    )
    feed(m, encode("<|channel|>analysis<|message|>free {{ text<|end|><|start|>assistant<|channel|>final<|message|>"))
    assert not m.in_block and not m.accept(encode("hello")[0])
    feed(m, encode('{"a":7}'))
    assert m.is_completed()


def test_harmony_tool_calls_follow_the_analysis_in_the_commentary_channel(service, encode, tokenizer):
    from grammar.kinds.tool_calls.format import get_tool_call_format
    from grammar.kinds.tool_calls.parser import parse_tool_calls
    from grammar.reasoning.split import split_reasoning

    payload = {"tools": [ADD], "tool_choice": "required", "parallel_tool_calls": True, "format": "harmony"}
    c = harmony_constraint(service, encode, GrammarSpec.of("tool_calls", payload, True), tools=True)
    m = c.new_matcher()
    plan = tokenizer.decode(m.completion_plan())
    assert plan.startswith("<|channel|>analysis<|message|><|end|><|start|>assistant")
    text = "<|channel|>analysis<|message|>add one<|end|><|start|>assistant"
    text += "<|channel|>commentary to=functions.add<|constrain|>json<|message|>"
    feed(m, encode(text + '{"a":1}<|call|>'))
    assert m.is_completed()
    reasoning, content = split_reasoning(HARMONY.for_answer(True), TO_COME, text + '{"a":1}<|call|>')
    _, calls = parse_tool_calls(content, get_tool_call_format("harmony"))
    assert reasoning == "add one" and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1})]
