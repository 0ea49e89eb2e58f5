"""Running engine requests from the event loop: submit, stream, abort, account.

`EngineStream` wraps one engine request: it records TTFT / inter-token / end-to-end latency and
token counts once, and `close()` aborts the engine request if it has not finished (client gone,
error elsewhere, n>1 sibling failed). Every code path that opens a stream closes it in a `finally`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, fields
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from gateway.errors import SERVER_ERROR, APIError, ClientDisconnected, from_engine_error, overloaded
from gateway.metrics import GatewayMetrics
from gateway.pipeline.logprobs import TokenTexts, token_texts
from runtime.api import (
    ENGINE_STOPPED,
    VALUE_RETRIES_EXHAUSTED,
    EngineClient,
    EngineError,
    GenerateRequest,
    StreamEvent,
    TokenLogprob,
)

T = TypeVar("T")


class ConcurrencyLimiter:
    """Bounded number of in-flight generation requests; beyond it a request is refused at once
    (503 + Retry-After) instead of piling up in memory."""

    def __init__(self, limit: int, retry_after_s: int = 1):
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0

    def acquire(self) -> Permit:
        if self.in_flight >= self.limit:
            raise overloaded(
                f"The server is handling {self.in_flight} requests, its limit; retry shortly.", self.retry_after_s
            )
        self.in_flight += 1
        return Permit(self)


class Permit:
    def __init__(self, limiter: ConcurrencyLimiter):
        self._limiter: ConcurrencyLimiter | None = limiter

    def release(self) -> None:
        if self._limiter is not None:  # idempotent
            self._limiter.in_flight -= 1
            self._limiter = None


@dataclass
class Outcome:
    """What one engine request produced (the fields a response and the log line need)."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    closed_at_budget: bool = False  # strict closing completed the value (runtime.api.StreamEvent)
    decode_seconds: float = 0.0  # first output token to the last (runtime.api.StreamEvent)
    token_ids: list[int] = field(default_factory=list)  # generated ids (a stop token included)
    # requests that asked for logprobs: the records so far, and the tokenizer's texts to show them
    logprobs: list[TokenLogprob] | None = None
    token_texts: TokenTexts | None = None
    # a reasoning model's think block (`text` is then the answer after it); None: no block
    reasoning: str | None = None
    reasoning_tokens: int = 0


@dataclass
class SplitEvent(StreamEvent):
    """An event of a request with a think block: `text` is the answer's piece, `reasoning` the block's."""

    reasoning: str = ""


_EVENT_FIELDS = tuple(f.name for f in fields(StreamEvent) if f.name != "text")


def reasoning_of(event: StreamEvent) -> str:
    return event.reasoning if isinstance(event, SplitEvent) else ""


