"""Server-sent events for `/v1/responses`, as OpenAI sends them.

    response.created, response.in_progress,
    per output item: response.output_item.added,
      reasoning (a think block, first): response.reasoning_text.delta..., response.reasoning_text.done
      message: response.content_part.added, response.output_text.delta..., response.output_text.done,
               response.content_part.done
      function_call: response.function_call_arguments.delta..., response.function_call_arguments.done
    response.output_item.done, then response.completed (response.incomplete at max_output_tokens),
    or response.failed on an error. Every event carries a growing `sequence_number`.

As for chat completions (`streaming.owning`), the event stream owns the engine stream: its
`finally` closes it and calls `on_close(outcome)`; `SSEResponse` covers a disconnect while it is
parked at a `yield`.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, Callable

import msgspec

from gateway.chat.bodies import owning
from gateway.errors import stream_error
from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import EngineStream, Outcome, reasoning_of
from gateway.pipeline.logprobs import chat_token_logprobs
from gateway.protocol import ChatTokenLogprob
from gateway.responses.items import finished_response, item_id
from gateway.responses.protocol import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseError,
    ResponseEvent,
    ResponseObject,
)


class ResponseStreamWriter:
    """Builds the event sequence (and the output items) from content pieces and tool-call deltas."""

    def __init__(self, shell: ResponseObject, answer_tool: str | None):
        self.shell = shell
        self.answer_tool = answer_tool
        self.seq = 0
        self.items: list[OutputItem] = []
        self.message: OutputMessage | None = None  # the open message item
        self.call: OutputFunctionCall | None = None  # the open function_call item
        self.call_index: int | None = None  # the open call's index in the tool-call stream
        self.answer_index: int | None = None  # the final-answer call's index (its arguments are text)
        self.pending_logprobs: list[ChatTokenLogprob] = []  # tokens whose text has not been sent yet
        self.reasoning_item: OutputReasoning | None = None  # the open reasoning item

    def event(self, type: str, **fields: Any) -> bytes:
        body = msgspec.json.encode(ResponseEvent(type=type, sequence_number=self.seq, **fields))
        self.seq += 1
        return b"event: " + type.encode() + b"\ndata: " + body + b"\n\n"

    def start(self) -> list[bytes]:
        return [
            self.event("response.created", response=self.shell),
            self.event("response.in_progress", response=self.shell),
        ]

    @property
    def output_index(self) -> int:
        return len(self.items) - 1

    def reasoning(self, piece: str) -> list[bytes]:
        """A piece of the think block (its item opens with the first one)."""
        if not piece:
            return []
        out: list[bytes] = []
        item = self.reasoning_item
        if item is None:
            item = self.reasoning_item = OutputReasoning(
                id=item_id("rs"), content=[ReasoningText(text="")], status="in_progress"
            )
            self.items.append(item)
            out.append(self.event("response.output_item.added", output_index=self.output_index, item=item))
        item.content[0].text += piece
        out.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=item.id,
                output_index=self.items.index(item),
                content_index=0,
                delta=piece,
            )
        )
        return out

    def close_reasoning(self) -> list[bytes]:
        item = self.reasoning_item
        if item is None:
            return []
        self.reasoning_item = None
        item.status = "completed"
        index = self.items.index(item)
        return [
            self.event(
                "response.reasoning_text.done",
                item_id=item.id,
                output_index=index,
                content_index=0,
                text=item.content[0].text,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def open_message(self) -> list[bytes]:
        out = self.close_reasoning() + self.close_call()
        self.message = OutputMessage(id=item_id("msg"), content=[], status="in_progress")
        self.items.append(self.message)
        out.append(self.event("response.output_item.added", output_index=self.output_index, item=self.message))
        out.append(
            self.event(
                "response.content_part.added",
                item_id=self.message.id,
                output_index=self.output_index,
                content_index=0,
                part=OutputText(text=""),
            )
        )
        self.message.content.append(OutputText(text=""))
        return out

    def text(self, piece: str, logprobs: list[ChatTokenLogprob] | None = None) -> list[bytes]:
        """A text delta; `logprobs` (of the tokens behind it) ride on the next delta that has text."""
        self.pending_logprobs += logprobs or []
        if not piece:
            return []
        out = self.open_message() if self.message is None else []
        assert self.message is not None
        part = self.message.content[0]
        part.text += piece
        sent, self.pending_logprobs = self.pending_logprobs, []
        part.logprobs += sent
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message.id,
                output_index=self.items.index(self.message),
                content_index=0,
                delta=piece,
                logprobs=sent,
            )
        )
        return out

    def tool(self, index: int, call_id: str | None, name: str | None, arguments: str | None) -> list[bytes]:
        out: list[bytes] = []
        if name is not None:  # a call opens
            if name == self.answer_tool:
                self.answer_index = index
            else:
                out += self.close_reasoning() + self.close_message() + self.close_call()
                self.call = OutputFunctionCall(
                    id=item_id("fc"), call_id=call_id or item_id("call"), name=name, arguments="", status="in_progress"
                )
                self.call_index = index
                self.items.append(self.call)
                out.append(self.event("response.output_item.added", output_index=self.output_index, item=self.call))
        if arguments:
            if index == self.answer_index:
                out += self.text(arguments)
            elif self.call is not None and index == self.call_index:
                self.call.arguments += arguments
                out.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=self.call.id,
                        output_index=self.items.index(self.call),
                        delta=arguments,
                    )
                )
        return out

    def close_message(self) -> list[bytes]:
        m = self.message
        if m is None:
            return []
        index = self.items.index(m)
        out = []
        if self.pending_logprobs:  # tokens with no text of their own (held back, then dropped): still reported
            out.append(
                self.event(
                    "response.output_text.delta",
                    item_id=m.id,
                    output_index=index,
                    content_index=0,
                    delta="",
                    logprobs=self.pending_logprobs,
                )
            )
            m.content[0].logprobs += self.pending_logprobs
            self.pending_logprobs = []
        self.message = None
        m.status = "completed"
        return out + [
            self.event(
                "response.output_text.done",
                item_id=m.id,
                output_index=index,
                content_index=0,
                text=m.content[0].text,
                logprobs=m.content[0].logprobs,
            ),
            self.event(
                "response.content_part.done", item_id=m.id, output_index=index, content_index=0, part=m.content[0]
            ),
            self.event("response.output_item.done", output_index=index, item=m),
        ]

    def close_call(self) -> list[bytes]:
        c = self.call
        if c is None:
            return []
        self.call = self.call_index = None
        index = self.items.index(c)
        c.status = "completed"
        return [
            self.event(
                "response.function_call_arguments.done",
                item_id=c.id,
                output_index=index,
                arguments=c.arguments,
                name=c.name,
            ),
            self.event("response.output_item.done", output_index=index, item=c),
        ]

    def finish(self, outcome: Outcome) -> tuple[list[bytes], ResponseObject]:
        out = self.close_reasoning() + self.close_message() + self.close_call()
        if all(
            isinstance(i, OutputReasoning) for i in self.items
        ):  # no answer: still one (empty) message, as the whole response has
            out += self.open_message() + self.close_message()
        response = finished_response(self.shell, outcome, self.items)
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        out.append(self.event(kind, response=response))
        return out, response

    def failed(self, exc: BaseException, retry_after_s: int) -> bytes:
        exc = stream_error(exc, retry_after_s)
        response = msgspec.structs.replace(
            self.shell,
            status="failed",
            output=self.items,
            error=ResponseError(code=exc.code or exc.type, message=exc.message),
        )
        return self.event("response.failed", response=response)


def response_events(
    shell: ResponseObject,
    streams: list[EngineStream],
    parse_tool_calls: bool,
    answer_tool: str | None,
    on_close: Callable[[str], None],
    on_done: Callable[[ResponseObject, Outcome], None],
    retry_after_s: int = 1,
) -> AsyncGenerator[bytes, None]:
    """The event stream of one response (one engine stream); `on_done` gets the finished response."""
    writer = ResponseStreamWriter(shell, answer_tool)
    parser = grammar_adapter.ToolCallStream() if parse_tool_calls else None
    stream = streams[0]

    def pieces(content: str, calls: list) -> list[bytes]:
        out = writer.text(content)
        for call in calls:
            out += writer.tool(*call)
        return out

    async def body() -> AsyncGenerator[bytes, None]:
        for event in writer.start():
            yield event
        async for event in stream:
            for piece in writer.reasoning(reasoning_of(event)):
                yield piece
            if parser is None:  # plain text (logprobs are never asked together with tools)
                texts = stream.outcome.token_texts
                logprobs = chat_token_logprobs(event.logprobs, texts) if event.logprobs and texts else None
                for piece in writer.text(event.text, logprobs):
                    yield piece
            elif event.text:
                for piece in pieces(*parser.feed(event.text)):
                    yield piece
        if parser is not None:
            for piece in pieces(*parser.finish()):
                yield piece
        stream.check_error()
        events, response = writer.finish(stream.outcome)
        on_done(response, stream.outcome)
        for piece in events:
            yield piece

    return owning(body(), streams, on_close, lambda exc: writer.failed(exc, retry_after_s))
