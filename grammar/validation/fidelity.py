"""How faithfully a compiled JSON schema is kept, keyword by keyword: the fidelity report of a
schema, of a tool list, or of a grammar spec, and which engine compiles a schema (xgrammar, or
llguidance where it enforces exactly what xgrammar would approximate).

The report's types: grammar/validation/fidelity_report.py; the classifier: fidelity_walk.py; the
rules and the keyword table: docs/structured-output.md, docs/keywords.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from grammar.errors import join_pointer
from grammar.validation.fidelity_report import (  # noqa: F401 -- the report's vocabulary, re-exported
    ARRAY_KEYWORDS,
    CHECKABLE_FORMATS,
    CHECKED,
    COMBINATORS,
    DUPLICATE_KEYS,
    ENFORCED,
    LLGUIDANCE,
    MASKED_FORMATS,
    NEVER_MASKED,
    NUMBER_KEYWORDS,
    OBJECT_KEYWORDS,
    ROLLBACK,
    STRING_KEYWORDS,
    UNENFORCED,
    VALIDATION_KEYWORDS,
    VALUE_CHECK,
    XGRAMMAR,
    FidelityReport,
    KeywordFidelity,
    needs_rollback,
    uses_rollback,
    with_rollback,
)
from grammar.validation.fidelity_walk import walk_schema


def schema_fidelity(schema: Any, *, strict: bool = True, pointer: str = "", value_check: bool = True) -> FidelityReport:
    """Classify every validation keyword of `schema` (already validated; pointers under `pointer`);
    `value_check`: the output is followed by Jumpgate's value check (json_schema, json_object)."""
    return FidelityReport(tuple(walk_schema(schema, pointer, strict, value_check)))


def routed_schema_fidelity(schema: Any, *, strict: bool = True, rollback: bool = False) -> FidelityReport:
    """The report of the engine that compiles `schema`: xgrammar's, unless llguidance enforces
    exactly every keyword xgrammar would not mask and compiles the schema cleanly. With
    `rollback` (check-and-roll-back will keep the `checked` keywords) llguidance is taken where it
    enforces some of them and the rest are `checked`: what a mask can keep is not left to rewrites."""
    report = schema_fidelity(schema, strict=strict)
    refused = report.refused_in_strict
    exact = [k.exact_in_llguidance for k in refused]
    if rollback:
        if not any(exact) or not all(e or k.status == CHECKED for e, k in zip(exact, refused)):
            return report
    elif not refused or not all(exact):
        return report
    from grammar.engines.llguidance.schema import llguidance_refusal  # only schemas that need it load llguidance

    if llguidance_refusal(schema, strict=strict) is not None:
        return report
    return FidelityReport(tuple(_under_llguidance(k) for k in report.keywords), engine=LLGUIDANCE)


def _under_llguidance(entry: KeywordFidelity) -> KeywordFidelity:
    if entry.exact_in_llguidance:
        return replace(
            entry,
            status=ENFORCED,
            engine=LLGUIDANCE,
            reason=f"enforced by llguidance (xgrammar would not: {entry.reason})",
        )
    if entry.engine == VALUE_CHECK:
        return entry  # the value check rides on either engine's matcher
    return replace(entry, engine=LLGUIDANCE) if entry.status == ENFORCED else entry


def tools_fidelity(tools: Iterable[Any]) -> FidelityReport:
    """One report for the parameters of every tool (pointers `/i/function/parameters/...`).

    A tool is strict unless its `function.strict` is false, as the tool-call grammar compiles it.
    """
    found: list[KeywordFidelity] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        params = function.get("parameters") or {}
        if isinstance(params, dict) and "type" not in params:
            params = {"type": "object", **params}  # as the grammar compiles it
        strict = function.get("strict") is not False
        found += walk_schema(
            params, join_pointer("", i, "function", "parameters"), strict, value_check=False, names_checked=True
        )
    return FidelityReport(tuple(found))


def spec_fidelity(kind: str, payload: Any, strict: bool = True, retries: int = 0) -> FidelityReport | None:
    """The report for a grammar spec's kind and payload; None for kinds without a schema.
    `retries` > 0: a JSON schema's or a tool's `checked` keywords are kept by check-and-roll-back
    with that many rewrites (for a JSON schema routing then prefers llguidance for the rest, and
    the report says so; tool calls compile with xgrammar)."""
    if kind == "json_schema":
        report = routed_schema_fidelity(payload, strict=strict, rollback=retries > 0)
        return with_rollback(report, retries) if retries and needs_rollback(report) else report
    if kind == "tool_calls" and isinstance(payload, dict):
        report = tools_fidelity(payload.get("tools") or [])
        return with_rollback(report, retries) if retries and needs_rollback(report) else report
    return None