class EngineStream:
    def __init__(
        self,
        engine: EngineClient,
        request: GenerateRequest,
        metrics: GatewayMetrics | None,
        splitter: Any = None,
    ):
        """`splitter`: a grammar.reasoning ReasoningSplitter, for a request whose output opens with
        a think block (its events become `SplitEvent`s)."""
        self.engine = engine
        self.request = request
        self.rid = request.rid
        self.metrics = metrics
        self.outcome = Outcome(prompt_tokens=len(request.prompt_ids))
        self.splitter = splitter
        if splitter is not None:
            self.outcome.reasoning = ""
        if request.sampling.logprobs is not None:
            self.outcome.logprobs, self.outcome.token_texts = [], token_texts(engine.tokenizer)
        self.finished = False
        self._closed = False
        self._started = time.perf_counter()
        self._last: float | None = None
        # submit raises EngineError at once for a refusal (too long, queue full, stopped)
        self._events: AsyncIterator[StreamEvent] = engine.submit(request).__aiter__()
        self._peeked: StreamEvent | None = None

    async def prime(self) -> None:
        """Wait for the first event so that refusals an engine reports lazily still become an HTTP
        status before a streaming response has started."""
        if self._peeked is None and not self.finished:
            self._peeked = await self._next_event()

    async def _next_event(self) -> StreamEvent:
        event = await self._events.__anext__()
        if self.splitter is not None:
            event = self._split(event)
        self._account(event)
        return event

    def _split(self, event: StreamEvent) -> SplitEvent:
        """The event's text as (block, answer) pieces; its tokens count as reasoning while the
        output is in the block (or may still open it) and the block goes on after them."""
        before = self.splitter.thinking
        reasoning, content = self.splitter.feed(event.text)
        if event.finished:
            more_reasoning, more_content = self.splitter.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        if before and (self.splitter.thinking or reasoning or not content):
            self.outcome.reasoning_tokens += len(event.token_ids)
        self.outcome.reasoning = (self.outcome.reasoning or "") + reasoning
        return SplitEvent(**{name: getattr(event, name) for name in _EVENT_FIELDS}, text=content, reasoning=reasoning)

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._peeked is not None:
            event, self._peeked = self._peeked, None
            return event
        if self.finished:
            raise StopAsyncIteration
        try:
            return await self._next_event()
        except StopAsyncIteration:
            self.finished = True  # an engine that ends without a finished event
            raise

    def _account(self, event: StreamEvent) -> None:
        now = time.perf_counter()
        o = self.outcome
        if event.text or event.token_ids:
            if self._last is None:
                if self.metrics:
                    self.metrics.ttft.observe(now - self._started)
            elif self.metrics:
                self.metrics.itl.observe(now - self._last)
            self._last = now
        o.text += event.text
        o.token_ids += event.token_ids
        if o.logprobs is not None and event.logprobs:
            o.logprobs.extend(event.logprobs)
        if event.prompt_tokens:
            o.prompt_tokens = event.prompt_tokens
        if event.cached_tokens:
            o.cached_tokens = event.cached_tokens
        if event.completion_tokens:
            o.completion_tokens = event.completion_tokens
        elif event.token_ids:
            o.completion_tokens += len(event.token_ids)
        if event.finished:
            self.finished = True
            o.finish_reason = event.finish_reason
            o.error = event.error
            o.closed_at_budget = event.closed_at_budget
            o.decode_seconds = event.decode_seconds
            self._record_final()

    def _record_final(self) -> None:
        if self.metrics:
            o = self.outcome
            self.metrics.prompt_tokens.inc(o.prompt_tokens)
            self.metrics.cached_prompt_tokens.inc(o.cached_tokens)
            self.metrics.generated_tokens.inc(o.completion_tokens)
            self.metrics.e2e.observe(time.perf_counter() - self._started)

    async def collect(self) -> Outcome:
        async for _ in self:
            pass
        self.check_error()
        return self.outcome

    def check_error(self) -> None:
        o = self.outcome
        if o.error and o.error.startswith(VALUE_RETRIES_EXHAUSTED):
            raise APIError(
                422,
                o.error.partition(": ")[2] + ". Raise max_tokens, send a temperature above 0, or send "
                '"schema_mode": "best_effort" to receive the last value with its schema errors.',
                code=VALUE_RETRIES_EXHAUSTED,
            )
        if o.error and o.error.startswith(ENGINE_STOPPED):  # stopped under it (shutdown, a lost tensor-parallel rank)
            raise APIError(
                503, f"The engine stopped: {o.error}. Retry the request.", type=SERVER_ERROR, code="engine_stopped"
            )
        if o.finish_reason == "error" or o.error:
            raise APIError(
                500,
                f"The engine failed on this request: {o.error or 'unknown error'}",
                type=SERVER_ERROR,
                code="engine_error",
            )
        if o.finish_reason == "abort":
            raise APIError(
                503, "The request was aborted by the engine (shutting down?).", type=SERVER_ERROR, code="engine_stopped"
            )

    def close(self) -> None:
        """Abort the engine request unless it finished; safe to call any number of times."""
        if self._closed:
            return
        self._closed = True
        if not self.finished:
            self.finished = True
            try:
                self.engine.abort(self.rid)
            finally:
                self._record_final()  # count what the aborted request used


def open_streams(
    engine: EngineClient,
    requests: list[GenerateRequest],
    metrics: GatewayMetrics | None,
    retry_after_s: int = 1,
    splitter: Callable[[], Any] | None = None,
) -> list[EngineStream]:
    """Submit all n requests; if one is refused, abort the ones already queued and raise.
    `splitter()`: a fresh think-block splitter per stream (None: no block)."""
    streams: list[EngineStream] = []
    try:
        for req in requests:
            streams.append(EngineStream(engine, req, metrics, splitter() if splitter is not None else None))
    except EngineError as exc:
        close_all(streams)
        raise from_engine_error(exc, retry_after_s) from exc
    except BaseException:
        close_all(streams)
        raise
    return streams


def close_all(streams: list[EngineStream]) -> None:
    for s in streams:
        s.close()


async def merge(streams: list[EngineStream]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Interleave the events of n streams as (choice index, event), in arrival order."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, StreamEvent | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: EngineStream) -> None:
        try:
            async for event in stream:
                await queue.put((index, event, None))
            await queue.put((index, None, None))
        except Exception as exc:  # handed to the consumer
            await queue.put((index, None, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, event, exc = await queue.get()
            if exc is not None:
                raise exc
            if event is None:
                remaining -= 1
                continue
            yield index, event
    finally:
        for t in tasks:
            t.cancel()


async def until_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]) -> T:
    """Run `work`; if the client disconnects first, cancel it (its finally blocks abort the engine
    requests) and raise `ClientDisconnected`. Call only after the request body was read."""
    work_task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                return

    watch_task = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return work_task.result()
        work_task.cancel()
        try:
            await work_task
        except BaseException:
            pass
        raise ClientDisconnected()
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()


@dataclass
class RequestLog:
    """The per-request log record, filled by the route and written by the logging middleware."""

    request_id: str = "-"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    outcome: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # the slowest choice's mean decode step (ms per output token after the first; None: no choice
    # had two tokens), sent as x-jumpgate-decode-ms-per-token where headers follow the answer
    decode_ms_per_token: float | None = None

    def add(self, o: Outcome) -> None:
        self.prompt_tokens += o.prompt_tokens
        self.cached_tokens += o.cached_tokens
        self.completion_tokens += o.completion_tokens
        if o.completion_tokens > 1 and o.decode_seconds > 0:
            step = o.decode_seconds * 1e3 / (o.completion_tokens - 1)
            self.decode_ms_per_token = max(step, self.decode_ms_per_token or 0.0)
