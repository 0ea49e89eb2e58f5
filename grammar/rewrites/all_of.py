"""An `allOf` of object schemas merged into the one object schema it equals; both engines compile that.

xgrammar compiles an `allOf` of several branches as any JSON value, so SchemaStore's common
`allOf: [{"$ref": "#/definitions/base"}, {"properties": {...}, "required": [...]}]` left the whole
value to check-and-roll-back, whose rewrites could spend themselves on scalars (`"image": true`).
Where every branch, and the node's own keywords beside `allOf`, say only `type`, `properties`,
`required`, bounds (`minLength`, `maximum`, `minProperties`, ...), value keywords that one part
says (`pattern`, `format`, `enum`, `items`, ...) and annotations, the `allOf` is exactly the
schema with the intersection of the types, the union of the properties and of the required names,
the tightest bounds and those value keywords (with `unevaluatedProperties: false` beside it, the
parts may also say `patternProperties`: see `_closed_union`). A name declared by several branches takes
their subschemas merged the same way (identical ones are kept once); where that merge is not
possible, nothing is merged. A branch that is only a local `$ref` stands for the definition it
names (one link; the definition's own `$ref`s stay references). Anything else in a branch
(`additionalProperties`, `patternProperties`, conditionals, combinators, `$defs`) ties its meaning
to that branch's own names, which one object cannot say: such an `allOf` is left as it is.

The same merge distributes keywords beside an `anyOf` into its branches (`distributed_any_of`).
`lower_all_of` rewrites every such node of a schema (grammar/rewrites/lowering.py); grammar/validation/fidelity.py
classifies the merged node (each merged branch) where the `allOf` (`anyOf`) is written, so what
xgrammar does with keywords put together (it drops `minLength` beside `pattern`) is reported.
"""

from __future__ import annotations

import json
from typing import Any

from grammar.schema.walk import ANNOTATION_KEYWORDS, follow_local_refs, rewrite_bottom_up

# bounds merge to the tightest; the other value keywords only where one part says them (or all the same)
LOWER_BOUNDS = frozenset({"minProperties", "minLength", "minItems", "minimum", "exclusiveMinimum"})
UPPER_BOUNDS = frozenset({"maxProperties", "maxLength", "maxItems", "maximum", "exclusiveMaximum"})
SAID_ONCE = frozenset(
    {"pattern", "format", "enum", "const", "multipleOf", "uniqueItems", "items", "contentEncoding", "contentMediaType"}
)
MERGED_KEYWORDS = frozenset({"type", "properties", "required"}) | LOWER_BOUNDS | UPPER_BOUNDS | SAID_ONCE
# what a part may say about the names it does not declare: exact only in the one part that declares
# names, where nothing else declares any (its additionalProperties then means the same merged)
OPEN_KEYWORDS = frozenset({"additionalProperties", "patternProperties", "propertyNames"})
# annotations that would change how references resolve if moved out of their branch
_SCOPE_KEYWORDS = frozenset({"$id", "$schema", "$anchor"})
_PARENT_ONLY = frozenset({"$defs", "definitions"})  # kept where they are, beside the merged object
# a value's JSON type, numbers split into integers and numbers with a fraction
_TYPE_CLASSES = {
    "null": {"null"},
    "boolean": {"boolean"},
    "object": {"object"},
    "array": {"array"},
    "string": {"string"},
    "integer": {"integer"},
    "number": {"integer", "fraction"},
}


def merged_all_of(node: Any, root: Any) -> dict | None:
    """The object schema `node`'s `allOf` (with `node`'s own keywords) equals, or None where that
    cannot be written as one object schema (see the module docstring)."""
    if not isinstance(node, dict) or not isinstance(node.get("allOf"), list) or not node["allOf"]:
        return None
    own = {k: v for k, v in node.items() if k != "allOf"}
    if len(node["allOf"]) == 1 and not set(own) - _PARENT_ONLY - ANNOTATION_KEYWORDS:
        return None  # a lone branch: both engines compile it as it is
    closed = own.get("unevaluatedProperties") is False
    parts = [{k: v for k, v in own.items() if k not in _PARENT_ONLY and not (closed and k == "unevaluatedProperties")}]
    for branch in node["allOf"]:
        target = follow_local_refs(branch, root, only_bare=True)
        if target is True or target == {}:
            continue
        if not isinstance(target, dict) or "$ref" in target:
            return None
        parts.append({k: v for k, v in target.items() if k not in _SCOPE_KEYWORDS})
    if not all(mergeable_part(part) for part in parts):
        return None
    if closed:
        merged = _closed_union(parts, root)
        return None if merged is None else {**{k: v for k, v in own.items() if k in _PARENT_ONLY}, **merged}
    naming = [p for p in parts if "properties" in p or OPEN_KEYWORDS & set(p)]
    opened = [p for p in naming if OPEN_KEYWORDS & set(p)]
    if opened and len(naming) > 1 and not _within(opened, naming):
        return None
    merged = _merge(parts, root)
    if merged is not None and opened:
        merged.update({k: v for k, v in opened[0].items() if k in OPEN_KEYWORDS})
    if merged is None:
        return None
    return {**{k: v for k, v in own.items() if k in _PARENT_ONLY}, **merged}


