"""What both streaming tool-call parsers share (parser.py's for Hermes, tag_parser.py's for the
structural-tag formats): the calls and deltas they produce, the scanner that finds where a JSON
value ends, and `StepParser`, which drives a parser's `_step` over the text as it arrives.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field


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
        call = {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }
        return {"tool_calls": [call]}


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    arguments: str

    def to_openai(self) -> dict:
        return {"tool_calls": [{"index": self.index, "function": {"arguments": self.arguments}}]}


Delta = ContentDelta | ToolCallStartDelta | ToolCallArgumentsDelta


class JsonObjectScanner:
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
class CallInProgress:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class StepParser:
    """What both streaming parsers share (parser.py's and tag_parser.py's): the buffer, the content and
    calls collected, and feed/finish driving `_step` (one transition; True while another may follow)."""

    _buf: str
    _content: list[str]
    _calls: list[CallInProgress]
    _finished: bool

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

    def _step(self, out: list[Delta], *, final: bool) -> bool:
        raise NotImplementedError
