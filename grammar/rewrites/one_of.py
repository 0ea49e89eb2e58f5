"""`oneOf` rewritten as the `anyOf` it equals, where that can be proved; both engines compile that.

A token mask can only enforce "at least one branch" (xgrammar compiles `oneOf` as `anyOf`,
llguidance 1.9 refuses it). `oneOf` is "exactly one", which is the same only where no value
matches two branches. `exclusive_branches` returns branches that are pairwise disjoint and whose
union is exactly the set of values the `oneOf` accepts, or None where it cannot show that:

- the branches are told apart by distinct `const`s, or by a property every branch requires with a
  distinct `const` in each (a discriminator): they are returned as they are;
- otherwise by JSON type. A value's type is one of null, boolean, object, array, string, integer,
  or a number with a fraction. Where two or more branches admit a type and none of them says
  anything else about values of that type (only `type` and keywords of other types), every value
  of that type matches them all, so none is valid: the type is taken out of those branches. The
  Kubernetes `IntOrString` (`[{type: [string, null]}, {type: [integer, null]}]`) becomes
  `[{type: string}, {type: integer}]`: `null` matches both and is not valid. Where a type is
  shared by a branch that constrains it, nothing is proved. A branch left with "a number with a
  fraction" but not integers cannot be written as a `type`: nothing is proved either.

"Exactly one of these names" (`oneOf: [{"required": ["url"]}, {"required": ["path"]}]`, only
`required` in each branch) is the `anyOf` of objects that have one branch's names and not the
name that would complete another's (`properties: {"path": false}`); where completing another
branch would take two or more missing names, nothing is proved, and a branch whose names include
another's can never match alone and is left out. The generated branches say `additionalProperties:
true`: they only constrain the object around them, which strict mode closes.

A branch that is only a local `$ref` (SchemaStore's `oneOf: [{"type": "string"}, {"$ref":
"#/definitions/step"}]`) is judged by the definition it names; a branch of listed values admits
the types of its values (`enum: ["a", "b"]` is a string, and constrains strings); a branch that
is itself an `anyOf`/`oneOf` admits the union of its branches' types, an `allOf` their
intersection (and constrains all of them). A referenced branch is never rewritten: where it would
have to be narrowed, nothing is proved.

`lower_one_of` rewrites every such `oneOf` of a schema (grammar/engines/xgrammar/schema.py and
grammar/engines/llguidance/schema.py run it before compiling); grammar/validation/fidelity.py reports a `oneOf` enforced
exactly when `exclusive_branches` is not None.
"""

from __future__ import annotations

import json
from typing import Any

from grammar.schema.keyword_sets import ARRAY_KEYWORDS, NUMBER_KEYWORDS, OBJECT_KEYWORDS, STRING_KEYWORDS
from grammar.schema.walk import ANNOTATION_KEYWORDS, follow_local_refs, rewrite_bottom_up

# A value's JSON type, with numbers split: "fraction" is a number that is not an integer.
CLASSES = ("null", "boolean", "object", "array", "string", "integer", "fraction")
_TYPE_CLASSES = {"number": {"integer", "fraction"}, **{t: {t} for t in CLASSES if t != "fraction"}}
# keywords that only constrain values of some types (JSON Schema ignores them for the others)
_ONLY_FOR = {
    **{k: {"string"} for k in STRING_KEYWORDS + ("contentEncoding", "contentMediaType", "contentSchema")},
    **{k: {"integer", "fraction"} for k in NUMBER_KEYWORDS},
    **{k: {"array"} for k in ARRAY_KEYWORDS + ("additionalItems",)},
    **{k: {"object"} for k in OBJECT_KEYWORDS},
}
# annotations (grammar/schema/walk.py) constrain no value; any keyword not named there or above is
# taken to constrain values of every type, which can only keep a proof from being found
_ANNOTATIONS = ANNOTATION_KEYWORDS


def exclusive_branches(branches: Any, root: Any = None) -> list[Any] | None:
    """Pairwise disjoint branches that accept exactly what `oneOf: branches` accepts (see the
    module docstring), or None where that is not proved. `root`: the document local `$ref`s
    resolve in (None: they are not followed)."""
    if not isinstance(branches, list) or not branches or not all(isinstance(b, dict) for b in branches):
        return None
    views = [_view(b, root) for b in branches]
    if not all(isinstance(v, dict) for v in views):
        return None
    for tell in (_const_of, _discriminator_of(views)):
        if tell is not None:
            tags = [tell(v) for v in views]
            if None not in tags and len(set(tags)) == len(tags):
                return list(branches)
    by_names = _split_by_required(views)
    return by_names if by_names is not None else _split_by_type(branches, views, root)


def _split_by_required(views: list[dict]) -> list[dict] | None:
    """Branches of only `required` as disjoint objects (see the module docstring), or None."""
    names = []
    for view in views:
        required = view.get("required")
        if (
            set(view) - {"required"} - _ANNOTATIONS
            or not isinstance(required, list)
            or not required
            or not all(isinstance(n, str) for n in required)
        ):
            return None
        names.append(list(dict.fromkeys(required)))
    out = []
    for i, own in enumerate(names):
        forbidden: list[str] = []
        possible = True
        for j, other in enumerate(names):
            if j == i:
                continue
            missing = [n for n in other if n not in own]
            if not missing:
                possible = False  # whenever this branch matches, so does the other one
                break
            if len(missing) > 1:
                return None  # "not all of these" is a disjunction no single branch can say
            forbidden += [n for n in missing if n not in forbidden]
        if possible:
            branch: dict[str, Any] = {"type": "object", "required": own}
            if forbidden:
                branch["properties"] = {n: False for n in forbidden}
            out.append({**branch, "additionalProperties": True})
    return out or None


