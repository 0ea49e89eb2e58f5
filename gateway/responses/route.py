"""/v1/responses: the OpenAI Responses API (create, whole or streamed; retrieve; delete).

A request is translated to the chat path (`gateway.responses.items`) and served by the same
preparation, engine lifecycle and grammar; `previous_response_id` continues a stored turn from its
exact token ids, so a chained agent turn is a radix-cache hit for everything said before.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from gateway.chat.chat_route import serve_generation
from gateway.errors import APIError, not_found
from gateway.pipeline.generation import Outcome, RequestLog
from gateway.pipeline.logprobs import chat_token_logprobs
from gateway.pipeline.preparation import Prepared, prepare_chat
from gateway.protocol import AssistantMessage, Message
from gateway.responses.events import response_events
from gateway.responses.items import (
    ChatPlan,
    check_unsupported,
    finished_response,
    output_items,
    renamed,
    response_shell,
    status_of,
    to_chat_request,
)
from gateway.responses.protocol import ResponseDeleted, ResponseObject, ResponseRequest
from gateway.responses.store import ResponseStore, StoredResponse, StoredTurn, new_response_id
from gateway.services import GatewayServices


def response_not_found(response_id: str, param: str | None = None) -> APIError:
    return not_found(f"No response with id '{response_id}' was found.", param, code="response_not_found")


def continue_turn(renderer, turn: StoredTurn, messages, tools, instructions, schema=None):
    """`prepare_chat`'s render for a chained turn: the previous prompt + output ids, then the new text."""
    return renderer.render_continuation(messages, tools, instructions, turn, schema)


class ResponsesController(Controller):
    path = "/responses"
    tags = ["responses"]

    @post("", status_code=200, summary="Create a model response (OpenAI Responses API)")
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[ResponseRequest],
        services: NamedDependency[GatewayServices],
        response_store: NamedDependency[ResponseStore],
        tenant: NamedDependency[str],
        request_log: NamedDependency[RequestLog],
    ) -> Response[ResponseObject]:
        s, store = services, response_store
        response_id = new_response_id()
        shell = response_shell(data, response_id)
        prepared: Prepared | None = None
        plan: ChatPlan | None = None

        async def prepare():
            nonlocal prepared, plan
            check_unsupported(data)
            previous: StoredTurn | None = None
            if data.previous_response_id is not None:
                record = store.get(tenant, data.previous_response_id)
                if record is None:
                    raise response_not_found(data.previous_response_id, "previous_response_id")
                previous = record.turn
            plan = to_chat_request(data, list(previous.messages) if previous else [])
            render = None
            if previous is not None:  # extend the previous turn's exact ids, which the radix cache holds
                render = partial(continue_turn, s.renderer, previous)
            try:
                prepared = await prepare_chat(plan.chat, s, tenant, render=render)
            except APIError as exc:
                raise renamed(exc) from exc
            prepared.request_id = response_id
            request_log.request_id = response_id
            return prepared.engine_requests(1, data.jump_forward)

        def save(response: ResponseObject, outcome: Outcome) -> None:
            if not data.store:
                return
            assert prepared is not None and plan is not None
            history: list[Message] = plan.history + [AssistantMessage(content=outcome.text)]
            turn = StoredTurn(
                messages=history,
                prompt_text=prepared.prompt_text or "",
                prompt_ids=prepared.prompt_ids,
                output_text=outcome.text,
                output_ids=outcome.token_ids,
                tokenizer=s.renderer.tokenizer_fingerprint,
            )
            store.put(tenant, StoredResponse(response=response, turn=turn))

        def respond(outcomes: list[Outcome]) -> ResponseObject:
            assert prepared is not None and plan is not None
            outcome = outcomes[0]
            status, _ = status_of(outcome)
            logprobs = None
            if outcome.logprobs is not None and outcome.token_texts is not None:
                logprobs = chat_token_logprobs(outcome.logprobs, outcome.token_texts)
            items = output_items(
                outcome.text, prepared.plan.parse_tool_calls, plan.answer_tool, status, logprobs, outcome.reasoning
            )
            response = finished_response(shell, outcome, items)
            save(response, outcome)
            return response

        return await serve_generation(
            "responses",
            request,
            s,
            request_log,
            prepare=prepare,
            stream=data.stream,
            events=lambda streams, on_close: response_events(
                shell,
                streams,
                prepared.plan.parse_tool_calls,
                plan.answer_tool,  # type: ignore[union-attr]
                on_close,
                save,
                s.settings.retry_after_s,
            ),
            respond=respond,
            reasoning=lambda: prepared.reasoning,
        )

    @get("/{response_id:str}", summary="Retrieve a stored response")
    async def retrieve(
        self, response_id: FromPath[str], response_store: NamedDependency[ResponseStore], tenant: NamedDependency[str]
    ) -> ResponseObject:
        record = response_store.get(tenant, response_id)
        if record is None:
            raise response_not_found(response_id)
        return record.response

    @delete("/{response_id:str}", status_code=200, summary="Delete a stored response")
    async def remove(
        self, response_id: FromPath[str], response_store: NamedDependency[ResponseStore], tenant: NamedDependency[str]
    ) -> ResponseDeleted:
        if not response_store.delete(tenant, response_id):
            raise response_not_found(response_id)
        return ResponseDeleted(id=response_id)
