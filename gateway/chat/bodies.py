"""Engine outcomes → OpenAI chat and text completion bodies: whole (`chat_completion`,
`completion`), or as server-sent events as OpenAI sends them (`chat_events`, `completion_events`).

Each event stream owns its engine streams (`owning`, which `/v1/responses` and `/v1/messages` use
too): its `finally` closes them (aborting unfinished engine requests) and calls `on_close(outcome)`.
On a client disconnect Litestar cancels the task that iterates the generator, which runs that
`finally` only if the generator was inside an `await`; `SSEResponse` therefore also finishes the job
itself once the response is over, however it ended (parked at a `yield`, never started, or failed):
`on_close` runs exactly once in every case.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from typing import Any, AsyncGenerator, Callable

import msgspec
from litestar.response import Stream
from msgspec import UNSET

from gateway.errors import stream_error
from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import EngineStream, Outcome, close_all, merge, reasoning_of
from gateway.pipeline.logprobs import chat_logprobs, completion_logprobs, text_length
from gateway.pipeline.output_validation import OutputCheck
from gateway.pipeline.preparation import Prepared
from gateway.protocol import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChoiceDelta,
    ChoiceValidity,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionChunk,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    make_usage,
)

# -- whole bodies ----------------------------------------------------------------------------------


def finish_reason(engine_reason: str | None, has_tool_calls: bool = False) -> str:
    if has_tool_calls:
        return "tool_calls"
    if engine_reason == "length":
        return "length"
    return "stop"


def usage_of(outcomes: list[Outcome]) -> Usage:
    """OpenAI counts the prompt once for n choices; completions (and their reasoning) add up."""
    first = outcomes[0]
    reasoning = sum(o.reasoning_tokens for o in outcomes) if first.reasoning is not None else None
    return make_usage(first.prompt_tokens, sum(o.completion_tokens for o in outcomes), first.cached_tokens, reasoning)


def reasoning_field(outcome: Outcome):
    """`reasoning_content` of a choice: the think block's text (null where the model wrote none;
    left out where the request could have none)."""
    if outcome.reasoning is None:
        return UNSET
    return outcome.reasoning or None


def chat_choice(
    index: int,
    outcome: Outcome,
    parse_tools: bool,
    check: OutputCheck | None = None,
    answer_tool: str | None = None,
    tools: list | None = None,
) -> ChatChoice:
    """`tools`: the request's, to type arguments a model format writes as markup."""
    text = outcome.text
    if parse_tools:
        content, calls = grammar_adapter.parse_tool_calls(outcome.text, tools)
        # no call: the content as the parser reads it (harmony's channel markers dropped), as streamed
        text = content if content is not None else text
        answers = [c for c in calls if c.name == answer_tool]  # the final answer, as content
        if answers:
            content = (content or "") + "".join(c.arguments for c in answers)
            calls = [c for c in calls if c.name != answer_tool]
            if not calls:
                return ChatChoice(
                    index=index,
                    message=ChatMessage(content=content, reasoning_content=reasoning_field(outcome)),
                    finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
                    jumpgate=_calls_validity(check, outcome, answers) or UNSET,
                )
        if calls:
            tool_calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]
            return ChatChoice(
                index=index,
                message=ChatMessage(
                    content=content or None, tool_calls=tool_calls, reasoning_content=reasoning_field(outcome)
                ),
                logprobs=chat_logprobs(outcome.logprobs, outcome.token_texts),
                finish_reason="tool_calls" if outcome.finish_reason != "length" else "length",  # type: ignore[arg-type]
                jumpgate=_calls_validity(check, outcome, calls) or UNSET,
            )
    return ChatChoice(
        index=index,
        message=ChatMessage(content=text, reasoning_content=reasoning_field(outcome)),
        logprobs=chat_logprobs(outcome.logprobs, outcome.token_texts),
        finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
        jumpgate=choice_validity(check, outcome, False) or UNSET,
    )


