"""JSON schema checks that run before compiling, so a bad schema is refused with what is wrong
and where.

Schemas are checked against their meta-schema (draft from `$schema`, 2020-12 by default), then
for what Jumpgate cannot or will not compile: references outside the document, regexes that do
not parse, bounds that no value can satisfy. xgrammar has the last word at compile time (its
errors are mapped in `grammar/service/compile.py`); these checks exist because they can say *where* the
problem is, which xgrammar's messages do not.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import jsonschema
from jsonschema.exceptions import best_match

from grammar.errors import GrammarSpecError, join_pointer
from grammar.rewrites.listed_values import fitting_values
from grammar.rewrites.one_of import admitted_classes
from grammar.schema.limits import check_json_limits
from grammar.schema.walk import iter_subschemas
from grammar.validation.regex_check import validate_regex

DEFAULT_DIALECT = jsonschema.Draft202012Validator


def _dialect_uri(uri: str) -> str:
    """Dialect URIs compared without the trailing '#' and the http/https difference."""
    return uri.rstrip("#").replace("https://", "http://")


_DIALECTS = {
    _dialect_uri(cls.META_SCHEMA.get("$id", cls.META_SCHEMA["$schema"])): cls
    for cls in (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
}
_DIALECTS["http://json-schema.org/schema"] = DEFAULT_DIALECT  # "latest" alias

_MAX_MESSAGE = 300  # a meta-schema message can quote a whole sub-schema; keep refusals readable


def validate_json_schema(
    schema: Any, *, param: str = "response_format", pointer_prefix: str = "", strict: bool = True
) -> None:
    """Raise GrammarSpecError (pointer rooted at `pointer_prefix`) if `schema` cannot be used."""
    try:
        _validate_json_schema(schema, strict=strict)
    except GrammarSpecError as e:
        raise e.with_context(param=param, pointer_prefix=pointer_prefix) from None


def _validate_json_schema(schema: Any, *, strict: bool) -> None:
    if not isinstance(schema, dict):
        raise GrammarSpecError(f"a JSON schema must be an object, got {type(schema).__name__}", "")
    check_json_limits(schema)
    dialect = _dialect_of(schema)
    error = best_match(dialect(dialect.META_SCHEMA).iter_errors(schema))
    if error is not None:
        raise GrammarSpecError(
            f"not a valid JSON schema ({_dialect_name(dialect)}): {_short(error.message)}",
            join_pointer("", *error.absolute_path),
        )
    for node, pointer in iter_subschemas(schema):
        if isinstance(node, dict):
            _check_node(node, pointer, root=schema, strict=strict)
    _check_mandatory_values(schema)


def _dialect_of(schema: dict) -> type:
    uri = schema.get("$schema")
    if uri is None:
        return DEFAULT_DIALECT
    if not isinstance(uri, str):
        raise GrammarSpecError("$schema must be a string URI", "/$schema")
    dialect = _DIALECTS.get(_dialect_uri(uri))
    if dialect is None:
        known = ", ".join(sorted(_DIALECTS))
        raise GrammarSpecError(f"unknown $schema {uri!r}; supported: {known}", "/$schema")
    return dialect


def _dialect_name(dialect: type) -> str:
    return dialect.__name__.removesuffix("Validator")


def _check_node(node: dict, pointer: str, *, root: dict, strict: bool) -> None:
    for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
        if keyword in node:
            _check_ref(node[keyword], keyword, join_pointer(pointer, keyword), root)
    if isinstance(node.get("pattern"), str):
        validate_regex(node["pattern"], param=None, pointer=join_pointer(pointer, "pattern"), leading_lookaheads=True)
    if isinstance(node.get("patternProperties"), dict):
        for name in node["patternProperties"]:
            # a name's pattern may open with lookaheads as a value's may: checked after generation
            validate_regex(
                name, param=None, pointer=join_pointer(pointer, "patternProperties", name), leading_lookaheads=True
            )
    _check_bounds(node, pointer)
    if node.get("enum") == []:
        raise GrammarSpecError("enum is empty, so no value can match", join_pointer(pointer, "enum"))
    _check_required(node, pointer)
    if strict and "contains" in node and "items" not in node and "prefixItems" not in node:
        # strict mode allows no undeclared items, and `contains` alone declares none
        raise GrammarSpecError(
            "in strict mode an array allows only declared items: add 'items' next to 'contains' (or use strict: false)",
            join_pointer(pointer, "contains"),
        )


def _check_ref(ref: Any, keyword: str, pointer: str, root: dict) -> None:
    if keyword != "$ref":
        raise GrammarSpecError(f"{keyword} is not supported; use a local $ref ('#/$defs/...')", pointer)
    if not isinstance(ref, str):
        raise GrammarSpecError("$ref must be a string", pointer)
    if not ref.startswith("#"):
        raise GrammarSpecError(
            f"$ref {ref!r} points outside this schema (remote URLs, files and other documents are "
            "never fetched); put the referenced schema under $defs and use '#/$defs/...'",
            pointer,
        )
    if ref != "#" and not ref.startswith("#/"):
        raise GrammarSpecError(
            f"$ref {ref!r}: anchors are not supported; use a JSON pointer like '#/$defs/...'", pointer
        )
    target: Any = root
    for token in ref[2:].split("/") if ref != "#" else []:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            raise GrammarSpecError(f"$ref {ref!r} does not resolve inside this schema", pointer)


def _num(node: dict, keyword: str) -> float | None:
    value = node.get(keyword)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _check_bounds(node: dict, pointer: str) -> None:
    for low, high, what in (
        ("minLength", "maxLength", "string length"),
        ("minItems", "maxItems", "item count"),
        ("minProperties", "maxProperties", "property count"),
    ):
        lo, hi = _num(node, low), _num(node, high)
        if lo is not None and hi is not None and lo > hi:
            raise GrammarSpecError(f"{low} {lo} > {high} {hi}: no {what} can satisfy both", join_pointer(pointer, low))
    lo_kw = "exclusiveMinimum" if _num(node, "exclusiveMinimum") is not None else "minimum"
    hi_kw = "exclusiveMaximum" if _num(node, "exclusiveMaximum") is not None else "maximum"
    lo, hi = _num(node, lo_kw), _num(node, hi_kw)
    if lo is not None and hi is not None:
        exclusive = lo_kw.startswith("exclusive") or hi_kw.startswith("exclusive")
        if lo > hi or (lo == hi and exclusive):
            raise GrammarSpecError(f"{lo_kw} {lo} and {hi_kw} {hi} leave no number", join_pointer(pointer, lo_kw))


def _check_required(node: dict, pointer: str) -> None:
    required, properties = node.get("required"), node.get("properties")
    if node.get("additionalProperties") is not False or not isinstance(required, list):
        return
    declared = properties if isinstance(properties, dict) else {}
    for i, name in enumerate(required):
        if name not in declared:
            raise GrammarSpecError(
                f"required property {name!r} is not declared in properties, and additionalProperties is false",
                join_pointer(pointer, "required", i),
            )


def _check_mandatory_values(schema: dict) -> None:
    """Refuse a schema no instance satisfies, where that shows at a value every instance holds
    (the root, and required properties of such objects, declared in `properties`): listed values
    none of which fits the node's other keywords (BFCL writes `type: array` beside an enum of
    strings), or keywords that leave no JSON type (a `type` that no `oneOf`/`anyOf` branch's `type`
    shares: grammar/rewrites/one_of.py's `admitted_classes`). Check-and-roll-back could only spend its
    rewrites on these and fail; a 400 says why at once."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict):
            continue
        if fitting_values(node) == []:
            keyword = "const" if "const" in node else "enum"
            raise GrammarSpecError(
                f"no value listed in {keyword} fits this value's other keywords, and every "
                "instance must hold this value: no instance can match the schema",
                join_pointer(pointer, keyword),
            )
        if admitted_classes(node, schema) == set():
            keyword = next((k for k in ("oneOf", "anyOf", "allOf", "enum", "const") if k in node), "type")
            raise GrammarSpecError(
                f"`type` and `{keyword}` here leave no JSON type a value could have, so no "
                "instance can match the schema",
                join_pointer(pointer, keyword),
            )
        properties, required = node.get("properties"), node.get("required")
        if isinstance(properties, dict) and isinstance(required, list):
            stack += [
                (properties[name], join_pointer(pointer, "properties", name))
                for name in required
                if isinstance(name, str) and name in properties
            ]


def _short(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."
