"""`if`/`then`/`else` on a discriminator, lowered to an `anyOf` that a token mask can enforce.

No engine masks `if`/`then`/`else` (xgrammar ignores it, llguidance 1.9 refuses it). The common
real-world form tests one property against listed values, the property itself having finitely
many values:

    {"properties": {"kind": {"enum": ["a", "b"]}, ...},
     "if": {"properties": {"kind": {"const": "a"}}}, "then": T, "else": E}

which is exactly

    "anyOf": [{"allOf": [kind in {a}, T]}, {"allOf": [kind in {b}, E]}]

(with the property's absence sent to the branch JSON Schema sends it to: a missing property passes
`properties`, so it satisfies the `if` unless the `if` also requires it). llguidance enforces
`anyOf` with sibling keywords and `allOf` with several branches exactly, so a lowered schema is
compiled there (grammar/fidelity.py routes it; grammar/llg_schema.py lowers before compiling).
Every other `if` stays what it was: not masked, refused in strict mode.

The generated branches carry `additionalProperties: true`: they only constrain the object the
enclosing schema already closes (strict mode closes that one, not the branches).
"""

from __future__ import annotations

from typing import Any

from grammar.schema_walk import rewrite_bottom_up

_COMBINATORS = ("anyOf", "oneOf", "$ref")


def _listed(schema: Any) -> list[Any] | None:
    """The finite set of values `schema` allows, if it lists them (const, enum, boolean type)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    if schema.get("type") == "boolean" and len(schema) == 1:
        return [True, False]
    return None


def discriminator(node: dict) -> tuple[str, list[Any], list[Any], bool] | None:
    """(property, values it passes with, values it fails with, whether its absence passes) when
    `node`'s `if` only tests one declared property with finitely many values; None otherwise."""
    test = node.get("if")
    props = node.get("properties")
    if not isinstance(test, dict) or not isinstance(props, dict) or any(k in node for k in _COMBINATORS):
        return None
    if set(test) - {"properties", "required", "type"} or test.get("type", "object") != "object":
        return None
    tested = test.get("properties")
    if not isinstance(tested, dict) or len(tested) != 1:
        return None
    (name, condition), = tested.items()
    required = test.get("required", [])
    if required not in ([], [name]):
        return None
    passing, values = _listed(condition), _listed(props.get(name))
    if passing is None or values is None:
        return None
    outer_required = node.get("required") if isinstance(node.get("required"), list) else []
    absent_passes = not required and name not in outer_required
    return name, [v for v in values if v in passing], [v for v in values if v not in passing], absent_passes


def _branch(name: str, values: list[Any], absence_here: bool, body: Any) -> dict:
    # no listed value takes this branch: only the property's absence does
    cond: dict[str, Any] = {"properties": {name: {"enum": values} if values else False}}
    if not absence_here:
        cond["required"] = [name]
    parts = [cond] if body is None or body is True else [cond, body]
    return {"allOf": parts, "additionalProperties": True} if len(parts) > 1 else {**cond, "additionalProperties": True}


def lower_conditionals(node: Any) -> Any:
    """`node` with every discriminator `if`/`then`/`else` rewritten as an equivalent `anyOf`."""
    return rewrite_bottom_up(node, _lower_conditional)


def _lower_conditional(out: dict) -> Any:
    found = discriminator(out)
    if found is None:
        return out
    name, passing, failing, absent_passes = found
    branches = []
    if passing or absent_passes:
        branches.append(_branch(name, passing, absent_passes, out.get("then")))
    if failing or not absent_passes:
        branches.append(_branch(name, failing, not absent_passes, out.get("else")))
    lowered = {k: v for k, v in out.items() if k not in ("if", "then", "else")}
    lowered["anyOf"] = branches
    return lowered
