"""POST /v1/messages (whole or streamed) and POST /v1/messages/count_tokens.

A request is translated to the chat path (`gateway.messages.translate`) and served by the same
preparation, engine lifecycle (`serve_generation`) and grammar; outcomes become content blocks
(`results`, `events`). Errors on these paths, the API-key guard's and a wrong method's included,
answer in Anthropic's shape (`gateway.messages.errors`, wrapped around the app's handlers). `x-api-key` and `Authorization: Bearer` both carry
the key (`gateway.auth`); `anthropic-version` is accepted with any value.
"""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.chat.chat_route import serve_generation
from gateway.errors import APIError
from gateway.messages.cache_pins import pin_breakpoints, pins_of
from gateway.messages.events import message_events
from gateway.messages.protocol import CountTokensRequest, Message, MessagesRequest, TokenCount
from gateway.messages.results import matched_stop, message, message_id
from gateway.messages.translate import MessagesPlan, renamed, to_chat_request
from gateway.pipeline.constraints import plan_chat
from gateway.pipeline.generation import Outcome, RequestLog
from gateway.pipeline.preparation import Prepared, check_model, prepare_chat
from gateway.pipeline.reasoning import effort_kwargs
from gateway.services import GatewayServices


class MessagesController(Controller):
    path = "/messages"
    tags = ["messages"]

    @post("", status_code=200, summary="Create a message (Anthropic Messages API)")
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[MessagesRequest],
        services: NamedDependency[GatewayServices],
        tenant: NamedDependency[str],
        request_log: NamedDependency[RequestLog],
    ) -> Response[Message]:
        s = services
        msg_id = message_id()
        prepared: Prepared | None = None
        plan: MessagesPlan | None = None

        async def prepare():
            nonlocal prepared, plan
            plan = to_chat_request(data)
            try:
                prepared = await prepare_chat(plan.chat, s, tenant)
            except APIError as exc:
                raise renamed(exc) from exc
            prepared.request_id = msg_id
            request_log.request_id = msg_id
            return prepared.engine_requests(1, data.jump_forward)

        def stop_of(outcome: Outcome) -> str | None:
            assert prepared is not None and plan is not None
            # after the turn: its prefix is in the radix cache now, so pinning prefills nothing
            pin_breakpoints(pins_of(request.app.state, s.engine), s.renderer, prepared, plan)
            return matched_stop(s.renderer.tokenizer, outcome, data.stop_sequences)

        def respond(outcomes: list[Outcome]) -> Message:
            assert prepared is not None and plan is not None
            outcome = outcomes[0]
            return message(
                msg_id, data.model, outcome, prepared.plan.parse_tool_calls, plan.answer_tool, stop_of(outcome)
            )

        return await serve_generation(
            "messages",
            request,
            s,
            request_log,
            prepare=prepare,
            stream=data.stream,
            events=lambda streams, on_close: message_events(
                msg_id,
                data.model,
                streams,
                prepared.plan.parse_tool_calls,
                plan.answer_tool,  # type: ignore[union-attr]
                stop_of,
                on_close,
                s.settings.retry_after_s,
            ),
            respond=respond,
            reasoning=lambda: prepared.reasoning,
        )

    @post("/count_tokens", status_code=200, summary="Count a message request's input tokens")
    async def count_tokens(
        self,
        data: JSONBody[CountTokensRequest],
        services: NamedDependency[GatewayServices],
        tenant: NamedDependency[str],
    ) -> TokenCount:
        """The prompt exactly as /v1/messages renders it (system, tools text, turns), counted."""
        s = services
        check_model(data.model, s.engine, s.settings)
        chat = to_chat_request(data).chat
        try:
            cplan = plan_chat(chat, s.registry, tenant)
            kwargs = effort_kwargs(chat.reasoning_effort, None)  # thinking off: the template's closed block
            schema = (cplan.kind, cplan.payload) if cplan.kind else None
            rendered = await anyio.to_thread.run_sync(
                lambda: s.renderer.render_chat(
                    chat.messages, cplan.tools, cplan.instructions, schema, template_kwargs=kwargs
                )
            )
        except APIError as exc:
            raise renamed(exc) from exc
        return TokenCount(input_tokens=len(rendered.token_ids))
