"""The fidelity report (grammar/validation/fidelity.py) in strict mode against real xgrammar: open
objects, uniqueItems and dependentRequired that the value check keeps, tools, pointers, annotations."""

from __future__ import annotations

import pytest

from grammar.checks.value_rules import dependent_required_exact
from grammar.validation.fidelity import (
    CHECKED,
    DUPLICATE_KEYS,
    ENFORCED,
    UNENFORCED,
    VALUE_CHECK,
    routed_schema_fidelity,
    schema_fidelity,
    tools_fidelity,
)
from tests.grammar.validation.fidelity_cases import OBJ_AB, grammar_accepts, not_masked


def test_open_objects_report_the_duplicate_key_risk_the_grammar_really_has():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    # the grammar alone repeats names; the value check (tests/grammar/checks/test_value_check_names.py) masks them out
    assert grammar_accepts(schema, '{"b":1,"b":2}')
    assert not_masked(schema_fidelity(schema, value_check=False)) == {("", DUPLICATE_KEYS, CHECKED)}
    report = schema_fidelity(schema)
    assert report.guaranteed and report.refused_in_strict == ()
    names = next(k for k in report.keywords if k.keyword == DUPLICATE_KEYS)
    assert (names.status, names.engine) == (ENFORCED, VALUE_CHECK)
    assert names.as_dict()["engine"] == VALUE_CHECK and "value check" in names.reason
    # names limited by propertyNames may have no way on once used: only checked
    limited = {"type": "object", "propertyNames": {"enum": ["a", "b"]}}
    assert ("", DUPLICATE_KEYS, CHECKED) in not_masked(schema_fidelity(limited))
    # declared names are never repeated, and strict mode closes objects that declare properties
    declared = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert schema_fidelity(declared, strict=True).guaranteed
    assert not grammar_accepts(declared, '{"a":1,"a":2}', strict=False)
    assert ("", DUPLICATE_KEYS, CHECKED) in not_masked(schema_fidelity(declared, strict=False, value_check=False))


@pytest.mark.parametrize(
    "extra",
    [
        {"additionalProperties": True},
        {"additionalProperties": {"type": "integer"}},
        {"unevaluatedProperties": {"type": "integer"}},
    ],
)
def test_strict_mode_keeps_an_explicit_open_object_open_and_reports_its_names(extra):
    # strict closes only objects that declare properties and say nothing else: an explicit
    # additionalProperties / unevaluatedProperties still admits any other name, so perhaps one twice
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, **extra}
    assert grammar_accepts(schema, '{"a":1,"b":2,"b":3}', strict=True)
    names = [k for k in schema_fidelity(schema, strict=True).keywords if k.keyword == DUPLICATE_KEYS]
    assert [(k.pointer, k.status, k.engine) for k in names] == [("", ENFORCED, VALUE_CHECK)]
    assert ("", DUPLICATE_KEYS, CHECKED) in not_masked(schema_fidelity(schema, strict=True, value_check=False))
    # and so the mask cannot keep a dependentRequired there (the value check leaves such objects)
    both = {
        **schema,
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]},
    }
    assert "names are all declared" in dependent_required_exact(both, strict=True)


@pytest.mark.parametrize(
    "items",
    [
        {"type": "integer"},
        {"type": "number"},
        {"type": "string", "minLength": 1},
        {"enum": ["a", "b", "c"]},
        {"type": "boolean"},
        {"anyOf": [{"const": 1}, {"const": 2}]},
        {"$ref": "#/$defs/word"},
    ],
)
def test_unique_items_the_value_check_keeps_exactly_are_enforced_in_strict_mode(items):
    schema = {
        "$defs": {"word": {"type": "string"}},
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": items, "uniqueItems": True, "minItems": 2}},
    }
    report = routed_schema_fidelity(schema)
    entry = next(k for k in report.keywords if k.keyword == "uniqueItems")
    assert (entry.pointer, entry.status, entry.engine) == ("/properties/xs/uniqueItems", ENFORCED, VALUE_CHECK)
    assert report.refused_in_strict == ()


TAG = {
    "type": "object",
    "title": "Tag",
    "required": ["name", "weight"],
    "properties": {"name": {"type": "string", "title": "Name"}, "weight": {"type": "integer", "title": "Weight"}},
}


@pytest.mark.parametrize(
    "items",
    [
        {"type": "object", "properties": OBJ_AB},
        {"$ref": "#/$defs/Tag"},  # pydantic's set[Tag] of a frozen model
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "on": {"type": "boolean"}, "note": {"$ref": "#/$defs/word"}},
            "required": ["kind"],
            "additionalProperties": False,
        },
    ],
)
def test_unique_object_items_of_scalar_properties_are_enforced_in_strict_mode(items):
    schema = {
        "$defs": {"word": {"type": "string"}, "Tag": TAG},
        "type": "object",
        "required": ["xs"],
        "properties": {"xs": {"type": "array", "items": items, "uniqueItems": True, "minItems": 2}},
    }
    report = routed_schema_fidelity(schema)
    entry = next(k for k in report.keywords if k.keyword == "uniqueItems")
    assert (entry.pointer, entry.status, entry.engine) == ("/properties/xs/uniqueItems", ENFORCED, VALUE_CHECK)
    assert report.refused_in_strict == ()


