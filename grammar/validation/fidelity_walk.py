"""The classifier behind the fidelity report: a walk over a JSON schema deciding, node by node,
how each validation keyword is kept (the rules, established against xgrammar 0.2.9 by feeding a
violating instance to a matcher, are listed in docs/structured-output.md; every row of the keyword
table, grammar/validation/keywords/, has an example schema the tests hold this walk to). The walk
names the table's row (its `rule`) for each keyword it does not find plainly masked; the row says
the status, engine and reason (fidelity_report.keyword_entry).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonschema

from grammar.checks.value_rules import (
    SchemaNavigator,
    dependent_required_exact,
    names_only_dependencies,
    required_conditional,
    strict_closes,
    unique_items_exact,
)
from grammar.errors import join_pointer
from grammar.rewrites.all_of import distributed_any_of, merged_all_of, partly_merged_all_of
from grammar.rewrites.conditionals import allof_conditionals, discriminator
from grammar.rewrites.listed_values import fitting_values, omitted_properties
from grammar.rewrites.negation import negation
from grammar.rewrites.one_of import exclusive_branches
from grammar.rewrites.string_algebra import excluded_strings, leading_lookaheads
from grammar.validation.fidelity_report import (
    CHECKABLE_FORMATS,
    CHECKED,
    COMBINATORS,
    DUPLICATE_KEYS,
    KEYWORD_TYPES,
    NEVER_MASKED,
    OBJECT_KEYWORDS,
    UNENFORCED,
    VALIDATION_KEYWORDS,
    KeywordFidelity,
    keyword_entry,
)
from grammar.validation.fidelity_scalars import classify_scalar_keyword

VALUE_CHECKED = ("uniqueItems", "dependentRequired")  # what the value check can keep (grammar/checks/value_rules.py)

# -- the walk --------------------------------------------------------------------------------


def walk_schema(
    schema: Any, pointer: str, strict: bool, value_check: bool, names_checked: bool = False
) -> list[KeywordFidelity]:
    """`value_check`: the whole value check follows this schema; `names_checked`: only its names
    (tool arguments: the check has no schema there)."""
    found: list[KeywordFidelity] = []
    stack: list[tuple[Any, str, str | None]] = [(schema, pointer, None)]  # (node, pointer, implied type)
    navigator = SchemaNavigator(schema, strict) if value_check else None
    while stack:
        node, here, implied = stack.pop()
        if not isinstance(node, dict):
            continue  # boolean schemas are exact
        entries, children = _classify_node(
            node, here, strict, implied, navigator, value_check or names_checked, root=node is schema, document=schema
        )
        found += entries
        stack.extend(reversed(children))
    return found


def _classify_node(
    node: dict,
    here: str,
    strict: bool,
    implied: str | None,
    navigator: SchemaNavigator | None,
    names_checked: bool,
    root: bool = False,
    document: Any = None,
):
    entries: list[KeywordFidelity] = []
    children: list[tuple[Any, str, str | None]] = []
    present = [k for k in node if k in VALIDATION_KEYWORDS]
    for name in ("$defs", "definitions"):  # reachable through $ref: classified where they are written
        if isinstance(node.get(name), dict):
            children += [(v, join_pointer(here, name, k), None) for k, v in node[name].items()]

    def mark(keyword: str, rule: str = "", **fields: Any) -> None:
        """`keyword` of this node kept as the keyword table's row `rule` says ("": masked plainly)."""
        entry = keyword_entry(join_pointer(here, keyword), keyword, rule, **fields)
        if entry.status == CHECKED and _checked_or_unenforced(node, keyword) == UNENFORCED:
            entry = replace(entry, status=UNENFORCED)
        entries.append(entry)

    combinator = next((k for k in COMBINATORS if k in node), None)
    if combinator is not None:
        return _classify_combinator(node, here, strict, combinator, present, mark, entries, children, document)
    if "enum" in node or "const" in node:
        return _classify_listed_values(node, here, present, mark, entries, children)

    types = _types(node, implied)
    for keyword in present:
        value = node[keyword]
        if keyword == "type":
            mark(keyword)
        elif keyword in KEYWORD_TYPES:
            classify_scalar_keyword(node, keyword, types, mark)
        elif keyword in NEVER_MASKED:
            if keyword == "uniqueItems" and value is not True:
                continue  # uniqueItems: false asks nothing
            if keyword in ("then", "else") and "if" not in node:
                continue  # ignored by JSON Schema without `if`
            if keyword in ("if", "then", "else") and discriminator(node, None, document) is not None:
                mark(keyword, "conditional.discriminator")
                if keyword != "if":
                    children.append((value, join_pointer(here, keyword), None))
                continue
            # draft-7 `dependencies` of names, and `if` one name is present `then` others are, are
            # dependentRequired by another spelling (grammar/checks/value_rules.py: name_dependencies)
            spelled = (keyword == "dependencies" and names_only_dependencies(node) is not None) or (
                keyword in ("if", "then") and required_conditional(node) is not None
            )
            if (keyword in VALUE_CHECKED or spelled) and navigator is not None:
                why_not = (
                    unique_items_exact(node, navigator)
                    if keyword == "uniqueItems"
                    else dependent_required_exact(node, strict)
                )
                checked = "uniqueItems" if keyword == "uniqueItems" else "dependentRequired"
                if why_not is None:
                    mark(keyword, f"{checked}.value_check")
                else:
                    mark(keyword, f"{checked}.inexact", detail=why_not)
                continue
            if keyword == "not" and negation(value) is not None:
                # names absent (grammar/rewrites/negation.py): llguidance compiles it as `properties: {name:
                # false}`, which xgrammar refuses; the sub-schema itself is never generated
                mark(keyword, "not.absent_names")
                continue
            if keyword == "not" and node.get("type") == "string" and excluded_strings(value) is not None:
                # a string's `not` of patterns or listed strings: a complement in llguidance's regexes
                # (grammar/rewrites/string_algebra.py); the sub-schema itself is never generated
                mark(keyword, "not.string_complement")
                continue
            if (
                keyword == "patternProperties"
                and isinstance(value, dict)
                and any(leading_lookaheads(k) is not None for k in value)
            ):
                # no engine's name regexes have lookaheads: the grammar writes the names without
                # them (grammar/rewrites/string_algebra.py), validation after generation keeps them
                mark(keyword, "patternProperties.lookahead")
                children += [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
                continue
            if keyword == "patternProperties" and isinstance(value, dict):
                # llguidance matches names against the patterns exactly (and refuses patterns two
                # of which a name could match, which then stay refused here)
                mark(keyword, "patternProperties.disjoint")
                children += [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
                continue
            mark(keyword, NEVER_MASKED[keyword])
        elif keyword == "required":
            declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            undeclared = [n for n in value if n not in declared] if isinstance(value, list) else []
            if undeclared:
                mark(keyword, "required.undeclared", names=", ".join(map(str, undeclared)))
            else:
                mark(keyword)
        elif keyword == "unevaluatedProperties":
            closed = strict or node.get("additionalProperties") is False
            mark(keyword, "" if closed else "unevaluatedProperties.open")
        elif keyword == "unevaluatedItems":
            mark(keyword, "" if value is False else "unevaluatedItems.schema")
        elif keyword == "properties" and isinstance(value, dict):
            mark(keyword)
            omitted = omitted_properties(node, strict=strict, root=root)
            for name in omitted:  # grammar/rewrites/listed_values.py leaves them out of the grammar
                entries += [
                    keyword_entry(join_pointer(here, keyword, name, k), k, "listed_values.omitted")
                    for k in value[name]
                    if k in VALIDATION_KEYWORDS
                ]
            children += [c for c, name in zip(_subschemas(node, keyword, here), value) if name not in omitted]
        else:  # items, prefixItems, additionalProperties, min/maxItems, min/maxProperties, propertyNames
            mark(keyword)
            children += _subschemas(node, keyword, here)
    if _allows_additional_names(node, types, strict):
        checked = names_checked and "propertyNames" not in node
        entries.append(keyword_entry(here, DUPLICATE_KEYS, f"duplicate_keys.{'value_check' if checked else 'checked'}"))
    return entries, children


def _classify_combinator(node, here, strict, combinator, present, mark, entries, children, document=None):
    value = node[combinator]
    siblings = [k for k in present if k != combinator]
    # a oneOf is compiled as the anyOf of its exclusive branches (grammar/rewrites/one_of.py), where known
    exclusive = exclusive_branches(value, document) if combinator == "oneOf" else None
    conditionals = allof_conditionals(node, document) if combinator == "allOf" else None
    # An allOf (an anyOf with keywords beside it) compiled as the object schema(s) it merges into
    # (grammar/rewrites/all_of.py) is classified as compiled: the merged node where it is written, whose
    # keywords then show what xgrammar does with them together. `partial`: some allOf branches
    # cannot merge; the merged node has the rest and the keywords beside, the check keeps them.
    merged = merged_all_of(node, document) if combinator == "allOf" else None
    partial = partly_merged_all_of(node, document) if combinator == "allOf" and merged is None else None
    if conditionals:
        # an allOf of conditionals on one listed property: llguidance enforces it as one anyOf
        # (grammar/rewrites/conditionals.py); each conditional's keywords are reported where they are written
        mark("allOf", "allOf.conditionals")
        for i in conditionals:
            for keyword in ("if", "then", "else"):
                if keyword in value[i]:
                    entries.append(
                        keyword_entry(join_pointer(here, "allOf", i, keyword), keyword, "allOf.conditionals")
                    )
                    if keyword != "if":
                        children.append((value[i][keyword], join_pointer(here, "allOf", i, keyword), None))
        rest = [i for i in range(len(value)) if i not in conditionals]
        if len(rest) == 1:  # the one other branch is walked as a single-branch allOf's would be
            children.append((value[rest[0]], join_pointer(here, "allOf", rest[0]), None))
    elif merged is not None:
        mark("allOf")
        children.append((merged, here, None))
        return entries, children
    elif partial is not None and len(value) > 1:
        mark("allOf", "allOf.partial")
    elif combinator == "allOf" and isinstance(value, list) and len(value) > 1:
        mark("allOf", "allOf.several")
    elif combinator == "anyOf" and siblings and (spread := distributed_any_of(node, document)) is not None:
        mark("anyOf")
        children += [(b, join_pointer(here, "anyOf", i), None) for i, b in enumerate(spread["anyOf"])]
        return entries, children
    elif combinator == "oneOf" and exclusive is None:
        mark("oneOf", "oneOf.overlap")
    else:
        mark(combinator)
        children += _subschemas(node, combinator, here)
    if partial is not None:  # the keywords beside are in the merged node
        children.append((partial, here, None))
        return entries, children
    for keyword in siblings:
        if (
            keyword == "type"
            and combinator in ("anyOf", "oneOf")
            and _branch_types_within(value if exclusive is None else exclusive, node["type"])
        ):
            mark(keyword)  # every branch already has one of these types
            continue
        if keyword in ("then", "else") and "if" not in node:
            continue
        exact = combinator in ("anyOf", "allOf", "$ref") or exclusive is not None
        mark(keyword, f"beside_combinator.{'exact' if exact else 'overlap'}", combinator=combinator)
    return entries, children


def _classify_listed_values(node, here, present, mark, entries, children):
    listed = [node["const"]] if "const" in node else list(node.get("enum") or [])
    rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
    implied = _values_fit(listed, rest)
    fitting = fitting_values(node) if not implied else None  # non-empty: compiled as just these
    for keyword in present:
        if keyword in ("enum", "const"):
            mark(keyword)
        elif keyword in ("then", "else") and "if" not in node:
            continue
        elif implied:
            mark(keyword)  # every listed value satisfies it, and only listed values are generated
        elif fitting:
            mark(keyword, "listed_values.fitting")
        else:
            mark(keyword, "listed_values.ignored")
    return entries, children


def _checked_or_unenforced(node: dict, keyword: str) -> str:
    if keyword == "format" and node.get("format") not in CHECKABLE_FORMATS:
        return UNENFORCED
    return CHECKED


def _types(node: dict, implied: str | None) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return {implied} if implied else None


def _subschemas(node: dict, keyword: str, here: str) -> list[tuple[Any, str, str | None]]:
    value = node[keyword]
    if keyword in ("properties",) and isinstance(value, dict):
        return [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
    if keyword in ("prefixItems", "anyOf", "oneOf", "allOf") and isinstance(value, list):
        return [(v, join_pointer(here, keyword, i), None) for i, v in enumerate(value)]
    if keyword == "propertyNames":
        return [(value, join_pointer(here, keyword), "string")]  # names are strings
    if keyword in ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems") and isinstance(
        value, dict
    ):
        return [(value, join_pointer(here, keyword), None)]
    return []


def _allows_additional_names(node: dict, types: set[str] | None, strict: bool) -> bool:
    """Can the grammar write a property name it did not declare (so perhaps twice)?"""
    if types is not None and "object" not in types:
        return False
    if types is None and not any(k in node for k in OBJECT_KEYWORDS):
        return False
    most = node.get("maxProperties")
    if isinstance(most, int) and most <= 1:
        return False  # one name cannot repeat
    if node.get("patternProperties"):
        return True  # a name matching a pattern may be written again, whatever else closes the object
    if node.get("additionalProperties") is False or node.get("unevaluatedProperties") is False:
        return False
    return not (strict and strict_closes(node))  # strict closes an object of declared names only


def _branch_types_within(branches: Any, declared: Any) -> bool:
    allowed = {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else set()
    if not isinstance(branches, list) or not branches:
        return False
    for branch in branches:
        t = branch.get("type") if isinstance(branch, dict) else None
        got = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if not got or not got <= allowed | ({"integer"} if "number" in allowed else set()):
            return False
    return True


def _values_fit(values: list[Any], rest: dict) -> bool:
    """Does every listed value satisfy the other keywords of its schema (so they need no mask)?"""
    if not any(k in VALIDATION_KEYWORDS for k in rest):
        return True
    if any(k in rest for k in ("$ref",)):
        return False  # would need the whole document to resolve
    try:
        validator = jsonschema.Draft202012Validator(rest, format_checker=jsonschema.FormatChecker())
        return all(validator.is_valid(v) for v in values)
    except Exception:  # a value jsonschema cannot judge here (e.g. a reference): assume it does not fit
        return False
