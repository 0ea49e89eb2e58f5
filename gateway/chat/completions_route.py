"""POST /v1/completions: text completions (string, strings, token ids), optionally constrained."""

from __future__ import annotations

import time
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.chat.bodies import completion, completion_events
from gateway.chat.chat_route import serve_generation
from gateway.errors import bad_request
from gateway.pipeline.constraints import compile_plan, plan_completion
from gateway.pipeline.generation import RequestLog
from gateway.pipeline.output_validation import build_output_check
from gateway.pipeline.preparation import (
    check_model,
    check_n,
    check_sampling_fields,
    completion_prompts,
    new_id,
    prepare_completion,
    schema_mode_of,
    vocab_size,
)
from gateway.protocol import Completion, CompletionRequest
from gateway.services import GatewayServices


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
        request_id, created = new_id("cmpl"), int(time.time())
        echo_texts: list[str | None] = []
        check = None  # validates each structured choice (and refuses what strict mode cannot guarantee)

        async def prepare():
            nonlocal check
            check_model(data.model, s.engine, s.settings)
            check_sampling_fields(data)
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
            check = build_output_check(plan, constraint, schema_mode_of(data, s.registry, tenant), metrics=s.metrics)
            request_log.request_id = request_id
            requests = []
            for p, prompt in enumerate(prompts):
                prepared = await prepare_completion(data, prompt, s, tenant, plan=plan, constraint=constraint)
                requests += prepared.engine_requests(data.n, data.jump_forward, rid_prefix=f"{request_id}-{p}")
                echo = None
                if data.echo:
                    echo = (
                        prepared.prompt_text
                        if prepared.prompt_text is not None
                        else s.renderer.decode(prepared.prompt_ids)
                    )
                echo_texts.append(echo)
            return requests

        include_usage = bool(data.stream_options and data.stream_options.include_usage)
        return await serve_generation(
            "completions",
            request,
            s,
            request_log,
            prepare=prepare,
            stream=bool(data.stream),
            events=lambda streams, on_close: completion_events(
                request_id,
                created,
                data.model,
                streams,
                data.n,
                echo_texts,
                include_usage,
                on_close,
                s.settings.retry_after_s,
                check,
            ),
            respond=lambda outcomes: completion(request_id, created, data.model, outcomes, data.n, echo_texts, check),
        )
