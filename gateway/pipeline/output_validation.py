"""Schema fidelity at the gateway: refuse in strict mode what the mask cannot guarantee, and
validate every structured output before its final chunk leaves.

Strict mode (Jumpgate's default for json_schema and tools) promises that every answer fits its
schema, so a schema whose fidelity report (grammar/validation/fidelity.py) holds a keyword that the mask does
not enforce is refused with a 400 naming each keyword and its JSON pointer. With
`schema_mode: "best_effort"` (or `strict: false`), generation proceeds and each choice says whether
its final value validated (`jumpgate.schema_valid`, and the `x-jumpgate-schema-valid` header on
whole responses; a stream's headers leave before any value exists, so there the verdict rides on
each choice's final chunk only).

Validation runs in both modes (jsonschema with its format checker, plus a duplicate-key check
that jsonschema cannot make on parsed JSON). A strict-mode failure is a fidelity bug: it is counted
in /metrics and logged with the schema and the failing pointer, never silent.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import APIError, bad_request
from gateway.pipeline.grammar_adapter import (
    FidelityReport,
    KeywordFidelity,
    arguments_schema,
    schema_fidelity,
    schema_validator,
    tools_fidelity,
)
from gateway.protocol import ChoiceValidity, SchemaViolation

log = logging.getLogger("jumpgate.gateway.validation")

STRICT, BEST_EFFORT = "strict", "best_effort"
SCHEMA_VALID_HEADER = "x-jumpgate-schema-valid"
MAX_ERRORS = 20  # per choice: enough to fix a prompt, bounded for a pathological output
_MAX_MESSAGE = 300

# why an output failed: the label of the invalid-output counter
NOT_JSON, TRUNCATED, DUPLICATE_KEY, SCHEMA = "not_json", "truncated", "duplicate_key", "schema"


@dataclass
class OutputCheck:
    """What one request's structured outputs are validated against, and in which mode."""

    kind: str  # "json_schema" or "tool_calls"
    label: str  # names the schema in logs (registered id, response_format name, tool names)
    mode: str  # STRICT or BEST_EFFORT (tool calls: STRICT only if every called tool is strict)
    report: FidelityReport
    schema: Any = None  # json_schema
    tools: dict[str, tuple[Any, str]] = field(default_factory=dict)  # tool name -> (parameters, mode)
    metrics: Any = None  # GatewayMetrics: counts invalid outputs

    def check_text(self, text: str, finish_reason: str | None) -> ChoiceValidity:
        """Validate a json_schema choice's whole text."""
        violations, reason = _validate_json(text, self.schema, "", finish_reason)
        return self._record(self.mode, violations, reason)

    def check_tool_calls(self, calls: list[tuple[str, str]], finish_reason: str | None) -> ChoiceValidity | None:
        """Validate each call's arguments against its tool's parameters (None: no call was made)."""
        if not calls:
            return None
        violations: list[SchemaViolation] = []
        reason = None
        modes = set()
        for i, (name, arguments) in enumerate(calls):
            schema, mode = self.tools.get(name, ({"type": "object"}, BEST_EFFORT))
            modes.add(mode)
            found, why = _validate_json(
                arguments, schema, join_pointer("", "tool_calls", i, "function", "arguments"), finish_reason
            )
            violations += found
            reason = reason or why
        return self._record(STRICT if modes == {STRICT} else BEST_EFFORT, violations, reason)

    def _record(self, mode: str, violations: list[SchemaViolation], reason: str | None) -> ChoiceValidity:
        validity = ChoiceValidity(
            schema_valid=not violations,
            schema_mode=mode,  # type: ignore[arg-type]
            schema_errors=violations[:MAX_ERRORS],
        )
        if reason is not None:
            if self.metrics is not None:
                self.metrics.structured_output_invalid(mode, reason)
            if mode == STRICT and reason != TRUNCATED:  # a cut-off output is the budget's doing, not the mask's
                first = violations[0]
                log.error(
                    "strict structured output failed validation (a fidelity bug): schema %s, pointer %r: %s",
                    self.label,
                    first.pointer,
                    first.message,
                )
        return validity


def build_output_check(
    plan: Any, constraint: Any, schema_mode: str | None, *, label: str | None = None, metrics: Any = None
) -> OutputCheck | None:
    """The check for a planned constraint (None for free text, regex, EBNF, json_object).

    Raises the strict-mode 400 when the schema holds keywords the mask does not enforce.
    """
    if plan.kind == "json_schema":
        mode = BEST_EFFORT if schema_mode == BEST_EFFORT or not plan.strict else STRICT
        report = getattr(constraint, "fidelity", None) or schema_fidelity(plan.payload, strict=plan.strict)
        if mode == STRICT and report.refused_in_strict:
            raise strict_refusal(plan.label, plan.param, report.refused_in_strict)
        return OutputCheck("json_schema", label or plan.label, mode, report, schema=plan.payload, metrics=metrics)
    if plan.kind == "tool_calls":
        tools = list(plan.payload.get("tools") or [])
        report = getattr(constraint, "fidelity", None) or tools_fidelity(tools)
        modes = [
            BEST_EFFORT if schema_mode == BEST_EFFORT or _function(t).get("strict") is False else STRICT for t in tools
        ]
        refused = [k for k in report.refused_in_strict if modes[_tool_index(k)] == STRICT]
        if refused:
            raise strict_refusal(plan.label, plan.param, refused, tools=True)
        by_name = {_function(t).get("name"): (_parameters(t), m) for t, m in zip(tools, modes)}
        names = ", ".join(str(n) for n in by_name)
        return OutputCheck(
            "tool_calls",
            label or f"tools ({names})",
            STRICT if STRICT in modes else BEST_EFFORT,
            report,
            tools=by_name,
            metrics=metrics,
        )
    return None


