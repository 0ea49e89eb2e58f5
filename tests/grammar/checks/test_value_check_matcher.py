"""The value check inside the real matchers (grammar/engines/xgrammar/matcher.py, grammar/engines/llguidance/matcher.py) with the
real SmolLM2 tokenizer: masks, drafts and completion plans never write a repeated name or item,
on xgrammar and on llguidance, and a grammar loaded back from the disk cache keeps the check."""

from __future__ import annotations

import math

import pytest
import torch

from grammar import GrammarService, GrammarSpec


@pytest.fixture(scope="module")
def vocab_size(smollm_dir):
    from runtime.model.loader import read_config

    return read_config(smollm_dir).vocab_size


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def allowed_texts(matcher, vocab_size, tokenizer, fill=None) -> set[str]:
    bitmask = torch.zeros((1, math.ceil(vocab_size / 32)), dtype=torch.int32)
    (fill or matcher.fill_bitmask)(bitmask, 0)
    words = bitmask[0].tolist()
    return {tokenizer.decode([i]) for i in range(vocab_size) if (words[i // 32] >> (i % 32)) & 1}


def walk(matcher, tokenizer, text):
    for token in encode(tokenizer, text):
        assert matcher.accept(token), text
    return matcher


OPEN = {"type": "object", "additionalProperties": {"type": "string"}}


@pytest.mark.parametrize(
    "spec", [GrammarSpec.json_schema(OPEN), GrammarSpec.of("json_object", None)], ids=["json_schema", "json_object"]
)
def test_a_name_already_written_cannot_be_closed_again(service, tokenizer, vocab_size, spec):
    matcher = walk(service.compile(spec).new_matcher(), tokenizer, '{"apple":"1","apple')
    allowed = allowed_texts(matcher, vocab_size, tokenizer)
    assert '"' not in allowed and '":' not in allowed and '":"' not in allowed
    assert "s" in allowed  # "apples" is a new name
    other = walk(service.compile(spec).new_matcher(), tokenizer, '{"apple":"1","pear')
    assert '"' in allowed_texts(other, vocab_size, tokenizer)


def test_rollback_after_a_rejected_draft_forgets_the_names(service, tokenizer, vocab_size):
    matcher = service.compile(GrammarSpec.json_schema(OPEN)).new_matcher()
    walk(matcher, tokenizer, '{"apple":"1",')
    n = len(encode(tokenizer, '"pear":"2",'))
    walk(matcher, tokenizer, '"pear":"2",')
    matcher.rollback(n)
    walk(matcher, tokenizer, '"pear')
    assert '"' in allowed_texts(matcher, vocab_size, tokenizer)


def test_a_forced_span_that_would_repeat_a_name_is_not_drafted(service, tokenizer):
    # only two names exist, so after a name's first letter the grammar forces the rest of it
    schema = {
        "type": "object",
        "propertyNames": {"enum": ["alpha", "beta"]},
        "additionalProperties": {"type": "integer"},
    }
    matcher = walk(
        service.compile(GrammarSpec.json_schema(schema, strict=False)).new_matcher(), tokenizer, '{"alpha":1,"al'
    )
    forced = matcher.jump_forward_string()
    assert forced.startswith('pha"')  # the grammar alone would draft the repeat ...
    assert '"' not in tokenizer.decode(matcher.jump_forward_tokens())  # ... the check stops before its quote


def test_completion_plans_and_closing_masks_avoid_repeats(service, tokenizer, vocab_size):
    schema = {
        "type": "object",
        "required": ["colors"],
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green"]}, "uniqueItems": True, "minItems": 2}
        },
    }
    matcher = walk(service.compile(GrammarSpec.json_schema(schema)).new_matcher(), tokenizer, '{"colors":["red",')
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == '"green"]}'
    assert '"red' not in allowed_texts(matcher, vocab_size, tokenizer, matcher.fill_bitmask)
    closing = allowed_texts(matcher, vocab_size, tokenizer, lambda b, r: matcher.fill_closing_bitmask(b, r, False))
    assert closing and not any(t.startswith('"r') for t in closing)
    # a free name being written equal to an earlier one: the plan grows it instead of closing it
    matcher = walk(service.compile(GrammarSpec.json_schema(OPEN)).new_matcher(), tokenizer, '{"a":"1","a')
    text = tokenizer.decode(matcher.completion_plan())
    assert not text.startswith('"') and text.endswith("}")


def test_llguidance_matchers_carry_the_check(service, tokenizer, vocab_size):
    # llguidance compiles this schema (pattern beside maxLength); it refuses uniqueItems itself
    schema = {
        "type": "object",
        "required": ["code"],
        "additionalProperties": {"type": "string"},
        "properties": {"code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
    }
    handle = service.compile(GrammarSpec.json_schema(schema, strict=False))
    assert handle.engine == "llguidance"
    matcher = walk(handle.new_matcher(), tokenizer, '{"code":"ab","x":"1","x')
    allowed = allowed_texts(matcher, vocab_size, tokenizer)
    assert '"' not in allowed and '":' not in allowed
    assert "y" in allowed


def test_a_grammar_warmed_from_disk_gets_its_check_back(tokenizer, vocab_size, tmp_path):
    spec = GrammarSpec.json_schema(
        {
            "type": "object",
            "required": ["xs"],
            "properties": {"xs": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        }
    )
    first = GrammarService(tokenizer, vocab_size, cache_dir=tmp_path)
    first.compile(spec)
    first.close()
    second = GrammarService(tokenizer, vocab_size, cache_dir=tmp_path)
    try:
        assert second.warm_from_disk() == 1
        handle = second.compile(spec)
        assert handle.kind == "json_schema" and handle.fidelity is not None
        matcher = walk(handle.new_matcher(), tokenizer, '{"xs":["a","a')
        assert '"' not in allowed_texts(matcher, vocab_size, tokenizer)
    finally:
        second.close()


def test_tool_call_arguments_never_repeat_a_name(service, tokenizer, vocab_size):
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "additionalProperties": {"type": "integer"}}},
        }
    ]
    handle = service.compile(GrammarSpec.tool_calls(tools, "required"))
    matcher = walk(handle.new_matcher(), tokenizer, '<tool_call>{"name":"f","arguments":{"apple":1,"apple')
    allowed = allowed_texts(matcher, vocab_size, tokenizer)
    assert '"' not in allowed and '":' not in allowed and "s" in allowed


