"""Tool-call grammars over real tokenizers (Qwen3's and DeepSeek's, from registry packages; see
tests/e2e/real_tokenizer_models.py): each marker the grammar forces is the tokenizer's one special
token in the shortest completion, as in the model's own output, and the think block's way out is
the real `</think>` token. gpt-oss's markers are special tokens in its tokenizer: the grammar takes
them as the tokens (grammar/engines/xgrammar/tokenizer.py's `output_markers`). A marker the plan
chooses at a branch (DeepSeek's `<｜tool▁calls▁end｜>` after a call, harmony's `<|constrain|>`) is
the one token too: the planner tries a format's markers first outside text."""

from __future__ import annotations

import json

import pytest

from grammar import GrammarSpec, output_markers
from grammar.kinds.tool_calls.format import get_tool_call_format
from grammar.kinds.tool_calls.parser import parse_tool_calls
from grammar.reasoning.markers import TO_COME, think_markers, think_tag
from grammar.reasoning.sequence import ThinkThenConstraint
from tests.e2e.real_tokenizer_models import (
    HARMONY_VOCAB,
    QWEN3_VOCAB,
    deepseek_tokenizer,
    harmony_tokenizer,
    qwen3_tokenizer,
)

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}}]
# family -> (tokenizer builder, vocabulary, format, markers of one call that must each be one token)
FAMILIES = {
    # gpt-oss's call ends at its stop token <|call|> (not in the plan); <|constrain|> follows a branch
    "harmony": (harmony_tokenizer, HARMONY_VOCAB, "harmony", ["<|channel|>", "<|message|>"]),
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
    text = tok.decode(plan)
    for marker in output_markers(tok):  # every marker in the plan, forced or chosen, as its one token
        assert text.count(marker) == plan.count(tok.convert_tokens_to_ids(marker)), (marker, text)


REASONING = {"qwen_3": "qwen_3", "deepseek_r1": "deepseek_r1", "harmony": "harmony"}  # tool format -> think format


def test_the_think_blocks_markers_are_the_real_tokens(family):
    tok, svc, fmt, _ = family
    markers = think_markers(REASONING[fmt])
    think = svc.compile(GrammarSpec.of("structural_tag", think_tag(markers, TO_COME), True))
    answer = svc.compile(GrammarSpec.of("json_schema", ADD, True))

    def encode(text):
        return list(tok.encode(text, add_special_tokens=False))

    way_out = markers.end + markers.after
    plan = ThinkThenConstraint(think, answer, markers.begin, way_out, encode).new_matcher().completion_plan()
    assert tok.decode(plan) == markers.begin + way_out + '{"a":0}'
    assert plan[: len(encode(markers.begin + way_out))] == encode(markers.begin + way_out)
    specials = {
        t for t in encode(markers.begin + markers.end) if tok.convert_ids_to_tokens(t) in markers.begin + markers.end
    }
    assert specials and specials <= set(plan)  # <think>/</think>, harmony's <|channel|> <|message|> <|end|>


def test_a_marker_spelled_in_pieces_is_checked_against_the_budget(family):
    """Forced text is not forced tokens: where the format's next marker is one token, spelling it
    in pieces costs more than the plan counted, so such a token has its bound checked (a DeepSeek
    call spelled this way ended 'length' at max_tokens 96)."""
    tok, svc, fmt, markers = family
    if fmt == "harmony":
        pytest.skip("harmony's first marker follows a choice (its two header layouts): nothing is forced")
    payload = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": True, "format": fmt}
    m = svc.compile(GrammarSpec.of("tool_calls", payload, True)).new_matcher()
    forced = m.completion_plan()[0]
    assert not m.may_expand(forced)  # the tokenizer's own first token of the forced text
    spelled = tok.encode(tok.decode([forced]), add_special_tokens=False, split_special_tokens=True)[0]
    if spelled != forced and m.accept(spelled):
        m.rollback(1)
        assert m.may_expand(spelled)
