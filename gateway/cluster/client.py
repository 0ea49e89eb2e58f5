"""`ClusterEngineClient`: the engine replicas behind a Ray Serve handle, as one `EngineClient`.

The gateway serves a cluster with its own code unchanged: `submit` streams from the deployment
handle (the prefix-aware router picks the replica), `abort` cancels that call (the replica then
aborts its engine request), `stats` sums the replicas' last reported counters. A replica that dies
mid-request ends its streams with EngineError(code="engine_stopped"): a 503, or an error event.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, AsyncIterator

from ray import exceptions as ray_errors

from gateway.cluster.routing_log import ROUTING_LOG
from runtime.api import EngineError, EngineInfo, EngineStats, GenerateRequest, StreamEvent
from runtime.engine_config import EngineConfig
from runtime.model.loader import load_tokenizer, resolve_model_dir

log = logging.getLogger("jumpgate.cluster")

REPLICA_LOST = (ray_errors.ActorDiedError, ray_errors.ActorUnavailableError, ray_errors.RayActorError)


def engine_error_of(exc: BaseException) -> EngineError:
    """The EngineError a replica raised (Ray wraps it), or engine_stopped for a lost replica."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, EngineError):
        return EngineError(exc.message, exc.code, exc.param)
    if isinstance(cause, EngineError):
        return EngineError(cause.message, cause.code, cause.param)
    if isinstance(exc, REPLICA_LOST) or isinstance(cause, REPLICA_LOST):
        return EngineError("The engine replica serving this request stopped; retry the request.", "engine_stopped")
    return EngineError(f"The engine replica failed: {type(exc).__name__}: {exc}", "engine_stopped")


AVERAGED = frozenset({"lookup_row_cost"})  # per-replica shares, not amounts


def sum_stats(snapshots: list[dict[str, Any]]) -> EngineStats:
    """Cluster totals of the replicas' EngineStats (sent as `dataclasses.asdict` dicts): numbers add,
    per-key maps (requests by finish reason, cached tokens by tier, tier counters) add key by key;
    shares (AVERAGED) are the replicas' mean."""
    fields = {f.name for f in dataclasses.fields(EngineStats)}
    total: dict[str, Any] = {}
    for snap in snapshots:
        for key, value in snap.items():
            if key not in fields:
                continue
            if isinstance(value, dict):
                into = total.setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    for key in AVERAGED & total.keys():
        total[key] /= sum(1 for snap in snapshots if key in snap)
    return EngineStats(**total)


class ClusterEngineClient:
    def __init__(self, handle: Any, engine_config: EngineConfig, replicas: int, info: EngineInfo | None = None):
        """`info` is fetched from a replica unless given (inside an event loop, await it first)."""
        model_dir = resolve_model_dir(engine_config.model)
        self.handle = handle
        self.replicas = replicas
        self.tokenizer = load_tokenizer(model_dir)
        # every replica serves the same engine
        self.info: EngineInfo = info if info is not None else handle.info.remote().result()
        self._calls: dict[str, Any] = {}  # rid -> the streaming call, for abort

    @property
    def is_running(self) -> bool:
        return True  # Ray restarts lost replicas; a request finding none gets a 503

    def submit(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        call = self.handle.options(stream=True).generate.remote(req)
        self._calls[req.rid] = call
        return self._events(req.rid, call)

    async def _events(self, rid: str, call: Any) -> AsyncIterator[StreamEvent]:
        finished = False
        try:
            async for event in call:
                finished = event.finished
                yield event
        except Exception as exc:  # noqa: BLE001 -- every replica failure becomes an engine error
            raise engine_error_of(exc) from exc
        finally:
            self._calls.pop(rid, None)
            if not finished:
                # The consumer left early (client gone, its task cancelled): cancel the call here.
                # `abort(rid)`, called after the consumer's task was cancelled, finds the call already
                # popped by this `finally`, and the replica's request ran on (a CI run saw it).
                call.cancel()

    def abort(self, rid: str) -> None:
        call = self._calls.pop(rid, None)
        if call is not None:
            call.cancel()

    def stats(self) -> EngineStats:
        _, replica_stats = ROUTING_LOG.snapshot()
        return sum_stats([s.get("engine", {}) for s in replica_stats.values()])

    def replica_stats(self) -> dict[str, dict[str, Any]]:
        """Each live replica's last reported engine stats, by replica id."""
        _, replica_stats = ROUTING_LOG.snapshot()
        return {rid: s.get("engine", {}) for rid, s in replica_stats.items()}

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> Any:
        return self._call("explain_prefix", prompt_ids, namespace)

    def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        return self._call("pin_prefix", token_ids, namespace, name)

    def unpin_prefix(self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None) -> int:
        return self._call("unpin_prefix", token_ids, namespace, name)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.handle, method).remote(*args).result()
        except Exception as exc:  # noqa: BLE001
            raise engine_error_of(exc) from exc

    def shutdown(self) -> None:
        pass  # the replicas belong to Ray Serve; `serve.shutdown()` stops them
