"""POST /v1/completions: text completions (string, strings, token ids), optionally constrained."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.constraints import compile_plan, plan_completion
from gateway.errors import bad_request
from gateway.generation import RequestLog, close_all, open_streams, prime_all, until_disconnect
from gateway.preparation import (
    check_model, check_n, check_unsupported, completion_prompts, new_id, prepare_completion, vocab_size,
)
from gateway.protocol import Completion, CompletionRequest
from gateway.responses import completion
from gateway.services import GatewayServices, outcome_of
from gateway.streaming import SSEResponse, completion_events, once


class CompletionsController(Controller):
    path = "/completions"
    tags = ["completions"]

    @post("", status_code=200, summary="Create a text completion (OpenAI-compatible)")
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[CompletionRequest],
        services: NamedDependency[GatewayServices],
        tenant: NamedDependency[str],
        request_log: NamedDependency[RequestLog],
    ) -> Response[Completion]:
        s = services
        permit = s.limiter.acquire()
        streams: list = []
        handed_over = False
        error: BaseException | None = None
        try:
            check_model(data.model, s.engine, s.settings)
            check_unsupported(data)
            check_n(data.n, s.settings)
            if data.suffix:
                raise bad_request("'suffix' is not supported by this server.", "suffix")
            if data.best_of is not None and data.best_of != data.n:
                raise bad_request("'best_of' is not supported by this server (leave it out or equal to n).", "best_of")
            prompts = completion_prompts(data.prompt, vocab_size(s.renderer.tokenizer))
            if len(prompts) * data.n > s.settings.max_n * 4:
                raise bad_request(f"At most {s.settings.max_n * 4} choices (prompts x n) per request.", "prompt")
            plan = plan_completion(data, s.registry, tenant)
            constraint = await compile_plan(plan, s.grammar, s.settings.grammar_compile_timeout_s)
            request_id, created = new_id("cmpl"), int(time.time())
            request_log.request_id = request_id
            requests, echo_texts = [], []
            for p, prompt in enumerate(prompts):
                prepared = await prepare_completion(
                    data, prompt, engine=s.engine, grammar_service=s.grammar, renderer=s.renderer,
                    registry=s.registry, settings=s.settings, tenant=tenant, plan=plan, constraint=constraint,
                )
                requests += prepared.engine_requests(data.n, data.jump_forward, rid_prefix=f"{request_id}-{p}")
                echo = None
                if data.echo:
                    echo = prepared.prompt_text if prepared.prompt_text is not None else s.renderer.decode(prepared.prompt_ids)
                echo_texts.append(echo)
            streams = open_streams(s.engine, requests, s.metrics, s.settings.retry_after_s)
            if data.stream:
                await until_disconnect(request.receive, prime_all(streams, s.settings.retry_after_s))

                @once
                def on_close(outcome: str) -> None:
                    close_all(streams)
                    permit.release()
                    s.finish("completions", outcome, request_log, streams)

                include_usage = bool(data.stream_options and data.stream_options.include_usage)
                events = completion_events(request_id, created, data.model, streams, data.n, echo_texts,
                                           include_usage, on_close, s.settings.retry_after_s)
                handed_over = True
                return SSEResponse(events, on_close)
            outcomes = await until_disconnect(request.receive, asyncio.gather(*(st.collect() for st in streams)))
            return Response(completion(request_id, created, data.model, list(outcomes), data.n, echo_texts))
        except BaseException as exc:
            error = exc
            raise
        finally:
            if not handed_over:
                close_all(streams)
                permit.release()
                s.finish("completions", outcome_of(error), request_log, streams)
