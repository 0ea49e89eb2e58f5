"""Start the engine replicas on Ray Serve and serve the gateway in front of them.

The Litestar gateway runs in this (the driver) process and reaches the replicas through a
deployment handle; Ray Serve's own HTTP proxy stays off. `start_replicas` is what tests and the
bench use to get a cluster without HTTP.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from gateway.cluster.client import ClusterEngineClient
from gateway.cluster.grammar_bridge import ClusterGrammarService
from gateway.cluster.metrics import register_cluster_metrics
from gateway.cluster.replica import EngineReplica
ROUTER_CLASS = "gateway.cluster.router:PrefixAwareRouter"  # by name: Ray imports it where the handle routes
from gateway.cluster.settings import ClusterSettings, with_shared_folders
from grammar.settings import GrammarSettings
from runtime.engine_config import EngineConfig

log = logging.getLogger("jumpgate.cluster")

APP_NAME = "jumpgate"
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


def init_ray(cluster: ClusterSettings) -> None:
    if ray.is_initialized():
        return
    # replicas import this project: put it on their path whether it is installed or a checkout
    path = os.pathsep.join(p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        ray.init(runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=False)


def start_replicas(engine: EngineConfig, grammar: GrammarSettings, cluster: ClusterSettings,
                   max_ongoing_requests: int | None = None, app_name: str = APP_NAME) -> Any:
    """Deploy `cluster.replicas` engines; returns the deployment handle once all are running.

    A process keeps one router per deployment for its lifetime, so a redeployment with other
    router settings needs another `app_name` (the bench deploys each policy under its own)."""
    init_ray(cluster)
    engine, grammar = with_shared_folders(engine, grammar)
    serve.start(proxy_location="Disabled")
    deployment = serve.deployment(EngineReplica, name="engine").options(
        num_replicas=cluster.replicas or 1,
        ray_actor_options={"num_cpus": cluster.replica_cpus, "num_gpus": cluster.replica_gpus},
        max_ongoing_requests=max_ongoing_requests or engine.max_running_requests + engine.max_waiting_requests,
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs=cluster.router_kwargs(),
            request_routing_stats_period_s=cluster.routing_stats_period_s,
        ),
    )
    return serve.run(deployment.bind(engine, grammar), name=app_name, route_prefix=None)


def stop_replicas(app_name: str = APP_NAME) -> None:
    serve.delete(app_name)


def create_cluster_app(client: ClusterEngineClient, grammar_service: Any, settings: Any) -> Any:
    """The gateway's app over the replicas, with the per-replica and router series in /metrics."""
    from gateway.app import build_services, create_app

    services = build_services(client, grammar_service, settings)
    register_cluster_metrics(services.metrics.registry)
    return create_app(client, grammar_service, settings, services=services)


def serve_cluster(config: Any, cluster: ClusterSettings) -> int:
    """`jumpgate serve --replicas N`: `config` is the CLI's ServeSettings."""
    import uvicorn

    from gateway.startup import banner, build_grammar_service

    settings = config.gateway
    handle = start_replicas(config.engine, config.grammar, cluster)
    grammar_service = None
    try:
        engine = ClusterEngineClient(handle, config.engine, cluster.replicas or 1)
        grammar_service = ClusterGrammarService(build_grammar_service(engine, config.grammar))
        app = create_cluster_app(engine, grammar_service, settings)
        print(banner(engine, settings), flush=True)
        print(f"  replicas   {cluster.replicas} on Ray Serve, routing: {cluster.routing_policy}", flush=True)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
                    timeout_graceful_shutdown=5)
    finally:
        if grammar_service is not None:
            grammar_service.close()
        serve.shutdown()
        ray.shutdown()
    return 0