def _within(opened: list[dict], naming: list[dict]) -> bool:
    """One part says what its other names are, and every other part declares only names it
    declares too: its `additionalProperties` (patterns, `propertyNames`) then mean the same for
    the merged object (dependabot's update and a `oneOf` branch requiring one of its names)."""
    if len(opened) != 1 or not isinstance(opened[0].get("properties", {}), dict):
        return False
    declared = set(opened[0].get("properties", {}))
    return all(
        isinstance(p.get("properties", {}), dict) and set(p.get("properties", {})) <= declared
        for p in naming
        if p is not opened[0]
    )


def _closed_union(parts: list[dict], root: Any) -> dict | None:
    """`unevaluatedProperties: false` beside an `allOf` whose parts name their properties
    (`properties`, `patternProperties`) and say nothing of the other names: a name is evaluated
    where some part's property or pattern takes it, so the allOf is the one object of every part's
    properties and patterns (those of a name or pattern several parts declare merged), closed
    (`additionalProperties: false`): in one object a name's property and every pattern it matches
    apply together, as every part's do in the allOf. compose-spec's services (container_spec and
    workload_spec, each with its `^x-` pattern) compiled as any JSON value before."""
    if any("additionalProperties" in p or "unevaluatedProperties" in p for p in parts):
        return None
    said = [p["propertyNames"] for p in parts if "propertyNames" in p]
    if len(said) > 1:
        return None
    patterns: dict[str, list] = {}
    for part in parts:
        declared = part.get("patternProperties", {})
        if not isinstance(declared, dict):
            return None
        for pattern, sub in declared.items():
            patterns.setdefault(pattern, []).append(sub)
    merged = _merge([{k: v for k, v in p.items() if k not in OPEN_KEYWORDS} for p in parts], root)
    if merged is None:
        return None
    if patterns:
        merged["patternProperties"] = {}
        for pattern, subs in patterns.items():
            unique = list({json.dumps(s, sort_keys=True): s for s in subs}.values())
            sub = unique[0] if len(unique) == 1 else merged_all_of({"allOf": unique}, root)
            if sub is None:
                return None
            merged["patternProperties"][pattern] = sub
    if said:
        merged["propertyNames"] = said[0]
    merged["additionalProperties"] = False
    return merged


def _merge(parts: list[dict], root: Any) -> dict | None:
    out: dict[str, Any] = {}
    for part in parts:  # annotations: the first one written wins (they constrain nothing)
        for key in ANNOTATION_KEYWORDS - _SCOPE_KEYWORDS:
            if key in part and key not in out:
                out[key] = part[key]
    types = [_classes(p["type"]) for p in parts if "type" in p]
    if types:
        if any(t is None for t in types):
            return None
        common = set.intersection(*types)
        written = _type_of(common)
        if written is None:
            return None
        out["type"] = written
    properties: dict[str, list] = {}
    for part in parts:
        declared = part.get("properties", {})
        if not isinstance(declared, dict):
            return None
        for name, sub in declared.items():
            properties.setdefault(name, []).append(sub)
    if properties:
        out["properties"] = {}
        for name, subs in properties.items():
            unique = list({json.dumps(s, sort_keys=True): s for s in subs}.values())
            if len(unique) == 1:
                out["properties"][name] = unique[0]
                continue
            sub = merged_all_of({"allOf": unique}, root)
            if sub is None:
                return None
            out["properties"][name] = sub
    required: list[str] = []
    for part in parts:
        names = part.get("required", [])
        if not isinstance(names, list):
            return None
        required += [n for n in names if n not in required]
    if required:
        out["required"] = required
    for keyword in LOWER_BOUNDS | UPPER_BOUNDS:
        bounds = [p[keyword] for p in parts if keyword in p]
        if not bounds:
            continue
        if not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
            return None  # draft-4's boolean exclusiveMinimum belongs with its minimum
        out[keyword] = max(bounds) if keyword in LOWER_BOUNDS else min(bounds)
    for keyword in SAID_ONCE:
        said = {json.dumps(p[keyword], sort_keys=True): p[keyword] for p in parts if keyword in p}
        if len(said) > 1:
            return None
        for value in said.values():
            out[keyword] = value
    return out


def _classes(written: Any) -> set[str] | None:
    names = [written] if isinstance(written, str) else written
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_CLASSES for n in names):
        return None
    return set().union(*(_TYPE_CLASSES[n] for n in names))


