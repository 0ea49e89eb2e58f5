"""Tool calls for models without a native tool format: prompt text, grammar, and parser.

Everything about how a tool call looks in the model's output lives in one `ToolCallFormat`, so
a model family with its own convention gets its own instance. The default is the Hermes/Qwen
style, written compact so the grammar forces long spans (jump-forward) and leaves no whitespace
to loop on:

    <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

Several calls are separated by one newline. The grammar per `tool_choice`:

- "none": no grammar (None): free text.
- "auto": free text that never contains `<tool_call>`, optionally followed by one or more
  calls (at most one without parallel_tool_calls), and nothing after the calls.
- "required": one or more calls (one without parallel_tool_calls), no free text.
- {"type": "function", "function": {"name": N}}: exactly one call of N.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from grammar.canonical import canonical_json, canonical_tool
from grammar.errors import GrammarSpecError
from grammar.spec import GrammarSpec
from grammar.validate import validate_json_schema, validate_spec

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
SIMPLE_TOOL_CHOICES = ("none", "auto", "required")


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# -- results and streaming deltas -----------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of the arguments object, exactly as generated

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ContentDelta:
    text: str

    def to_openai(self) -> dict:
        return {"content": self.text}


@dataclass(frozen=True)
class ToolCallStartDelta:
    index: int
    id: str
    name: str

    def to_openai(self) -> dict:
        call = {"index": self.index, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": ""}}
        return {"tool_calls": [call]}


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    arguments: str

    def to_openai(self) -> dict:
        return {"tool_calls": [{"index": self.index, "function": {"arguments": self.arguments}}]}


Delta = ContentDelta | ToolCallStartDelta | ToolCallArgumentsDelta


# -- the format -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCallFormat:
    """How tool calls are written by one model family (Hermes/Qwen style by default)."""

    name: str = "hermes"
    call_begin: str = "<tool_call>"
    call_end: str = "</tool_call>"
    call_separator: str = "\n"
    response_begin: str = "<tool_response>"
    response_end: str = "</tool_response>"

    # prompt ---------------------------------------------------------------------------------

    def render_tools_prompt(self, tools: list[dict]) -> str:
        """Text appended after the system prompt. Canonical JSON (sorted keys, fixed separators),
        so the same tools always give the same tokens and share a KV-cache prefix."""
        lines = "\n".join(canonical_json(canonical_tool(t)) for t in tools)
        example = f'{self.call_begin}{{"name":<function-name>,"arguments":<arguments-json-object>}}{self.call_end}'
        return (
            "# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            f"To call a function, write a JSON object with the function name and arguments within "
            f"{self.call_begin}{self.call_end} tags, exactly like this:\n"
            f"{example}"
        )

    def render_call(self, name: str, arguments: str) -> str:
        """One call as the model writes it (also used to render past assistant turns);
        `arguments` is the arguments' JSON text, inserted as is."""
        return f"{self.call_prefix(name)}{arguments}{self.call_suffix}"

    def render_calls(self, calls: Iterable[tuple[str, str]]) -> str:
        return self.call_separator.join(self.render_call(n, a) for n, a in calls)

    def render_tool_response(self, content: str) -> str:
        """A tool result as shown back to the model."""
        return f"{self.response_begin}\n{content}\n{self.response_end}"

    def call_prefix(self, name: str) -> str:
        """Everything before the arguments object: forced once the name is chosen."""
        return f'{self.call_begin}{{"name":{json.dumps(name, ensure_ascii=False)},"arguments":'

    @property
    def call_suffix(self) -> str:
        return "}" + self.call_end

    # grammar --------------------------------------------------------------------------------

    def structural_tag(
        self,
        tools: list[dict],
        tool_choice: str | dict,
        parallel_tool_calls: bool,
        arguments_grammar: Callable[[Any, bool], str],
    ) -> dict:
        """xgrammar structural tag for a validated payload; `arguments_grammar(schema, strict)`
        gives the EBNF of one tool's arguments."""

        def tag(tool: dict) -> dict:
            function = tool["function"]
            ebnf = arguments_grammar(arguments_schema(function), function.get("strict") is not False)
            return {
                "type": "tag",
                "begin": self.call_prefix(function["name"]),
                "content": {"type": "grammar", "grammar": ebnf},
                "end": self.call_suffix,
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
            "separator": self.call_separator,
            "at_least_one": tool_choice == "required",
            "stop_after_first": not parallel_tool_calls,
        }
        if tool_choice == "required":
            return {"type": "structural_tag", "format": calls}
        # auto: text without the call marker, then zero or more calls, then the end
        text = {"type": "any_text", "excludes": [self.call_begin]}
        return {"type": "structural_tag", "format": {"type": "sequence", "elements": [text, calls]}}

    # parsing --------------------------------------------------------------------------------

    def stream_parser(self, id_factory: Callable[[], str] = new_tool_call_id) -> "ToolCallStreamParser":
        return ToolCallStreamParser(self, id_factory)

    def parse(self, text: str, id_factory: Callable[[], str] = new_tool_call_id) -> tuple[str, list[ToolCall]]:
        """(content text, tool calls) of a whole output; same result as streaming it."""
        parser = self.stream_parser(id_factory)
        parser.feed(text)
        parser.finish()
        return parser.content, parser.tool_calls


