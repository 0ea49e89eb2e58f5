"""The model's output split into content and tool calls, whole or as it streams: Hermes's own
parser here, the structural-tag formats' in tag_parser.py (`stream_parser` picks), both built on
step_parser.py.

For each call the stream parser yields one ToolCallStartDelta (index, id, name), then
ToolCallArgumentsDelta pieces whose concatenation is the arguments JSON; text outside the calls
is ContentDelta. A block that is not a well-formed call is given back as content, never lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, ToolCallFormat
from grammar.kinds.tool_calls.step_parser import (
    CallInProgress,
    ContentDelta,
    Delta,
    JsonObjectScanner,
    StepParser,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStartDelta,
    new_tool_call_id,
)
from grammar.kinds.tool_calls.tag_parser import TagToolCallParser

_HEADER_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')


class ToolCallStreamParser(StepParser):
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
        self._scanner = JsonObjectScanner()
        self._calls: list[CallInProgress] = []
        self._content: list[str] = []
        self._finished = False

    # one transition; True if progress was made and another step may follow
    def _step(self, out: list[Delta], *, final: bool) -> bool:
        state, begin, end = self._state, self._fmt.call_begin, self._fmt.call_end
        if state == "text":
            idx = self._buf.find(begin)
            if idx >= 0:
                self._emit_text(out, self._buf[:idx].rstrip())
                self._buf = self._buf[idx + len(begin) :]
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
                call = CallInProgress(self._new_id(), name)
                self._calls.append(call)
                out.append(ToolCallStartDelta(len(self._calls) - 1, call.id, name))
                self._buf = self._buf[m.end() :]
                self._scanner = JsonObjectScanner()
                self._state = "args"
                return True
            idx = self._buf.find(end)
            if idx >= 0 or final:
                body = self._buf[:idx] if idx >= 0 else self._buf
                self._buf = self._buf[idx + len(end) :] if idx >= 0 else ""
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
                self._buf = self._buf[idx + len(end) :] if idx >= 0 else ""
                self._state = "between"
                return True
            return False
        if state == "tail":  # after the arguments: the envelope's "}" and the end marker
            idx = self._buf.find(end)
            if idx >= 0:
                self._buf = self._buf[idx + len(end) :]
                self._state = "between"
                return True
            if final:
                self._buf = ""
            return False
        if state == "between":
            self._buf = self._buf.lstrip()
            if self._buf.startswith(begin):
                self._buf = self._buf[len(begin) :]
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
        call = CallInProgress(self._new_id(), name)
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


def stream_parser(
    fmt=HERMES_TOOL_CALL_FORMAT,
    schemas: dict[str, dict] | None = None,
    id_factory: Callable[[], str] = new_tool_call_id,
):
    """The stream parser of a format: Hermes's own, or the structural-tag parser of a model format
    (`schemas`: each tool's parameters, to type markup arguments)."""
    if isinstance(fmt, ToolCallFormat):
        return ToolCallStreamParser(fmt, id_factory)
    return TagToolCallParser(fmt.shape, schemas, id_factory)


def parse_tool_calls(
    text: str,
    fmt=HERMES_TOOL_CALL_FORMAT,
    id_factory: Callable[[], str] = new_tool_call_id,
    schemas: dict[str, dict] | None = None,
) -> tuple[str, list[ToolCall]]:
    """(content text, tool calls) of a whole output; same result as streaming it."""
    parser = stream_parser(fmt, schemas, id_factory)
    parser.feed(text)
    parser.finish()
    return parser.content, parser.tool_calls
