"""The gateway's collaborators, built once by `create_app` and injected into the route handlers."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth import Authenticator
from gateway.metrics import GatewayMetrics
from gateway.pipeline.generation import ConcurrencyLimiter, EngineStream, RequestLog
from gateway.pipeline.model_formats import ModelFormats
from gateway.pipeline.preparation import PreparationServices
from gateway.pipeline.schema_registry import SchemaRegistry


@dataclass(kw_only=True)
class GatewayServices(PreparationServices):
    """What preparation reads, with the registry and metrics always there, plus the request
    limiter and the authenticator."""

    registry: SchemaRegistry
    metrics: GatewayMetrics
    limiter: ConcurrencyLimiter
    authenticator: Authenticator
    started_at: int = 0  # unix time the app was built (the models' `created`)
    formats: ModelFormats | None = (
        None  # the model's tool-call and reasoning formats (gateway/pipeline/model_formats.py)
    )

    def finish(self, route: str, outcome: str, record: RequestLog, streams: list[EngineStream]) -> None:
        """Account one finished request (once): log record, outcome counter."""
        for s in streams:
            record.add(s.outcome)
        record.outcome = outcome
        self.metrics.request_finished(route, outcome)


def outcome_of(exc: BaseException | None) -> str:
    from gateway.errors import APIError, ClientDisconnected, from_engine_error
    from runtime.api import EngineError

    if exc is None:
        return "success"
    if isinstance(exc, EngineError):
        exc = from_engine_error(exc)
    if isinstance(exc, ClientDisconnected):
        return "cancelled"
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if isinstance(exc, APIError) and status == 503:
        return "overloaded" if exc.code == "overloaded" else "error"
    if isinstance(status, int) and 400 <= status < 500:
        return "rejected"
    return "error"
