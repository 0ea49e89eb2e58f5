"""Start the engine replicas on Ray Serve, with the gateway as the application's ingress.

`jumpgate serve --replicas N` deploys one Serve application: the Litestar gateway as the ingress
deployment (`ingress.GatewayIngress`, served by Serve's HTTP proxy on --host/--port), bound to the
engine deployment, whose handle (and so the prefix-aware router) lives in each gateway replica. This
driver process only deploys, waits for a signal and tears down. `start_replicas` is what tests and
the bench use to get the engines alone, without HTTP, routed from their own process.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from gateway.cluster import proxy_errors
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
    # replicas import this project: put it on their path whether it is installed or a checkout;
    # Serve's HTTP proxy (started by the controller, which inherits this job's environment) wraps
    # its app in proxy_errors' middleware: a gateway replica lost mid-request answers a clear 503
    path = os.pathsep.join(p for p in (PROJECT_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, proxy_errors.ENV_VAR: proxy_errors.IMPORT_PATH}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        ray.init(runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=False)


def engine_deployment(
    engine: EngineConfig, grammar: GrammarSettings, cluster: ClusterSettings, max_ongoing_requests: int | None = None
) -> Any:
    """The bound engine deployment (`cluster.replicas` engines behind the router), not yet run."""
    engine, grammar = with_shared_folders(engine, grammar)
    deployment = serve.deployment(EngineReplica, name="engine").options(
        num_replicas=cluster.replicas or 1,
        ray_actor_options={"num_cpus": cluster.replica_cpus, "num_gpus": cluster.replica_gpus},
        max_ongoing_requests=max_ongoing_requests or engine.max_running_requests + engine.max_waiting_requests,
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs=cluster.router_kwargs(),
            request_routing_stats_period_s=cluster.routing_stats_period_s,
        ),
    )
    return deployment.bind(engine, grammar)


def start_replicas(
    engine: EngineConfig,
    grammar: GrammarSettings,
    cluster: ClusterSettings,
    max_ongoing_requests: int | None = None,
    app_name: str = APP_NAME,
) -> Any:
    """Deploy `cluster.replicas` engines alone; returns the deployment handle once all are running.

    A process keeps one router per deployment for its lifetime, so a redeployment with other
    router settings needs another `app_name` (the bench deploys each policy under its own)."""
    init_ray(cluster)
    serve.start(proxy_location="Disabled")
    return serve.run(
        engine_deployment(engine, grammar, cluster, max_ongoing_requests), name=app_name, route_prefix=None
    )


def stop_replicas(app_name: str = APP_NAME) -> None:
    serve.delete(app_name)


def gateway_application(config: Any, cluster: ClusterSettings) -> Any:
    """The Serve application of `jumpgate serve --replicas N`: the gateway ingress bound to the
    engine deployment (`config` is the CLI's ServeSettings)."""
    from gateway.cluster.ingress import GatewayIngress

    settings = config.gateway
    engine, grammar = with_shared_folders(config.engine, config.grammar)
    engines = engine_deployment(engine, grammar, cluster)
    ingress = serve.deployment(GatewayIngress, name="gateway").options(
        num_replicas=cluster.gateway_replicas,
        ray_actor_options={"num_cpus": cluster.gateway_cpus},
        # the gateway's own limiter answers 429 beyond max_concurrent_requests; Serve must not queue first
        max_ongoing_requests=2 * settings.max_concurrent_requests + 64,
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
    )
    return ingress.bind(engines, engine, grammar, settings, cluster.replicas or 1)


def serve_cluster(config: Any, cluster: ClusterSettings) -> int:
    """`jumpgate serve --replicas N`: deploy the application, serve until SIGINT/SIGTERM, tear down.

    A signal during start-up (replicas still loading) stops it too. Attached to a cluster
    (--ray-address) only this application is deleted; a local Ray instance is shut down whole."""
    import signal
    import time

    from gateway.startup import banner

    def on_signal(*_: Any) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # the tear-down below must not be interrupted
        raise KeyboardInterrupt

    settings = config.gateway
    try:
        init_ray(cluster)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, whose own SIGTERM handler aborts the process
            signal.signal(sig, on_signal)
        serve.start(proxy_location="HeadOnly", http_options={"host": settings.host, "port": settings.port})
        serve.run(gateway_application(config, cluster), name=APP_NAME, route_prefix="/")
        info = serve.get_deployment_handle("engine", app_name=APP_NAME).info.remote().result()
        print(banner(_Described(info), settings), flush=True)
        print(
            f"  replicas   {cluster.replicas} on Ray Serve, routing: {cluster.routing_policy}; "
            f"gateway: {cluster.gateway_replicas} ingress replica(s) behind Serve's HTTP proxy",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if ray.is_initialized():
            try:
                if cluster.ray_address:
                    serve.delete(APP_NAME)
            finally:
                ray.shutdown()
    return 0


class _Described:
    """What `banner` reads of an engine: its info."""

    def __init__(self, info: Any):
        self.info = info
