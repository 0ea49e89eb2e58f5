"""`if`/`then`/`else` on a discriminator, lowered to an `anyOf` that a token mask can enforce.

No engine masks `if`/`then`/`else` (xgrammar ignores it, llguidance 1.9 refuses it). The common
real-world form tests one property against listed values, the property itself having finitely
many values:

    {"properties": {"kind": {"enum": ["a", "b"]}, ...},
     "if": {"properties": {"kind": {"const": "a"}}}, "then": T, "else": E}

which is exactly

    "anyOf": [{"allOf": [kind in {a}, T]}, {"allOf": [kind in {b}, E]}]

(with the property's absence sent to the branch JSON Schema sends it to: a missing property passes
`properties`, so it satisfies the `if` unless the `if` also requires it; an `if` of
`{"not": {"required": [name]}}` passes on absence alone). The property may be declared beside the
`if` or, for a conditional that is a branch of an object's `allOf`, in that object, and through a
local `$ref` to its listing. SchemaStore writes discriminated unions as such an `allOf` of
conditionals on one property (GitHub issue forms, GitLab CI inputs, Dependabot's schedule); those
are merged into one `anyOf` with a branch per group of values that take the same `then`s and
`else`s (an `allOf` of one `anyOf` per conditional is a product llguidance refuses as too large).
llguidance enforces `anyOf` with sibling keywords and `allOf` with several branches exactly, so a
lowered schema is compiled there (grammar/validation/fidelity.py routes it; grammar/engines/llguidance/schema.py lowers
before compiling). Every other `if` stays what it was: not masked, refused in strict mode.

The generated branches carry `additionalProperties: true`: they only constrain the object the
enclosing schema already closes (strict mode closes that one, not the branches). Names that only a
`then` or `else` declares are added to an open object's `properties` as `{}` (which allows what
it allowed), so that strict mode's closing keeps them.
"""

from __future__ import annotations

import json
from typing import Any

from grammar.schema.walk import ANNOTATION_KEYWORDS as _ANNOTATIONS
from grammar.schema.walk import follow_local_refs, rewrite_bottom_up

_COMBINATORS = ("anyOf", "oneOf", "$ref")
_BRANCH_KEYS = frozenset({"if", "then", "else"}) | _ANNOTATIONS


def _listed(schema: Any, root: Any = None) -> list[Any] | None:
    """The finite set of values `schema` allows, if it lists them (const, enum, boolean type)."""
    # siblings beside a $ref can only narrow its listing: the listing is a superset of the values,
    # which is all a partition by value needs
    schema = follow_local_refs(schema, root)
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    if schema.get("type") == "boolean" and not set(schema) - {"type"} - _ANNOTATIONS:
        return [True, False]
    return None


def _key(value: Any) -> str:
    """JSON equality (1 and true are different values there, not in Python)."""
    return json.dumps(value, sort_keys=True)


def _required(*nodes: Any) -> set[str]:
    return {
        n
        for node in nodes
        if isinstance(node, dict) and isinstance(node.get("required"), list)
        for n in node["required"]
        if isinstance(n, str)
    }


def _declared(name: str, node: dict, context: dict | None) -> Any:
    for where in (node, context):
        props = where.get("properties") if isinstance(where, dict) else None
        if isinstance(props, dict) and name in props:
            return props[name]
    return None


def _tested(test: Any) -> tuple[str, Any, bool] | None:
    """(property, the condition on its value or None when only its absence passes, whether the
    test requires it) for an `if` that tests one property; None for any other `if`."""
    if not isinstance(test, dict):
        return None
    test = {k: v for k, v in test.items() if k not in _ANNOTATIONS}
    absent = test.get("not")
    if set(test) == {"not"} and isinstance(absent, dict) and set(absent) == {"required"}:
        names = absent["required"]
        return (names[0], None, False) if isinstance(names, list) and len(names) == 1 else None
    if set(test) - {"properties", "required", "type"} or test.get("type", "object") != "object":
        return None
    tested = test.get("properties")
    if not isinstance(tested, dict) or len(tested) != 1:
        return None
    ((name, condition),) = tested.items()
    required = test.get("required", [])
    if required not in ([], [name]):
        return None
    return name, condition, bool(required)


def discriminator(
    node: dict, context: dict | None = None, root: Any = None
) -> tuple[str, list[Any], list[Any], bool] | None:
    """(property, values it passes with, values it fails with, whether its absence passes) when
    `node`'s `if` only tests one property with finitely many values; None otherwise. The property
    is declared in `node` or in `context` (the object whose `allOf` holds `node`); `root` resolves
    local `$ref`s to its listing."""
    found = _tested(node.get("if"))
    if found is None or any(k in node for k in _COMBINATORS):
        return None
    name, condition, test_requires = found
    values = _listed(_declared(name, node, context), root)
    if values is None:
        return None
    outside = name in _required(node, context)
    if condition is None:  # `not: {required: [name]}`: only the property's absence passes
        return name, [], values, not outside
    passing = _listed(condition, root)
    if passing is None:
        return None
    keys = {_key(v) for v in passing}
    return (
        name,
        [v for v in values if _key(v) in keys],
        [v for v in values if _key(v) not in keys],
        not test_requires and not outside,
    )


def allof_conditionals(node: dict, root: Any = None) -> dict[int, tuple[str, list[Any], list[Any], bool]] | None:
    """The branches of `node`'s `allOf` that are discriminator conditionals (a branch holding only
    `if`/`then`/`else` and annotations), by index, when they all test the same property; None when
    there are none, one cannot be lowered, or they test different properties."""
    branches = node.get("allOf")
    if not isinstance(branches, list) or any(k in node for k in ("anyOf", "oneOf", "$ref", "if")):
        return None
    found = {}
    for i, branch in enumerate(branches):
        if isinstance(branch, dict) and "if" in branch and not set(branch) - _BRANCH_KEYS:
            tested = discriminator(branch, node, root)
            if tested is None:
                return None
            found[i] = tested
    return found if found and len({name for name, *_ in found.values()}) == 1 else None


