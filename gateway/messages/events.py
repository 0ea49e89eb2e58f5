"""Server-sent events for `/v1/messages`, as Anthropic sends them.

    message_start, then per content block: content_block_start, content_block_delta...
    (thinking_delta then signature_delta for a thinking block, text_delta for text,
    input_json_delta for a tool_use block's input), content_block_stop;
    then message_delta (stop_reason, stop_sequence, usage) and message_stop. A failure after
    the stream began is an `event: error` with Anthropic's error body.

The joined `partial_json` pieces of a tool_use block are exactly the arguments text the
whole response parses into `input`. As for chat (`gateway.chat.bodies.owning`), the event stream
owns the engine stream and calls `on_close(outcome)` however it ends.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, Callable

import msgspec

from gateway.chat.bodies import owning
from gateway.errors import stream_error
from gateway.messages.errors import error_body
from gateway.messages.protocol import Message, TextOut, ThinkingOut, ToolUseOut, Usage
from gateway.messages.results import stop_reason, tool_use_id, usage_of
from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import EngineStream, Outcome, reasoning_of


def sse(event: str, body: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + msgspec.json.encode(body) + b"\n\n"


class MessageStreamWriter:
    """Content pieces and tool-call deltas → the event sequence, one open block at a time."""

    def __init__(self, answer_tool: str | None):
        self.answer_tool = answer_tool
        self.index = -1  # the open (or last) block's index
        self.open: str | None = None  # "text" / "tool_use"
        self.call_index: int | None = None  # the open tool_use block's index in the tool-call stream
        self.answer_index: int | None = None  # the final-answer call (its arguments are text)
        self.tool_uses = 0

    def start(self, msg_id: str, model: str, prompt_tokens: int) -> bytes:
        shell = Message(id=msg_id, model=model, content=[], usage=Usage(input_tokens=prompt_tokens, output_tokens=0))
        return sse("message_start", {"type": "message_start", "message": shell})

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # the block's signature (empty: nothing checks it) ends it
            delta = {"type": "signature_delta", "signature": ""}
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}))
        self.open = self.call_index = None
        return out + [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def begin(self, block: Any) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = {TextOut: "text", ThinkingOut: "thinking"}.get(type(block), "tool_use")
        out.append(
            sse("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def thinking(self, piece: str) -> list[bytes]:
        if not piece:
            return []
        out = self.begin(ThinkingOut(thinking="")) if self.open != "thinking" else []
        delta = {"type": "thinking_delta", "thinking": piece}
        out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}))
        return out

    def text(self, piece: str) -> list[bytes]:
        if not piece:
            return []
        out = self.begin(TextOut(text="")) if self.open != "text" else []
        out.append(
            sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": piece}},
            )
        )
        return out

    def tool(self, index: int, call_id: str | None, name: str | None, arguments: str | None) -> list[bytes]:
        out: list[bytes] = []
        if name is not None:  # a call opens
            if name == self.answer_tool:
                self.answer_index = index
            else:
                out += self.begin(ToolUseOut(id=tool_use_id(call_id), name=name, input={}))
                self.call_index = index
                self.tool_uses += 1
        if arguments:
            if index == self.answer_index:
                out += self.text(arguments)
            elif self.open == "tool_use" and index == self.call_index:
                out.append(
                    sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "input_json_delta", "partial_json": arguments},
                        },
                    )
                )
        return out

    def finish(self, outcome: Outcome, stop_sequence: str | None) -> list[bytes]:
        out = self.close()
        usage = usage_of(outcome)
        delta = {"stop_reason": stop_reason(outcome, self.tool_uses > 0, stop_sequence), "stop_sequence": stop_sequence}
        out.append(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return out


def message_events(
    msg_id: str,
    model: str,
    streams: list[EngineStream],
    parse_tool_calls: bool,
    answer_tool: str | None,
    stop_of: Callable[[Outcome], str | None],
    on_close: Callable[[str], None],
    retry_after_s: int = 1,
) -> AsyncGenerator[bytes, None]:
    """The event stream of one message (one engine stream); `stop_of(outcome)` names the stop
    sequence it ended on."""
    writer = MessageStreamWriter(answer_tool)
    parser = grammar_adapter.ToolCallStream() if parse_tool_calls else None
    stream = streams[0]

    def pieces(content: str, calls: list) -> list[bytes]:
        out = writer.text(content)
        for call in calls:
            out += writer.tool(*call)
        return out

    async def body() -> AsyncGenerator[bytes, None]:
        yield writer.start(msg_id, model, len(stream.request.prompt_ids))
        async for event in stream:
            for piece in writer.thinking(reasoning_of(event)):
                yield piece
            if not event.text:
                continue
            for piece in pieces(*parser.feed(event.text)) if parser is not None else writer.text(event.text):
                yield piece
        if parser is not None:
            for piece in pieces(*parser.finish()):
                yield piece
        stream.check_error()
        for piece in writer.finish(stream.outcome, stop_of(stream.outcome)):
            yield piece

    def failed(exc: BaseException) -> bytes:
        return sse("error", msgspec.to_builtins(error_body(stream_error(exc, retry_after_s))))

    return owning(body(), streams, on_close, failed)