def choice_validity(
    check: OutputCheck | None, outcome: Outcome, parse_tools: bool, tools: list | None = None
) -> ChoiceValidity | None:
    """The jumpgate validity of one finished choice (None: nothing structured to validate)."""
    if parse_tools:
        return _calls_validity(check, outcome, grammar_adapter.parse_tool_calls(outcome.text, tools)[1])
    if check is None or check.kind != "json_schema":
        return None
    return _noted(check.check_text(outcome.text, outcome.finish_reason), outcome)


def _calls_validity(check: OutputCheck | None, outcome: Outcome, calls: list) -> ChoiceValidity | None:
    if check is None:
        return None
    return _noted(check.check_tool_calls([(c.name, c.arguments) for c in calls], outcome.finish_reason), outcome)


def _noted(validity: ChoiceValidity | None, outcome: Outcome) -> ChoiceValidity | None:
    """The verdict, saying also whether strict closing shaped the value."""
    if validity is not None and outcome.closed_at_budget:
        validity.closed_at_budget = True
    return validity


def chat_completion(prepared: Prepared, outcomes: list[Outcome], answer_tool: str | None = None) -> ChatCompletion:
    """`answer_tool`: the final-answer tool of a request with tools and a format
    (gateway.pipeline.constraints.fold_format_into_tools)."""
    return ChatCompletion(
        id=prepared.request_id,
        created=prepared.created,
        model=prepared.model,
        choices=[
            chat_choice(i, o, prepared.plan.parse_tool_calls, prepared.output_check, answer_tool, prepared.plan.tools)
            for i, o in enumerate(outcomes)
        ],
        usage=usage_of(outcomes),
    )