HERMES_TOOL_CALL_FORMAT = ToolCallFormat()
TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {HERMES_TOOL_CALL_FORMAT.name: HERMES_TOOL_CALL_FORMAT}


def get_tool_call_format(name: str) -> ToolCallFormat:
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        raise GrammarSpecError(f"unknown tool-call format {name!r}; known: {', '.join(TOOL_CALL_FORMATS)}") from None


def arguments_schema(function: dict) -> dict:
    """A tool's parameters schema; a missing one (or one without a type) means any object."""
    params = function.get("parameters")
    if not params:
        return {"type": "object"}
    if "type" not in params:
        return {"type": "object", **params}
    return params


# -- module-level API (default format) --------------------------------------------------------


def render_tools_prompt(tools: list[dict], fmt: ToolCallFormat = HERMES_TOOL_CALL_FORMAT) -> str:
    return fmt.render_tools_prompt(tools)


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


def parse_tool_calls(
    text: str, fmt: ToolCallFormat = HERMES_TOOL_CALL_FORMAT, id_factory: Callable[[], str] = new_tool_call_id
) -> tuple[str, list[ToolCall]]:
    return fmt.parse(text, id_factory)


def tool_calls_structural_tag(payload: dict) -> dict:
    """The structural tag for a validated tool_calls payload (used by grammar/compile.py)."""
    from grammar.compile import compact_json_schema_ebnf

    fmt = get_tool_call_format(payload.get("format", HERMES_TOOL_CALL_FORMAT.name))
    return fmt.structural_tag(
        payload["tools"],
        payload["tool_choice"],
        payload["parallel_tool_calls"],
        lambda schema, strict: compact_json_schema_ebnf(schema, strict=strict),
    )


# -- validation -------------------------------------------------------------------------------


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
        raise GrammarSpecError(f"tool_choice names function {name!r}, which is not in tools (tools: {known})",
                               "/function/name", "tool_choice")


# -- streaming parser -------------------------------------------------------------------------

_HEADER_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')


