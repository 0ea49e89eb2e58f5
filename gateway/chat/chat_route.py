"""POST /v1/chat/completions: whole responses and SSE streams, n choices, tool calls; and
`serve_generation`, the lifecycle every generating route shares (chat, text completions,
responses, messages).

That lifecycle: take a concurrency permit, prepare the engine requests, open their streams, then
either hand the streams at once (before the first token: a queued stream still starts) to an SSE
response, which releases everything when the stream ends or the client leaves, or wait for every
choice and build one response. Whatever happens before the hand-over (a bad request, an engine
refusal, a disconnect), the streams are closed, the permit released and the request accounted
exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.chat.bodies import SSEResponse, chat_completion, chat_events, once
from gateway.pipeline.constraints import fold_format_into_tools
from gateway.pipeline.generation import EngineStream, Outcome, RequestLog, close_all, open_streams, until_disconnect
from gateway.pipeline.output_validation import validity_headers
from gateway.pipeline.preparation import Prepared, prepare_chat
from gateway.protocol import ChatCompletion, ChatCompletionRequest
from gateway.services import GatewayServices, outcome_of
from runtime.api import GenerateRequest

# the engine admission class (runtime.api.GenerateRequest.priority) of an in-process request; HTTP
# clients cannot set scope keys, so online traffic is always priority 0
PRIORITY_SCOPE_KEY = "jumpgate.priority"

Events = Callable[[list[EngineStream], Callable[[str], None]], AsyncIterator[bytes]]


async def serve_generation(
    route: str,
    request: Request[Any, Any, Any],
    services: GatewayServices,
    request_log: RequestLog,
    *,
    prepare: Callable[[], Awaitable[list[GenerateRequest]]],
    stream: bool,
    events: Events,
    respond: Callable[[list[Outcome]], Any],
    reasoning: Callable[[], Any] | None = None,
) -> Response[Any]:
    """`prepare()` validates and returns the engine requests (raising an APIError for a bad
    request); `events(streams, on_close)` makes the SSE body; `respond(outcomes)` the whole one;
    `reasoning()`, once prepared: the request's think block (gateway.pipeline.reasoning's
    ReasoningPlan, or None), whose text the streams split from the answer."""
    s = services
    permit = s.limiter.acquire()
    streams: list[EngineStream] = []
    handed_over = False
    error: BaseException | None = None
    try:
        engine_requests = await prepare()
        priority = request.scope.get(PRIORITY_SCOPE_KEY)  # type: ignore[call-overload]
        if isinstance(priority, int):  # an in-process request of the server's own (a Batch API line)
            for r in engine_requests:
                r.priority = priority
        block = reasoning() if reasoning is not None else None
        splitter = block.splitter if block is not None else None
        streams = open_streams(s.engine, engine_requests, s.metrics, s.settings.retry_after_s, splitter)
        if stream:
            # Headers and the first event go out now, while the request waits in the engine's queue:
            # a queued client sees its stream start instead of a silent connection it may time out.
            # The engine refuses synchronously in submit (a status above); later failures are events.
            @once
            def on_close(outcome: str) -> None:
                close_all(streams)
                permit.release()
                s.finish(route, outcome, request_log, streams)

            body = events(streams, on_close)
            handed_over = True
            return SSEResponse(body, on_close)
        outcomes = await until_disconnect(request.receive, asyncio.gather(*(st.collect() for st in streams)))
        body = respond(list(outcomes))
        return Response(body, headers=validity_headers(body))  # x-jumpgate-schema-valid
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not handed_over:
            close_all(streams)
            permit.release()
            s.finish(route, outcome_of(error), request_log, streams)


class ChatController(Controller):
    path = "/chat/completions"
    tags = ["chat"]

    @post("", status_code=200, summary="Create a chat completion (OpenAI-compatible, with structured output)")
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[ChatCompletionRequest],
        services: NamedDependency[GatewayServices],
        tenant: NamedDependency[str],
        request_log: NamedDependency[RequestLog],
    ) -> Response[ChatCompletion]:
        s = services
        prepared: Prepared | None = None
        answer_tool: str | None = None

        async def prepare():
            nonlocal prepared, answer_tool
            answer_tool = fold_format_into_tools(data)  # tools + a JSON format: answering is a tool too
            prepared = await prepare_chat(data, s, tenant)
            request_log.request_id = prepared.request_id
            return prepared.engine_requests(data.n, data.jump_forward)

        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return await serve_generation(
            "chat",
            request,
            s,
            request_log,
            prepare=prepare,
            stream=bool(data.stream),
            events=lambda streams, on_close: chat_events(
                prepared, streams, include_usage, on_close, s.settings.retry_after_s, answer_tool
            ),
            respond=lambda outcomes: chat_completion(prepared, outcomes, answer_tool),
            reasoning=lambda: prepared.reasoning,
        )
