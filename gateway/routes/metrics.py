"""GET /metrics: Prometheus text format."""

from __future__ import annotations

import logging

from litestar import Response, get
from litestar.di import NamedDependency

from gateway import grammar_adapter
from gateway.services import GatewayServices

log = logging.getLogger("jumpgate.gateway")

CONTENT_TYPE = "text/plain; version=0.0.4"  # Litestar appends the charset


@get("/metrics", summary="Prometheus metrics", tags=["ops"], sync_to_thread=False)
def metrics(services: NamedDependency[GatewayServices]) -> Response[str]:
    try:
        engine_stats = services.engine.stats().as_dict()
    except Exception:  # a scrape must not fail because of one source
        log.exception("engine.stats() failed")
        engine_stats = {}
    services.metrics.in_flight.set(services.limiter.in_flight)
    text = services.metrics.render(engine_stats, grammar_adapter.grammar_stats(services.grammar))
    return Response(text, media_type=CONTENT_TYPE)
