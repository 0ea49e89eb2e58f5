"""Tool-call grammars over real tokenizers (Qwen3's and DeepSeek's, from registry packages; see
tests/e2e/real_tokenizer_models.py): each marker the grammar forces is the tokenizer's one special
token in the shortest completion, as in the model's own output, and the think block's way out is
the real `</think>` token. (A marker the plan chooses at a branch, DeepSeek's
`<｜tool▁calls▁end｜>` after a call, is spelled in plain pieces: the planner's token classes hold
no added tokens. The text, and so the parse, is the same.)"""

from __future__ import annotations

import json

import pytest

from grammar import GrammarSpec
from grammar.kinds.tool_calls.format import get_tool_call_format
from grammar.kinds.tool_calls.parser import parse_tool_calls
from grammar.reasoning.markers import TO_COME, think_markers, think_tag
from grammar.reasoning.sequence import ThinkThenConstraint
from tests.e2e.real_tokenizer_models import QWEN3_VOCAB, deepseek_tokenizer, qwen3_tokenizer

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}}]
# family -> (tokenizer builder, vocabulary, format, markers of one call that must each be one token)
FAMILIES = {
    "qwen3": (qwen3_tokenizer, QWEN3_VOCAB, "qwen_3", ["<tool_call>", "</tool_call>"]),
    "deepseek": (
        deepseek_tokenizer,
        None,
        "deepseek_r1",
        [
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
        ],
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    from grammar import GrammarService

    build, vocab, fmt, markers = FAMILIES[request.param]
    tok = build(tmp_path_factory.mktemp(f"tok-{request.param}"))
    svc = GrammarService(tok, vocab or (len(tok) + 63) // 64 * 64)
    yield tok, svc, fmt, markers
    svc.close()


def test_each_marker_of_the_plan_is_one_special_token(family):
    tok, svc, fmt, markers = family
    payload = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": True, "format": fmt}
    plan = svc.compile(GrammarSpec.of("tool_calls", payload, True)).new_matcher().completion_plan()
    ids = {tok.convert_tokens_to_ids(m) for m in markers}
    assert all(len(tok.encode(m, add_special_tokens=False)) == 1 for m in markers)
    assert ids <= set(plan), tok.decode(plan)
    _, calls = parse_tool_calls(tok.decode(plan), get_tool_call_format(fmt))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 0})]


def test_the_think_blocks_way_out_is_the_real_end_token(family):
    tok, svc, _, _ = family
    markers = think_markers("qwen_3")
    think = svc.compile(GrammarSpec.of("structural_tag", think_tag(markers, TO_COME), True))
    answer = svc.compile(GrammarSpec.of("json_schema", ADD, True))

    def encode(text):
        return list(tok.encode(text, add_special_tokens=False))

    plan = ThinkThenConstraint(think, answer, markers.begin, markers.end + markers.after, encode).new_matcher()
    ids = plan.completion_plan()
    assert ids[:2] == [tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")]
    assert tok.decode(ids) == '<think></think>\n\n{"a":0}'