@pytest.mark.parametrize(
    "items,strict,why",
    [
        ({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}, True, "closed objects"),
        (
            {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
            True,
            "closed objects",
        ),
        ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}, True, "closed objects"),
        (
            {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
            True,
            "closed objects",
        ),
        ({"type": "object", "properties": OBJ_AB, "minProperties": 1}, True, "closed objects"),
        ({"type": "object", "properties": OBJ_AB}, False, "closed objects"),  # open: names beyond a and b
        (
            {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]},
            True,
            "minItems 3 exceeds the 2 distinct objects",
        ),
    ],
)
def test_unique_object_items_the_check_cannot_steer_stay_refused(items, strict, why):
    schema = {"type": "array", "items": items, "uniqueItems": True, "minItems": 3}
    entry = next(k for k in schema_fidelity(schema, strict=strict).not_masked if k.keyword == "uniqueItems")
    assert entry.status == CHECKED and why in entry.reason


def test_dependent_required_the_value_check_keeps_is_enforced_in_strict_mode():
    schema = {"type": "object", "properties": OBJ_AB, "dependentRequired": {"a": ["b"]}}
    report = routed_schema_fidelity(schema)
    entry = next(k for k in report.keywords if k.keyword == "dependentRequired")
    assert (entry.status, entry.engine) == (ENFORCED, VALUE_CHECK) and report.refused_in_strict == ()
    assert grammar_accepts(schema, '{"a":1}')  # the grammar alone would close without "b"
    # outside strict mode the object is open: names beyond the declared ones make it inexact
    assert [k.keyword for k in schema_fidelity(schema, strict=False).refused_in_strict] == ["dependentRequired"]


def test_unique_items_that_min_items_exhausts_stay_refused():
    # no instance is valid; the mask would have to write a repeat or stop short of minItems
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 3, "uniqueItems": True}
    report = schema_fidelity(schema)
    assert [(k.keyword, k.status) for k in report.refused_in_strict] == [("uniqueItems", CHECKED)]
    assert "minItems 3" in report.refused_in_strict[0].reason


def test_tool_arguments_are_not_followed_by_the_value_check():
    params = {
        "type": "object",
        "properties": {"x": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
    }
    report = tools_fidelity([{"type": "function", "function": {"name": "f", "parameters": params}}])
    assert ("/0/function/parameters/properties/x/uniqueItems", "uniqueItems", CHECKED) in not_masked(report)


def test_pointers_are_nested_and_escaped():
    schema = {
        "type": "object",
        "properties": {"a/b": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}},
        "required": ["a/b"],
    }
    assert not_masked(schema_fidelity(schema)) == {("/properties/a~1b/contains", "contains", CHECKED)}


def test_tools_report_roots_each_tool_and_keeps_its_strictness():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
                },
            },
        },
        {"type": "function", "function": {"name": "g"}},  # no parameters: any object
    ]
    report = tools_fidelity(tools)
    assert ("/0/function/parameters/properties/x/uniqueItems", "uniqueItems", CHECKED) in not_masked(report)
    names = next(k for k in report.keywords if k.keyword == DUPLICATE_KEYS)  # the value check follows tool calls
    assert (names.pointer, names.status, names.engine) == ("/1/function/parameters", ENFORCED, VALUE_CHECK)
    assert report.as_dict()["guaranteed"] is False


def test_a_tools_checked_keywords_are_kept_by_rollback_when_rewrites_are_allowed():
    from grammar.validation.fidelity import ROLLBACK, spec_fidelity

    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "array", "items": {"type": "object"}, "uniqueItems": True}},
                },
            },
        }
    ]
    payload = {"tools": tools, "tool_choice": "auto", "parallel_tool_calls": True, "format": "hermes"}
    refused = spec_fidelity("tool_calls", payload, retries=0).refused_in_strict
    assert [(k.pointer, k.status) for k in refused] == [("/0/function/parameters/properties/x/uniqueItems", CHECKED)]
    kept = spec_fidelity("tool_calls", payload, retries=4)
    assert kept.refused_in_strict == ()
    unique = next(k for k in kept.keywords if k.keyword == "uniqueItems")
    assert (unique.status, unique.engine) == (ENFORCED, ROLLBACK) and "4 times" in unique.reason


def test_annotations_are_not_classified():
    schema = {
        "type": "string",
        "title": "t",
        "description": "d",
        "examples": ["x"],
        "default": "x",
        "contentEncoding": "base64",
        "x-vendor": 1,
    }
    report = schema_fidelity(schema)
    assert [k.keyword for k in report.keywords] == ["type"]
    assert report.as_dict() == {
        "guaranteed": True,
        "counts": {ENFORCED: 1, CHECKED: 0, UNENFORCED: 0},
        "keywords": [{"pointer": "/type", "keyword": "type", "status": ENFORCED}],
    }
