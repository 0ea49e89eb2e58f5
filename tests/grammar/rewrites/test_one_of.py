"""`oneOf` as the `anyOf` it equals (grammar/rewrites/one_of.py): the exclusive branches accept exactly what
the `oneOf` accepts, on instances of every JSON type; both engines' masks refuse a value that
matches two branches; what cannot be proved is left alone (and stays refused in strict mode)."""

from __future__ import annotations

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.rewrites.one_of import exclusive_branches, lower_one_of
from grammar.validation.fidelity import ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity, schema_fidelity
from tests.grammar.validation.fidelity_cases import grammar_accepts
from tests.grammar.validation.test_llguidance_fidelity import writes

INT_OR_STRING = {"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]}  # Kubernetes'
QUANTITY = {"oneOf": [{"type": ["string", "null"]}, {"type": ["number", "null"]}]}
SAMPLES = [
    None,
    True,
    False,
    0,
    3,
    -2,
    1.5,
    "",
    "a",
    "12",
    [],
    [1],
    ["a", 2],
    {},
    {"a": 1},
    {"kind": "a"},
    {"a": 1, "kind": "b"},
    {"a": 1, "x": 2},
    {"a": 1, "x": 2, "kind": "a"},
    {"x": 1, "kind": "a"},
]

PROVED = [
    INT_OR_STRING,
    QUANTITY,
    {"oneOf": [{"type": "string", "minLength": 2}, {"type": "integer", "minimum": 0}]},  # distinct types
    {"oneOf": [{"type": ["string", "null"], "minLength": 1}, {"type": ["array", "null"], "items": {}}]},
    {"oneOf": [{"description": "any"}, {"type": "string"}]},  # strings match both: everything else is valid
    {"oneOf": [{"type": ["boolean", "null"]}, {"type": "null"}]},  # the second branch is only overlap
    {"oneOf": [{"const": 1}, {"const": "a"}]},
    {
        "oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]},
        ]
    },
    # SchemaStore's forms: a branch that is a $ref is judged by its definition, listed values by
    # their types, a nested anyOf by its branches' types
    {"oneOf": [{"type": "string"}, {"$ref": "#/$defs/x"}], "$defs": {"x": {"type": "integer", "minimum": 2}}},
    {
        "oneOf": [{"type": "boolean"}, {"$ref": "#/definitions/s", "description": "a name"}],
        "definitions": {"s": {"type": "string", "pattern": "^[a-z]+$"}},
    },
    {"oneOf": [{"enum": ["a", "b"]}, {"type": "array", "items": {"type": "string"}}]},
    {"oneOf": [{"enum": [1, 2.5]}, {"type": "string"}]},
    {"oneOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "object"}]},
    # exactly one of the names (a third branch whose names hold another's never matches alone)
    {"oneOf": [{"required": ["a"]}, {"required": ["kind"], "description": "by kind"}]},
    {"oneOf": [{"required": ["a"]}, {"required": ["kind"]}, {"required": ["a", "kind"]}]},
    {"oneOf": [{"required": ["a", "x"]}, {"required": ["a", "kind"]}]},
    {
        "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        "$defs": {
            "a": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            "b": {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]},
        },
    },
]
NOT_PROVED = [
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},  # leaves fractions only: not a type
    {"oneOf": [{"type": "string", "minLength": 2}, {"type": "string"}]},  # shared and constrained
    {"oneOf": [{"type": ["string", "null"]}, {"enum": [None, 1]}]},  # enum constrains every type
    # null matches both, but the referenced branch would have to be narrowed: not rewritten
    {"oneOf": [{"$ref": "#/$defs/sn"}, {"type": ["integer", "null"]}], "$defs": {"sn": {"type": ["string", "null"]}}},
    {"oneOf": [{"enum": ["a"]}, {"type": "string"}]},  # "a" matches both, and the enum constrains strings
    {"oneOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "integer"}]},  # shared, constrained
    {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]},  # beside a type
    {"oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},  # "not both a and b" is a disjunction
    {"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}], "anyOf": [{}]},  # beside anyOf
]


@pytest.mark.parametrize("schema", PROVED)
def test_the_exclusive_branches_accept_exactly_what_the_one_of_accepts(schema):
    lowered = lower_one_of(schema)
    assert "oneOf" not in lowered and "anyOf" in lowered
    branches = lowered["anyOf"]
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}  # what a branch's $ref resolves in
    for value in SAMPLES:
        original = jsonschema.Draft202012Validator(schema).is_valid(value)
        matching = sum(jsonschema.Draft202012Validator({**b, **defs}).is_valid(value) for b in branches)
        assert matching <= 1, (value, branches)  # pairwise disjoint
        assert original == (matching == 1), value


