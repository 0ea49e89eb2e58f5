"""The gateway's only door into `grammar/`: specs, canonical text, compile, tool-call format.

Every use of the grammar package goes through these few functions, so a change of names there is
a change here only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grammar import (
    HERMES_TOOL_CALL_FORMAT,
    KINDS,
    ContentDelta,
    GrammarServiceBusy,
    GrammarSpec,
    GrammarSpecError,
    ToolCallArgumentsDelta,
    ToolCallStartDelta,
    detect_reasoning_format,
    detect_tool_call_format,
    get_tool_call_format,
    kind_for,
    stream_parser,
    tool_call_format_names,
)
from grammar import parse_tool_calls as parse_with_format
from grammar.checks.rollback import schema_validator
from grammar.kinds.tool_calls.grammar import arguments_schema
from grammar.kinds.tool_calls.payload import TOOL_NAME_RE
from grammar.schema.canonical import canonical_json, canonical_tool
from grammar.schema.limits import check_json_limits
from grammar.spec import tokenizer_fingerprint
from grammar.validation.fidelity import FidelityReport, KeywordFidelity, schema_fidelity, tools_fidelity

if TYPE_CHECKING:  # types only: importing grammar's service pulls in xgrammar
    from grammar import GrammarService
    from runtime.constraint import CompiledConstraint

# The tool-call format shown to (and parsed from) the model, and its reasoning format: set once at
# start-up from the model's chat template (`use_formats`); one process serves one model.
FORMAT: Any = HERMES_TOOL_CALL_FORMAT
REASONING_FORMAT = "none"
REASONING_FORMATS = ("none", "qwen_3", "deepseek_r1", "harmony")
# The served model's special tokens that its formats write (gpt-oss's <|channel|>, Mistral's
# [TOOL_CALLS]): the engine keeps their text in an output the gateway parses (`use_markers`).
MARKER_IDS: frozenset[int] = frozenset()

__all__ = [
    "arguments_schema",
    "FidelityReport",
    "KeywordFidelity",
    "schema_fidelity",
    "schema_validator",
    "tools_fidelity",
    "GrammarSpecError",
    "GrammarServiceBusy",
    "ParsedToolCall",
    "ToolCallStream",
    "canonical_payload_text",
    "compile_spec",
    "error_code",
    "grammar_stats",
    "make_spec",
    "parse_tool_calls",
    "prompt_instructions",
    "render_tool_calls",
    "render_tool_result",
    "render_tools_prompt",
    "strict_closing",
    "tokenizer_fingerprint",
    "valid_tool_name",
    "use_formats",
    "use_markers",
    "marker_ids",
    "detect_formats",
    "tool_call_format_name",
    "reasoning_format_name",
    "uses_own_tools_text",
    "canonical_tools",
]


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text


# --------------------------------------------------------------------------- specs


def make_spec(kind: str, payload: Any, strict: bool = True) -> GrammarSpec:
    """The grammar spec of a constraint (what each kind's payload is: grammar/kinds/). Tool calls
    are written in FORMAT; the gateway's payload for them is {"tools", "tool_choice",
    "parallel_tool_calls"}."""
    if kind == "tool_calls" and isinstance(payload, dict):
        payload = {**payload, "format": FORMAT.name}
    return GrammarSpec.of(kind, payload, strict)


def canonical_payload_text(kind: str, payload: Any) -> str:
    """One text per meaning of a registry entry (its id is the hash of this); registry kinds are
    the grammar kinds plus "tools", a tool set."""
    if kind == "tools":
        body: Any = [canonical_tool(t) for t in payload]
    else:
        body = kind_for(kind).canonical_payload(payload)
    return canonical_json({"kind": kind, "payload": body})


def error_code(kind: str | None) -> str:
    """The OpenAI-style error code of a refused constraint of `kind` (invalid_schema if unknown)."""
    known = KINDS.get(kind or "")
    return "invalid_schema" if known is None else known.error_code


def kind_param(kind: str) -> str | None:
    """The request parameter a kind's refusals point at by default."""
    known = KINDS.get(kind)
    return None if known is None else known.param


def strict_closing(kind: str) -> bool:
    """Whether a strict constraint of `kind` runs under the runtime's completion guard."""
    known = KINDS.get(kind)
    return known is not None and known.strict_closing


def prompt_instructions(kind: str, payload: Any, param: str | None = None) -> str | None:
    """The system-block text that tells the model what to write for `kind` (None: none).

    Rendering walks the whole spec (canonical form, then JSON text) on the caller's thread, which
    for a request is the event loop; the size limits are checked first, and they stop early, so a
    hostile multi-megabyte spec is refused (GrammarSpecError) instead of holding the loop."""
    known = KINDS.get(kind)
    if known is None:
        return None
    check_json_limits(payload, param=param)
    return known.prompt_instructions(payload)


