"""`not` that says which names are absent (grammar/rewrites/negation.py): each form equals the schema it is
rewritten to on every instance, clashes are left as written, strict mode routes these schemas to
llguidance with the `not` enforced, its masks refuse the forbidden names, and a `not` about values
stays refused."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.rewrites.negation import lower_negations, negation
from grammar.validation.fidelity import CHECKED, ENFORCED, LLGUIDANCE, routed_schema_fidelity
from tests.grammar.validation.test_pattern_properties import masked_writes

INSTANCES = [None, True, 1, 2.5, "s", [], [1], {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"c": 1}, {"a": "x", "c": 1}]

# (not's value, what it is rewritten to)
FORMS = [
    ({}, False),
    (True, False),
    ({"description": "never"}, False),
    (False, {}),
    ({"required": ["a"]}, {"type": "object", "properties": {"a": False}}),
    ({"type": "object", "required": ["a"]}, {"properties": {"a": False}}),
    ({"required": ["a"], "properties": {"a": True}}, {"type": "object", "properties": {"a": False}}),
    (
        {"type": "object", "required": ["a", "b"]},
        {
            "anyOf": [
                {"properties": {"a": False}, "additionalProperties": True},
                {"properties": {"b": False}, "additionalProperties": True},
            ]
        },
    ),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"type": "object", "properties": {"a": False, "b": False}}),
    (
        {"anyOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]},
        {"properties": {"a": False, "b": False}},
    ),
    (
        {"allOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {
            "type": "object",
            "anyOf": [
                {"properties": {"a": False}, "additionalProperties": True},
                {"properties": {"b": False}, "additionalProperties": True},
            ],
        },
    ),
]
# about values, or several names in one anyOf branch: not written as absent names
LEFT_AS_WRITTEN = [
    {"required": ["a"], "properties": {"a": {"type": "string"}}},
    {"enum": [1, 2]},
    {"type": "string"},
    {"type": "array", "required": ["a"]},
    {"anyOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
    {"required": []},
]


@pytest.mark.parametrize("not_value,expected", FORMS, ids=[json.dumps(f[0]) for f in FORMS])
def test_each_form_is_rewritten_to_a_schema_equal_on_every_instance(not_value, expected):
    assert negation(not_value) == expected
    original, rewritten = jsonschema.Draft202012Validator({"not": not_value}), jsonschema.Draft202012Validator(expected)
    assert [original.is_valid(i) for i in INSTANCES] == [rewritten.is_valid(i) for i in INSTANCES]
    assert any(original.is_valid(i) for i in INSTANCES) != (expected is False)  # the instances tell them apart


@pytest.mark.parametrize("not_value", LEFT_AS_WRITTEN, ids=json.dumps)
def test_value_forms_are_not_rewritten(not_value):
    assert negation(not_value) is None
    node = {"type": "object", "not": not_value}
    assert lower_negations(node) == node


def test_the_rewrite_merges_into_its_node_or_leaves_a_clash_alone():
    declared = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "not": {"required": ["b"]},
    }
    # a declared name becomes absent in place; a node declaring names keeps strict mode's closing
    assert lower_negations(declared) == {"type": "object", "properties": {"a": {"type": "string"}, "b": False}}
    # a node without names of its own stays open: it only says which names are absent
    assert lower_negations({"not": {"required": ["b"]}}) == {
        "type": "object",
        "additionalProperties": True,
        "properties": {"b": False},
    }
    clash = {"anyOf": [{"required": ["a"]}, {"required": ["c"]}], "not": {"type": "object", "required": ["a", "b"]}}
    assert lower_negations(clash) == clash  # a second anyOf: left to the engines, which refuse it
    assert lower_negations({"type": "string", "not": {"required": ["a"]}}) is False  # no string is an object
    assert lower_negations({"properties": {"deployment": {"not": {}}}}) == {"properties": {"deployment": False}}
    # every rewrite still validates like the original
    for node in (declared, {"type": ["object", "null"], "not": {"required": ["a"]}}):
        before, after = jsonschema.Draft202012Validator(node), jsonschema.Draft202012Validator(lower_negations(node))
        assert [before.is_valid(i) for i in INSTANCES] == [after.is_valid(i) for i in INSTANCES]


ARRAY = {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}
# GitHub workflows' push trigger: branches or branches-ignore, not both
TRIGGER = {
    "type": "object",
    "properties": {"branches": ARRAY, "branches-ignore": ARRAY, "tags": ARRAY},
    "allOf": [{"not": {"type": "object", "required": ["branches", "branches-ignore"]}}],
}
# GitLab CI inputs: neither options nor default where a regex is given (here: always)
INPUT = {
    "type": "object",
    "properties": {
        "regex": {"type": "string", "maxLength": 8},
        "options": ARRAY,
        "default": {"type": "string", "maxLength": 8},
    },
    "required": ["regex"],
    "not": {"anyOf": [{"required": ["options"]}, {"required": ["default"]}]},
}
# Bitbucket's final step: a deployment is never allowed there
FINAL = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "deployment": {"not": {}}},
    "required": ["name"],
}


@pytest.mark.parametrize(
    "schema,pointer",
    [(TRIGGER, "/allOf/0/not"), (INPUT, "/not"), (FINAL, "/properties/deployment/not")],
    ids=["trigger", "input", "final"],
)
def test_strict_routes_name_negations_to_llguidance_enforced(schema, pointer):
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    verdict = {k.pointer: k for k in report.keywords}[pointer]
    assert (verdict.keyword, verdict.status, verdict.engine) == ("not", ENFORCED, LLGUIDANCE)


def test_a_negation_about_values_stays_refused():
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "string"}},
        "not": {"required": ["tags"], "properties": {"tags": {"const": "x"}}},
    }
    report = routed_schema_fidelity(schema, strict=True)
    assert [(k.pointer, k.status) for k in report.refused_in_strict] == [("/not", CHECKED)]


def test_llguidance_masks_refuse_the_absent_names(service, tokenizer):
    cases = [
        (
            TRIGGER,
            ['{"branches":["main"]}', '{"branches-ignore":["dev"],"tags":["v1"]}', "{}"],
            ['{"branches":["main"],"branches-ignore":["dev"]}'],
        ),
        (INPUT, ['{"regex":"a+"}'], ['{"regex":"a+","options":["a"]}', '{"regex":"a+","default":"a"}']),
        (FINAL, ['{"name":"ship"}'], ['{"name":"ship","deployment":"prod"}', '{"name":"ship","deployment":{}}']),
    ]
    for schema, allowed, refused in cases:
        handle = service.compile(GrammarSpec("json_schema", schema, True))
        assert isinstance(handle, LLGuidanceHandle)
        validator = jsonschema.Draft202012Validator(schema)
        for text in allowed:
            assert validator.is_valid(json.loads(text)) and masked_writes(handle, tokenizer, text), text
        for text in refused:
            assert not validator.is_valid(json.loads(text)) and not masked_writes(handle, tokenizer, text), text