class _JsonObjectScanner:
    """Finds where a JSON object/array ends, one character at a time (strings and escapes aware)."""

    __slots__ = ("depth", "in_string", "escaped", "started")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False

    def feed(self, text: str) -> int:
        """Consume `text`; return how many characters belong to the value (len(text) if not done)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return len(text)

    @property
    def done(self) -> bool:
        return self.started and self.depth == 0


@dataclass
class _CallInProgress:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ToolCallStreamParser:
    """Splits generated text, as it arrives, into content deltas and tool-call deltas.

    For each call: one ToolCallStartDelta (index, id, name), then ToolCallArgumentsDelta pieces
    whose concatenation is the arguments JSON. Text before the first call is content (trailing
    whitespace before a call dropped); whitespace between calls is dropped. A block that is not
    a well-formed call is given back as content, never lost.
    """

    def __init__(self, fmt: ToolCallFormat = HERMES_TOOL_CALL_FORMAT, id_factory: Callable[[], str] = new_tool_call_id):
        self._fmt = fmt
        self._new_id = id_factory
        self._buf = ""
        self._state = "text"  # text | header | args | raw_args | tail | between
        self._scanner = _JsonObjectScanner()
        self._calls: list[_CallInProgress] = []
        self._content: list[str] = []
        self._finished = False

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(c.id, c.name, "".join(c.arguments)) for c in self._calls]

    def feed(self, text: str) -> list[Delta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        out: list[Delta] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Delta]:
        """Flush what was held back (a partial marker, trailing whitespace) at end of output."""
        out: list[Delta] = []
        if not self._finished:
            while self._step(out, final=True):
                pass
            self._finished = True
        return out

    # one transition; True if progress was made and another step may follow
    def _step(self, out: list[Delta], *, final: bool) -> bool:
        state, begin, end = self._state, self._fmt.call_begin, self._fmt.call_end
        if state == "text":
            idx = self._buf.find(begin)
            if idx >= 0:
                self._emit_text(out, self._buf[:idx].rstrip())
                self._buf = self._buf[idx + len(begin):]
                self._state = "header"
                return True
            if final:
                self._emit_text(out, self._buf)
                self._buf = ""
                return False
            cut = _safe_text_cut(self._buf, begin)
            self._emit_text(out, self._buf[:cut])
            self._buf = self._buf[cut:]
            return False
        if state == "header":
            m = _HEADER_RE.match(self._buf)
            if m:
                name = json.loads(f'"{m.group(1)}"')
                call = _CallInProgress(self._new_id(), name)
                self._calls.append(call)
                out.append(ToolCallStartDelta(len(self._calls) - 1, call.id, name))
                self._buf = self._buf[m.end():]
                self._scanner = _JsonObjectScanner()
                self._state = "args"
                return True
            idx = self._buf.find(end)
            if idx >= 0 or final:
                body = self._buf[:idx] if idx >= 0 else self._buf
                self._buf = self._buf[idx + len(end):] if idx >= 0 else ""
                self._whole_block(out, body, closed=idx >= 0)
                self._state = "between" if self._calls else "text"
                return True
            return False
        if state == "args":
            stripped = self._buf.lstrip() if not self._scanner.started else self._buf
            if not self._scanner.started:
                if not stripped:
                    self._buf = ""
                    return False
                if stripped[0] not in "{[":
                    self._buf = stripped
                    self._state = "raw_args"
                    return True
            used = self._scanner.feed(stripped)
            self._emit_args(out, stripped[:used])
            self._buf = stripped[used:]
            if self._scanner.done:
                self._state = "tail"
                return True
            return False
        if state == "raw_args":  # a non-object arguments value: take it whole at the end
            idx = self._buf.find(end)
            if idx >= 0 or final:
                raw = self._buf[:idx] if idx >= 0 else self._buf
                raw = raw.rstrip()
                raw = raw[:-1].rstrip() if raw.endswith("}") else raw  # the envelope's "}"
                self._emit_args(out, raw)
                self._buf = self._buf[idx + len(end):] if idx >= 0 else ""
                self._state = "between"
                return True
            return False
        if state == "tail":  # after the arguments: the envelope's "}" and the end marker
            idx = self._buf.find(end)
            if idx >= 0:
                self._buf = self._buf[idx + len(end):]
                self._state = "between"
                return True
            if final:
                self._buf = ""
            return False
        if state == "between":
            self._buf = self._buf.lstrip()
            if self._buf.startswith(begin):
                self._buf = self._buf[len(begin):]
                self._state = "header"
                return True
            if not self._buf or (begin.startswith(self._buf) and not final):
                return False
            self._state = "text"  # text after the calls
            return True
        raise AssertionError(state)

    def _emit_text(self, out: list[Delta], text: str) -> None:
        if text:
            self._content.append(text)
            out.append(ContentDelta(text))

    def _emit_args(self, out: list[Delta], text: str) -> None:
        if text:
            self._calls[-1].arguments.append(text)
            out.append(ToolCallArgumentsDelta(len(self._calls) - 1, text))

    def _whole_block(self, out: list[Delta], body: str, *, closed: bool) -> None:
        """A call block in an unexpected layout: parse it whole, or give it back as content."""
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raw = self._fmt.call_begin + body + (self._fmt.call_end if closed else "")
            self._emit_text(out, raw)
            return
        call = _CallInProgress(self._new_id(), name)
        self._calls.append(call)
        out.append(ToolCallStartDelta(len(self._calls) - 1, call.id, name))
        args_text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"), ensure_ascii=False)
        self._emit_args(out, args_text)


def _safe_text_cut(text: str, marker: str) -> int:
    """How much of `text` can be emitted now: hold back a possible start of `marker` at the end,
    and trailing whitespace (dropped if a call follows)."""
    cut = len(text)
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            cut = len(text) - k
            break
    return len(text[:cut].rstrip())