def lower_one_of(node: Any) -> Any:
    """`node` with every `oneOf` whose exclusive branches are known written as their `anyOf`
    (a `oneOf` beside an `anyOf` is left as it is: there is no second `anyOf` to write)."""
    return rewrite_bottom_up(node, lambda out: _lower_one_of(out, node))


def _view(branch: Any, root: Any) -> Any:
    """The schema a branch that is only a local `$ref` (and annotations) stands for; else itself."""
    return follow_local_refs(branch, root, only_bare=True)


def _lower_one_of(out: dict, root: Any = None) -> Any:
    if "oneOf" in out and "anyOf" not in out:
        branches = exclusive_branches(out["oneOf"], root)
        if branches is not None:
            lowered = {k: v for k, v in out.items() if k != "oneOf"}
            lowered["anyOf"] = branches
            return {k: lowered[k] for k in sorted(lowered)} if list(out) == sorted(out) else lowered
    return out


# -- by type -----------------------------------------------------------------------------------


def admitted_classes(branch: Any, root: Any = None, depth: int = 8) -> set[str] | None:
    """The classes of values `branch` admits (None: a `type` it cannot read, or too deep)."""
    if branch is True:
        return set(CLASSES)
    if not isinstance(branch, dict) or depth < 0:
        return None if branch is not False else set()
    declared = branch.get("type")
    if declared is None:
        found = set(CLASSES)
    else:
        names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
        if names is None or not all(isinstance(n, str) and n in _TYPE_CLASSES for n in names):
            return None
        found = set().union(*(_TYPE_CLASSES[n] for n in names))
    listed = _listed_classes(branch)
    if listed is not None:
        found &= listed
    for key in ("anyOf", "oneOf", "allOf"):
        subs = branch.get(key)
        if isinstance(subs, list) and subs:
            each = [admitted_classes(_view(b, root), root, depth - 1) for b in subs]
            if any(c is None for c in each):
                return None
            found &= set().union(*each) if key != "allOf" else set.intersection(*each)
    return found


def _listed_classes(branch: dict) -> set[str] | None:
    """The classes of a branch's listed values (None: it lists none)."""
    values = (
        [branch["const"]] if "const" in branch else branch.get("enum") if isinstance(branch.get("enum"), list) else None
    )
    if values is None:
        return None
    found = set()
    for v in values:
        if v is None:
            found.add("null")
        elif isinstance(v, bool):
            found.add("boolean")
        elif isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
            found.add("integer")
        elif isinstance(v, float):
            found.add("fraction")
        else:
            found.add({str: "string", list: "array", dict: "object"}.get(type(v), "object"))
    return found


def _constrained(branch: dict, admitted: set[str]) -> set[str]:
    """The classes whose values some keyword of `branch` (other than `type`) constrains."""
    found: set[str] = set()
    for key in branch:
        if key == "type" or key in _ANNOTATIONS or key.startswith("x-"):
            continue
        # listed values constrain only the classes they admit; any other keyword (combinators
        # included) is taken to constrain every class it could
        found |= admitted if key in ("enum", "const") else _ONLY_FOR.get(key, set(CLASSES))
    return found


def _split_by_type(branches: list[dict], views: list[dict] | None = None, root: Any = None) -> list[Any] | None:
    views = branches if views is None else views
    classes = [admitted_classes(v, root) for v in views]
    if any(c is None for c in classes):
        return None
    constrained = [_constrained(v, c) for v, c in zip(views, classes)]
    invalid: set[str] = set()  # classes of which no value is valid (each matches several branches)
    for cls in CLASSES:
        sharing = [i for i, c in enumerate(classes) if cls in c]
        if len(sharing) < 2:
            continue
        if any(cls in constrained[i] for i in sharing):
            return None
        invalid.add(cls)
    if not invalid:
        return list(branches)
    out = []
    for branch, view, admitted in zip(branches, views, classes):
        kept = admitted - invalid
        if kept == admitted:
            out.append(branch)
            continue
        if not kept:
            continue  # nothing of this branch is valid
        declared = _type_for(kept)
        if declared is None or view is not branch:
            return None  # a referenced branch is not rewritten
        out.append({**branch, "type": declared})
    return out or None


def _type_for(classes: set[str]) -> str | list[str] | None:
    """The `type` admitting exactly `classes` (None: fractions without integers cannot be written)."""
    if "fraction" in classes and "integer" not in classes:
        return None
    names = [c for c in CLASSES if c in classes and c not in ("integer", "fraction")]
    if "fraction" in classes:
        names.append("number")
    elif "integer" in classes:
        names.append("integer")
    return names[0] if len(names) == 1 else names


# -- by listed values --------------------------------------------------------------------------


def _const_of(branch: dict) -> str | None:
    return json.dumps(branch["const"], sort_keys=True) if "const" in branch else None


def _discriminator_of(branches: list[dict]):
    """A property required by every branch with a const in each: the tag that tells branches apart."""
    required = [set(b.get("required") or []) if isinstance(b.get("required"), list) else set() for b in branches]
    for name in set.intersection(*required) if required else set():

        def tag(branch: dict, name=name) -> str | None:
            props = branch.get("properties")
            prop = props.get(name) if isinstance(props, dict) else None
            return _const_of(prop) if isinstance(prop, dict) else None

        if all(tag(b) is not None for b in branches):
            return tag
    return None
