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

import itertools
import json
from typing import Any

from grammar.rewrites.conditionals import discriminator
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
    listed = [p["enum"] for p in parts if isinstance(p.get("enum"), list)]
    if len(listed) > 1:  # several listings: the values all of them list (in the first one's order)
        common = [v for v in listed[0] if all(any(_same(v, w) for w in other) for other in listed[1:])]
        if not common:
            return None
        out["enum"] = common
    for keyword in SAID_ONCE - ({"enum"} if len(listed) > 1 else set()):
        said = {json.dumps(p[keyword], sort_keys=True): p[keyword] for p in parts if keyword in p}
        if len(said) > 1:
            return None
        for value in said.values():
            out[keyword] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality (1 and true differ; 1 and 1.0 do not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or (
        isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
    )


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
    branches merge (`merged_all_of`) or nothing would be kept.

    A left-out branch that is a choice between mergeable parts (`_choice`: a `oneOf`/`anyOf`, or
    a conditional on a name's presence or listed values) is taken into the mask as the `anyOf` of
    the rest merged with each alternative (with several such branches, with each combination, up to
    MAX_ALTERNATIVES): dependabot's update then requires `directory` or `directories` (not both)
    and `schedule` unless `multi-ecosystem-group` is written."""
    branches = node.get("allOf") if isinstance(node, dict) else None
    if not isinstance(branches, list) or not branches:
        return None
    kept = [b for b in branches if mergeable_part(follow_local_refs(b, root, only_bare=True))]
    if len(kept) == len(branches):
        return None
    own = {k: v for k, v in node.items() if k != "allOf"}
    if not set(own) - _PARENT_ONLY - ANNOTATION_KEYWORDS and len(kept) < 2:
        return None
    choices = _choices(branches, kept, own, root)
    while choices:  # a choice whose parts do not merge is left to the check with the rest
        merged = _combined(own, kept, choices, root)
        if merged:
            # the node's own keywords stay beside the anyOf (xgrammar compiles only the anyOf), so
            # that references into them (`#/definitions/update/properties/...`) still resolve
            return {**own, "anyOf": merged}
        choices = choices[:-1]
    return merged_all_of({**own, "allOf": kept or [{}]}, root)


def _combined(own: dict, kept: list, choices: list, root: Any) -> list[dict] | None:
    """The rest merged with each combination of the choices' alternatives (those no value fits
    left out); None where one does not merge."""
    merged = []
    for combination in itertools.product(*choices):
        one = merged_all_of({**own, "allOf": kept + [part for part, _ in combination]}, root)
        if one is None:
            return None
        one = _without_names(one, {n for _, absent in combination for n in absent})
        if one is not None:
            merged.append(one)
    return merged


MAX_ALTERNATIVES = 8  # merged objects one allOf becomes in xgrammar's mask (each a copy of the object)
Alternative = tuple[dict, frozenset]  # a part to merge, and names it leaves out (absent in that alternative)


def _choices(branches: list, kept: list, own: dict, root: Any) -> list[list[Alternative]]:
    """The alternatives of each left-out branch that is a choice (`_choice`), while their
    combinations stay within MAX_ALTERNATIVES."""
    found: list[list[Alternative]] = []
    total = 1
    for branch in branches:
        if any(branch is k for k in kept):
            continue
        target = follow_local_refs(branch, root, only_bare=True)
        alternatives = _choice(target, own, root) if isinstance(target, dict) else None
        if alternatives and total * len(alternatives) <= MAX_ALTERNATIVES:
            found.append(alternatives)
            total *= len(alternatives)
    return found


def _choice(target: dict, own: dict, root: Any) -> list[Alternative] | None:
    """The alternatives a left-out `allOf` branch chooses between, each a mergeable part and the
    names absent with it, where together they admit exactly what the branch does (given the
    object's own keywords), or None:

    - a `oneOf`/`anyOf` of mergeable parts: each part. A `oneOf` of parts that each only require
      their own name, as dependabot's `directory` or `directories`: each part with the others'
      names absent (only one passes, so the others' names are missing);
    - `if` a name is present (or absent), `then` T, `else` E, as dependabot's "schedule unless
      multi-ecosystem-group": the name required with the passing body, the name absent with the
      other; `if` a name takes one of its listed values: that name held to the passing values with
      T, to the others with E (conditionals.py `discriminator`). T and E must be mergeable."""
    keywords = [k for k in target if k not in ANNOTATION_KEYWORDS]
    if len(keywords) == 1 and keywords[0] in ("oneOf", "anyOf") and isinstance(target[keywords[0]], list):
        parts = [follow_local_refs(a, root, only_bare=True) for a in target[keywords[0]]]
        if not parts or not all(mergeable_part(p) for p in parts):
            return None
        parts = [_plain(p, own, root) for p in parts]
        alone = [_only_requires(p) for p in parts]
        if keywords[0] == "oneOf" and all(alone) and len(set(alone)) == len(alone):
            return [(p, frozenset(alone) - {n}) for p, n in zip(parts, alone)]
        return [(p, frozenset()) for p in parts]
    if not set(keywords) <= {"if", "then", "else"} or "if" not in keywords:
        return None
    then, otherwise = (follow_local_refs(target.get(k, {}), root, only_bare=True) for k in ("then", "else"))
    if not mergeable_part(then) or not mergeable_part(otherwise):
        return None
    then, otherwise = _plain(then, own, root), _plain(otherwise, own, root)
    presence = _presence(target["if"])
    if presence is not None:
        name, present_passes = presence
        first, second = (then, otherwise) if present_passes else (otherwise, then)
        return [
            ({**first, "required": list(first.get("required", [])) + [name]}, frozenset()),
            (second, frozenset({name})),
        ]
    found = discriminator(target, own, root)
    if found is None:
        return None
    name, passing, failing, absent_passes = found
    out: list[Alternative] = []
    for values, body, absent in ((passing, then, absent_passes), (failing, otherwise, not absent_passes)):
        if values:
            out.append((_with_value(body, name, values, required=not absent), frozenset()))
        elif absent:
            out.append((body, frozenset({name})))
    return out or None


def _presence(test: Any) -> tuple[str, bool] | None:
    """(name, whether its presence passes) for an `if` that only tests one name's presence
    (`required: [name]`, or its `not`; declaring the name as `{}` says nothing more)."""
    negated = False
    for _ in range(2):
        if not isinstance(test, dict):
            return None
        test = {k: v for k, v in test.items() if k not in ANNOTATION_KEYWORDS}
        if set(test) != {"not"}:
            break
        test, negated = test["not"], not negated
    required = test.get("required")
    if set(test) - {"required", "properties"} or not isinstance(required, list) or len(required) != 1:
        return None
    name = required[0]
    if not isinstance(name, str) or test.get("properties", {}) not in ({}, {name: {}}, {name: True}):
        return None
    return name, not negated


def _plain(part: Any, own: dict, root: Any) -> dict:
    """`part` as a dict, without the properties that say nothing beyond the object's own: `{}`,
    and a bare `$ref` to this very object's declaration of the name (dependabot's branches write
    `{"$ref": "#/definitions/update/properties/directory"}` inside update)."""
    if part is True:
        return {}
    props = part.get("properties")
    if not isinstance(props, dict):
        return dict(part)
    kept = {n: s for n, s in props.items() if not (s in ({}, True) or _self_declared(s, n, own, root))}
    out = {k: v for k, v in part.items() if k != "properties"}
    return {**out, "properties": kept} if kept else out


def _self_declared(sub: Any, name: str, own: dict, root: Any) -> bool:
    """Is `sub` a bare `$ref` to `<object>/properties/<name>`, that object being the one `own`
    describes (the same declared names, required names and additionalProperties)?"""
    ref = sub.get("$ref") if isinstance(sub, dict) else None
    if not isinstance(ref, str) or any(k != "$ref" and k not in ANNOTATION_KEYWORDS for k in sub):
        return False
    tail = "/properties/" + name.replace("~", "~0").replace("/", "~1")
    if not ref.endswith(tail) or not isinstance(own.get("properties"), dict) or name not in own["properties"]:
        return False
    holder = follow_local_refs({"$ref": ref[: -len(tail)]}, root)
    return (
        isinstance(holder, dict)
        and isinstance(holder.get("properties"), dict)
        and list(holder["properties"]) == list(own["properties"])
        and all(holder.get(k) == own.get(k) for k in ("required", "additionalProperties", "type"))
    )


def _with_value(body: dict, name: str, values: list, *, required: bool) -> dict:
    """`body` with `name` held to `values` (and required)."""
    out = dict(body)
    props = dict(out.get("properties", {}))
    if name in props:
        return out  # cannot say both in one part: left as the body (the mask admits more)
    props[name] = {"enum": values}
    out["properties"] = props
    if required:
        out["required"] = list(out.get("required", [])) + [name]
    return out


def _only_requires(part: dict) -> str | None:
    """The one name `part` requires, where that is all it says (its own declarations stripped by
    `_plain`): it then passes exactly when the name is written."""
    rest = {k: v for k, v in part.items() if k not in ANNOTATION_KEYWORDS}
    required = rest.get("required")
    if set(rest) != {"required"} or not isinstance(required, list) or len(required) != 1:
        return None
    return required[0] if isinstance(required[0], str) else None


def _without_names(merged: dict, absent: set) -> dict | None:
    """`merged` with the `absent` names no longer allowed; None where no value fits (it requires
    one of them, or a closed object requires a name it does not declare). Only a closed object
    without patterns can leave a name out; any other is left as it is (the mask admits more)."""
    closed = merged.get("additionalProperties") is False and "patternProperties" not in merged
    required = merged.get("required", [])
    if any(n in required for n in absent) or (closed and any(n not in merged.get("properties", {}) for n in required)):
        return None
    if not absent or not closed:
        return merged
    props = {n: s for n, s in merged.get("properties", {}).items() if n not in absent}
    return {**merged, "properties": props}


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
