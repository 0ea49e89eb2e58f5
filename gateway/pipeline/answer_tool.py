"""Tools together with an output format: the final answer offered to the model as one more tool.

Agent frameworks (the OpenAI Agents SDK with an `output_type`) send function tools *and* a JSON
schema, meaning "call a tool, or give the final answer in this shape". The tool-call grammar knows
only calls and free text, so the answer becomes a tool, `final_answer`, whose arguments are the
schema: tool_choice "auto" turns into "required" over the tools plus that one (one call per turn),
and a call of it goes back to the client as the message content. With tool_choice "required" or a
named tool the turn is a call, so the format is left for a later turn.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import bad_request
from gateway.protocol import (
    ChatCompletionRequest,
    FunctionDefinition,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ToolDefinition,
)

ANSWER_TOOL = "final_answer"


def answer_tool_name(taken: set[str]) -> str:
    name, n = ANSWER_TOOL, 1
    while name in taken:
        name, n = f"{ANSWER_TOOL}_{n}", n + 1
    return name


def fold_format_into_tools(req: ChatCompletionRequest, schema_param: str = "response_format") -> str | None:
    """Rewrite a request with tools and a JSON format (in place); the answer tool's name, or None."""
    rf = req.response_format
    if not req.tools or not isinstance(rf, (ResponseFormatJsonSchema, ResponseFormatJsonObject)):
        return None
    if req.tool_choice == "none":
        return None  # the tools are only shown; the format applies (as plan_chat does it)
    if req.tool_choice not in (None, "auto"):
        req.response_format = None
        return None
    schema: Any = rf.json_schema.schema if isinstance(rf, ResponseFormatJsonSchema) else {"type": "object"}
    strict = rf.json_schema.strict if isinstance(rf, ResponseFormatJsonSchema) else None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise bad_request(
            "With tools, the output format must describe a JSON object (it becomes the final answer's arguments).",
            schema_param,
        )
    name = answer_tool_name({t.function.name for t in req.tools})
    # listed first: a small model leans towards the first tool, and answering is the usual end
    req.tools = [
        ToolDefinition(
            function=FunctionDefinition(
                name=name,
                description="Give the final answer to the user (once tool results are in).",
                parameters=schema,
                strict=strict,
            )
        )
    ] + list(req.tools)
    req.tool_choice, req.parallel_tool_calls, req.response_format = "required", False, None
    return name
