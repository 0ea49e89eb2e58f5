"""A request's tools -> the tool_calls spec to compile, checked (or None for free text)."""

from __future__ import annotations

from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, ToolCallFormat
from grammar.spec import GrammarSpec
from grammar.validate import validate_spec


def tool_calls_grammar_spec(
    tools: list[dict] | None,
    tool_choice: str | dict | None = "auto",
    parallel_tool_calls: bool = True,
    fmt: ToolCallFormat = HERMES_TOOL_CALL_FORMAT,
) -> GrammarSpec | None:
    """The spec to compile for a request's tools, or None when output is unconstrained
    (tool_choice "none", or "auto" without tools). Raises GrammarSpecError for bad tools/choice."""
    tool_choice = "auto" if tool_choice is None else tool_choice
    spec = GrammarSpec.tool_calls(tools or [], tool_choice, parallel_tool_calls, format=fmt.name)
    validate_spec(spec)  # remembered per canonical spec: repeated tools are checked once
    if tool_choice == "none" or (tool_choice == "auto" and not tools):
        return None
    return spec
