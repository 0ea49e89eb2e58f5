"""Checks of a tool-calls payload: tools, tool_choice and parallel_tool_calls, each refusal
naming the request parameter and the JSON pointer of the bad part."""

from __future__ import annotations

import re
from typing import Any

from grammar.errors import GrammarSpecError
from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format
from grammar.validation.json_schema_check import validate_json_schema

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
SIMPLE_TOOL_CHOICES = ("none", "auto", "required")


def validate_tool_calls_payload(payload: Any) -> None:
    """Refuse malformed tools / tool_choice / parallel_tool_calls with param and pointer."""
    if not isinstance(payload, dict):
        raise GrammarSpecError("tool_calls payload must be an object", "", "tools")
    get_tool_call_format(payload.get("format", HERMES_TOOL_CALL_FORMAT.name))
    tools = payload.get("tools")
    if not isinstance(tools, list):
        raise GrammarSpecError("tools must be a list", "", "tools")
    names: dict[str, int] = {}
    for i, tool in enumerate(tools):
        _validate_tool(tool, i, names)
    if not isinstance(payload.get("parallel_tool_calls", True), bool):
        raise GrammarSpecError("parallel_tool_calls must be a boolean", "", "parallel_tool_calls")
    _validate_tool_choice(payload.get("tool_choice", "auto"), names)


def _validate_tool(tool: Any, i: int, names: dict[str, int]) -> None:
    here = f"/{i}"
    if not isinstance(tool, dict):
        raise GrammarSpecError("each tool must be an object", here, "tools")
    if tool.get("type") != "function":
        raise GrammarSpecError(f"tool type must be 'function', got {tool.get('type')!r}", here + "/type", "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise GrammarSpecError("tool.function must be an object", here + "/function", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
        raise GrammarSpecError(
            f"function name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, _ or -", here + "/function/name", "tools"
        )
    if name in names:
        raise GrammarSpecError(
            f"duplicate function name {name!r} (also tool {names[name]})", here + "/function/name", "tools"
        )
    names[name] = i
    if "description" in function and not isinstance(function["description"], str):
        raise GrammarSpecError("description must be a string", here + "/function/description", "tools")
    if "strict" in function and not isinstance(function["strict"], (bool, type(None))):
        raise GrammarSpecError("strict must be a boolean", here + "/function/strict", "tools")
    params = function.get("parameters")
    if params is None:
        return
    pointer = here + "/function/parameters"
    if not isinstance(params, dict):
        raise GrammarSpecError("parameters must be a JSON schema object", pointer, "tools")
    if "type" in params and params["type"] != "object":
        raise GrammarSpecError(
            f"parameters must describe an object (type 'object'), got {params['type']!r}", pointer + "/type", "tools"
        )
    validate_json_schema(params, param="tools", pointer_prefix=pointer, strict=function.get("strict") is not False)


def _validate_tool_choice(choice: Any, names: dict[str, int]) -> None:
    if isinstance(choice, str):
        if choice not in SIMPLE_TOOL_CHOICES:
            raise GrammarSpecError(
                f"tool_choice must be one of {', '.join(SIMPLE_TOOL_CHOICES)} or a named function, got {choice!r}",
                "",
                "tool_choice",
            )
        if choice == "required" and not names:
            raise GrammarSpecError("tool_choice 'required' needs at least one tool", "", "tool_choice")
        return
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
        raise GrammarSpecError(
            'tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":...}}',
            "",
            "tool_choice",
        )
    name = choice["function"].get("name")
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise GrammarSpecError(
            f"tool_choice names function {name!r}, which is not in tools (tools: {known})",
            "/function/name",
            "tool_choice",
        )
