"""GET /metrics: Prometheus text format (one engine and one grammar snapshot per scrape)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from litestar import Response, get
from litestar.di import NamedDependency

from gateway.metrics import CONTENT_TYPE, engine_snapshot
from gateway.services import GatewayServices

log = logging.getLogger("jumpgate.gateway")


def _snapshot(source: str, read: Any) -> Any:
    """`read()`, or None when it fails: a scrape must not fail because of one source."""
    try:
        return read()
    except Exception:
        log.exception("%s stats failed", source)
        return None


def scrape(services: GatewayServices) -> bytes:
    """Blocking: engine.stats() waits for the engine thread."""
    engine = _snapshot("engine", lambda: engine_snapshot(services.engine.stats()))
    grammar = services.grammar  # None: structured output unavailable, no grammar series
    grammar_stats = _snapshot("grammar", grammar.stats) if grammar is not None else None
    services.metrics.in_flight.set(services.limiter.in_flight)
    return services.metrics.render(engine, grammar_stats)


@get("/metrics", summary="Prometheus metrics", tags=["ops"])
async def metrics(services: NamedDependency[GatewayServices]) -> Response[bytes]:
    text = await anyio.to_thread.run_sync(scrape, services)
    return Response(text, media_type=CONTENT_TYPE)
