"""JSON schemas as llguidance grammars: the exact engine for what xgrammar would approximate.

llguidance intersects `pattern` with minLength/maxLength, enforces `multipleOf` on numbers and the
keywords beside anyOf/allOf (and allOf with several branches), and errors on what it does not
implement instead of approximating. The JSON it writes is compact, as with xgrammar
(grammar/compact_json.py): no free whitespace, separators "," and ":".
"""

from __future__ import annotations

from typing import Any

import llguidance

from grammar.canonical import canonical_schema

ENGINE = "llguidance"
_COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def llguidance_grammar(schema: Any, *, strict: bool) -> str:
    """The llguidance grammar text of compact JSON matching `schema` (not yet validated)."""
    schema = canonical_schema(schema)
    if strict:
        schema = _closed(schema, in_all_of=False)
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


def _closed(node: Any, in_all_of: bool) -> Any:
    """Strict mode: no properties beyond the declared ones where an object declares them (as
    xgrammar's strict_mode does). allOf branches stay open: closing each would refuse the
    properties the other branches declare."""
    if isinstance(node, list):
        return [_closed(v, in_all_of) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas") and isinstance(
                value, dict):
            out[key] = {name: _closed(sub, False) for name, sub in value.items()}
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value  # data, not schemas
        else:
            out[key] = _closed(value, key == "allOf")
    if ("properties" in out and not in_all_of and "additionalProperties" not in out
            and "unevaluatedProperties" not in out):
        out["additionalProperties"] = False
    return out
