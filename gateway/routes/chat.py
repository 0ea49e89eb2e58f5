"""POST /v1/chat/completions: whole responses and SSE streams, n choices, tool calls."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.generation import RequestLog, close_all, open_streams, prime_all, until_disconnect
from gateway.preparation import prepare_chat
from gateway.protocol import ChatCompletion, ChatCompletionRequest
from gateway.responses import chat_completion
from gateway.services import GatewayServices, outcome_of
from gateway.streaming import SSEResponse, chat_events, once


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
        permit = s.limiter.acquire()
        streams: list = []
        handed_over = False
        error: BaseException | None = None
        try:
            prepared = await prepare_chat(
                data, engine=s.engine, grammar_service=s.grammar, renderer=s.renderer,
                registry=s.registry, settings=s.settings, tenant=tenant,
            )
            request_log.request_id = prepared.request_id
            streams = open_streams(s.engine, prepared.engine_requests(data.n, data.jump_forward), s.metrics,
                                   s.settings.retry_after_s)
            if data.stream:
                await until_disconnect(request.receive, prime_all(streams, s.settings.retry_after_s))

                @once
                def on_close(outcome: str) -> None:
                    close_all(streams)
                    permit.release()
                    s.finish("chat", outcome, request_log, streams)

                include_usage = bool(data.stream_options and data.stream_options.include_usage)
                events = chat_events(prepared, streams, include_usage, on_close, s.settings.retry_after_s)
                handed_over = True
                return SSEResponse(events, on_close)
            outcomes = await until_disconnect(request.receive, asyncio.gather(*(st.collect() for st in streams)))
            return Response(chat_completion(prepared, list(outcomes)))
        except BaseException as exc:
            error = exc
            raise
        finally:
            if not handed_over:
                close_all(streams)
                permit.release()
                s.finish("chat", outcome_of(error), request_log, streams)
