"""The keyword table: each JSON Schema keyword, how it is kept, under which condition, by which module.

One row per way a keyword is kept, each with a small schema in which it is kept that way. The rows
are data the fidelity report is held to: tests/grammar/validation/test_keywords.py classifies every
example with `spec_fidelity` and fails where the report says otherwise, and docs/keywords.md is
generated from this table (`python -m grammar.validation.keywords > docs/keywords.md`; a test fails
when the file is stale). Means: `xgrammar` / `llguidance` (the engine's token mask), `value_check`
(Jumpgate's mask over names and items), `check_and_rollback` (the finished value checked, a failing
one rewritten), `unenforced` (refused in strict mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeywordRow:
    keywords: str  # what the row covers, as the docs name it
    kept_by: str  # xgrammar | llguidance | value_check | check_and_rollback | unenforced
    condition: str  # when this row applies ("" : always)
    module: str  # where it is done
    example: dict[str, Any]  # a schema in which the keyword is kept this way
    pointer: str  # the keyword's JSON pointer in `example`
    keyword: str  # the keyword at `pointer`, as the fidelity report names it


def _obj(name: str, schema: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {name: schema}, "required": [name], **more}


OBJECT_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

KEYWORD_TABLE: tuple[KeywordRow, ...] = (
    KeywordRow(
        "`type`, `properties`, `required`",
        "xgrammar",
        "",
        "grammar/engines/xgrammar/schema.py",
        OBJECT_A,
        "/required",
        "required",
    ),
    KeywordRow(
        "`enum`, `const`",
        "xgrammar",
        "listed values that break the keywords beside them are left out first",
        "grammar/rewrites/listed_values.py",
        _obj("c", {"type": "string", "enum": ["a", "b"]}),
        "/properties/c/enum",
        "enum",
    ),
    KeywordRow(
        "`items`, `minItems`, `maxItems`",
        "xgrammar",
        "",
        "grammar/engines/xgrammar/schema.py",
        _obj("l", {"type": "array", "items": {"type": "integer"}, "maxItems": 3}),
        "/properties/l/maxItems",
        "maxItems",
    ),
    KeywordRow(
        "`additionalProperties`, `propertyNames`",
        "xgrammar",
        "",
        "grammar/engines/xgrammar/schema.py",
        {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "integer"}}},
        "/additionalProperties",
        "additionalProperties",
    ),
    KeywordRow(
        "`minLength`, `maxLength`",
        "xgrammar",
        "under a declared `type`, without `pattern` or `format`",
        "grammar/engines/xgrammar/schema.py",
        _obj("s", {"type": "string", "maxLength": 8}),
        "/properties/s/maxLength",
        "maxLength",
    ),
    KeywordRow(
        "`pattern`",
        "xgrammar",
        "alone, without lookaheads",
        "grammar/engines/xgrammar/schema.py",
        _obj("s", {"type": "string", "pattern": "^[a-z]+$"}),
        "/properties/s/pattern",
        "pattern",
    ),
    KeywordRow(
        "`minimum`, `maximum`",
        "xgrammar",
        "under a declared `type`",
        "grammar/engines/xgrammar/schema.py",
        _obj("n", {"type": "integer", "minimum": 0, "maximum": 9}),
        "/properties/n/minimum",
        "minimum",
    ),
    KeywordRow(
        "`multipleOf`",
        "xgrammar",
        "a whole divisor of integers",
        "grammar/engines/xgrammar/schema.py",
        _obj("n", {"type": "integer", "multipleOf": 5}),
        "/properties/n/multipleOf",
        "multipleOf",
    ),
    KeywordRow(
        "`format`",
        "xgrammar",
        "date, time, date-time, email, uri, uuid, ... (`byte`, `ipv4`, `ipv6`, `date` as exact patterns)",
        "grammar/rewrites/formats.py",
        _obj("d", {"type": "string", "format": "date"}),
        "/properties/d/format",
        "format",
    ),
    KeywordRow(
        "`anyOf`, `$ref`",
        "xgrammar",
        "",
        "grammar/engines/xgrammar/schema.py",
        _obj("v", {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
        "/properties/v/anyOf",
        "anyOf",
    ),
    KeywordRow(
        "`oneOf`",
        "xgrammar",
        "branches that exclude each other (JSON type, listed values, a discriminator, "
        '"exactly one of these names"), as the equal `anyOf`',
        "grammar/rewrites/one_of.py",
        _obj("v", {"oneOf": [{"type": "string"}, {"type": "integer"}]}),
        "/properties/v/oneOf",
        "oneOf",
    ),
    KeywordRow(
        "`allOf`",
        "xgrammar",
        "branches (and the keywords beside it) that merge into one schema: type, "
        "properties, required, bounds, value keywords one branch says",
        "grammar/rewrites/all_of.py",
        {"allOf": [OBJECT_A, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
        "/allOf",
        "allOf",
    ),
    KeywordRow(
        "keywords beside `anyOf`",
        "xgrammar",
        "where they merge into every branch",
        "grammar/rewrites/all_of.py",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["a"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            "anyOf": [{"required": ["b"]}, {"required": ["c"]}],
        },
        "/anyOf",
        "anyOf",
    ),
    KeywordRow(
        "`minLength` / `maxLength` beside `pattern`",
        "llguidance",
        "",
        "grammar/engines/llguidance/schema.py",
        _obj("s", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}),
        "/properties/s/maxLength",
        "maxLength",
    ),
    KeywordRow(
        "`multipleOf`",
        "llguidance",
        "a binary fraction (0.5) on numbers",
        "grammar/engines/llguidance/schema.py",
        _obj("n", {"type": "number", "multipleOf": 0.5}),
        "/properties/n/multipleOf",
        "multipleOf",
    ),
    KeywordRow(
        "`allOf`",
        "llguidance",
        "branches that do not merge into one schema",
        "grammar/engines/llguidance/schema.py",
        {"allOf": [{"type": "integer"}, {"anyOf": [{"minimum": 2}, {"maximum": -2}]}]},
        "/allOf",
        "allOf",
    ),
    KeywordRow(
        "`pattern`",
        "llguidance",
        "opening with lookaheads (`^(?!@@)[a-z@]+$`), as a regex intersection",
        "grammar/rewrites/string_algebra.py",
        _obj("s", {"type": "string", "pattern": "^(?!@@)[a-z@]+$"}),
        "/properties/s/pattern",
        "pattern",
    ),
    KeywordRow(
        "`not`",
        "llguidance",
        "saying which names are absent (`not: {required: [x]}`)",
        "grammar/rewrites/negation.py",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "not": {"required": ["b"]},
        },
        "/not",
        "not",
    ),
    KeywordRow(
        "`if` / `then` / `else`",
        "llguidance",
        "on a discriminator (a listed property), as the `anyOf` it means",
        "grammar/rewrites/conditionals.py",
        {
            "type": "object",
            "required": ["kind"],
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
        },
        "/then",
        "then",
    ),
    KeywordRow(
        "`patternProperties`",
        "llguidance",
        "patterns no name can match two of",
        "grammar/engines/llguidance/schema.py",
        {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}},
        "/patternProperties",
        "patternProperties",
    ),
    KeywordRow(
        "`uniqueItems`",
        "value_check",
        "over free strings, unbounded numbers, listed values, or closed objects of such properties",
        "grammar/checks/value_check.py",
        _obj("l", {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        "/properties/l/uniqueItems",
        "uniqueItems",
    ),
    KeywordRow(
        "`dependentRequired`",
        "value_check",
        "in an object of declared names (also draft-7 `dependencies`, or `if` one name `then` others)",
        "grammar/checks/value_rules.py",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        "/dependentRequired",
        "dependentRequired",
    ),
    KeywordRow(
        "repeated names (`duplicate keys`)",
        "value_check",
        "in free-form objects, `json_object`, "
        "`additionalProperties`, `patternProperties`, tool-call arguments, at any depth",
        "grammar/checks/value_check.py",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        "",
        "duplicate keys",
    ),
    KeywordRow(
        "`patternProperties`",
        "check_and_rollback",
        "a name pattern with lookaheads (`^(?!x-)[a-z-]+$`): the grammar writes names by the pattern without them",
        "grammar/checks/rollback.py",
        {
            "type": "object",
            "patternProperties": {"^(?!x-)[a-z-]+$": {"type": "integer"}},
            "additionalProperties": False,
        },
        "/patternProperties",
        "patternProperties",
    ),
    KeywordRow(
        "`contains`",
        "check_and_rollback",
        "",
        "grammar/checks/rollback.py",
        _obj("l", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}),
        "/properties/l/contains",
        "contains",
    ),
    KeywordRow(
        "`if` / `then` / `else`",
        "check_and_rollback",
        "on values (not a discriminator)",
        "grammar/checks/rollback.py",
        _obj("n", {"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 9}}),
        "/properties/n/then",
        "then",
    ),
    KeywordRow(
        "`oneOf`",
        "check_and_rollback",
        "branches that may overlap",
        "grammar/checks/rollback.py",
        _obj("v", {"oneOf": [{"type": "integer"}, {"type": "number"}]}),
        "/properties/v/oneOf",
        "oneOf",
    ),
    KeywordRow(
        "`format`",
        "unenforced",
        "one jsonschema cannot check (`simple-template`): refused in strict mode",
        "grammar/validation/fidelity_scalars.py",
        _obj("t", {"type": "string", "format": "simple-template"}),
        "/properties/t/format",
        "format",
    ),
)


def markdown() -> str:
    """docs/keywords.md."""
    lines = [
        "# JSON Schema keywords: how each is kept",
        "",
        "Generated from `grammar/validation/keywords.py` (`python -m grammar.validation.keywords > docs/keywords.md`);",
        "each row's example schema is classified by the fidelity report in the tests, so the table and the code",
        "cannot drift. What the means are: [structured-output.md](structured-output.md).",
        "",
        "| keyword | kept by | when | where |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r.keywords} | {r.kept_by} | {r.condition or 'always'} | `{r.module}` |" for r in KEYWORD_TABLE]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