def _branch(name: str, values: list[Any] | None, bodies: list[Any]) -> dict:
    """The object with `name` taking one of `values` (None: `name` absent), and every body."""
    if values is None:
        cond: dict[str, Any] = {"properties": {name: False}}
    else:
        cond = {"properties": {name: {"enum": values}}, "required": [name]}
    parts = [cond] + [b for b in bodies if b is not None and b is not True]
    return {"allOf": parts, "additionalProperties": True} if len(parts) > 1 else {**cond, "additionalProperties": True}


def _partition(name: str, values: list[Any], absence: bool, body_of) -> list[dict]:
    """One branch per group of values taking the same bodies (`body_of(value, absent)` gives
    them), and one for the property's absence when it may be absent."""
    groups: dict[str, tuple[list[Any], list[Any]]] = {}
    for value in values:
        bodies = body_of(value, False)
        groups.setdefault(_key(bodies), ([], bodies))[0].append(value)
    branches = [_branch(name, vs, bodies) for vs, bodies in groups.values()]
    if absence:
        branches.append(_branch(name, None, body_of(None, True)))
    return branches


def _with_branch_names(out: dict, bodies: list[Any], root: Any) -> dict:
    """An open object gets the names its conditional bodies declare, as `{}` (see the docstring)."""
    if any(k in out for k in ("additionalProperties", "unevaluatedProperties", "patternProperties")):
        return out
    props = dict(out["properties"]) if isinstance(out.get("properties"), dict) else {}
    for body in bodies:
        body = follow_local_refs(body, root)
        names = body.get("properties") if isinstance(body, dict) else None
        if isinstance(names, dict):
            props.update({n: {} for n in names if n not in props})
    return {**out, "properties": props} if props else out


def lower_conditionals(node: Any) -> Any:
    """`node` with every discriminator `if`/`then`/`else` (and every `allOf` of them on one
    property) rewritten as an equivalent `anyOf`."""
    return rewrite_bottom_up(node, lambda out: _lower_conditional(out, node))


def _lower_conditional(out: dict, root: Any) -> Any:
    found = discriminator(out, None, root)
    if found is not None:
        name, passing, failing, absent_passes = found
        values = passing + failing
        keys = {_key(v) for v in passing}
        then, otherwise = out.get("then"), out.get("else")
        branches = _partition(
            name,
            values,
            name not in _required(out),
            lambda v, absent: [then if (absent_passes if absent else _key(v) in keys) else otherwise],
        )
        if not branches:
            return out  # the property can take no value and must be present: nothing to lower
        lowered = {k: v for k, v in out.items() if k not in ("if", "then", "else")}
        lowered["anyOf"] = branches
        return _with_branch_names(lowered, [then, otherwise], root)
    merged = allof_conditionals(out, root)
    if merged is None:
        return out
    name = next(iter(merged.values()))[0]
    conditionals = {i: out["allOf"][i] for i in merged}

    passing_keys = {i: {_key(v) for v in passing} for i, (_, passing, _, _) in merged.items()}

    def bodies(value: Any, absent: bool) -> list[Any]:
        taken = []
        for i, (_, _, _, absent_passes) in merged.items():
            passes = absent_passes if absent else _key(value) in passing_keys[i]
            taken.append(conditionals[i].get("then" if passes else "else"))
        return taken

    first = next(iter(merged.values()))
    values = first[1] + first[2]
    lowered = {k: v for k, v in out.items() if k != "allOf"}
    rest = [b for i, b in enumerate(out["allOf"]) if i not in merged]
    if rest:
        lowered["allOf"] = rest
    branches = _partition(name, values, name not in _required(out), bodies)
    if not branches:
        return out
    lowered["anyOf"] = branches
    every_body = [c.get(k) for c in conditionals.values() for k in ("then", "else")]
    return _with_branch_names(lowered, every_body, root)


def narrow_by_branches(schema: Any) -> Any:
    """For xgrammar's mask only (it ignores `if`/`then`/`else`): a property both branches of a
    conditional declare, whose own schema beside them says nothing, is written as the `anyOf` of
    the two. Sound, not exact: whichever branch applies, the value fits one of them; the
    conditional itself stays with check-and-roll-back. github-actions' root declares `outputs` as
    `{}` and lets `then`/`else` say what it is (composite outputs or the others), so its mask let
    any JSON value in, and the rewrites ran out on it."""
    return rewrite_bottom_up(schema, lambda out: _narrowed(out, schema))


def _narrowed(out: dict, root: Any) -> dict:
    if "if" not in out or not isinstance(out.get("properties"), dict):
        return out
    then = follow_local_refs(out.get("then"), root, only_bare=True)
    otherwise = follow_local_refs(out.get("else"), root, only_bare=True)
    if not isinstance(then, dict) or not isinstance(otherwise, dict):
        return out  # a missing branch allows anything
    properties = dict(out["properties"])
    for name, own in out["properties"].items():
        if own is not True and not (isinstance(own, dict) and not set(own) - _ANNOTATIONS):
            continue
        first, second = _declared(name, then, None), _declared(name, otherwise, None)
        if first is not None and second is not None:
            properties[name] = first if _key(first) == _key(second) else {"anyOf": [first, second]}
    return out if properties == out["properties"] else {**out, "properties": properties}
