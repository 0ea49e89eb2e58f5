"""The gateway's only door into `grammar/`: spec construction, compile, tool-call format and parsing.

Everything the gateway needs from the grammar package goes through these few functions, so a change
of names there is a change here only. Where the grammar package lacks a piece, a small local
fallback keeps the gateway working (noted in each function's docstring).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

import grammar as _grammar

try:  # the tool-call format lives in grammar.tool_calls
    from grammar import tool_calls as _tool_calls
except ImportError:  # pragma: no cover - only while grammar/ is being written
    _tool_calls = None  # type: ignore[assignment]


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# --------------------------------------------------------------------------- specs and errors


def make_spec(kind: str, payload: Any) -> Any:
    spec_cls = getattr(_grammar, "GrammarSpec", None)
    if spec_cls is None:
        return _LocalSpec(kind, payload)
    return spec_cls(kind=kind, payload=payload)


@dataclass(frozen=True)
class _LocalSpec:  # used only while grammar.GrammarSpec does not exist
    kind: str
    payload: Any


def spec_error_types() -> tuple[type[BaseException], ...]:
    err = getattr(_grammar, "GrammarSpecError", None)
    return (err,) if isinstance(err, type) else ()


def spec_error_fields(exc: BaseException) -> tuple[str, str | None, str | None]:
    """(message, JSON pointer, param) of a grammar spec error."""
    message = getattr(exc, "message", None) or str(exc)
    return str(message), getattr(exc, "pointer", None), getattr(exc, "param", None)


async def compile_spec(service: Any, spec: Any) -> Any:
    """Compile (or fetch from the grammar cache) on a worker thread; returns the engine constraint."""
    compile_async = getattr(service, "compile_async", None)
    if compile_async is not None:
        return await compile_async(spec)
    import anyio

    return await anyio.to_thread.run_sync(service.compile, spec)


def grammar_stats(service: Any) -> dict[str, Any]:
    if service is None:
        return {}
    stats = getattr(service, "stats", None)
    if stats is None:
        return {}
    try:
        value = stats() if callable(stats) else stats
    except Exception:  # stats must never break a scrape
        return {}
    if isinstance(value, dict):
        return value
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    return {}


# --------------------------------------------------------------------------- tool-call format


def render_tools_prompt(tools: list[dict[str, Any]]) -> str:
    fn = getattr(_tool_calls, "render_tools_prompt", None)
    if fn is not None:
        return fn(tools)
    # fallback: Hermes-style tool list in canonical JSON
    lines = [
        "You may call one or more functions. Available functions, one JSON object per line:",
        *(_canonical(t) for t in tools),
        'To call functions, answer only with <tool_call>{"name":NAME,"arguments":{...}}</tool_call> blocks.',
    ]
    return "\n".join(lines)


def render_tool_calls(calls: list[tuple[str, str, str]]) -> str:
    """Assistant turn text for earlier tool calls [(id, name, arguments JSON text)], in the same
    format the model is asked to produce (so history and generation agree)."""
    for name in ("render_tool_calls", "format_tool_calls"):
        fn = getattr(_tool_calls, name, None)
        if fn is not None:
            return fn([_tool_call_obj(cid, n, a) for cid, n, a in calls])
    return "".join(
        "<tool_call>" + _canonical({"name": n, "arguments": _json_or_text(a)}) + "</tool_call>" for _, n, a in calls
    )


def render_tool_result(name: str | None, tool_call_id: str, content: str) -> str:
    """Text of one tool result, for templates without a tool role."""
    fn = getattr(_tool_calls, "render_tool_result", None)
    if fn is not None:
        try:
            return fn(name=name, tool_call_id=tool_call_id, content=content)
        except TypeError:
            return fn(name, content)
    return "<tool_response>" + _canonical({"name": name, "content": content}) + "</tool_response>"


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """(content outside the calls or None, calls) of a finished generation."""
    fn = getattr(_tool_calls, "parse_tool_calls", None)
    if fn is not None:
        content, calls = fn(text)
        return (content or None), [_normalize_call(c) for c in calls]
    return _fallback_parse(text)


class ToolCallStream:
    """Turns streamed text into OpenAI tool-call deltas.

    `feed(text)` returns (content delta, [(index, id|None, name|None, argument piece|None)]).
    Uses the grammar package's incremental parser when it has one; otherwise it holds the text back
    and emits whole calls at `finish()` (correct, just not incremental).
    """

    def __init__(self) -> None:
        parser_cls = None
        for name in ("ToolCallStreamParser", "IncrementalToolCallParser", "StreamingToolCallParser"):
            parser_cls = getattr(_tool_calls, name, None)
            if parser_cls is not None:
                break
        self._parser = parser_cls() if parser_cls is not None else None
        self._buffer = ""
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[tuple[int, str | None, str | None, str | None]]]:
        if self._parser is None:
            self._buffer += text
            return "", []
        return self._adapt(self._parser.feed(text))

    def finish(self) -> tuple[str, list[tuple[int, str | None, str | None, str | None]]]:
        if self._parser is None:
            content, calls = parse_tool_calls(self._buffer)
            deltas = [(i, c.id, c.name, c.arguments) for i, c in enumerate(calls)]
            self.num_calls = len(calls)
            return content or "", deltas
        finish = getattr(self._parser, "finish", None) or getattr(self._parser, "close", None)
        return self._adapt(finish()) if finish is not None else ("", [])

    def _adapt(self, out: Any) -> tuple[str, list[tuple[int, str | None, str | None, str | None]]]:
        content, deltas = _split_parser_output(out)
        adapted = []
        for d in deltas:
            index = _field(d, "index")
            self.num_calls = max(self.num_calls, int(index) + 1)
            adapted.append((int(index), _field(d, "id"), _field(d, "name"), _field(d, "arguments")))
        return content, adapted


# --------------------------------------------------------------------------- helpers


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _tool_call_obj(call_id: str, name: str, arguments: str) -> Any:
    cls = getattr(_tool_calls, "ToolCall", None)
    if cls is not None:
        try:
            return cls(id=call_id, name=name, arguments=arguments)
        except TypeError:
            pass
    return {"id": call_id, "name": name, "arguments": arguments}


def _normalize_call(call: Any) -> ParsedToolCall:
    arguments = _field(call, "arguments")
    if not isinstance(arguments, str):
        arguments = _canonical(arguments if arguments is not None else {})
    return ParsedToolCall(id=_field(call, "id") or new_tool_call_id(), name=str(_field(call, "name")), arguments=arguments)


def _split_parser_output(out: Any) -> tuple[str, Iterable[Any]]:
    if out is None:
        return "", []
    if isinstance(out, tuple) and len(out) == 2:
        content, deltas = out
        return content or "", deltas or []
    content = _field(out, "content") or ""
    deltas = _field(out, "tool_calls") or _field(out, "deltas") or []
    return content, deltas


_FALLBACK_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _fallback_parse(text: str) -> tuple[str | None, list[ParsedToolCall]]:
    calls = []
    for m in _FALLBACK_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", {})
            calls.append(ParsedToolCall(new_tool_call_id(), obj["name"], args if isinstance(args, str) else _canonical(args)))
    content = _FALLBACK_CALL.sub("", text).strip() if calls else text
    return (content or None), calls