@pytest.mark.parametrize("schema", NOT_PROVED)
def test_what_cannot_be_proved_is_left_alone_and_refused(schema):
    if "anyOf" not in schema:
        assert exclusive_branches(schema["oneOf"], schema) is None
    assert lower_one_of(schema) == schema
    assert "oneOf" in {k.keyword for k in routed_schema_fidelity(schema).refused_in_strict}


def test_the_kubernetes_int_or_string_is_split_by_type():
    assert exclusive_branches(INT_OR_STRING["oneOf"]) == [{"type": "string"}, {"type": "integer"}]
    assert exclusive_branches(QUANTITY["oneOf"]) == [{"type": "string"}, {"type": "number"}]


@pytest.mark.parametrize("schema", [INT_OR_STRING, QUANTITY])
def test_xgrammar_refuses_the_value_both_branches_match(schema):
    report = schema_fidelity(schema)
    assert report.guaranteed and routed_schema_fidelity(schema).engine == XGRAMMAR
    for text in ('"a"', "12"):
        assert grammar_accepts(schema, text)
    assert not grammar_accepts(schema, "null")  # both branches match it: not valid
    assert grammar_accepts(QUANTITY, "1.5") and not grammar_accepts(INT_OR_STRING, "1.5")


def test_keywords_beside_an_exclusive_one_of_go_to_llguidance(service, tokenizer):
    # minLength beside the oneOf: xgrammar drops it, llguidance enforces it on the lowered anyOf
    schema = {"type": "object", "required": ["q"], "properties": {"q": {**INT_OR_STRING, "minLength": 2}}}
    report = routed_schema_fidelity(schema)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    verdict = {k.pointer: k for k in report.keywords}["/properties/q/minLength"]
    assert (verdict.status, verdict.engine) == (ENFORCED, LLGUIDANCE)
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"q":"ab"}') and writes(handle, tokenizer, '{"q":7}')
    assert not writes(handle, tokenizer, '{"q":null}')  # matches both branches
    assert not writes(handle, tokenizer, '{"q":"a"}')  # minLength
    assert not writes(handle, tokenizer, '{"q":1.5}')


def test_the_service_compiles_the_lowered_one_of_with_xgrammar(service, tokenizer):
    schema = {"type": "object", "required": ["port"], "properties": {"port": INT_OR_STRING}}
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert not isinstance(handle, LLGuidanceHandle) and handle.fidelity.refused_in_strict == ()
    assert writes(handle, tokenizer, '{"port":8080}') and writes(handle, tokenizer, '{"port":"http"}')
    assert not writes(handle, tokenizer, '{"port":null}')


def test_a_one_of_with_a_referenced_branch_is_enforced_by_xgrammar(service, tokenizer):
    # SchemaStore's "a step is a command string or a step object"
    schema = {
        "type": "object",
        "required": ["step"],
        "properties": {"step": {"oneOf": [{"type": "string"}, {"$ref": "#/$defs/step"}]}},
        "$defs": {"step": {"type": "object", "properties": {"run": {"type": "string"}}, "required": ["run"]}},
    }
    report = routed_schema_fidelity(schema)
    assert report.engine == XGRAMMAR and report.refused_in_strict == ()
    verdict = {k.pointer: k for k in report.keywords}["/properties/step/oneOf"]
    assert verdict.status == ENFORCED
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert writes(handle, tokenizer, '{"step":"make"}') and writes(handle, tokenizer, '{"step":{"run":"ls"}}')
    assert not writes(handle, tokenizer, '{"step":{}}') and not writes(handle, tokenizer, '{"step":1}')


def test_exactly_one_of_two_names_goes_to_llguidance_and_its_mask_keeps_it(service, tokenizer):
    schema = {
        "type": "object",
        "properties": {"url": {"type": "string"}, "path": {"type": "string"}, "timeout": {"type": "integer"}},
        "oneOf": [{"required": ["url"]}, {"required": ["path"]}],
    }
    report = routed_schema_fidelity(schema)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"url":"http://a","timeout":3}') and writes(handle, tokenizer, '{"path":"/a"}')
    assert not writes(handle, tokenizer, '{"url":"http://a","path":"/a"}')  # both: matches two branches
    assert not writes(handle, tokenizer, '{"timeout":3}')  # neither
