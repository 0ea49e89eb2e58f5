"""The grammar of a tool-calls spec: an xgrammar structural tag per `tool_choice`.

- "none": free text (no structure).
- "auto": free text that never contains the call marker, optionally followed by one or more
  calls (at most one without parallel_tool_calls), and nothing after the calls.
- "required": one or more calls (one without parallel_tool_calls), no free text.
- {"type": "function", "function": {"name": N}}: exactly one call of N.

Each call's arguments are compact JSON of the tool's parameters schema (grammar/engines/xgrammar/schema.py).
A model format from xgrammar's registry builds its own tag (tag_format.py), with the same
arguments grammar wherever its arguments are JSON.
"""

from __future__ import annotations

from grammar.engines.xgrammar.schema import compact_json_schema_ebnf
from grammar.kinds.tool_calls.format import ToolCallFormat


def arguments_schema(function: dict) -> dict:
    """A tool's parameters schema; a missing one (or one without a type) means any object."""
    params = function.get("parameters")
    if not params:
        return {"type": "object"}
    if "type" not in params:
        return {"type": "object", **params}
    return params


def structural_tag(fmt: ToolCallFormat, tools: list[dict], tool_choice: str | dict, parallel_tool_calls: bool) -> dict:
    """xgrammar structural tag for a validated payload (a model format's own: tag_format.py)."""
    if not isinstance(fmt, ToolCallFormat):
        return fmt.structural_tag(tools, tool_choice, parallel_tool_calls)

    def tag(tool: dict) -> dict:
        function = tool["function"]
        ebnf = compact_json_schema_ebnf(arguments_schema(function), strict=function.get("strict") is not False)
        return {
            "type": "tag",
            "begin": fmt.call_prefix(function["name"]),
            "content": {"type": "grammar", "grammar": ebnf},
            "end": fmt.call_suffix,
        }

    if tool_choice == "none" or not tools:
        return {"type": "structural_tag", "format": {"type": "any_text", "excludes": []}}
    if isinstance(tool_choice, dict):
        wanted = tool_choice["function"]["name"]
        chosen = next(t for t in tools if t["function"]["name"] == wanted)
        return {"type": "structural_tag", "format": tag(chosen)}
    calls = {
        "type": "tags_with_separator",
        "tags": [tag(t) for t in tools],
        "separator": fmt.call_separator,
        "at_least_one": tool_choice == "required",
        "stop_after_first": not parallel_tool_calls,
    }
    if tool_choice == "required":
        return {"type": "structural_tag", "format": calls}
    # auto: text without the call marker, then zero or more calls, then the end
    text = {"type": "any_text", "excludes": [fmt.call_begin]}
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": [text, calls]}}