def completion(
    request_id: str,
    created: int,
    model: str,
    outcomes: list[Outcome],
    n: int,
    echo_texts: list[str | None],
    check: OutputCheck | None = None,
) -> Completion:
    """Choices for p prompts × n samples (index = prompt * n + sample), as OpenAI numbers them."""
    choices = []
    for index, outcome in enumerate(outcomes):
        prefix = echo_texts[index // n] or ""
        validity = choice_validity(check, outcome, False)
        choices.append(
            CompletionChoice(
                index=index,
                text=prefix + outcome.text,
                finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
                logprobs=completion_logprobs(outcome.logprobs, outcome.token_texts, len(prefix)),
                jumpgate=validity or UNSET,
            )
        )
    prompt_tokens = sum(outcomes[p * n].prompt_tokens for p in range(len(outcomes) // n))
    cached = sum(outcomes[p * n].cached_tokens for p in range(len(outcomes) // n))
    return Completion(
        id=request_id,
        created=created,
        model=model,
        choices=choices,
        usage=make_usage(prompt_tokens, sum(o.completion_tokens for o in outcomes), cached),
    )


# -- server-sent events ----------------------------------------------------------------------------

log = logging.getLogger("jumpgate.gateway")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def once(fn: Callable[[str], None]) -> Callable[[str], None]:
    """`fn(outcome)` runs on the first call only (the stream's end and the response's end both call it)."""
    done = False

    def call(outcome: str) -> None:
        nonlocal done
        if not done:
            done = True
            fn(outcome)

    return call


class SSEResponse(Stream):
    """A text/event-stream response that always finalizes its generator.

    `on_close` must be idempotent (see `once`); it is called with "cancelled" after the response,
    which is a no-op when the generator's own `finally` already reported the real outcome.
    """

    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[str], None], **kwargs: Any):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS, **kwargs)
        self._events = events
        self._on_close = on_close

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        inner = super().to_asgi_response(*args, **kwargs)
        events, on_close = self._events, self._on_close

        async def app(scope: Any, receive: Any, send: Any) -> None:
            try:
                await inner(scope, receive, send)
            finally:
                on_close("cancelled")  # synchronous: aborts the engine requests even if we are cancelled
                try:
                    await events.aclose()  # lets the generator's own finally (merge tasks) run
                except Exception:  # cleanup must not mask the response's outcome
                    log.exception("closing an event stream failed")

        return app


def sse(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


async def owning(
    events: AsyncGenerator[bytes, None],
    streams: list[EngineStream],
    on_close: Callable[[str], None],
    failed: Callable[[Exception], bytes],
    done: bytes | None = None,
) -> AsyncGenerator[bytes, None]:
    """The body of an event stream: `events`, then `done`; on an error, `failed(exc)` then `done`.
    It owns the engine streams: however it ends (finished, failed, or closed at a `yield`), its
    `finally` closes them and calls `on_close(outcome)`."""
    outcome = "cancelled"
    try:
        async with aclosing(events):
            async for piece in events:
                yield piece
        if done is not None:
            yield done
        outcome = "success"
    except Exception as exc:
        outcome = "error"
        yield failed(exc)
        if done is not None:
            yield done
    finally:
        close_all(streams)
        on_close(outcome)


def _error_event(exc: BaseException, retry_after_s: int) -> bytes:
    return sse(stream_error(exc, retry_after_s).body())


def _set(value):  # None → left out of the JSON
    return UNSET if value is None else value


def _tool_deltas(pieces: list[tuple[int, str | None, str | None, str | None]]) -> list[ToolCallDelta]:
    """OpenAI's shape: a call opens with index, id, type and name (arguments ""), then argument pieces."""
    deltas = []
    for index, call_id, name, arguments in pieces:
        opening = call_id is not None or name is not None
        if arguments is None and opening:
            arguments = ""
        deltas.append(
            ToolCallDelta(
                index=index,
                id=_set(call_id),
                type="function" if opening else UNSET,
                function=FunctionCallDelta(name=_set(name), arguments=_set(arguments)),
            )
        )
    return deltas


def chat_events(
    prepared: Prepared,
    streams: list[EngineStream],
    include_usage: bool,
    on_close: Callable[[str], None],
    retry_after_s: int = 1,
    answer_tool: str | None = None,
) -> AsyncGenerator[bytes, None]:
    """`answer_tool`: the final-answer tool (gateway.pipeline.constraints.fold_format_into_tools); its
    arguments stream as content."""
    n = len(streams)
    parsers = [
        grammar_adapter.ToolCallStream(prepared.plan.tools) if prepared.plan.parse_tool_calls else None
        for _ in range(n)
    ]
    answer_index: list[int | None] = [None] * n  # which call of each choice is the final answer
    finished = [False] * n

    def chunk(index: int, delta: ChoiceDelta, reason: str | None = None, validity=None, logprobs=None) -> bytes:
        choice = ChunkChoice(
            index=index,
            delta=delta,
            finish_reason=reason,  # type: ignore[arg-type]
            logprobs=logprobs,
            jumpgate=validity or UNSET,
        )
        return sse(
            ChatCompletionChunk(
                id=prepared.request_id,
                created=prepared.created,
                model=prepared.model,
                choices=[choice],
            )
        )

    def pieces(index: int, content: str, calls: list, logprobs=None) -> list[bytes]:
        """The chunks of one event; its logprobs ride on the first (on an empty delta if the
        text is held back: part of a UTF-8 character, or a tool call still being parsed)."""
        if answer_tool is not None:
            for call_index, _, name, arguments in calls:
                if name == answer_tool:
                    answer_index[index] = call_index
                if call_index == answer_index[index]:
                    content += arguments or ""
            calls = [c for c in calls if c[0] != answer_index[index]]
        out = []
        if content:
            out.append(chunk(index, ChoiceDelta(content=content), logprobs=logprobs))
            logprobs = None
        if calls:
            out.append(chunk(index, ChoiceDelta(tool_calls=_tool_deltas(calls)), logprobs=logprobs))
            logprobs = None
        if logprobs is not None:
            out.append(chunk(index, ChoiceDelta(content=""), logprobs=logprobs))
        return out

    def final(index: int) -> list[bytes]:
        finished[index] = True
        out: list[bytes] = []
        parser = parsers[index]
        if parser is not None:
            out += pieces(index, *parser.finish())
        streams[index].check_error()
        has_calls = parser is not None and parser.num_calls > (answer_index[index] is not None)
        reason = streams[index].outcome.finish_reason
        # validated before the final chunk goes out, which carries the verdict
        validity = choice_validity(
            prepared.output_check, streams[index].outcome, parser is not None, prepared.plan.tools
        )
        out.append(
            chunk(index, ChoiceDelta(), "length" if reason == "length" else finish_reason(reason, has_calls), validity)
        )
        return out

    async def body() -> AsyncGenerator[bytes, None]:
        for i in range(n):
            yield chunk(i, ChoiceDelta(role="assistant", content=""))
        async with aclosing(merge(streams)) as events:
            async for index, event in events:
                logprobs = chat_logprobs(event.logprobs, streams[index].outcome.token_texts) if event.logprobs else None
                reasoning = reasoning_of(event)
                if reasoning:  # the think block streams apart from the answer
                    yield chunk(index, ChoiceDelta(reasoning_content=reasoning))
                if event.text or logprobs is not None:
                    parser = parsers[index]
                    feed = (event.text, []) if parser is None else parser.feed(event.text)
                    for piece in pieces(index, *feed, logprobs=logprobs):
                        yield piece
                if event.finished:
                    for piece in final(index):
                        yield piece
        for index in range(n):  # an engine stream that ended without a finished event
            if not finished[index]:
                for piece in final(index):
                    yield piece
        if include_usage:
            yield sse(
                ChatCompletionChunk(
                    id=prepared.request_id,
                    created=prepared.created,
                    model=prepared.model,
                    choices=[],
                    usage=usage_of([s.outcome for s in streams]),
                )
            )

    return owning(body(), streams, on_close, lambda exc: _error_event(exc, retry_after_s), DONE)


def completion_events(
    request_id: str,
    created: int,
    model: str,
    streams: list[EngineStream],
    n: int,
    echo_texts: list[str | None],
    include_usage: bool,
    on_close: Callable[[str], None],
    retry_after_s: int = 1,
    check: OutputCheck | None = None,
) -> AsyncGenerator[bytes, None]:
    finished = [False] * len(streams)
    text_offsets = [0] * len(streams)  # where the next token's text starts in each choice (legacy logprobs)

    def chunk(index: int, text: str, reason: str | None = None, validity=None, logprobs=None) -> bytes:
        choice = CompletionChoice(
            index=index,
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            logprobs=logprobs,
            jumpgate=validity or UNSET,
        )
        return sse(CompletionChunk(id=request_id, created=created, model=model, choices=[choice]))

    def final(index: int) -> bytes:
        finished[index] = True
        streams[index].check_error()
        done = streams[index].outcome
        return chunk(index, "", finish_reason(done.finish_reason), choice_validity(check, done, False))

    async def body() -> AsyncGenerator[bytes, None]:
        for index in range(len(streams)):
            echo = echo_texts[index // n]
            if echo:
                yield chunk(index, echo)
        async with aclosing(merge(streams)) as events:
            async for index, event in events:
                logprobs = None
                if event.logprobs:
                    texts = streams[index].outcome.token_texts
                    logprobs = completion_logprobs(event.logprobs, texts, text_offsets[index])
                    text_offsets[index] += text_length(event.logprobs, texts)
                if event.text or logprobs is not None:
                    yield chunk(index, event.text, logprobs=logprobs)
                if event.finished:
                    yield final(index)
        for index in range(len(streams)):
            if not finished[index]:
                yield final(index)
        if include_usage:
            outcomes = [s.outcome for s in streams]
            prompts = range(len(streams) // n)
            usage = usage_of(outcomes)
            usage.prompt_tokens = sum(outcomes[p * n].prompt_tokens for p in prompts)
            usage.prompt_tokens_details.cached_tokens = sum(outcomes[p * n].cached_tokens for p in prompts)
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            yield sse(CompletionChunk(id=request_id, created=created, model=model, choices=[], usage=usage))

    return owning(body(), streams, on_close, lambda exc: _error_event(exc, retry_after_s), DONE)