async def compile_spec(service: GrammarService, spec: GrammarSpec) -> CompiledConstraint:
    """Compile (or fetch from the grammar cache) on the service's workers; returns the handle the
    engine takes as `GenerateRequest.constraint`."""
    return await service.compile_async(spec)


def grammar_stats(service: GrammarService | None) -> dict[str, Any]:
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


def detect_formats(template: str | None, special_tokens: list[str]) -> tuple[str, str]:
    """(tool-call format, reasoning format) a chat template and its special tokens show."""
    return detect_tool_call_format(template, special_tokens), detect_reasoning_format(template, special_tokens)


def use_formats(tool_call_format: str, reasoning_format: str) -> None:
    """Set the formats of the served model (ValueError naming the known ones for a bad name)."""
    global FORMAT, REASONING_FORMAT
    try:
        fmt = get_tool_call_format(tool_call_format)
    except GrammarSpecError:
        raise ValueError(
            f"--tool-call-format {tool_call_format!r}: unknown; known: {', '.join(tool_call_format_names())}"
        ) from None
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"--reasoning-format {reasoning_format!r}: unknown; known: {', '.join(REASONING_FORMATS)}")
    FORMAT, REASONING_FORMAT = fmt, reasoning_format


def use_markers(tokenizer: Any, stop_token_ids: Any = ()) -> frozenset[int]:
    """Set (and return) the ids of the special tokens the model's formats write as markers
    (grammar's `output_markers`: the grammar takes them as text too), less its stop tokens, which
    end the output and are never text."""
    global MARKER_IDS
    from grammar import output_markers  # xgrammar: loaded at start-up, not at import

    markers = output_markers(tokenizer)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    stops = {int(i) for i in stop_token_ids or ()}
    MARKER_IDS = frozenset(
        int(i)
        for i, tok in added.items()
        if getattr(tok, "special", False) and str(tok) in markers and int(i) not in stops
    )
    return MARKER_IDS


def marker_ids() -> frozenset[int]:
    """The special tokens a parsed output keeps as text (`GenerateRequest.keep_special_ids`)."""
    return MARKER_IDS


def tool_call_format_name() -> str:
    return FORMAT.name


def reasoning_format_name() -> str:
    return REASONING_FORMAT


def uses_own_tools_text() -> bool:
    """Whether the format is Jumpgate's own (hermes: its tools text goes in the system block)."""
    return FORMAT is HERMES_TOOL_CALL_FORMAT


def canonical_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools as handed to a chat template: canonical (sorted keys), so equal tools give equal tokens."""
    return [canonical_tool(t) for t in tools]


def valid_tool_name(name: str) -> bool:
    """OpenAI's rule for function names, as the tool_calls kind checks it."""
    return bool(TOOL_NAME_RE.match(name))


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


def _schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict] | None:
    if not tools:
        return None
    return {
        t["function"]["name"]: arguments_schema(t["function"]) for t in tools if isinstance(t.get("function"), dict)
    }


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, list[ParsedToolCall]]:
    """(content outside the calls or None, calls) of a finished generation (`tools` type the
    arguments of formats that write them as markup)."""
    content, calls = parse_with_format(text, FORMAT, schemas=_schemas(tools))
    return (content or None), [ParsedToolCall(c.id, c.name, c.arguments) for c in calls]


ToolDelta = tuple[int, "str | None", "str | None", "str | None"]  # (index, id, name, argument piece)


class ToolCallStream:
    """Streamed text → (content piece, [tool-call deltas]) as OpenAI streams them: per call first
    (index, id, name), then argument pieces whose concatenation is the arguments JSON."""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self._parser = stream_parser(FORMAT, _schemas(tools))
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolDelta]]:
        return self._adapt(self._parser.feed(text))

    def finish(self) -> tuple[str, list[ToolDelta]]:
        return self._adapt(self._parser.finish())

    def _adapt(self, deltas: list[Any]) -> tuple[str, list[ToolDelta]]:
        content: list[str] = []
        calls: list[ToolDelta] = []
        for d in deltas:
            if isinstance(d, ContentDelta):
                content.append(d.text)
            elif isinstance(d, ToolCallStartDelta):
                self.num_calls = max(self.num_calls, d.index + 1)
                calls.append((d.index, d.id, d.name, None))
            elif isinstance(d, ToolCallArgumentsDelta):
                if calls and calls[-1][0] == d.index:
                    i, call_id, name, args = calls[-1]  # merge consecutive pieces of one call
                    calls[-1] = (i, call_id, name, (args or "") + d.arguments)
                else:
                    calls.append((d.index, None, None, d.arguments))
        return "".join(content), calls
