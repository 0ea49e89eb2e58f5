"""GET /health: answers from the event loop alone (never waits on the engine thread)."""

from __future__ import annotations

from litestar import Response, get
from litestar.di import NamedDependency

from gateway.errors import SERVER_ERROR, APIError, error_response
from gateway.protocol import Health
from gateway.services import GatewayServices
from runtime.api import EngineClient


def engine_stopped(engine: EngineClient) -> bool:
    """Read a flag only: no lock, no call into the engine thread."""
    return not engine.is_running


@get("/health", summary="Liveness", tags=["ops"], sync_to_thread=False)
def health(services: NamedDependency[GatewayServices]) -> Response[Health]:
    engine = services.engine
    if engine_stopped(engine):
        stopped = APIError(503, "The engine is stopped.", type=SERVER_ERROR, code="engine_stopped")
        return error_response(stopped)  # type: ignore[return-value]
    return Response(Health(status="ok", model=engine.info.model_name))
