"""The gateway's only door into `grammar/`: specs, canonical text, compile, tool-call format.

Every use of the grammar package goes through these few functions, so a change of names there is
a change here only.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from grammar import tool_calls as _tc
from grammar.canonical import canonical_json, canonical_schema, canonical_tool
from grammar.errors import GrammarServiceBusy, GrammarSpecError
from grammar.fidelity import FidelityReport, KeywordFidelity, schema_fidelity, tools_fidelity
from grammar.spec import GrammarSpec

FORMAT = _tc.HERMES_TOOL_CALL_FORMAT  # the tool-call format shown to (and parsed from) the model

__all__ = [
    "FidelityReport",
    "KeywordFidelity",
    "schema_fidelity",
    "tools_fidelity",
    "GrammarSpecError",
    "GrammarServiceBusy",
    "ParsedToolCall",
    "ToolCallStream",
    "canonical_payload_text",
    "compile_spec",
    "grammar_stats",
    "make_spec",
    "parse_tool_calls",
    "render_tool_calls",
    "render_tool_result",
    "render_tools_prompt",
    "schema_text",
]


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text


# --------------------------------------------------------------------------- specs


def make_spec(kind: str, payload: Any, strict: bool = True) -> GrammarSpec:
    """The grammar spec of a constraint. Payloads: json_schema → schema dict; json_object → None;
    regex / ebnf → source text; tool_calls → {"tools", "tool_choice", "parallel_tool_calls"}."""
    if kind == "json_schema":
        return GrammarSpec.json_schema(payload, strict=strict)
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "regex":
        return GrammarSpec.regex(payload)
    if kind == "ebnf":
        return GrammarSpec.ebnf(payload)
    if kind == "tool_calls":
        return GrammarSpec.tool_calls(
            payload["tools"], payload.get("tool_choice", "auto"), payload.get("parallel_tool_calls", True),
            format=FORMAT.name,
        )
    raise GrammarSpecError(f"unknown grammar kind {kind!r}")


def schema_text(schema: Any) -> str:
    """Canonical JSON of a schema as shown in a prompt (keywords sorted, `properties` in order)."""
    return canonical_json(canonical_schema(schema))


def canonical_payload_text(kind: str, payload: Any) -> str:
    """One text per meaning of a registry entry (its id is the hash of this)."""
    if kind == "json_schema":
        body: Any = canonical_schema(payload)
    elif kind == "tools":
        body = [canonical_tool(t) for t in payload]
    else:
        body = payload
    return canonical_json({"kind": kind, "payload": body})


async def compile_spec(service: Any, spec: GrammarSpec) -> Any:
    """Compile (or fetch from the grammar cache) on the service's workers; returns the handle the
    engine takes as `GenerateRequest.constraint`."""
    compile_async = getattr(service, "compile_async", None)
    if compile_async is not None:
        return await compile_async(spec)
    return await asyncio.to_thread(service.compile, spec)


def grammar_stats(service: Any) -> dict[str, Any]:
    if service is None or not hasattr(service, "stats"):
        return {}
    try:
        value = service.stats()
    except Exception:  # stats must never break a scrape
        return {}
    if isinstance(value, dict):
        return value
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict):
        return dict(as_dict())
    return dict(vars(value)) if hasattr(value, "__dict__") else {}


# --------------------------------------------------------------------------- tool-call format


def render_tools_prompt(tools: list[dict[str, Any]]) -> str:
    return FORMAT.render_tools_prompt(tools)


def _compact_arguments(arguments: str) -> str:
    """Arguments as the model would have written them: compact JSON, key order kept."""
    try:
        return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return arguments


def render_tool_calls(calls: list[tuple[str, str, str]]) -> str:
    """Earlier tool calls [(id, name, arguments JSON)] in the format the model is asked to write."""
    return FORMAT.render_calls((name, _compact_arguments(args)) for _, name, args in calls)


def render_tool_result(name: str | None, tool_call_id: str, content: str) -> str:
    """A tool result as shown back to the model (for templates without a tool role)."""
    return FORMAT.render_tool_response(content)


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """(content outside the calls or None, calls) of a finished generation."""
    content, calls = _tc.parse_tool_calls(text, FORMAT)
    return (content or None), [ParsedToolCall(c.id, c.name, c.arguments) for c in calls]


ToolDelta = tuple[int, "str | None", "str | None", "str | None"]  # (index, id, name, argument piece)


class ToolCallStream:
    """Streamed text → (content piece, [tool-call deltas]) as OpenAI streams them: per call first
    (index, id, name), then argument pieces whose concatenation is the arguments JSON."""

    def __init__(self) -> None:
        self._parser = FORMAT.stream_parser()
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolDelta]]:
        return self._adapt(self._parser.feed(text))

    def finish(self) -> tuple[str, list[ToolDelta]]:
        return self._adapt(self._parser.finish())

    def _adapt(self, deltas: list[Any]) -> tuple[str, list[ToolDelta]]:
        content: list[str] = []
        calls: list[ToolDelta] = []
        for d in deltas:
            if isinstance(d, _tc.ContentDelta):
                content.append(d.text)
            elif isinstance(d, _tc.ToolCallStartDelta):
                self.num_calls = max(self.num_calls, d.index + 1)
                calls.append((d.index, d.id, d.name, None))
            elif isinstance(d, _tc.ToolCallArgumentsDelta):
                if calls and calls[-1][0] == d.index:
                    i, call_id, name, args = calls[-1]  # merge consecutive pieces of one call
                    calls[-1] = (i, call_id, name, (args or "") + d.arguments)
                else:
                    calls.append((d.index, None, None, d.arguments))
        return "".join(content), calls