def strict_refusal(
    label: str, param: str | None, keywords: tuple[KeywordFidelity, ...] | list[KeywordFidelity], *, tools: bool = False
) -> APIError:
    listed = "; ".join(f"'{k.keyword}' at '{k.pointer}' ({k.reason})" for k in keywords)
    opt_out = (
        'set "strict": false on those functions, or send "schema_mode": "best_effort"'
        if tools
        else 'send "schema_mode": "best_effort" (or "strict": false)'
    )
    return bad_request(
        f"Invalid {label}: strict mode guarantees that every output fits the schema, but the constrained decoder "
        f"does not enforce these keywords: {listed}. Checking after generation would only detect a violation, not "
        f"prevent it, so strict mode refuses them. Rewrite the schema without them, or {opt_out} to generate "
        "anyway: each choice then reports jumpgate.schema_valid and jumpgate.schema_errors.",
        param,
        code="schema_not_enforceable",
    )


def validity_headers(body: Any) -> dict[str, str]:
    """`x-jumpgate-schema-valid` for a whole response: false if any validated choice failed."""
    verdicts = [
        c.jumpgate.schema_valid
        for c in getattr(body, "choices", []) or []
        if isinstance(getattr(c, "jumpgate", None), ChoiceValidity)
    ]
    return {SCHEMA_VALID_HEADER: "true" if all(verdicts) else "false"} if verdicts else {}


# -- validation ------------------------------------------------------------------------------


class _JsonObject(dict):
    """A parsed object that remembers the names it saw twice (json keeps only the last value)."""

    duplicates: list[str]


def _object_pairs(pairs: list[tuple[str, Any]]) -> _JsonObject:
    obj = _JsonObject(pairs)
    obj.duplicates = [] if len(obj) == len(pairs) else _repeated([name for name, _ in pairs])
    return obj


def _repeated(names: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for name in names:
        if name in seen and name not in out:
            out.append(name)
        seen.add(name)
    return out


def _duplicate_keys(value: Any, prefix: str) -> list[SchemaViolation]:
    found = []
    stack = [(value, prefix)]
    while stack and len(found) < MAX_ERRORS:
        node, here = stack.pop()
        if isinstance(node, _JsonObject):
            found += [SchemaViolation(pointer=here, message=f"duplicate key {name!r}") for name in node.duplicates]
            stack.extend((v, join_pointer(here, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, join_pointer(here, i)) for i, v in enumerate(node))
    return found


def _validate_json(
    text: str, schema: Any, prefix: str, finish_reason: str | None
) -> tuple[list[SchemaViolation], str | None]:
    """(violations, why) of `text` against `schema`; why is None when the value is valid."""
    try:
        value = json.loads(text, object_pairs_hook=_object_pairs)
    except (ValueError, RecursionError) as e:
        if finish_reason == "length":
            return [
                SchemaViolation(
                    pointer=prefix, message="the output was cut off at the token limit before the value was complete"
                )
            ], TRUNCATED
        return [SchemaViolation(pointer=prefix, message=_short(f"the output is not JSON: {e}"))], NOT_JSON
    violations = _duplicate_keys(value, prefix)
    why = DUPLICATE_KEY if violations else None
    for error in _validator(schema).iter_errors(value):
        if len(violations) >= MAX_ERRORS:
            break
        violations.append(
            SchemaViolation(
                pointer=join_pointer(prefix, *error.absolute_path),
                message=_short(error.message),
                schema_pointer=join_pointer("", *error.absolute_schema_path),
            )
        )
        why = why or SCHEMA
    return violations, why


_validators: OrderedDict[str, Any] = OrderedDict()
_validators_lock = threading.Lock()
_VALIDATORS_MAX = 512


def _validator(schema: Any) -> Any:
    """A jsonschema validator (dialect from `$schema`, format checker on), cached per schema."""
    key = json.dumps(schema, sort_keys=True)
    with _validators_lock:
        found = _validators.get(key)
        if found is not None:
            _validators.move_to_end(key)
            return found
    validator = schema_validator(schema)
    with _validators_lock:
        _validators[key] = validator
        while len(_validators) > _VALIDATORS_MAX:
            _validators.popitem(last=False)
    return validator


def join_pointer(base: str, *tokens: object) -> str:
    """RFC 6901: `~` and `/` inside a token are escaped."""
    return base + "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def _function(tool: Any) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function if isinstance(function, dict) else {}


def _parameters(tool: Any) -> Any:
    """A tool's parameters as its grammar compiles them and check-and-roll-back checks them (none,
    or no type: any object)."""
    return arguments_schema(_function(tool))


def _tool_index(keyword: KeywordFidelity) -> int:
    return int(keyword.pointer.split("/")[1])  # tools_fidelity roots each tool at /i/function/parameters


def _short(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."
