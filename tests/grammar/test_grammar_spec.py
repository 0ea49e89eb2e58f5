"""Canonical specs and cache keys: same meaning -> same key; different output -> different key."""

from __future__ import annotations

import copy
import json

import pytest

from grammar import GrammarSpec, GrammarSpecError, tokenizer_fingerprint
from grammar.schema.canonical import canonical_json, canonical_schema
from grammar.schema.limits import MAX_JSON_DEPTH, MAX_SPEC_BYTES

FP = "f" * 64

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _reorder_keys(value, keep_order=False):
    """The same JSON with every object's keys in reverse order except the names under `properties`."""
    if isinstance(value, dict):
        keys = list(value) if keep_order else list(reversed(list(value)))
        return {k: _reorder_keys(value[k], keep_order=(k == "properties" and not keep_order)) for k in keys}
    if isinstance(value, list):
        return [_reorder_keys(v) for v in value]
    return value


def test_reordered_keys_give_the_same_key():
    a = GrammarSpec.json_schema(PERSON)
    b = GrammarSpec.json_schema(json.loads(json.dumps(_reorder_keys(PERSON))))
    assert list(b.payload) != list(a.payload)  # really reordered
    assert a.canonical == b.canonical
    assert a.key(FP) == b.key(FP)


def test_canonical_text_is_compact_and_sorted():
    text = GrammarSpec.json_schema(PERSON).canonical
    assert ", " not in text and ": " not in text
    body = json.loads(text)
    assert list(body) == sorted(body)
    assert list(body["payload"]) == sorted(body["payload"])


def test_property_order_is_kept_because_it_is_the_output_order():
    swapped = copy.deepcopy(PERSON)
    swapped["properties"] = {"age": PERSON["properties"]["age"], "name": PERSON["properties"]["name"]}
    a, b = GrammarSpec.json_schema(PERSON), GrammarSpec.json_schema(swapped)
    assert a.key(FP) != b.key(FP)
    assert list(canonical_schema(swapped)["properties"]) == ["age", "name"]


def test_a_property_named_properties_is_not_mistaken_for_the_keyword():
    schema = {"type": "object", "properties": {"properties": {"type": "object", "properties": {"z": {}, "a": {}}}}}
    out = canonical_schema(schema)
    assert list(out["properties"]["properties"]["properties"]) == ["z", "a"]


def test_different_schemas_kinds_flags_and_tokenizers_give_different_keys():
    base = GrammarSpec.json_schema(PERSON)
    changed = copy.deepcopy(PERSON)
    changed["properties"]["age"]["minimum"] = 1
    keys = {
        base.key(FP),
        GrammarSpec.json_schema(changed).key(FP),
        GrammarSpec.json_schema(PERSON, strict=False).key(FP),
        base.key("e" * 64),
        GrammarSpec.regex("[a-z]+").key(FP),
        GrammarSpec.ebnf('root ::= "a"').key(FP),
        GrammarSpec.json_object().key(FP),
    }
    assert len(keys) == 7
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)


def test_tool_calls_payload_is_canonical_but_tool_order_and_choice_matter():
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}},
    }
    a = GrammarSpec.tool_calls([tool], "auto", True)
    b = GrammarSpec.tool_calls([_reorder_keys(tool)], "auto", True)
    assert a.key(FP) == b.key(FP)
    assert a.key(FP) != GrammarSpec.tool_calls([tool], "required", True).key(FP)
    assert a.key(FP) != GrammarSpec.tool_calls([tool], "auto", False).key(FP)


def test_canonical_json_keeps_unicode_and_numbers_as_written():
    assert canonical_json({"é": 1.5, "n": 10}) == '{"é":1.5,"n":10}'


def test_limits_refuse_deep_and_huge_specs_with_a_pointer():
    deep: dict = {"type": "string"}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarSpecError) as e:
        GrammarSpec.json_schema(deep).canonical  # noqa: B018
    assert "nested deeper" in e.value.message
    assert e.value.pointer.startswith("/items/items/")
    assert e.value.param == "response_format"

    huge = {"type": "string", "enum": ["x" * 1000] * (MAX_SPEC_BYTES // 1000 + 1)}
    with pytest.raises(GrammarSpecError, match="byte limit"):
        GrammarSpec.json_schema(huge).key(FP)


def test_unknown_kind_is_refused():
    with pytest.raises(GrammarSpecError, match="unknown grammar kind"):
        GrammarSpec("yaml", "a: 1").key(FP)  # type: ignore[arg-type]


def test_tokenizer_fingerprint_is_stable_and_cached(tokenizer):
    from transformers import AutoTokenizer

    first = tokenizer_fingerprint(tokenizer)
    assert first == tokenizer_fingerprint(tokenizer)
    assert len(first) == 64
    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    assert tokenizer_fingerprint(other) == first  # same vocabulary, another object


def test_non_json_payloads_are_refused():
    with pytest.raises(GrammarSpecError, match="not plain JSON"):
        GrammarSpec.json_schema({"type": "number", "minimum": float("nan")}).key(FP)
    with pytest.raises(GrammarSpecError, match="not plain JSON"):
        GrammarSpec.json_schema({"enum": {1, 2}}).key(FP)
