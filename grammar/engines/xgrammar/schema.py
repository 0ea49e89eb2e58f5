"""JSON schemas as compact xgrammar grammars: no free whitespace, separators (",", ":").

Compact means fewer tokens, longer forced spans for jump-forward, and no room for a small model to
loop on indentation until `max_tokens`. Schemas are converted from their canonical form, so two
specs that share a cache key always share a grammar, through the exact rewrites of
grammar/rewrites/lowering.py (exclusive `oneOf` as `anyOf`, listed values cut to those that fit, `byte` as
its pattern). Used by the json_schema and json_object kinds
and for the arguments of tool calls.
"""

from __future__ import annotations

import json
from typing import Any

import xgrammar as xgr

from grammar.errors import XGRAMMAR_ERRORS, GrammarSpecError, xgrammar_message
from grammar.rewrites.lowering import lower_for_masks
from grammar.rewrites.string_algebra import without_lookaheads
from grammar.schema.walk import rewrite_bottom_up
from grammar.validation.regex_check import xgrammar_regex

COMPACT_SEPARATORS = (",", ":")

# xgrammar (0.2.x) spells the characters of a length-bounded JSON string (minLength / maxLength,
# propertyNames) as [^"\\\r\n]: raw control characters such as TAB or \x01 are let into the output,
# which is then not JSON. Its own unbounded strings use JSON's class, which is put in their place.
_LOOSE_STRING_CHARS = r"[^\"\\\r\n]"
_JSON_STRING_CHARS = r"[^\0-\x1f\"\\\r\n]"


def _patterns_xgrammar_reads(schema: Any) -> Any:
    """`schema` with raw control characters in its patterns escaped (the same regexes, which
    xgrammar's EBNF lexer can read) and lookaheads dropped (best effort only: grammar/rewrites/string_algebra.py)."""

    def rewrite(node: dict) -> dict:
        if isinstance(node.get("pattern"), str):
            node = {**node, "pattern": xgrammar_regex(node["pattern"])}
        if isinstance(node.get("patternProperties"), dict):
            node = {**node, "patternProperties": {xgrammar_regex(k): v for k, v in node["patternProperties"].items()}}
        return node

    return rewrite_bottom_up(without_lookaheads(schema), rewrite)


def _xgrammar_json_grammar(schema: Any, strict: bool) -> xgr.Grammar:
    return xgr.Grammar.from_json_schema(
        json.dumps(lower_for_masks(_patterns_xgrammar_reads(schema), strict, partial_all_of=True)),
        any_whitespace=False,
        separators=COMPACT_SEPARATORS,
        strict_mode=strict,
    )


def compact_json_grammar(schema: Any, *, strict: bool) -> xgr.Grammar:
    """The grammar of compact JSON matching `schema` (xgrammar's errors propagate)."""
    grammar = _xgrammar_json_grammar(schema, strict)
    text = str(grammar)
    if _LOOSE_STRING_CHARS in text:
        grammar = xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS))
    return grammar


def compact_json_schema_ebnf(schema: Any, *, strict: bool = True) -> str:
    """EBNF for compact JSON matching `schema`, to embed in a structural tag.

    Structural tags' own `json_schema` content always allows free whitespace, so tool-call
    arguments are embedded as a grammar converted here with the same compact settings.
    """
    try:
        grammar = _xgrammar_json_grammar(schema, strict)
    except XGRAMMAR_ERRORS as e:
        raise GrammarSpecError(f"JSON schema cannot be compiled: {xgrammar_message(e)}") from e
    return str(grammar).replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS)
