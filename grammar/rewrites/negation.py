"""`not` rewritten as the schema it equals, for the forms that say "these names are absent".

No token mask enforces `not` in general (a mask writes what a schema allows, not its complement),
and neither engine compiles it. But the `not`s real-world schemas write are mostly about names:
SchemaStore's GitHub workflow triggers (`not: {type: object, required: [branches, branches-ignore]}`:
not both), GitLab CI inputs (`not: {anyOf: [{required: [options]}, {required: [default]}]}`: neither),
Bitbucket's `deployment: {not: {}}` (never). `negation` returns the equal schema where it can be
written with `properties: {name: false}` ("absent"):

- `not: {}` (or `true`, or only annotations) is `false`; `not: false` is `{}`.
- `not: {required: [n1, ...]}`, maybe with `type: object` and with `properties` that allow anything:
  `required` holds for every value that is not an object, so without `type` the `not` means "an
  object lacking one of the names", with `type: object` "not an object, or lacking one of the
  names". One name: `{type: object, properties: {n1: false}}` (or without `type`); several: the
  `anyOf` of each name absent. An `allOf` of such branches without `type` is their names together.
- `not: {anyOf: [{required: [a]}, {required: [b]}, ...]}` (one name per branch): every name
  absent, `{properties: {a: false, b: false}}`, an object unless every branch says `type: object`.

Anything else is left as written (None). The generated `properties` come with `additionalProperties:
true` where the node declared no names of its own: they say which names are absent, not which may
be there, and strict mode closes an object over the names it declares. `lower_negations` rewrites
the `not`s of a schema where the result merges into the node's other keywords (a second `anyOf` is
left as written; a `type` without object makes the node `false`), and llguidance then compiles the
rewritten schema (grammar/engines/llguidance/schema.py): xgrammar
refuses `false` sub-schemas, so grammar/validation/fidelity.py reports these `not`s enforced by llguidance.
`not: {enum|const}` beside listed values needs none of this: grammar/rewrites/listed_values.py keeps just
the listed values it allows.
"""

from __future__ import annotations

from typing import Any

from grammar.schema.walk import ANNOTATION_KEYWORDS, rewrite_bottom_up

_ABSENT = False  # the schema of a property that must not be there


def negation(not_value: Any) -> Any:
    """The schema equal to `{"not": not_value}`, or None where this module cannot write it."""
    if not_value is True or _only(not_value, ()):
        return False
    if not_value is False:
        return {}
    names = _names_form(not_value)
    if names is not None:
        typed, required = names
        absent = _some_absent(required)
        return absent if typed else {"type": "object", **absent}
    branches = _only(not_value, ("anyOf",)) and not_value["anyOf"]
    if isinstance(branches, list) and branches:
        forms = [_names_form(b) for b in branches]
        if all(f is not None and len(f[1]) == 1 for f in forms):
            out: dict[str, Any] = {"properties": {f[1][0]: _ABSENT for f in forms}}
            return out if all(typed for typed, _ in forms) else {"type": "object", **out}
    return None


def lower_negations(schema: Any) -> Any:
    """`schema` with every `not` that `negation` writes (and that merges cleanly) replaced."""
    return rewrite_bottom_up(schema, _lower_node)


def _lower_node(node: dict) -> Any:
    if "not" not in node:
        return node
    equal = negation(node["not"])
    if equal is None:
        return node
    rest = {k: v for k, v in node.items() if k != "not"}
    merged = _merge(rest, equal)
    return node if merged is None else merged


def _merge(node: dict, extra: Any) -> Any:
    """The schema that is both `node` and `extra` (a `negation` result), or None on a clash."""
    if extra is False:
        return False
    out = dict(node)
    for key, value in extra.items():
        if key == "type":
            declared = out.get("type")
            if declared is None:
                out["type"] = value
            elif value in (declared if isinstance(declared, list) else [declared]):
                out["type"] = value  # the one type both allow
            else:
                return False  # no value is both
        elif key == "properties":
            props = out.get("properties")
            if props is not None and not isinstance(props, dict):
                return None
            if props is None and "additionalProperties" not in out:
                # the node declared no names: it stays as open as it was (strict mode closes an
                # object over the names it declares, and these only say which are absent)
                out["additionalProperties"] = True
            out["properties"] = {**(props or {}), **value}  # absent wins over what the name allowed
        elif key in out:
            return None  # a second anyOf: left as written
        else:
            out[key] = value
    return out


def _some_absent(names: list[str]) -> dict:
    if len(names) == 1:
        return {"properties": {names[0]: _ABSENT}}
    # each branch only constrains the object around it, so strict mode must not close it
    return {"anyOf": [{"properties": {n: _ABSENT}, "additionalProperties": True} for n in names]}


def _names_form(node: Any) -> tuple[bool, list[str]] | None:
    """(says `type: object`, the names) where `node` holds exactly when an object has all the
    names (or, without `type`, when it is not an object either); else None."""
    if not isinstance(node, dict):
        return None
    if _only(node, ("allOf",)) and isinstance(node["allOf"], list) and node["allOf"]:
        parts = [_names_form(b) for b in node["allOf"]]
        if all(p is not None and not p[0] for p in parts):
            return False, list(dict.fromkeys(n for p in parts for n in p[1]))
        return None
    if not _only(node, ("required", "type", "properties")):
        return None
    required = node.get("required")
    if not isinstance(required, list) or not required or not all(isinstance(n, str) for n in required):
        return None
    declared = node.get("type", None)
    if declared not in (None, "object", ["object"]):
        return None
    props = node.get("properties", {})
    if not isinstance(props, dict) or not all(v is True or _only(v, ()) for v in props.values()):
        return None  # a property constrained here would make the `not` about its value too
    return declared is not None, list(dict.fromkeys(required))


def _only(node: Any, keywords: tuple[str, ...]) -> bool:
    """`node` is an object schema whose keywords are among `keywords` and annotations."""
    return isinstance(node, dict) and all(k in keywords or k in ANNOTATION_KEYWORDS for k in node)
