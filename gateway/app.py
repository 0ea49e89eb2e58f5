"""`create_app(engine, grammar_service, settings)`: the Litestar application.

Collaborators are built here once and injected (`services`, `tenant`, `request_log`); nothing is
global. /v1 routes sit behind the API-key guard; /health and /metrics do not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from gateway.auth import Authenticator, provide_tenant, require_api_key
from gateway.batches.api import BatchAPI, build_batch_api
from gateway.batches.batches_route import BatchesController
from gateway.batches.files_route import files_controller
from gateway.cache_explain.route import CacheController
from gateway.chat.chat_route import ChatController
from gateway.chat.completions_route import CompletionsController
from gateway.errors import exception_handlers
from gateway.http.access_log import access_log_middleware, request_log_of
from gateway.http.request_body import JumpgateRequest
from gateway.messages.errors import with_messages_errors
from gateway.messages.route import MessagesController
from gateway.metrics import GatewayMetrics
from gateway.pipeline.generation import ConcurrencyLimiter, RequestLog
from gateway.pipeline.model_formats import configure_formats
from gateway.pipeline.prompt import PromptRenderer, schema_budget_tokens
from gateway.pipeline.schema_registry import SchemaRegistry
from gateway.registry.pinning import restore_pins
from gateway.registry.route import SchemasController
from gateway.responses.route import ResponsesController
from gateway.responses.store import ResponseStore
from gateway.routes.health import health
from gateway.routes.metrics import metrics
from gateway.routes.models import ModelsController
from gateway.services import GatewayServices
from gateway.settings import Settings
from runtime.api import EngineClient

VERSION = "0.1.0"


def default_registry_dir() -> Path:
    root = Path(os.environ.get("JUMPGATE_CACHE_DIR", Path.home() / ".cache" / "jumpgate"))
    return root / "registry"


def build_response_store(settings: Settings) -> ResponseStore:
    """Stored responses live beside the schema registry: `<registry's parent>/responses`."""
    registry = Path(settings.registry_dir) if settings.registry_dir else default_registry_dir()
    return ResponseStore(registry.parent / "responses", settings.responses_max_stored, settings.responses_max_bytes)


def data_root(settings: Settings) -> Path:
    """The folder holding the gateway's per-tenant data beside the registry (responses, files, batches)."""
    registry = Path(settings.registry_dir) if settings.registry_dir else default_registry_dir()
    return registry.parent


def build_services(
    engine: EngineClient, grammar_service: Any, settings: Settings, tokenizer: Any = None
) -> GatewayServices:
    settings.validate()
    tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
    # before the renderer reads the template: --chat-template, and the model's tool-call format
    formats = configure_formats(
        tokenizer,
        settings.tool_call_format,
        settings.reasoning_format,
        settings.chat_template,
        stop_token_ids=engine.info.eos_token_ids,
    )
    return GatewayServices(
        engine=engine,
        grammar=grammar_service,
        renderer=PromptRenderer(
            tokenizer, schema_budget_tokens(settings.schema_prompt_budget, engine.info.max_context)
        ),
        registry=SchemaRegistry(settings.registry_dir or default_registry_dir()),
        settings=settings,
        metrics=GatewayMetrics(),
        limiter=ConcurrencyLimiter(settings.max_concurrent_requests, settings.retry_after_s),
        authenticator=Authenticator(settings.api_keys),
        started_at=int(time.time()),
        formats=formats,
    )


def provide_request_log(request: Request[Any, Any, Any]) -> RequestLog:
    return request_log_of(request.scope)


def create_app(
    engine: EngineClient,
    grammar_service: Any,
    settings: Settings | None = None,
    *,
    services: GatewayServices | None = None,
    tokenizer: Any = None,
) -> Litestar:
    """The app around a started engine; `grammar_service` may be None (free text only)."""
    settings = settings or Settings()
    services = services or build_services(engine, grammar_service, settings, tokenizer)
    response_store = build_response_store(services.settings)
    batch_api = build_batch_api(data_root(services.settings), services.settings, services.metrics.registry)

    def provide_services() -> GatewayServices:
        return services  # type: ignore[return-value]

    def provide_response_store() -> ResponseStore:
        return response_store

    def provide_batch_api() -> BatchAPI:
        return batch_api

    def start_batches(app: Litestar) -> None:
        """Batch lines are answered by in-process requests to this app, from a task on its loop."""
        batch_api.caller.app = app
        batch_api.runner.start()

    async def reapply_pins() -> None:
        """Pins recorded in the registry come back before the first request is served."""
        assert services is not None
        await restore_pins(services.engine, services.renderer, services.registry)

    v1 = Router(
        path="/v1",
        route_handlers=[
            ChatController,
            CompletionsController,
            ResponsesController,
            ModelsController,
            SchemasController,
            CacheController,
            MessagesController,
            files_controller(settings.batch_file_max_bytes),
            BatchesController,
        ],
        guards=[require_api_key],
    )
    return Litestar(
        route_handlers=[v1, health, metrics],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False, use_cache=True),
            "response_store": Provide(provide_response_store, sync_to_thread=False, use_cache=True),
            "batch_api": Provide(provide_batch_api, sync_to_thread=False, use_cache=True),
            "tenant": Provide(provide_tenant, sync_to_thread=False),
            "request_log": Provide(provide_request_log, sync_to_thread=False),
        },
        exception_handlers=with_messages_errors(exception_handlers(settings.retry_after_s)),
        middleware=[access_log_middleware],
        on_startup=[reapply_pins, start_batches],
        on_shutdown=[batch_api.runner.stop],  # before the engine stops: lines in flight run again next start
        request_max_body_size=settings.max_body_bytes,
        request_class=JumpgateRequest,
        openapi_config=OpenAPIConfig(
            title="Jumpgate",
            version=VERSION,
            path="/docs",
            description="OpenAI-compatible structured-output gateway",
        )
        if settings.openapi
        else None,
        state=State({"authenticator": services.authenticator, "services": services}),
        logging_config=None,
        debug=False,
    )