def test_unique_items_hold_on_llguidance_which_leaves_them_to_the_check(service, tokenizer, vocab_size):
    schema = {
        "type": "object",
        "required": ["code", "tags"],
        "properties": {
            "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
    }
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert handle.engine == "llguidance"
    matcher = walk(handle.new_matcher(), tokenizer, '{"code":"ab","tags":["x","x')
    allowed = allowed_texts(matcher, vocab_size, tokenizer)
    assert '"' not in allowed and '",' not in allowed and '"]' not in allowed and "y" in allowed
    bare = walk(handle.without_value_check().new_matcher(), tokenizer, '{"code":"ab","tags":["x","x')
    assert '"' in allowed_texts(bare, vocab_size, tokenizer)  # llguidance alone would repeat the item


TAG = {
    "type": "object",
    "title": "Tag",
    "required": ["name", "weight"],
    "properties": {"name": {"type": "string"}, "weight": {"type": "integer"}},
}
SETTINGS = {
    "type": "object",
    "required": ["mode"],
    "properties": {"mode": {"enum": ["fast", "slow"]}, "on": {"type": "boolean"}, "note": {"type": "string"}},
}
PICKS = {
    "type": "object",
    "required": ["mode", "on"],
    "properties": {"mode": {"enum": ["fast", "slow"]}, "on": {"type": "boolean"}},
}


def copying_writer(matcher, tokenizer, vocab_size, want: str, limit: int = 200) -> str:
    """Write `want` where the masks allow it (a model bent on repeating an item); where they do
    not, follow the matcher's completion plan to the end. Every mask must allow something."""
    out = ""
    steer = True
    for _ in range(limit):
        if matcher.is_completed():
            return out
        bitmask = torch.zeros((1, math.ceil(vocab_size / 32)), dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        words = bitmask[0].tolist()
        allowed = {i for i in range(vocab_size) if (words[i // 32] >> (i % 32)) & 1}
        assert allowed, f"no token allowed after {out!r}"
        token = None
        if steer and want[len(out) :]:
            wanted = encode(tokenizer, want[len(out) :])[0]
            token = (
                wanted
                if wanted in allowed
                else next(
                    (
                        i
                        for i in sorted(allowed)
                        if want[len(out) :].startswith(tokenizer.decode([i])) and tokenizer.decode([i])
                    ),
                    None,
                )
            )
        if token is None:
            steer = False
            plan = matcher.completion_plan()
            token = plan[0] if plan and plan[0] in allowed else min(allowed)
        assert matcher.accept(token)
        out += tokenizer.decode([token])
    raise AssertionError(f"no end after {limit} tokens: {out!r}")


def test_the_array_closes_once_every_object_item_is_used(service, tokenizer, vocab_size):
    import json

    schema = {
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": PICKS, "uniqueItems": True, "minItems": 4}},
    }
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert handle.fidelity.refused_in_strict == ()
    picks = [f'{{"mode":"{m}","on":{o}}}' for m in ("fast", "slow") for o in ("true", "false")]
    matcher = handle.new_matcher()
    text = copying_writer(matcher, tokenizer, vocab_size, '{"xs":[' + ",".join(picks + picks[:1]) + "]}")
    assert json.loads(text)["xs"] == [json.loads(p) for p in picks]  # a fifth item could only repeat one
    assert matcher.values.dead_ends == 0


@pytest.mark.parametrize(
    "items,item_text",
    [
        (TAG, '{"name":"tea","weight":1}'),
        ({"$ref": "#/$defs/Tag"}, '{"name":"tea","weight":0}'),  # pydantic's set[Tag]; 0 cannot grow
        (SETTINGS, '{"mode":"fast","on":true,"note":"x"}'),
        (PICKS, '{"mode":"fast","on":true}'),  # 4 distinct items: the array must close at 4
    ],
)
def test_object_items_never_repeat_and_the_masks_never_empty(service, tokenizer, vocab_size, items, item_text):
    import json

    import jsonschema

    schema = {
        "$defs": {"Tag": TAG},
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": items, "uniqueItems": True}},
    }
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert handle.fidelity.refused_in_strict == ()
    matcher = handle.new_matcher()
    text = copying_writer(matcher, tokenizer, vocab_size, '{"xs":[' + ",".join([item_text] * 6) + "]}")
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert len(value["xs"]) >= 2, text
    assert matcher.values.dead_ends == 0 and matcher.values.banned > 0
    if items is PICKS:
        assert len(value["xs"]) == 2  # the writer's repeat was turned into the next distinct item
    bare = handle.without_value_check().new_matcher()  # the grammar alone would write the repeats
    assert (
        json.loads(copying_writer(bare, tokenizer, vocab_size, '{"xs":[' + ",".join([item_text] * 2) + "]}"))["xs"]
        == [json.loads(item_text)] * 2
    )


def test_completion_plans_and_closing_masks_grow_an_object_item_instead_of_repeating_it(service, tokenizer, vocab_size):
    schema = {
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": TAG, "uniqueItems": True}},
    }
    start = '{"xs":[{"name":"tea","weight":1},{"name":"tea","weight":1'
    matcher = walk(service.compile(GrammarSpec.json_schema(schema)).new_matcher(), tokenizer, start)
    text = tokenizer.decode(matcher.completion_plan())
    assert not text.startswith("}") and text.endswith("]}")
    closing = allowed_texts(matcher, vocab_size, tokenizer, lambda b, r: matcher.fill_closing_bitmask(b, r, False))
    assert closing and not any(t.startswith("}") for t in closing)
    for fill in (matcher.fill_bitmask, matcher.fill_value_closing_bitmask):
        allowed = allowed_texts(matcher, vocab_size, tokenizer, fill)
        assert allowed and not any(t.startswith("}") for t in allowed)


def test_object_items_are_steered_on_llguidance_too(service, tokenizer, vocab_size):
    import json

    schema = {
        "type": "object",
        "required": ["code", "xs"],
        "properties": {
            "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "xs": {"type": "array", "items": PICKS, "uniqueItems": True},
        },
    }
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert handle.engine == "llguidance" and handle.fidelity.refused_in_strict == ()
    matcher = handle.new_matcher()
    item = '{"mode":"fast","on":true}'
    text = copying_writer(matcher, tokenizer, vocab_size, '{"code":"ab","xs":[' + ",".join([item] * 3) + "]}")
    xs = json.loads(text)["xs"]
    assert len(xs) >= 2 and len({json.dumps(x, sort_keys=True) for x in xs}) == len(xs), text
    assert matcher.values.dead_ends == 0


def test_the_smallest_output_counts_distinct_items(service, tokenizer):
    import json

    schema = {
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": PICKS, "uniqueItems": True, "minItems": 3}},
    }
    handle = service.compile(GrammarSpec.json_schema(schema))
    plan = handle.new_matcher().completion_plan()
    xs = json.loads(tokenizer.decode(plan))["xs"]
    assert len(xs) == 3 and len({json.dumps(x, sort_keys=True) for x in xs}) == 3
    # strict requests below this budget are refused at submission: it is the repaired plan's length
    assert handle.min_completion_tokens() == len(plan) >= handle.without_value_check().min_completion_tokens()
    matcher = walk(handle.new_matcher(), tokenizer, '{"xs":[{"mode":"fast","on":true}')
    comma = encode(tokenizer, ",")[0]
    after = matcher.completion_bound_after(comma)  # the next item must differ: counted with its repair
    walk(matcher, tokenizer, ",")
    assert after == len(matcher.completion_plan())
