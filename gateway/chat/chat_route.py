"""POST /v1/chat/completions: whole responses and SSE streams, n choices, tool calls."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.chat.bodies import chat_completion
from gateway.chat.serving import serve_generation
from gateway.chat.streaming import chat_events
from gateway.pipeline.answer_tool import fold_format_into_tools
from gateway.pipeline.generation import RequestLog
from gateway.pipeline.preparation import Prepared, prepare_chat
from gateway.protocol import ChatCompletion, ChatCompletionRequest
from gateway.services import GatewayServices


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
