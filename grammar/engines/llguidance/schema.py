"""JSON schemas as llguidance grammars: the exact engine for what xgrammar would approximate.

llguidance intersects `pattern` with minLength/maxLength, enforces `multipleOf` on numbers and the
keywords beside anyOf/allOf (and allOf with several branches), and errors on what it does not
implement instead of approximating. An `if`/`then`/`else` on a discriminator is lowered to the
`anyOf` it means first (grammar/rewrites/conditionals.py), and a `not` that says which names are absent as
`properties: {name: false}` (grammar/rewrites/negation.py), after the rewrites both engines share
(grammar/rewrites/lowering.py: a `oneOf` with provably exclusive branches as their `anyOf`, which matters
here since llguidance refuses `oneOf`; listed values cut to those that fit; `byte` as its pattern). The JSON it writes is compact, as with xgrammar
(grammar/engines/xgrammar/schema.py): no free whitespace, separators "," and ":". A schema with a `pattern`
that opens with lookaheads, or a string's `not` of patterns or listed strings, is written as a Lark
grammar instead (grammar/rewrites/string_algebra.py), whose `%json` parts are compiled the same way.

`uniqueItems` and `dependentRequired` (and its other spellings: draft-7 `dependencies` of names, an
`if` one name `then` others) are left out of the grammar: llguidance does not implement
them, and where they are enforced at all it is by Jumpgate's value check beside the matcher
(grammar/checks/value_check.py). A schema is routed here only when the fidelity report says every
keyword is then enforced (grammar/validation/fidelity.py), so leaving them out never loosens a promise.
"""

from __future__ import annotations

from typing import Any

import llguidance

from grammar.checks.value_rules import names_only_dependencies, required_conditional
from grammar.rewrites.conditionals import lower_conditionals
from grammar.rewrites.lowering import lower_for_masks
from grammar.rewrites.negation import lower_negations
from grammar.rewrites.string_algebra import lark_grammar, schema_needs_lark
from grammar.schema.walk import DATA_KEYWORDS, NAMED_SCHEMA_MAPS, resolve_local_ref, rewrite_bottom_up

ENGINE = "llguidance"
VALUE_CHECKED_KEYWORDS = frozenset({"uniqueItems", "dependentRequired"})  # see the module docstring
_SCHEMA_MAPS, _DATA = NAMED_SCHEMA_MAPS, DATA_KEYWORDS  # the lowerings' one table (grammar/schema/walk.py)
_COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def llguidance_grammar(schema: Any, *, strict: bool) -> str:
    """The llguidance grammar text of compact JSON matching `schema` (not yet validated)."""
    schema = lower_negations(
        lower_conditionals(_without_name_rules(_without(lower_for_masks(schema, strict), VALUE_CHECKED_KEYWORDS)))
    )
    if strict:
        schema = _closed(schema, schema, open_here=False, open_refs=_all_of_refs(schema))
    if schema_needs_lark(schema):  # lookahead patterns, strings' `not`s: a Lark grammar around them
        return llguidance.LLMatcher.grammar_from_lark(lark_grammar(schema))
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_COMPACT)


def llguidance_refusal(schema: Any, *, strict: bool) -> str | None:
    """Why llguidance would not compile `schema` exactly (None: it would).

    Warnings count as refusals: llguidance warns where it would drop or loosen a keyword, and
    this engine is only used where it is exact.
    """
    try:
        grammar = llguidance_grammar(schema, strict=strict)
    except (ValueError, TypeError) as e:
        return str(e)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return "; ".join(messages) if failed or messages else None


def _closed(node: Any, root: dict, *, open_here: bool, open_refs: set[str], where: str = "#") -> Any:
    """Strict mode: no properties beyond the declared ones where an object declares them (as
    xgrammar's strict_mode does). An allOf is closed as a whole, over the names its branches
    declare; the branches themselves (and the definitions they reference) stay open, since closing
    each would refuse the properties the others declare."""
    if isinstance(node, list):
        return [_closed(v, root, open_here=open_here, open_refs=open_refs) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas") and isinstance(
            value, dict
        ):
            out[key] = {
                name: _closed(
                    sub,
                    root,
                    open_here=f"{where}/{key}/{name}" in open_refs,
                    open_refs=open_refs,
                    where=f"{where}/{key}/{name}",
                )
                for name, sub in value.items()
            }
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value  # data, not schemas
        else:
            out[key] = _closed(value, root, open_here=key == "allOf", open_refs=open_refs)
    if open_here or "additionalProperties" in out or "unevaluatedProperties" in out:
        return out
    # names in the order they are declared (llguidance writes properties in that order)
    names = dict(out["properties"]) if isinstance(out.get("properties"), dict) else {}
    if isinstance(node.get("allOf"), list):
        for branch in node["allOf"]:
            branch = _resolve(branch, root)
            if isinstance(branch, dict) and isinstance(branch.get("properties"), dict):
                names.update({name: {} for name in branch["properties"] if name not in names})
        if names:
            out["properties"] = names
    if names:
        out["additionalProperties"] = False
    # keywords in canonical (sorted) order: llguidance 1.9 reads `additionalProperties` written
    # after `allOf` as closing the branches too, and then refuses their properties
    return {key: out[key] for key in sorted(out)}


def _without_name_rules(schema: Any) -> Any:
    """`schema` without the other spellings of dependentRequired (draft-7 `dependencies` of names,
    an `if` one name `then` others: grammar/checks/value_rules.py's name_dependencies), which the value
    check enforces as it does dependentRequired."""

    def drop(out: dict) -> dict:
        if names_only_dependencies(out) is not None:
            out = {k: v for k, v in out.items() if k != "dependencies"}
        if required_conditional(out) is not None:
            out = {k: v for k, v in out.items() if k not in ("if", "then")}
        return out

    return rewrite_bottom_up(schema, drop)


def _without(node: Any, keywords: frozenset[str]) -> Any:
    """`node` with `keywords` removed from every schema in it (names and data are kept as they are)."""
    if isinstance(node, list):
        return [_without(v, keywords) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in keywords:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _without(sub, keywords) for name, sub in value.items()}
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _without(value, keywords)
    return out


def _all_of_refs(schema: Any) -> set[str]:
    """The local references used as allOf branches (their definitions stay open)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for branch in node.get("allOf") or [] if isinstance(node.get("allOf"), list) else []:
                if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
                    found.add(branch["$ref"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _resolve(branch: Any, root: dict) -> Any:
    """A branch with a local `$ref` ("#/$defs/name") is read as the definition it names."""
    ref = branch.get("$ref") if isinstance(branch, dict) else None
    return resolve_local_ref(root, ref) if isinstance(ref, str) else branch
