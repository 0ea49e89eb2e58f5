"""What the fidelity report's tests share: a grammar check against real xgrammar and
the cases the report says are not masked (the llguidance and gateway fidelity tests run them too)."""

from __future__ import annotations

import xgrammar as xgr

from grammar.engines.xgrammar.schema import compact_json_schema_ebnf
from grammar.validation.fidelity import CHECKED

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)  # strings only, no vocabulary


def grammar_accepts(schema: dict, text: str, strict: bool = True) -> bool:
    """Does the grammar Jumpgate compiles for `schema` admit exactly `text`?"""
    compiled = COMPILER.compile_grammar(compact_json_schema_ebnf(schema, strict=strict))
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


OBJ_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}

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


def not_masked(report) -> set[tuple[str, str, str]]:
    return {(k.pointer, k.keyword, k.status) for k in report.not_masked}
