"""Which JSON values must differ: the schema side of Jumpgate's value check (grammar/checks/value_check.py).

The token mask of a grammar has no memory of what was written, so it cannot keep object names or
array items unique. The value check can: it follows the output and masks out tokens that would
complete a repeated name or item. This module answers the schema questions it asks while doing so:
which schema nodes describe the value being written (following `properties`, `patternProperties`,
`additionalProperties`, `items`, `prefixItems`, local `$ref`s and, as a union, the branches of
`anyOf`/`oneOf`/`allOf`), whether an array there has `uniqueItems`, and, where its items can take
only a few values (`enum`, `const`, booleans), which ones; plus the canonical form under which
JSON Schema calls two values equal (1 and 1.0 are, true and 1 are not).

`unique_items_exact` says when masking the completing token is exact: the writer can always turn
a repeated item into a new one (a free string grows, an unbounded number gains a digit), or the
items are finite and each is refused as soon as its text can only spell a used value, or the
items are closed objects of scalar properties (`ObjectItems`): there the check refuses every token
after which the object being written could only end equal to an earlier item, so one that can
still differ is always left.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grammar.checks.canonical import canonical
from grammar.checks.object_items import OBJECT_ITEM_KEYWORDS, SCALAR_KINDS, Field, ItemRule, ObjectItems
from grammar.checks.plan_names import required_names
from grammar.rewrites.listed_values import fitting_values
from grammar.schema.keyword_sets import ALL_VALIDATION_KEYWORDS
from grammar.schema.walk import ANNOTATION_KEYWORDS, resolve_local_ref

MAX_FINITE = 256  # beyond this many listed values, items are treated as unbounded (prefix checks cost)
_MAX_EXPAND = 256  # nodes listed for one place (a schema of many refs stays cheap)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_OBJECT_SHAPES = ("properties", "additionalProperties", "patternProperties", "unevaluatedProperties")
_STRING_SHAPES = ("pattern", "format", "maxLength", "enum", "const")


@dataclass(frozen=True)
class DependentNames:
    """dependentRequired of one object: which names a written name requires, and the order in
    which the grammar writes declared names (a name after a missing dependent would skip it)."""

    requires: dict[str, tuple[str, ...]]
    order: dict[str, int]
    spellings: dict[str, tuple[bytes, ...]]  # how each declared name is written between its quotes

    def missing(self, written: frozenset) -> list[str]:
        return [d for t in written for d in self.requires.get(t, ()) if d not in written]

    def writable(self, written: frozenset) -> list[bytes]:
        """Spellings of the names that may still be written without skipping a missing dependent."""
        missing = self.missing(written)
        if not missing:
            return []
        last = min(self.order.get(d, len(self.order)) for d in missing)
        return [raw for n, raws in self.spellings.items() if n not in written and self.order[n] <= last for raw in raws]


class SchemaNavigator:
    """Schema nodes for each place in a JSON value being written (nodes are dicts; `{}` is any)."""

    def __init__(self, root: Any, strict: bool = True) -> None:
        self._root = root
        self._strict = strict  # strict grammars close every object that declares properties
        self._memo: dict[int, tuple[dict, ...]] = {}
        self._rules: dict[tuple[int, ...], ItemRule | None] = {}

    def required_names(self) -> frozenset[str]:
        """Every name some object of the schema requires (the completion planner's name hint)."""
        return required_names(self._root)

    def root_nodes(self) -> tuple[dict, ...]:
        return self.expand(self._root)

    def expand(self, node: Any) -> tuple[dict, ...]:
        """`node` with its references resolved and its combinator branches listed beside it."""
        if node is True or node is None:
            return ({},)
        if not isinstance(node, dict):
            return ()
        found = self._memo.get(id(node))
        if found is None:
            out: list[dict] = []
            self._collect(node, out, set())
            found = self._memo[id(node)] = tuple(out)
        return found

    def _collect(self, node: Any, out: list[dict], seen: set[int]) -> None:
        if node is True:
            node = {}
        if not isinstance(node, dict) or id(node) in seen or len(seen) > _MAX_EXPAND:
            return
        seen.add(id(node))
        out.append(node)
        ref = node.get("$ref")
        if isinstance(ref, str):
            self._collect(self._resolve(ref), out, seen)
        for name in ("anyOf", "oneOf", "allOf"):
            branches = node.get(name)
            for branch in branches if isinstance(branches, list) else ():
                self._collect(branch, out, seen)

    def _resolve(self, ref: str) -> Any:
        return resolve_local_ref(self._root, ref)

    def value_nodes(self, object_nodes: tuple[dict, ...], name: str) -> tuple[dict, ...]:
        out: list[dict] = []
        for node in object_nodes:
            props = node.get("properties")
            if isinstance(props, dict) and name in props:
                out += self.expand(props[name])
                continue
            matched = [s for p, s in (node.get("patternProperties") or {}).items() if _search(p, name)]
            if matched:
                for sub in matched:
                    out += self.expand(sub)
                continue
            extra = node.get("additionalProperties", node.get("unevaluatedProperties"))
            if isinstance(extra, dict):
                out += self.expand(extra)
        return tuple(out)

    def item_nodes(self, array_nodes: tuple[dict, ...], index: int) -> tuple[dict, ...]:
        out: list[dict] = []
        for node in array_nodes:
            prefix = node.get("prefixItems")
            items = node.get("items")
            if isinstance(items, list):  # draft 4-2019 tuple form
                prefix, items = items, node.get("additionalItems")
            if isinstance(prefix, list) and index < len(prefix):
                out += self.expand(prefix[index])
            elif isinstance(items, (dict, bool)):
                out += self.expand(items)
        return tuple(out)

    def names_may_repeat(self, object_nodes: tuple[dict, ...]) -> bool:
        """Can the grammar write a name twice in an object described by `object_nodes`? Not where
        every object schema among them closes its names (then the check skips the object)."""
        objects = [n for n in object_nodes if n.get("type") == "object" or any(k in n for k in _OBJECT_SHAPES)]
        return not objects or any(not self._closed(n) for n in objects)

    def _closed(self, node: dict) -> bool:
        most = node.get("maxProperties")
        if isinstance(most, int) and most <= 1:
            return True
        if node.get("patternProperties"):
            return False  # a name matching a pattern may be written twice, even with no other names allowed
        return (
            node.get("additionalProperties") is False
            or node.get("unevaluatedProperties") is False
            or (self._strict and strict_closes(node))
        )

    def dependent_names(self, object_nodes: tuple[dict, ...]) -> DependentNames | None:
        """The dependentRequired rule of an object described by `object_nodes` (None: none, or the
        object's names are open: masking could not keep it exactly, and names are many to check)."""
        if self.names_may_repeat(object_nodes):
            return None
        requires: dict[str, tuple[str, ...]] = {}
        order: dict[str, int] = {}
        for node in object_nodes:
            deps = name_dependencies(node)
            if deps:
                for trigger, names in deps.items():
                    requires[trigger] = requires.get(trigger, ()) + tuple(str(n) for n in names)
                props = node.get("properties")
                for name in props if isinstance(props, dict) else ():
                    order.setdefault(name, len(order))
        if not requires:
            return None
        spellings = {n: tuple(raw[1:-1] for raw in _spellings(n)) for n in order}
        return DependentNames(requires, order, spellings)

    def item_rule(self, array_nodes: tuple[dict, ...]) -> ItemRule | None:
        """The uniqueness rule of an array described by `array_nodes` (None: items may repeat)."""
        key = tuple(id(n) for n in array_nodes)
        if key not in self._rules:
            self._rules[key] = self._item_rule(array_nodes)
        return self._rules[key]

    def _item_rule(self, array_nodes: tuple[dict, ...]) -> ItemRule | None:
        if not any(n.get("uniqueItems") is True for n in array_nodes):
            return None
        items = tuple(n for n in self.item_nodes(array_nodes, 1 << 30))
        return ItemRule(
            finite_values(items),
            bool(items) and all(_integer_only(n) for n in items if _typed(n)),
            self.object_items(items),
        )

    def object_items(self, item_nodes: tuple[dict, ...]) -> ObjectItems | None:
        """The model of object items the value check steers (None: the items are not closed
        objects of free scalar or listed properties, written in declared order)."""
        shaped = [n for n in item_nodes if _validating(n) - {"$ref"}]
        if len(shaped) != 1:
            return None
        node = shaped[0]
        props = node.get("properties")
        required = node.get("required", [])
        if (
            _validating(node) - OBJECT_ITEM_KEYWORDS
            or node.get("type", "object") != "object"
            or not isinstance(props, dict)
            or not props
            or not isinstance(required, list)
            or any(r not in props for r in required)
        ):
            return None
        extra = node.get("additionalProperties", True if not self._strict else None)
        if extra is not None and extra is not False:
            return None  # names beyond the declared ones
        fields = []
        for name, sub in props.items():
            field = self._field(str(name), sub, name in required)
            if field is None:
                return None
            fields.append(field)
        return ObjectItems(tuple(fields))

    def _field(self, name: str, sub: Any, required: bool) -> Field | None:
        nodes = self.expand(sub)
        names = tuple(raw[1:-1] for raw in _spellings(name))
        listed = finite_values(nodes)
        if listed is not None:
            return Field(name, required, "listed", listed, names)
        shaped = [n for n in nodes if _validating(n) - {"$ref"}]
        if len(shaped) != 1 or not _typed(shaped[0]) or shaped[0].get("type") not in SCALAR_KINDS:
            return None
        node = shaped[0]
        if not _growable(node) or _validating(node) - {"type", "minLength"}:
            return None
        return Field(name, required, node["type"], (), names)


def finite_values(nodes: tuple[dict, ...]) -> tuple[tuple[str, tuple[bytes, ...]], ...] | None:
    """Every value the nodes allow, when they list them (enum, const, boolean, null); else None."""
    values: dict[str, Any] = {}
    listed = False
    for node in nodes:
        fitting = fitting_values(node)  # the grammar writes only these (grammar/rewrites/listed_values.py)
        if fitting is not None:
            got = fitting
        elif "const" in node:
            got = [node["const"]]
        elif isinstance(node.get("enum"), list):
            got = list(node["enum"])
        elif node.get("type") == "boolean":
            got = [True, False]
        elif node.get("type") == "null":
            got = [None]
        elif _typed(node) or any(k in node for k in ("properties", "items", "minLength")):
            return None  # an open value of some type
        else:
            continue  # a wrapper (anyOf/$ref holder) whose branches are listed beside it
        listed = True
        for v in got:
            values.setdefault(canonical(v), v)
    if not listed or len(values) > MAX_FINITE:
        return None
    return tuple((c, _spellings(v)) for c, v in values.items())


def _spellings(value: Any) -> tuple[bytes, ...]:
    compact = (",", ":")
    forms = {
        json.dumps(value, separators=compact, ensure_ascii=False).encode(),
        json.dumps(value, separators=compact).encode(),
    }
    return tuple(sorted(forms))


def unique_items_exact(schema: dict, navigator: SchemaNavigator) -> str | None:
    """None when masking the completing token keeps this array's items unique without ever leaving
    the writer stuck; else why not."""
    nodes = navigator.expand(schema)
    items = navigator.item_nodes(nodes, 1 << 30)
    if any(isinstance(n.get("prefixItems"), list) or isinstance(n.get("items"), list) for n in nodes):
        return "uniqueItems beside prefixItems is checked only after generation"
    finite = finite_values(items)
    if finite is not None:
        least = max((n.get("minItems", 0) for n in nodes if isinstance(n.get("minItems"), int)), default=0)
        if least > len(finite):
            return f"minItems {least} exceeds the {len(finite)} distinct values the items allow"
        return None
    objects = navigator.object_items(items)
    if objects is not None:
        least = max((n.get("minItems", 0) for n in nodes if isinstance(n.get("minItems"), int)), default=0)
        size = objects.size()
        if size is not None and least > size:
            return f"minItems {least} exceeds the {size} distinct objects the items allow"
        return None
    typed = [n for n in items if _typed(n)]
    if not typed or any(not _growable(n) for n in typed):
        return (
            "uniqueItems is kept by the mask only for free strings, unbounded numbers, listed values "
            "(enum, const, boolean) and closed objects whose properties are all of these; other items are "
            "checked after generation"
        )
    return None


def strict_closes(node: dict) -> bool:
    """Does strict mode close `node`'s names to its declared properties? Only where it declares
    some and says nothing else: both engines keep an explicit `additionalProperties` or
    `unevaluatedProperties` (true or a schema: names beyond the declared ones, so perhaps one
    twice), and llguidance's strict grammar (grammar/engines/llguidance/schema.py) leaves `properties: {}` open."""
    props = node.get("properties")
    return (
        isinstance(props, dict)
        and bool(props)
        and "additionalProperties" not in node
        and "unevaluatedProperties" not in node
    )


def names_only_dependencies(node: dict) -> dict | None:
    """`node`'s draft-7 `dependencies` when every entry is a list of names (then it is
    dependentRequired by another spelling); None otherwise."""
    deps = node.get("dependencies")
    return deps if isinstance(deps, dict) and all(isinstance(v, list) for v in deps.values()) else None


def required_conditional(node: dict) -> tuple[str, list[str]] | None:
    """(trigger, names) when `node`'s `if`/`then` says only "when `trigger` is present, so are
    `names`": `if` requires one name (and may declare it unconstrained), `then` only requires
    names, and there is no `else`. That is exactly `dependentRequired: {trigger: names}`."""
    test, then = node.get("if"), node.get("then")
    if "else" in node or not isinstance(test, dict) or not isinstance(then, dict):
        return None
    test = {k: v for k, v in test.items() if k not in ANNOTATION_KEYWORDS}
    then = {k: v for k, v in then.items() if k not in ANNOTATION_KEYWORDS}
    required = test.get("required")
    if set(test) - {"required", "properties"} or not isinstance(required, list) or len(required) != 1:
        return None
    trigger = required[0]
    if test.get("properties", {}) not in ({}, {trigger: {}}, {trigger: True}) or set(then) != {"required"}:
        return None
    names = then["required"]
    if not isinstance(trigger, str) or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return trigger, names


def name_dependencies(node: dict) -> dict[str, list[str]]:
    """Which names each written name requires in `node`: its `dependentRequired`, the name lists of
    draft-7 `dependencies`, and a `required_conditional` (all mean the same rule)."""
    found: dict[str, list[str]] = {}
    sources = [node.get("dependentRequired"), names_only_dependencies(node)]
    conditional = required_conditional(node)
    if conditional is not None:
        sources.append({conditional[0]: conditional[1]})
    for source in sources:
        for trigger, names in (source or {}).items() if isinstance(source, dict) else ():
            if isinstance(names, list):
                found[trigger] = found.get(trigger, []) + [n for n in names if n not in found.get(trigger, [])]
    return found


def dependent_required_exact(node: dict, strict: bool) -> str | None:
    """None when masking keeps `node`'s dependentRequired exactly (the object's names are closed
    and declared, and each dependent is required or comes after its trigger, so banning the close
    and any name past a missing dependent always leaves that dependent to write); else why not."""
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    closed = node.get("additionalProperties") is False or (strict and strict_closes(node))
    if not closed or "patternProperties" in node or "maxProperties" in node:
        return (
            "dependentRequired is kept by the mask only in objects whose names are all declared "
            "(strict mode or additionalProperties: false), without patternProperties or maxProperties"
        )
    required = set(node.get("required") or ()) if isinstance(node.get("required"), list) else set()
    order = {name: i for i, name in enumerate(props)}
    for trigger, names in name_dependencies(node).items():
        for name in names:
            if name not in order or trigger not in order:
                return f"dependentRequired names {name!r}, which is not a declared property"
            if name not in required and order[name] < order[trigger]:
                return (
                    f"dependentRequired: {name!r} is declared before {trigger!r}, and the grammar writes "
                    "properties in declaration order; declare it after"
                )
    return None


def _validating(node: dict) -> set[str]:
    """The keywords of `node` that change which values are valid."""
    return {k for k in node if k in ALL_VALIDATION_KEYWORDS}


def _typed(node: dict) -> bool:
    return isinstance(node.get("type"), (str, list))


def _integer_only(node: dict) -> bool:
    return node.get("type") == "integer"


def _growable(node: dict) -> bool:
    """Can a repeated item of this schema always be written on into a different one?"""
    kind = node.get("type")
    if kind == "string":
        return not any(k in node for k in _STRING_SHAPES)
    if kind in ("integer", "number"):
        return not any(k in node for k in _BOUNDS + ("enum", "const"))
    return False


def _search(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


VALUE_CHECK_KINDS = frozenset({"json_schema", "json_object", "tool_calls"})  # kinds whose output holds JSON


def value_check_begin(kind: str, payload: Any) -> bytes | None:
    """For tool calls, the marker after which a call's JSON starts (None: the whole output is JSON)."""
    if kind != "tool_calls":
        return None
    from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format

    name = payload.get("format", HERMES_TOOL_CALL_FORMAT.name) if isinstance(payload, dict) else None
    return get_tool_call_format(name or HERMES_TOOL_CALL_FORMAT.name).call_begin.encode()


def value_checked(kind: str, payload: Any) -> bool:
    """Whether the value check can follow `kind`'s output: not tool calls in a markup format."""
    if kind != "tool_calls" or not isinstance(payload, dict):
        return True
    from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format

    return get_tool_call_format(payload.get("format") or HERMES_TOOL_CALL_FORMAT.name).value_checked


def navigator_for(kind: str, payload: Any, strict: bool) -> SchemaNavigator | None:
    """The schema side of the value check (None: no schema, every object's names are kept unique)."""
    return SchemaNavigator(payload, strict) if kind == "json_schema" else None
