"""Turn a validated GrammarSpec into an xgrammar CompiledGrammar (the one place that knows how).

JSON is compiled compact: no free whitespace and separators (",", ":"). That means fewer
tokens, longer forced spans for jump-forward, and no room for a small model to loop on
indentation until `max_tokens`. Specs are compiled from their canonical form, so two specs that
share a cache key always share a grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any

import xgrammar as xgr

from grammar.canonical import canonical_schema
from grammar.errors import GrammarSpecError

COMPACT_SEPARATORS = (",", ":")
# Bump when the way specs are compiled changes: it is part of the cache key, so grammars
# compiled under an older policy are never loaded from disk.
COMPILE_POLICY_VERSION = 2  # 2: length-bounded JSON strings refuse raw control characters

# xgrammar (0.2.x) spells the characters of a length-bounded JSON string (minLength / maxLength,
# propertyNames) as [^"\\\r\n]: raw control characters such as TAB or \x01 are let into the output,
# which is then not JSON. Its own unbounded strings use JSON's class, which is put in their place.
_LOOSE_STRING_CHARS = r'[^\"\\\r\n]'
_JSON_STRING_CHARS = r'[^\0-\x1f\"\\\r\n]'

_XGRAMMAR_ERRORS = (RuntimeError, ValueError, TypeError)  # xgrammar's own errors subclass RuntimeError
_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


def compile_spec(compiler: xgr.GrammarCompiler, spec: Any) -> xgr.CompiledGrammar:
    """Compile a spec already checked by `validate_spec`; xgrammar refusals become GrammarSpecError."""
    try:
        return _compile(compiler, spec)
    except GrammarSpecError:
        raise
    except _XGRAMMAR_ERRORS as e:
        raise GrammarSpecError(f"{_WHAT[spec.kind]} cannot be compiled: {xgrammar_message(e)}", "", spec.param) from e


_WHAT = {
    "json_schema": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "ebnf": "EBNF grammar",
    "tool_calls": "tool-call grammar",
}


def _compile(compiler: xgr.GrammarCompiler, spec: Any) -> xgr.CompiledGrammar:
    if spec.kind == "json_schema":
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(canonical_schema(spec.payload)),
            any_whitespace=False,
            separators=COMPACT_SEPARATORS,
            strict_mode=spec.strict,
        )
        text = str(grammar)
        if _LOOSE_STRING_CHARS in text:
            grammar = xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS))
        return compiler.compile_grammar(grammar)
    if spec.kind == "json_object":
        # any JSON object, compact (strict_mode would shrink a property-less object to {})
        return compiler.compile_json_schema(
            '{"type":"object"}', any_whitespace=False, separators=COMPACT_SEPARATORS, strict_mode=False
        )
    if spec.kind == "regex":
        return compiler.compile_regex(spec.payload)
    if spec.kind == "ebnf":
        return compiler.compile_grammar(spec.payload)
    if spec.kind == "tool_calls":
        from grammar.tool_calls import tool_calls_structural_tag

        return compiler.compile_structural_tag(tool_calls_structural_tag(spec.payload))
    raise GrammarSpecError(f"unknown grammar kind {spec.kind!r}", "", spec.param)


def compact_json_schema_ebnf(schema: Any, *, strict: bool = True) -> str:
    """EBNF for compact JSON matching `schema`, to embed in a structural tag.

    Structural tags' own `json_schema` content always allows free whitespace, so tool-call
    arguments are embedded as a grammar converted here with the same compact settings.
    """
    try:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(canonical_schema(schema)),
            any_whitespace=False,
            separators=COMPACT_SEPARATORS,
            strict_mode=strict,
        )
    except _XGRAMMAR_ERRORS as e:
        raise GrammarSpecError(f"JSON schema cannot be compiled: {xgrammar_message(e)}") from e
    return str(grammar).replace(_LOOSE_STRING_CHARS, _JSON_STRING_CHARS)


def xgrammar_message(error: BaseException) -> str:
    """xgrammar's message without its log prefix ("[08:47:33] /project/cpp/x.cc:94: ")."""
    text = str(error).strip()
    return _LOG_PREFIX.sub("", text).strip() or type(error).__name__
