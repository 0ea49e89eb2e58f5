"""The Litestar gateway as Ray Serve's ingress deployment: Serve's HTTP proxy hands each request to a
gateway replica, which serves it with the gateway's own app and reaches the engines through the
deployment handle it was bound to.

`serve.ingress()` without an app (Ray's late-bound form) calls `__serve_build_asgi_app__` after the
constructor, so the app is built inside the replica around objects that only exist there: the
handle (whose prefix-aware router therefore runs in this process, next to the /metrics that report
its decisions), the tokenizer and the grammar service (which compiles, validates and caches the
grammars it then sends to the engines as specs, `grammar_bridge`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from gateway.cluster.client import ClusterEngineClient
from gateway.cluster.grammar_bridge import ClusterGrammarService
from gateway.cluster.metrics import register_cluster_metrics
from grammar.settings import GrammarSettings
from runtime.engine_config import EngineConfig


def create_cluster_app(client: ClusterEngineClient, grammar_service: Any, settings: Any) -> Any:
    """The gateway's app over the replicas, with the per-replica and router series in /metrics."""
    from gateway.app import build_services, create_app

    services = build_services(client, grammar_service, settings)
    register_cluster_metrics(services.metrics.registry)
    return create_app(client, grammar_service, settings, services=services)


@serve.ingress()
class GatewayIngress:
    async def __init__(
        self,
        engine_handle: Any,
        engine_config: EngineConfig,
        grammar_settings: GrammarSettings,
        settings: Any,
        replicas: int,
    ):
        from gateway.startup import build_grammar_service

        logging.getLogger("jumpgate").setLevel(settings.log_level.upper())
        info = await engine_handle.info.remote()  # a sync .result() may not run on the replica's loop
        self.engine = ClusterEngineClient(engine_handle, engine_config, replicas, info=info)
        self.grammar = ClusterGrammarService(build_grammar_service(self.engine, grammar_settings))
        self.gateway_app = create_cluster_app(self.engine, self.grammar, settings)  # `app` is Serve's

    def __serve_build_asgi_app__(self) -> Any:
        return self.gateway_app

    def __del__(self) -> None:
        grammar = getattr(self, "grammar", None)
        if grammar is not None:
            grammar.close()
