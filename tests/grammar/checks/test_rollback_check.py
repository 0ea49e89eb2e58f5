"""grammar/checks/rollback.py alone: where a failing value is found, how far the output rolls back,
which tokens the rewrite may not take, and the retry budget (a toy vocabulary; the real model's
runs are in tests/grammar/checks/test_rollback_e2e.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grammar.checks.rollback import EXHAUSTED, RollbackCheck, RollbackRules, RollbackVocab, value_spans

TEXTS = [
    b"{",
    b'"',
    b"a",
    b'":',
    b"1",
    b"}",
    b"2",
    b"1}",
    b"12",
    b'"a',
    b"",
    b",",
    b" ",
    b'"x',
    b'x"',
    b'"y"}',
    b"3",
    b"-",
]
ID = {t: i for i, t in enumerate(TEXTS)}
STOP = ID[b""]
AT_LEAST_2 = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 2}}}


def check(schema=AT_LEAST_2, retries=2) -> RollbackCheck:
    return RollbackCheck(RollbackRules(schema, RollbackVocab(TEXTS), retries))


def write(c: RollbackCheck, *texts: bytes) -> None:
    for t in texts:
        c.accept(ID[t])


def allowed_after_ban(c: RollbackCheck, allowed: list[bytes]) -> set[bytes]:
    mask = torch.zeros((1, 1), dtype=torch.int32)
    words = mask[0].numpy().view(np.uint32)
    for t in allowed:
        words[0] |= np.uint32(1 << ID[t])
    c.ban(mask, 0)
    return {TEXTS[i] for i in range(len(TEXTS)) if int(words[0]) >> i & 1}


def test_value_spans_name_every_value_by_its_instance_path():
    text = b'{"a": [1, {"b":"x\\"y"}], "c":true, "d": -2.5e3}'
    spans = value_spans(text)
    parsed = json.loads(text)
    assert text[slice(*spans[()])] == text
    assert json.loads(text[slice(*spans[("a", 1, "b")])]) == parsed["a"][1]["b"]
    assert json.loads(text[slice(*spans[("a", 0)])]) == 1
    assert json.loads(text[slice(*spans[("c",)])]) is True
    assert json.loads(text[slice(*spans[("d",)])]) == -2500.0


def test_a_fitting_output_stands():
    c = check()
    write(c, b"{", b'"a', b'":', b"2", b"}", b"")
    assert c.verdict() is None and not c.failed


def test_a_failing_value_rolls_back_to_its_first_token_and_is_remembered():
    c = check()
    write(c, b"{", b'"a', b'":', b"1", b"}", b"")
    assert c.verdict() == 3  # `1`, `}` and the stop token
    assert c.failed == [(5, b'{"a":1')]
    c.rollback(3)
    assert c.text == b'{"a":'


def test_the_rewrite_may_not_write_the_failed_value_again():
    c = check()
    write(c, b"{", b'"a', b'":', b"1", b"}", b"")
    c.rollback(c.verdict())
    # `1` could still grow into another number (12), so only what would end it right there is banned
    assert allowed_after_ban(c, [b"1", b"2", b"1}", b"12"]) == {b"1", b"2", b"12"}
    c.accept(ID[b"1"])
    assert allowed_after_ban(c, [b"}", b"2", b",", b" "]) == {b"2"}


def test_a_forced_path_is_not_banned_and_the_rewrite_parts_later():
    c = check({"type": "object", "properties": {"a": {"type": "string", "pattern": "^y"}}})
    write(c, b"{", b'"a', b'":', b'"x', b'x"', b"}", b"")
    c.rollback(c.verdict())  # back to the string's start
    assert c.text == b'{"a":'
    assert allowed_after_ban(c, [b'"x']) == {b'"x'}  # the only way on: kept
    assert allowed_after_ban(c, [b'"x', b'"y"}']) == {b'"y"}'}


def test_text_before_the_failed_value_is_not_banned():
    c = check()
    write(c, b"{", b'"a', b'":', b"1", b"}", b"")
    c.rollback(5)  # an outer rollback, back to `{`
    assert allowed_after_ban(c, [b'"a', b'"x']) == {b'"a', b'"x'}


def test_the_retry_budget_is_spent_then_the_verdict_says_so():
    c = check(retries=1)
    write(c, b"{", b'"a', b'":', b"1", b"}", b"")
    c.rollback(c.verdict())
    write(c, b"3", b"-")  # not JSON: the grammar's business, not the check's
    assert c.verdict() is None
    c.rollback(2)
    write(c, b"1}", b"")
    assert c.verdict() == EXHAUSTED
    assert c.text == b'{"a":1}'  # nothing rolled back


BYTES = RollbackVocab([bytes([b]) for b in range(256)] + [b""])


def written(schema, text: bytes, retries=3) -> RollbackCheck:
    c = RollbackCheck(RollbackRules(schema, BYTES, retries))
    for b in text:
        c.accept(b)
    c.accept(256)
    return c


@pytest.mark.parametrize(
    "schema,text,path",
    [
        # a repeat is rewritten from the first item equal to an earlier one, not the whole array
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, b'["a","b","a","b"]', (2,)),
        (
            {"type": "object", "properties": {"p": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
            b'{"p":3}',
            ("p",),
        ),
        ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, b'{"d":"2024-13-45"}', ("d",)),
    ],
)
def test_the_rollback_starts_at_the_value_the_error_names(schema, text, path):
    c = written(schema, text)
    start = value_spans(text)[path][0]
    assert c.verdict() == len(text) - start + 1


ADULT_NEEDS_LICENSE = {
    "type": "object",
    "properties": {"age": {"type": "integer"}, "license": {"type": "string"}},
    "if": {"properties": {"age": {"minimum": 18}}},
    "then": {"required": ["license"]},
}


def test_a_failing_container_is_reopened_at_its_bracket_then_rewritten_whole():
    text = b'{"age":30}'
    c = written(ADULT_NEEDS_LICENSE, text)
    assert c.verdict() == 2  # the `}` and the stop token: the object goes on
    assert c.failed == [(len(text) - 1, text)]
    c.rollback(2)
    for b in b"}":
        c.accept(b)
    c.accept(256)
    assert c.verdict() == len(text) + 1  # the same object again: from its `{`
    assert c.failed[-1] == (0, text)


def test_a_container_the_grammar_must_close_there_is_rewritten_whole_at_once():
    text = b'{"age":30}'
    asked = []

    def extends(back, before):  # the matcher's answer: nothing but `}` may follow here
        asked.append((back, before))
        return False

    c = written(ADULT_NEEDS_LICENSE, text)
    assert c.verdict(extends) == len(text) + 1  # from its `{`, in one rewrite
    assert asked == [(2, b"")]  # the `}` and the stop token back; nothing of that token before it
    assert c.failed == [(0, text)] and c.retries == 1
    assert written(ADULT_NEEDS_LICENSE, text).verdict(lambda back, before: True) == 2  # it may go on: reopened


def test_a_repeated_name_is_rewritten_from_its_quote_with_that_name_banned():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    text = b'{"a":1,"b":2,"a":3}'
    c = written(schema, text)
    start = text.rindex(b'"a"')
    assert c.verdict() == len(text) - start + 1
    assert c.failed == [(start, text[: start + 3])]
    c.rollback(len(text) - start + 1)
    mask = torch.zeros((1, 9), dtype=torch.int32)
    words = mask[0].numpy().view(np.uint32)
    c.accept(ord('"'))  # a name starts again ...
    for t in (ord("a"), ord("c")):
        words[t >> 5] |= np.uint32(1 << (t & 31))
    c.ban(mask, 0)
    assert not int(words[ord("a") >> 5]) >> (ord("a") & 31) & 1  # ... but not spell "a" again
    assert int(words[ord("c") >> 5]) >> (ord("c") & 31) & 1


# -- tool calls: each call's arguments against its function's parameters ------------------------

TOOL_TEXTS = [
    b"<tool_call>",
    b'{"name":"f","arguments":',
    b'{"name":"g","arguments":',
    b"{",
    b'"a',
    b'":',
    b"1",
    b"2",
    b"}",
    b"}</tool_call>",
    b"\n",
    b"",
    b"Sure. ",
]
TOOL_ID = {t: i for i, t in enumerate(TOOL_TEXTS)}


def tool_check(retries=2) -> RollbackCheck:
    from grammar.checks.rollback import ToolCallRollbackRules

    rules = ToolCallRollbackRules(
        {"f": AT_LEAST_2, "g": {"type": "object"}}, "<tool_call>", RollbackVocab(TOOL_TEXTS), retries
    )
    return RollbackCheck(rules)


def call(c: RollbackCheck, name: bytes, digit: bytes) -> None:
    for t in (b"<tool_call>", name, b"{", b'"a', b'":', digit, b"}", b"}</tool_call>"):
        c.accept(TOOL_ID[t])


def test_tool_calls_that_fit_their_functions_stand():
    c = tool_check()
    c.accept(TOOL_ID[b"Sure. "])
    call(c, b'{"name":"f","arguments":', b"2")
    c.accept(TOOL_ID[b"\n"])
    call(c, b'{"name":"g","arguments":', b"1")  # g takes any object
    c.accept(TOOL_ID[b""])
    assert c.verdict() is None


def test_a_tool_calls_failing_argument_rolls_back_to_its_first_token_in_the_whole_output():
    c = tool_check()
    c.accept(TOOL_ID[b"Sure. "])
    call(c, b'{"name":"f","arguments":', b"2")
    c.accept(TOOL_ID[b"\n"])
    call(c, b'{"name":"f","arguments":', b"1")  # the second call's a breaks minimum 2
    c.accept(TOOL_ID[b""])
    before = c.text
    assert c.verdict() == 4  # `1`, `}`, `}</tool_call>` and the stop token
    start, failed = c.failed[0]
    assert failed == before[: start + 1] and before[start : start + 1] == b"1"
    c.rollback(4)
    assert c.text.endswith(b'<tool_call>{"name":"f","arguments":{"a":')
    c.accept(TOOL_ID[b"1"])  # the same digit again may only go on to another number (12)
    mask = torch.zeros((1, 1), dtype=torch.int32)
    words = mask[0].numpy().view(np.uint32)
    words[0] = (1 << TOOL_ID[b"}"]) | (1 << TOOL_ID[b"2"])
    c.ban(mask, 0)
    assert int(words[0]) == 1 << TOOL_ID[b"2"]  # the failed `1` may not end there again


def test_a_tool_call_that_is_not_whole_json_is_left_to_the_grammar():
    c = tool_check()
    for t in (b"<tool_call>", b'{"name":"f","arguments":', b"{", b'"a', b'":', b"1"):
        c.accept(TOOL_ID[t])
    assert c.verdict() is None
