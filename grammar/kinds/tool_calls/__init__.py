"""tool_calls: OpenAI `tools` + `tool_choice` + `parallel_tool_calls`, for models without a native
tool format: the model writes calls in a `ToolCallFormat` and the gateway parses them back.

- format.py:  how calls look (markers, the tools prompt, past calls and tool results)
- grammar.py: the structural tag that constrains the output per tool_choice
- payload.py: the checks of tools / tool_choice / parallel_tool_calls
- parser.py:  the model's output split into content and calls, whole or streamed (Hermes's parser;
  the structural-tag formats' in tag_parser.py; what both share in step_parser.py)
"""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.kinds.base import ConstraintKind, SpecLike
from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format
from grammar.kinds.tool_calls.grammar import structural_tag
from grammar.kinds.tool_calls.payload import validate_tool_calls_payload
from grammar.schema.canonical import canonical_data, canonical_tool


class ToolCallsKind(ConstraintKind):
    """Payload: {"tools": [...], "tool_choice": ..., "parallel_tool_calls": bool, "format": name}.
    Each tool's own `function.strict` decides its arguments' strictness; the spec is always strict."""

    name = "tool_calls"
    param = "tools"
    what = "tool-call grammar"
    error_code = "invalid_tools"
    strict_closing = True

    def spec_fields(self, payload: Any, strict: bool) -> tuple[Any, bool]:
        if not isinstance(payload, dict):
            return payload, True  # refused by validate, with its message
        return {
            "tools": payload.get("tools"),
            "tool_choice": payload.get("tool_choice", "auto"),
            "parallel_tool_calls": payload.get("parallel_tool_calls", True),
            "format": payload.get("format", HERMES_TOOL_CALL_FORMAT.name),
        }, True

    def validate(self, spec: SpecLike) -> None:
        validate_tool_calls_payload(spec.payload)

    def canonical_payload(self, payload: Any) -> Any:
        out = canonical_data(payload)
        tools = payload.get("tools") if isinstance(payload, dict) else None
        if isinstance(tools, list):
            out["tools"] = [canonical_tool(t) for t in tools]
        return out

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        payload = spec.payload
        fmt = get_tool_call_format(payload.get("format", HERMES_TOOL_CALL_FORMAT.name))
        tag = structural_tag(fmt, payload["tools"], payload["tool_choice"], payload["parallel_tool_calls"])
        return compiler.compile_structural_tag(tag)


KIND = ToolCallsKind()
