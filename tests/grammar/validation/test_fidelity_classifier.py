"""The fidelity report (grammar/validation/fidelity.py) against real xgrammar: a keyword reported `enforced`
has its violating instance refused by the compiled grammar; a keyword reported `checked` or
`unenforced` has a violating instance that the grammar lets through and jsonschema refuses. Each
case also checks that a valid instance passes both, so no case is vacuous."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr

from grammar.checks.value_rules import dependent_required_exact
from grammar.engines.xgrammar.schema import compact_json_schema_ebnf
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

DATA = Path(__file__).parents[2] / "data"
_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)  # strings only, no vocabulary


def grammar_accepts(schema: dict, text: str, strict: bool = True) -> bool:
    """Does the grammar Jumpgate compiles for `schema` admit exactly `text`?"""
    compiled = _COMPILER.compile_grammar(compact_json_schema_ebnf(schema, strict=strict))
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def schema_accepts(schema: dict, text: str) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(text))


OBJ_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}

# (name, schema, strict, valid instance, violating instance): the report says all enforced
ENFORCED_CASES = [
    ("type", {"type": "integer"}, True, "1", '"a"'),
    ("enum", {"enum": ["a", "b"]}, True, '"a"', '"c"'),
    ("const", {"const": "a"}, True, '"a"', '"b"'),
    ("enum_with_fitting_type", {"type": "string", "enum": ["a", "b"]}, True, '"a"', "1"),
    ("minLength", {"type": "string", "minLength": 2}, True, '"ab"', '"a"'),
    ("maxLength", {"type": "string", "maxLength": 2}, True, '"ab"', '"abc"'),
    ("pattern", {"type": "string", "pattern": "^[a-z]+$"}, True, '"ab"', '"A"'),
    ("format_date", {"type": "string", "format": "date"}, True, '"2020-01-01"', '"2020-13-45x"'),
    ("format_email", {"type": "string", "format": "email"}, True, '"a@b.co"', '"x"'),
    ("format_uuid", {"type": "string", "format": "uuid"}, True, '"123e4567-e89b-12d3-a456-426614174000"', '"x"'),
    ("minimum", {"type": "integer", "minimum": 3}, True, "3", "2"),
    ("maximum", {"type": "number", "maximum": 1.5}, True, "1.5", "1.6"),
    ("exclusiveMinimum", {"type": "integer", "exclusiveMinimum": 3}, True, "4", "3"),
    ("exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 3}, True, "2", "3"),
    ("multipleOf_integer", {"type": "integer", "multipleOf": 5}, True, "10", "3"),
    (
        "multipleOf_integer_two_bounds",
        {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
        True,
        "10",
        "3",
    ),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, True, "[1,2]", "[1]"),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 2}, True, "[1,2]", "[1,2,3]"),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, True, "[1]", '["a"]'),
    (
        "unevaluatedItems",
        {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
        True,
        "[1]",
        "[1,2]",
    ),
    ("required", {"type": "object", "properties": OBJ_AB, "required": ["a"]}, True, '{"a":1}', '{"b":1}'),
    (
        "additionalProperties_false",
        {"type": "object", "properties": OBJ_AB, "additionalProperties": False},
        False,
        '{"a":1}',
        '{"a":1,"c":2}',
    ),
    ("minProperties", {"type": "object", "properties": OBJ_AB, "minProperties": 1}, True, '{"a":1}', "{}"),
    ("maxProperties", {"type": "object", "properties": OBJ_AB, "maxProperties": 1}, True, '{"a":1}', '{"a":1,"b":2}'),
    (
        "unevaluatedProperties_strict",
        {"type": "object", "properties": OBJ_AB, "unevaluatedProperties": False},
        True,
        '{"a":1}',
        '{"a":1,"c":1}',
    ),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, True, "1", '"a"'),
    ("anyOf_with_covering_type", {"type": "integer", "anyOf": [{"type": "integer", "minimum": 5}]}, True, "5", "1"),
    ("oneOf_disjoint_types", {"oneOf": [{"type": "string"}, {"type": "integer"}]}, True, "1", "1.5"),
    # null matches both branches (Kubernetes' IntOrString): compiled as anyOf of string and integer
    ("oneOf_shared_null", {"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]}, True, "1", "null"),
    (
        "oneOf_discriminated",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["k", "x"],
                },
                {
                    "type": "object",
                    "properties": {"k": {"const": "b"}, "y": {"type": "integer"}},
                    "required": ["k", "y"],
                },
            ]
        },
        True,
        '{"k":"a","x":1}',
        '{"k":"c","x":1}',
    ),
    # the listed values that break the other keywords are never generated (grammar/rewrites/listed_values.py)
    ("type_beside_enum", {"type": "string", "enum": ["a", 1]}, True, '"a"', "1"),
    ("allOf_single", {"allOf": [{"type": "integer", "minimum": 2}]}, True, "2", "1"),
    ("ref", {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, True, "1", '"a"'),
    (
        "propertyNames",
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"},
            "additionalProperties": {"type": "integer"},
            "maxProperties": 1,
        },
        True,
        '{"ab":1}',
        '{"AB":1}',
    ),
]

# (name, schema, strict, valid instance, violating instance, (pointer, keyword, status))
NOT_MASKED_CASES = [
    (
        "pattern_with_maxLength",
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
        True,
        '"abcde"',
        '"abcdef"',
        ("/maxLength", "maxLength", CHECKED),
    ),
    (
        "pattern_with_minLength",
        {"type": "string", "pattern": "^[a-z]+$", "minLength": 3},
        True,
        '"abc"',
        '"ab"',
        ("/minLength", "minLength", CHECKED),
    ),
    (
        "format_with_maxLength",
        {"type": "string", "format": "email", "maxLength": 6},
        True,
        '"a@b.co"',
        '"ab@cd.ef"',
        ("/maxLength", "maxLength", CHECKED),
    ),
    (
        "multipleOf_number",
        {"type": "number", "multipleOf": 0.5},
        True,
        "1.5",
        "1.3",
        ("/multipleOf", "multipleOf", CHECKED),
    ),
    (
        "multipleOf_one_sided_range",
        {"type": "integer", "multipleOf": 5, "minimum": 5},
        True,
        "10",
        "7",
        ("/multipleOf", "multipleOf", CHECKED),
    ),
    # xgrammar ignores a divisor that is not whole under type integer (llguidance writes multiples of 5)
    (
        "multipleOf_fractional_divisor",
        {"type": "integer", "multipleOf": 2.5},
        True,
        "5",
        "3",
        ("/multipleOf", "multipleOf", CHECKED),
    ),
    # 0.01 is no binary fraction: jsonschema's float division refuses the exact multiple 19.99, which
    # llguidance's decimal mask would write, so neither engine takes it (tests/grammar/validation/test_llguidance_fidelity.py)
    (
        "multipleOf_not_a_binary_fraction",
        {"type": "number", "multipleOf": 0.01},
        True,
        "19.75",
        "19.99",
        ("/multipleOf", "multipleOf", CHECKED),
    ),
    (
        "uniqueItems_bounded_strings",
        {"type": "array", "items": {"type": "string", "maxLength": 1}, "uniqueItems": True},
        True,
        '["a","b"]',
        '["a","a"]',
        ("/uniqueItems", "uniqueItems", CHECKED),
    ),
    # object items are steered only where every property is a scalar (a nested object is not)
    (
        "uniqueItems_nested_object_items",
        {
            "type": "array",
            "items": {"type": "object", "properties": {"o": {"type": "object", "properties": OBJ_AB}}},
            "uniqueItems": True,
        },
        True,
        '[{"o":{"a":1}},{"o":{"a":2}}]',
        '[{"o":{"a":1}},{"o":{"a":1}}]',
        ("/uniqueItems", "uniqueItems", CHECKED),
    ),
    (
        "contains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}},
        True,
        "[5]",
        "[1]",
        ("/contains", "contains", CHECKED),
    ),
    (
        "minContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}, "minContains": 2},
        True,
        "[5,5]",
        "[1,1]",
        ("/minContains", "minContains", CHECKED),
    ),
    (
        "maxContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}, "maxContains": 1},
        True,
        "[5]",
        "[5,5]",
        ("/maxContains", "maxContains", CHECKED),
    ),
    ("not", {"type": "integer", "not": {"const": 3}}, True, "1", "3", ("/not", "not", CHECKED)),
    (
        "if_then",
        {
            "type": "object",
            "properties": OBJ_AB,
            "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
            "then": {"required": ["b"]},
        },
        True,
        '{"a":1,"b":1}',
        '{"a":1}',
        ("/if", "if", CHECKED),
    ),
    # the dependent is declared before its trigger: once "a" is written, the grammar cannot go back for "b"
    (
        "dependentRequired_dependent_first",
        {
            "type": "object",
            "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        True,
        '{"b":1,"a":1}',
        '{"a":1}',
        ("/dependentRequired", "dependentRequired", CHECKED),
    ),
    (
        "dependentRequired_open_object",
        {"type": "object", "properties": OBJ_AB, "dependentRequired": {"a": ["b"]}},
        False,
        '{"a":1,"b":1}',
        '{"a":1}',
        ("/dependentRequired", "dependentRequired", CHECKED),
    ),
    (
        "dependentSchemas",
        {"type": "object", "properties": OBJ_AB, "dependentSchemas": {"a": {"required": ["b"]}}},
        True,
        '{"a":1,"b":1}',
        '{"a":1}',
        ("/dependentSchemas", "dependentSchemas", CHECKED),
    ),
    (
        "patternProperties",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^x": {"type": "integer"}}},
        False,
        '{"a":1,"x1":1}',
        '{"a":1,"x1":"a"}',
        ("/patternProperties", "patternProperties", CHECKED),
    ),
    # (an allOf of plain branches is merged into one schema, grammar/rewrites/all_of.py: a branch that is
    # not plain is left out of xgrammar's mask)
    (
        "allOf_two_branches",
        {"allOf": [{"type": "integer"}, {"anyOf": [{"minimum": 2}, {"maximum": -2}]}]},
        True,
        "2",
        "1",
        ("/allOf", "allOf", CHECKED),
    ),
    (
        "oneOf_overlapping",
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        True,
        "1.5",
        "1",
        ("/oneOf", "oneOf", CHECKED),
    ),
    # (keywords beside an anyOf of plain branches are merged into them: here one branch is not plain)
    (
        "type_beside_anyOf",
        {"type": "integer", "anyOf": [{"minimum": 2}, {"if": {"minimum": 5}, "then": {"maximum": 9}}]},
        True,
        "3",
        '"a"',
        ("/type", "type", CHECKED),
    ),
    (
        "minimum_beside_ref",
        {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x", "minimum": 3},
        True,
        "3",
        "1",
        ("/minimum", "minimum", CHECKED),
    ),
    # (keywords beside an allOf are merged with its plain branches unless one of them is not plain)
    (
        "minimum_beside_allOf",
        {"type": "integer", "minimum": 0, "not": {"const": 5}, "allOf": [{"not": {"const": 6}}]},
        True,
        "2",
        "-1",
        ("/minimum", "minimum", CHECKED),
    ),
    # an optional property no listed value fits, in an object strict mode is not known to close
    # (only the root is: grammar/rewrites/listed_values.py): not left out
    (
        "type_beside_enum_nested",
        {
            "type": "object",
            "required": ["o"],
            "properties": {"o": {"type": "object", "properties": {"a": {"type": "boolean", "enum": ["x"]}}}},
        },
        True,
        '{"o":{}}',
        '{"o":{"a":"x"}}',
        ("/properties/o/properties/a/type", "type", CHECKED),
    ),
    (
        "required_undeclared",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
        False,
        '{"a":1,"b":1}',
        '{"a":1}',
        ("/required", "required", CHECKED),
    ),
    ("minLength_without_type", {"minLength": 2}, True, '"ab"', '"a"', ("/minLength", "minLength", CHECKED)),
    ("minimum_without_type", {"minimum": 3}, True, "3", "2", ("/minimum", "minimum", CHECKED)),
    (
        "unevaluatedProperties_not_strict",
        {"type": "object", "properties": OBJ_AB, "unevaluatedProperties": False},
        False,
        '{"a":1}',
        '{"a":1,"c":1}',
        ("/unevaluatedProperties", "unevaluatedProperties", CHECKED),
    ),
    ("format_regex", {"type": "string", "format": "regex"}, True, '"a+"', '"("', ("/format", "format", CHECKED)),
]


def _not_masked(report) -> set[tuple[str, str, str]]:
    return {(k.pointer, k.keyword, k.status) for k in report.not_masked}


@pytest.mark.parametrize("name,schema,strict,valid,violating", ENFORCED_CASES, ids=[c[0] for c in ENFORCED_CASES])
def test_enforced_keywords_are_masked(name, schema, strict, valid, violating):
    report = schema_fidelity(schema, strict=strict)
    assert _not_masked(report) == set() and report.guaranteed
    assert schema_accepts(schema, valid) and grammar_accepts(schema, valid, strict)
    assert not schema_accepts(schema, violating)
    assert not grammar_accepts(schema, violating, strict)  # the mask refuses the violation


@pytest.mark.parametrize(
    "name,schema,strict,valid,violating,expected", NOT_MASKED_CASES, ids=[c[0] for c in NOT_MASKED_CASES]
)
def test_keywords_reported_not_masked_are_really_not_masked(name, schema, strict, valid, violating, expected):
    report = schema_fidelity(schema, strict=strict)
    assert expected in _not_masked(report)
    assert not report.guaranteed and expected[:2] in {(k.pointer, k.keyword) for k in report.refused_in_strict}
    assert schema_accepts(schema, valid) and grammar_accepts(schema, valid, strict)
    assert not schema_accepts(schema, violating)  # jsonschema detects it: "checked"
    assert grammar_accepts(schema, violating, strict)  # ... but the mask lets it through


def test_a_format_neither_masked_nor_checkable_is_unenforced():
    schema = {"type": "string", "format": "phone"}
    report = schema_fidelity(schema)
    assert _not_masked(report) == {("/format", "format", UNENFORCED)}
    assert grammar_accepts(schema, '"not a phone"') and schema_accepts(schema, '"not a phone"')


def test_open_objects_report_the_duplicate_key_risk_the_grammar_really_has():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    # the grammar alone repeats names; the value check (tests/grammar/checks/test_value_check.py) masks them out
    assert grammar_accepts(schema, '{"b":1,"b":2}')
    assert _not_masked(schema_fidelity(schema, value_check=False)) == {("", DUPLICATE_KEYS, CHECKED)}
    report = schema_fidelity(schema)
    assert report.guaranteed and report.refused_in_strict == ()
    names = next(k for k in report.keywords if k.keyword == DUPLICATE_KEYS)
    assert (names.status, names.engine) == (ENFORCED, VALUE_CHECK)
    assert names.as_dict()["engine"] == VALUE_CHECK and "value check" in names.reason
    # names limited by propertyNames may have no way on once used: only checked
    limited = {"type": "object", "propertyNames": {"enum": ["a", "b"]}}
    assert ("", DUPLICATE_KEYS, CHECKED) in _not_masked(schema_fidelity(limited))
    # declared names are never repeated, and strict mode closes objects that declare properties
    declared = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert schema_fidelity(declared, strict=True).guaranteed
    assert not grammar_accepts(declared, '{"a":1,"a":2}', strict=False)
    assert ("", DUPLICATE_KEYS, CHECKED) in _not_masked(schema_fidelity(declared, strict=False, value_check=False))


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
    assert ("", DUPLICATE_KEYS, CHECKED) in _not_masked(schema_fidelity(schema, strict=True, value_check=False))
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
    assert ("/0/function/parameters/properties/x/uniqueItems", "uniqueItems", CHECKED) in _not_masked(report)


def test_pointers_are_nested_and_escaped():
    schema = {
        "type": "object",
        "properties": {"a/b": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}},
        "required": ["a/b"],
    }
    assert _not_masked(schema_fidelity(schema)) == {("/properties/a~1b/contains", "contains", CHECKED)}


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
    assert ("/0/function/parameters/properties/x/uniqueItems", "uniqueItems", CHECKED) in _not_masked(report)
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


# The corpus schemas the report says strict mode cannot guarantee, with the keywords why. The
# constrained-decoding e2e test (test_grammar_e2e.py) derives its allowance from the report, so this
# explicit list is what keeps that allowance from growing unnoticed.
EXPECTED_CORPUS_REFUSALS = {
    # (allof_base_and_extension left this list: its allOf compiles as the one object it equals)
    # xgrammar's own report; the schema is compiled by llguidance (tests/grammar/rewrites/test_conditionals.py), which
    # enforces the branches, their `pattern` without a declared type included
    "if_then_else_country_postal": {"if", "then", "else", "pattern"},
    "numeric_bounds_sensor": {"multipleOf"},
    "pattern_properties_env_vars": {"patternProperties"},
    "survey_response": {"oneOf"},
}


def test_corpus_refusals_are_the_expected_ones():
    refused = json.loads((DATA / "schema_corpus_refusals.json").read_text())
    found = {}
    for path in sorted((DATA / "schema_corpus").glob("*.json")):
        if path.stem in refused:
            continue
        report = schema_fidelity(json.loads(path.read_text()))
        if report.refused_in_strict:
            found[path.stem] = {k.keyword for k in report.refused_in_strict}
    assert found == EXPECTED_CORPUS_REFUSALS