def _type_of(classes: set[str]) -> str | list[str] | None:
    """`type` for a set of classes; None where none can say it (empty, or fractions without integers)."""
    if "fraction" in classes and "integer" not in classes:
        return None
    names = sorted(
        (classes - {"integer", "fraction"})
        | ({"number"} if "fraction" in classes else {"integer"} if "integer" in classes else set())
    )
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def mergeable_part(target: Any) -> bool:
    """Whether a branch (its definition, for a bare local `$ref`) says only what a merge keeps.
    Judged on its keywords as written: a branch with its own `allOf`/`anyOf` never is."""
    if target is True or target == {}:
        return True
    return isinstance(target, dict) and all(
        k in MERGED_KEYWORDS | OPEN_KEYWORDS or k in ANNOTATION_KEYWORDS for k in target
    )


def partly_merged_all_of(node: Any, root: Any) -> dict | None:
    """For xgrammar's mask only: `node`'s `allOf` with the branches that cannot merge left out
    (a general `if`/`then`/`else`, a combinator), the rest merged with the keywords beside it. The
    mask then admits more than the schema, and check-and-roll-back keeps the branches left out
    (grammar/validation/fidelity.py reports the `allOf` checked), where xgrammar alone would compile the
    whole node as any JSON value (dependabot's root, woodpecker-ci's steps). None where all
    branches merge (`merged_all_of`) or nothing would be kept."""
    branches = node.get("allOf") if isinstance(node, dict) else None
    if not isinstance(branches, list) or not branches:
        return None
    kept = [b for b in branches if mergeable_part(follow_local_refs(b, root, only_bare=True))]
    if len(kept) == len(branches):
        return None
    own = {k: v for k, v in node.items() if k != "allOf"}
    if not set(own) - _PARENT_ONLY - ANNOTATION_KEYWORDS and len(kept) < 2:
        return None
    alternatives = _alternatives(branches, kept, root)
    if alternatives is not None:
        # one left-out branch is a choice between mergeable parts: the mask takes each with the
        # rest (a oneOf as the anyOf it implies; check-and-roll-back keeps "only one"). The node's
        # own keywords stay beside it (xgrammar compiles only the anyOf), so that references into
        # them (`#/definitions/update/properties/...`) still resolve
        merged = [merged_all_of({**own, "allOf": kept + [alt]}, root) for alt in alternatives]
        if all(m is not None for m in merged):
            return {**own, "anyOf": merged}
    return merged_all_of({**own, "allOf": kept or [{}]}, root)


def _alternatives(branches: list, kept: list, root: Any) -> list | None:
    """The branches of the first left-out `allOf` branch that is only a `oneOf` or `anyOf` of
    mergeable parts (dependabot's update: `directory` or `directories`), or None."""
    for branch in branches:
        if any(branch is k for k in kept):
            continue
        target = follow_local_refs(branch, root, only_bare=True)
        if not isinstance(target, dict):
            continue
        choice = [k for k in target if k not in ANNOTATION_KEYWORDS]
        if len(choice) == 1 and choice[0] in ("oneOf", "anyOf") and isinstance(target[choice[0]], list):
            alternatives = target[choice[0]]
            if alternatives and all(mergeable_part(follow_local_refs(a, root, only_bare=True)) for a in alternatives):
                return alternatives
    return None


def distributed_any_of(node: Any, root: Any) -> dict | None:
    """`node`'s `anyOf` with the keywords beside it merged into each branch (A and (B1 or B2) is
    (A and B1) or (A and B2)), where every branch merges: xgrammar compiles only the `anyOf` of
    a node that has both, so taskfile's root (its properties, closed, beside `anyOf` of
    `{"required": [...]}`) let any name in. None where a branch does not merge."""
    if not isinstance(node, dict) or not isinstance(node.get("anyOf"), list) or not node["anyOf"]:
        return None
    beside = {k: v for k, v in node.items() if k != "anyOf" and k not in _PARENT_ONLY and k not in ANNOTATION_KEYWORDS}
    if not beside:
        return None
    branches = []
    for branch in node["anyOf"]:
        merged = merged_all_of({"allOf": [beside, branch]}, root)
        if merged is None:
            return None
        branches.append(merged)
    kept = {k: v for k, v in node.items() if k in _PARENT_ONLY or k in ANNOTATION_KEYWORDS}
    return {**kept, "anyOf": branches}


def lower_all_of(schema: Any, partial: bool = False) -> Any:
    """`schema` with every mergeable `allOf` replaced by the object schema it equals, and every
    `anyOf` with keywords beside it that distribute into its branches so distributed (references
    resolved in `schema` as written). `partial` (xgrammar's mask): an `allOf` some of whose
    branches cannot merge is merged without them (`partly_merged_all_of`)."""

    def rewrite(node: dict) -> Any:
        merged = merged_all_of(node, schema)
        if merged is None and partial:
            merged = partly_merged_all_of(node, schema)
        if merged is None and "allOf" not in node:
            merged = distributed_any_of(node, schema)
        return node if merged is None else merged

    return rewrite_bottom_up(schema, rewrite)
