"""The fidelity report (grammar/validation/fidelity.py) against real xgrammar, case by case: a keyword
reported `enforced` has its violating instance refused by the compiled grammar; a keyword reported
`checked` or `unenforced` has a violating instance that the grammar lets through and jsonschema
refuses. Each case also checks that a valid instance passes both, so no case is vacuous. And the
corpus schemas the report says strict mode cannot guarantee."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grammar.validation.fidelity import UNENFORCED, schema_fidelity
from tests.grammar.validation.fidelity_cases import NOT_MASKED_CASES, OBJ_AB, grammar_accepts, not_masked

DATA = Path(__file__).parents[2] / "data"


def schema_accepts(schema: dict, text: str) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(text))


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


@pytest.mark.parametrize("name,schema,strict,valid,violating", ENFORCED_CASES, ids=[c[0] for c in ENFORCED_CASES])
def test_enforced_keywords_are_masked(name, schema, strict, valid, violating):
    report = schema_fidelity(schema, strict=strict)
    assert not_masked(report) == set() and report.guaranteed
    assert schema_accepts(schema, valid) and grammar_accepts(schema, valid, strict)
    assert not schema_accepts(schema, violating)
    assert not grammar_accepts(schema, violating, strict)  # the mask refuses the violation


@pytest.mark.parametrize(
    "name,schema,strict,valid,violating,expected", NOT_MASKED_CASES, ids=[c[0] for c in NOT_MASKED_CASES]
)
def test_keywords_reported_not_masked_are_really_not_masked(name, schema, strict, valid, violating, expected):
    report = schema_fidelity(schema, strict=strict)
    assert expected in not_masked(report)
    assert not report.guaranteed and expected[:2] in {(k.pointer, k.keyword) for k in report.refused_in_strict}
    assert schema_accepts(schema, valid) and grammar_accepts(schema, valid, strict)
    assert not schema_accepts(schema, violating)  # jsonschema detects it: "checked"
    assert grammar_accepts(schema, violating, strict)  # ... but the mask lets it through


def test_a_format_neither_masked_nor_checkable_is_unenforced():
    schema = {"type": "string", "format": "phone"}
    report = schema_fidelity(schema)
    assert not_masked(report) == {("/format", "format", UNENFORCED)}
    assert grammar_accepts(schema, '"not a phone"') and schema_accepts(schema, '"not a phone"')


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
