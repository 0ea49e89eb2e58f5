"""Listed values that break their other keywords (grammar/rewrites/listed_values.py): the lowered schema
accepts exactly what the original accepts; both engines' masks refuse a listed value that breaks
`type`, and never write an optional property no value fits; what cannot be left out stays refused."""

from __future__ import annotations

import itertools

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.rewrites.listed_values import fitting_values, lower_listed_values, omitted_properties
from grammar.validation.fidelity import ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity, tools_fidelity
from tests.grammar.validation.fidelity_cases import grammar_accepts
from tests.grammar.validation.test_llguidance_fidelity import writes

# as BFCL writes them: the listed values are strings, the type is not
FIND = {
    "type": "object",
    "required": ["city"],
    "properties": {
        "city": {"type": "string"},
        "is_unisex": {"type": "boolean", "enum": ["True", "False", "dontcare"], "default": "dontcare"},
        "rooms": {"type": "integer", "enum": ["1", 2, 3, "dontcare"]},
    },
}
VALUES = {"city": ["a"], "is_unisex": ["True", True], "rooms": ["1", 2, 4]}


def instances():
    for k in range(len(VALUES) + 1):
        for names in itertools.combinations(VALUES, k):
            for picked in itertools.product(*(VALUES[n] for n in names)):
                yield dict(zip(names, picked))


def test_fitting_values():
    assert fitting_values(FIND["properties"]["is_unisex"]) == []
    assert fitting_values(FIND["properties"]["rooms"]) == [2, 3]
    assert fitting_values({"type": "string", "enum": ["a"]}) is None  # every one fits
    assert fitting_values({"type": "string"}) is None  # nothing listed
    assert omitted_properties(FIND, strict=True, root=True) == ["is_unisex"]


def test_the_lowered_schema_accepts_exactly_what_the_original_accepts():
    lowered = lower_listed_values(FIND, strict=True)
    assert list(lowered["properties"]) == ["city", "rooms"] and lowered["additionalProperties"] is False
    original, rewritten = jsonschema.Draft202012Validator(FIND), jsonschema.Draft202012Validator(lowered)
    verdicts = [(obj, original.is_valid(obj), rewritten.is_valid(obj)) for obj in instances()]
    assert all(a == b for _, a, b in verdicts), [v for v in verdicts if v[1] != v[2]]
    assert any(a for _, a, _ in verdicts) and not all(a for _, a, _ in verdicts)


@pytest.mark.parametrize(
    "schema,strict,root",
    [
        ({**FIND, "required": ["city", "is_unisex"]}, True, True),  # required: no valid instance, refused
        (FIND, False, True),  # not strict: the object stays open, so "is_unisex" could be written
        (FIND, True, False),  # not the root: strict may not close it (an allOf branch stays open)
        ({**FIND, "patternProperties": {"^is_": {}}}, True, True),  # the name would match a pattern
        ({**FIND, "additionalProperties": {"type": "string"}}, True, True),  # the name would be additional
    ],
)
def test_what_cannot_be_left_out_is_left_alone(schema, strict, root):
    assert omitted_properties(schema, strict=strict, root=root) == []


def test_a_required_property_no_value_fits_stays_refused():
    report = routed_schema_fidelity({**FIND, "required": ["city", "is_unisex"]})
    assert ("/properties/is_unisex/type", "type") in {(k.pointer, k.keyword) for k in report.refused_in_strict}


def test_xgrammar_never_writes_what_no_listed_value_allows():
    report = routed_schema_fidelity(FIND)
    assert report.engine == XGRAMMAR and report.refused_in_strict == ()
    omitted = {k.pointer: k for k in report.keywords}["/properties/is_unisex/enum"]
    assert omitted.status == ENFORCED and "leaves it out" in omitted.reason
    assert grammar_accepts(FIND, '{"city":"a","rooms":2}') and grammar_accepts(FIND, '{"city":"a"}')
    for text in ('{"city":"a","is_unisex":"True"}', '{"city":"a","is_unisex":true}', '{"city":"a","rooms":"1"}'):
        assert not grammar_accepts(FIND, text), text


def test_tool_arguments_get_the_same_rewrite():
    tools = [{"type": "function", "function": {"name": "find", "parameters": FIND}}]
    assert tools_fidelity(tools).refused_in_strict == ()
    relaxed = [{"type": "function", "function": {"name": "find", "parameters": FIND, "strict": False}}]
    assert "type" in {k.keyword for k in tools_fidelity(relaxed).refused_in_strict}  # open object


def test_llguidance_never_writes_what_no_listed_value_allows(service, tokenizer):
    schema = {**FIND, "properties": {**FIND["properties"], "code": {"pattern": "^[a-z]+$", "maxLength": 3}}}
    report = routed_schema_fidelity(schema)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"city":"a","rooms":3}')
    assert not writes(handle, tokenizer, '{"city":"a","is_unisex":"True"}')
    assert not writes(handle, tokenizer, '{"city":"a","rooms":"dontcare"}')


def test_unique_items_count_only_the_listed_values_that_fit():
    # 1, 2 and "x" are listed but "x" is no integer: two values cannot fill three unique items
    schema = {"type": "array", "items": {"type": "integer", "enum": [1, 2, "x"]}, "minItems": 3, "uniqueItems": True}
    assert "uniqueItems" in {k.keyword for k in routed_schema_fidelity(schema).refused_in_strict}
    fits = {**schema, "minItems": 2}
    assert routed_schema_fidelity(fits).refused_in_strict == ()
