"""One parser for every format xgrammar describes: output text → content, reasoning and calls.

It reads the format's `TagShape` (tag_format.py, from the same structural tag the grammar is
built from): each call's header (prefix, tool name, suffix, the regex before the arguments), the
arguments' style (JSON streams piece by piece; markup styles are converted to JSON when the call
closes) and end markers; wrapper markers and separators between calls are dropped; harmony's
final channel is content and its analysis channel reasoning. Streamed deltas concatenate to the
whole answer's result. A header that never completes is given back as content, never lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from grammar.kinds.tool_calls.step_parser import (
    CallInProgress,
    ContentDelta,
    Delta,
    JsonObjectScanner,
    StepParser,
    ToolCallArgumentsDelta,
    ToolCallStartDelta,
    new_tool_call_id,
)
from grammar.kinds.tool_calls.tag_format import CallShape, TagShape

HEADER_SLACK = 64 + 48  # past a header's literal parts: the longest tool name, and what arg_prefix matches


class TagToolCallParser(StepParser):
    """Streams the output of a `TagShape` format as ContentDelta / ToolCallStartDelta /
    ToolCallArgumentsDelta (the same deltas as the Hermes parser); `reasoning` collects
    reasoning channels (harmony analysis)."""

    def __init__(
        self, shape: TagShape, schemas: dict[str, dict] | None = None, id_factory: Callable[[], str] = new_tool_call_id
    ) -> None:
        self._shape = shape
        self._schemas = schemas or {}
        self._new_id = id_factory
        self._buf = ""
        self._state = "text"  # text | args | markup | tail | channel
        self._call: CallShape | None = None
        self._channel_ends: tuple[str, ...] = ()
        self._channel_is_reasoning = False
        self._scanner = JsonObjectScanner()
        self._calls: list[CallInProgress] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._finished = False
        # literal starts: (text, what) — what is a CallShape, ("marker",), or ("channel", ends, reasoning)
        starts: list[tuple[str, Any]] = [(c.head_prefix, c) for c in shape.calls]
        starts += [(m, ("marker",)) for m in shape.markers]
        starts += [(b, ("channel", ends, False)) for b, ends in shape.channels]
        starts += [(b, ("channel", ends, True)) for b, ends in shape.reasoning]
        self._starts = starts

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    # one transition; True if progress was made and another may follow
    def _step(self, out: list[Delta], *, final: bool) -> bool:
        if self._state == "text":
            return self._text(out, final)
        if self._state == "args":
            used = self._scanner.feed(self._buf)
            self._emit_args(out, self._buf[:used])
            self._buf = self._buf[used:]
            if self._scanner.done:
                self._state = "tail"
                return True
            if final:
                self._state = "text"
            return False
        if self._state in ("tail", "markup"):
            assert self._call is not None
            idx, end = _find_first(self._buf, self._call.ends)
            if idx < 0:
                if final:  # cut before its end: what was written stays the call's
                    if self._state == "markup":
                        self._emit_args(out, self._markup(self._buf))
                    self._buf, self._state = "", "text"
                return False
            if self._state == "markup":
                self._emit_args(out, self._markup(self._buf[:idx]))
            self._buf = self._buf[idx + len(end) :]
            self._state = "text"
            return True
        if self._state == "channel":
            idx, end = _find_first(self._buf, self._channel_ends)
            take = self._buf[:idx] if idx >= 0 else (self._buf if final else _hold_back(self._buf, self._channel_ends))
            if self._channel_is_reasoning:
                if take:
                    self._reasoning.append(take)
            else:
                self._emit_text(out, take)
            self._buf = self._buf[len(take) + (len(end) if idx >= 0 else 0) :]
            if idx >= 0 or final:
                self._state = "text"
                return idx >= 0
            return False
        raise AssertionError(self._state)

    def _text(self, out: list[Delta], final: bool) -> bool:
        best: tuple[int, str, Any] | None = None
        for literal, what in self._starts:
            idx = self._buf.find(literal)
            if idx >= 0 and (best is None or idx < best[0] or (idx == best[0] and len(literal) > len(best[1]))):
                best = (idx, literal, what)
        if best is None:
            if final:
                self._emit_text(out, self._buf)
                self._buf = ""
                return False
            keep = _hold_back(self._buf, [s for s, _ in self._starts]).rstrip()  # dropped if a call follows
            self._emit_text(out, keep)
            self._buf = self._buf[len(keep) :]
            return False
        idx, literal, what = best
        before = self._buf[:idx]
        if isinstance(what, CallShape):
            # several call shapes may share the literal start (harmony's ` to=functions.`): any may match
            shapes = [w for lit, w in self._starts if isinstance(w, CallShape) and self._buf.startswith(lit, idx)]
            m = None
            for shape in shapes:
                m = shape.head_re.match(self._buf, idx)
                if m is not None:
                    what = shape
                    break
            if m is None:
                longest = max(len(w.head_prefix) + len(w.head_suffix) for w in shapes)
                if not final and len(self._buf) - idx < longest + HEADER_SLACK:
                    kept = before.rstrip()  # maybe a header still arriving: hold the space before it
                    self._emit_text(out, kept)
                    self._buf = self._buf[len(kept) :]
                    return False
                self._emit_text(out, self._buf[: idx + 1])  # not a call: its first character is text
                self._buf = self._buf[idx + 1 :]
                return True
            self._emit_text(out, before.rstrip())
            call = CallInProgress(self._new_id(), m.group("name"))
            self._calls.append(call)
            out.append(ToolCallStartDelta(len(self._calls) - 1, call.id, call.name))
            self._buf = self._buf[m.end() :]
            self._call = what
            if what.style == "json":
                self._scanner = JsonObjectScanner()
                self._state = "args"
            else:
                self._state = "markup"
            return True
        self._emit_text(out, before.rstrip() if self._calls or what[0] == "marker" else before)
        self._buf = self._buf[idx + len(literal) :]
        if what[0] == "channel":
            self._state, self._channel_ends, self._channel_is_reasoning = "channel", what[1], what[2]
        return True

    def _markup(self, body: str) -> str:
        """Markup arguments → compact JSON text (typed by the tool's schema where known)."""
        assert self._call is not None
        schema = self._schemas.get(self._calls[-1].name) or {}
        props = schema.get("properties") or {}
        if self._call.style == "gemma":
            return json.dumps(_gemma(body.strip()), separators=(",", ":"), ensure_ascii=False)
        if self._call.style == "qwen_xml":
            pairs = re.findall(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>", body, re.S)
        else:  # glm_xml
            pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", body, re.S)
        args = {k: _typed(v, props.get(k)) for k, v in pairs}
        return json.dumps(args, separators=(",", ":"), ensure_ascii=False)

    def _emit_text(self, out: list[Delta], text: str) -> None:
        if text:
            self._content.append(text)
            out.append(ContentDelta(text))

    def _emit_args(self, out: list[Delta], text: str) -> None:
        if text:
            self._calls[-1].arguments.append(text)
            out.append(ToolCallArgumentsDelta(len(self._calls) - 1, text))


def _find_first(text: str, markers) -> tuple[int, str]:
    best, which = -1, ""
    for m in markers:
        i = text.find(m)
        if i >= 0 and (best < 0 or i < best):
            best, which = i, m
    return best, which


def _hold_back(text: str, markers) -> str:
    """The part of `text` that cannot be the start of any marker (what may be emitted now)."""
    cut = len(text)
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if m.startswith(text[-k:]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]


def _typed(raw: str, schema: dict | None) -> Any:
    """A markup value: a string where the schema says string, else JSON if it parses."""
    types = (schema or {}).get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_GEMMA_TOKEN = re.compile(r'<\|"\|>(.*?)<\|"\|>|([{}\[\],:])|([^{}\[\],:<]+)', re.S)


def _gemma(text: str) -> Any:
    """Gemma 4's argument notation ({key:<|"|>text<|"|>,n:5}) → a Python value."""
    tokens = [(m.group(1), m.group(2), (m.group(3) or "").strip()) for m in _GEMMA_TOKEN.finditer(text)]
    tokens = [t for t in tokens if t[0] is not None or t[1] or t[2]]
    pos = 0

    def value() -> Any:
        nonlocal pos
        s, punct, bare = tokens[pos]
        pos += 1
        if s is not None:
            return s
        if punct == "{":
            obj: dict[str, Any] = {}
            while tokens[pos][1] != "}":
                key = tokens[pos][0] if tokens[pos][0] is not None else tokens[pos][2]
                pos += 2  # key and ':'
                obj[key] = value()
                if tokens[pos][1] == ",":
                    pos += 1
            pos += 1
            return obj
        if punct == "[":
            arr = []
            while tokens[pos][1] != "]":
                arr.append(value())
                if tokens[pos][1] == ",":
                    pos += 1
            pos += 1
            return arr
        try:
            return json.loads(bare)
        except ValueError:
            return bare

    try:
        return value() if tokens else {}
    except (IndexError, TypeError):
        return {}
