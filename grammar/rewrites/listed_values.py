"""`enum`/`const` whose listed values break their other keywords, compiled as what they allow.

Beside `enum`/`const` a mask writes only the listed values and ignores the other keywords. Where
some listed value breaks them (BFCL's `{"type": "boolean", "enum": ["True", "False", "dontcare"]}`),
the values the schema allows are exactly the listed ones that fit: `fitting_values` finds them
(jsonschema judges each against the other keywords), and `lower_listed_values` compiles the node as
`{"enum": fitting}`.

Where none fits, no value is valid there. An optional property with such a schema is valid only
when absent; `omitted_properties` names the ones a closed object can simply not declare (the
object says `additionalProperties: false`, or it is the schema's root in strict mode, which closes
it, and nothing else names properties: no patternProperties, dependencies, combinators). The
lowered object leaves them out and says `additionalProperties: false`. A required one, or one of
an object that may stay open, is left alone: the fidelity report refuses it in strict mode.

grammar/engines/xgrammar/schema.py and grammar/engines/llguidance/schema.py lower before compiling; grammar/validation/fidelity.py
reports these keywords enforced exactly where this module rewrites them.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from grammar.schema.walk import ANNOTATION_KEYWORDS, DATA_KEYWORDS, NAMED_SCHEMA_MAPS

_SCHEMA_MAPS, _DATA = NAMED_SCHEMA_MAPS, DATA_KEYWORDS  # the lowerings' one table (grammar/schema/walk.py)
# keywords beside which leaving a property out of `properties` could change what is valid
_NAMES_ELSEWHERE = (
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
)


def fitting_values(node: Any) -> list[Any] | None:
    """The listed values of `node` that fit its other keywords, where some do not (maybe none);
    None where every one fits, `node` lists nothing, or jsonschema cannot judge them here."""
    if not isinstance(node, dict) or not ("const" in node or isinstance(node.get("enum"), list)):
        return None
    listed = [node["const"]] if "const" in node else list(node["enum"])
    rest = {k: v for k, v in node.items() if k not in ("enum", "const") and k not in ANNOTATION_KEYWORDS}
    if not rest or "$ref" in rest or any(isinstance(k, str) and k.startswith("$") for k in rest):
        return None
    try:
        validator = jsonschema.Draft202012Validator(rest, format_checker=jsonschema.FormatChecker())
        fits = [validator.is_valid(v) for v in listed]
    except Exception:  # a keyword jsonschema cannot judge here
        return None
    return None if all(fits) else [v for v, ok in zip(listed, fits) if ok]


def omitted_properties(node: dict, *, strict: bool, root: bool) -> list[str]:
    """The optional properties of object schema `node` that no value fits and that a closed
    object can leave out (see the module docstring)."""
    props = node.get("properties")
    if not isinstance(props, dict):
        return []
    closed = node.get("additionalProperties") is False
    if not closed and not (strict and root):
        return []
    if any(k in node for k in _NAMES_ELSEWHERE if not (k == "additionalProperties" and closed)):
        return []
    required = node.get("required") if isinstance(node.get("required"), list) else []
    return [name for name, sub in props.items() if name not in required and fitting_values(sub) == []]


def lower_listed_values(schema: Any, *, strict: bool) -> Any:
    """`schema` with listed values cut to those that fit and unsatisfiable optional properties of
    closed objects left out."""
    return _lower(schema, strict, root=True)


def _lower(node: Any, strict: bool, root: bool = False) -> Any:
    if isinstance(node, list):
        return [_lower(v, strict) for v in node]
    if not isinstance(node, dict):
        return node
    fitting = fitting_values(node)
    if fitting:  # a non-empty list: the node allows exactly these
        return {"enum": fitting}
    omitted = set(omitted_properties(node, strict=strict, root=root))
    out = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: _lower(sub, strict)
                for name, sub in value.items()
                if not (key == "properties" and name in omitted)
            }
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _lower(value, strict)
    if omitted:
        out["additionalProperties"] = False
        out = {k: out[k] for k in sorted(out)} if list(node) == sorted(node) else out
    return out
