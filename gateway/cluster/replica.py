"""One engine replica as a Ray Serve deployment: an `Engine` plus the grammar service that rebuilds
constraints sent to it, and a summary of the prefixes it served for the router.

Ray Serve routes to a replica only once its constructor has returned, so a replica still loading
its model gets no requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator

from gateway.cluster.grammar_bridge import use_replica_grammar
from gateway.cluster.prefix_keys import BLOCK_TOKENS, PrefixSummary, prefix_keys
from grammar.settings import GrammarSettings
from runtime.api import EngineInfo, GenerateRequest, StreamEvent
from runtime.engine_config import EngineConfig


class EngineReplica:
    def __init__(self, engine_config: EngineConfig, grammar_settings: GrammarSettings):
        from gateway.startup import build_grammar_service
        from runtime.engine.engine import Engine

        self.engine = Engine(engine_config).start()
        self.grammar = build_grammar_service(self.engine, grammar_settings)
        use_replica_grammar(self.grammar)
        # forgets about when the KV pool would: the pool holds kv_pool_tokens / BLOCK_TOKENS blocks
        self.served = PrefixSummary(self.engine.info.kv_pool_tokens // BLOCK_TOKENS)

    async def info(self) -> EngineInfo:
        return self.engine.info  # built once by the engine: model, device, weight format and why, limits

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """The engine's event stream. A cancelled call (client gone, gateway abort) aborts the
        engine request, so its KV slots are freed."""
        self.served.add(prefix_keys(req.prompt_ids, req.namespace))
        finished = False
        try:
            async for event in self.engine.submit(req):
                finished = event.finished
                yield event
        finally:
            if not finished:
                self.engine.abort(req.rid)

    async def stats(self) -> Any:
        return await asyncio.to_thread(self.engine.stats)

    async def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> Any:
        return await asyncio.to_thread(self.engine.explain_prefix, prompt_ids, namespace)

    async def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        self.served.add(prefix_keys(token_ids, namespace))
        return await asyncio.to_thread(self.engine.pin_prefix, token_ids, namespace, name)

    async def unpin_prefix(
        self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None
    ) -> int:
        return await asyncio.to_thread(self.engine.unpin_prefix, token_ids, namespace, name)

    async def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Ray Serve for the router: the prefixes held, and the engine's counters (the
        gateway's /metrics shows them per replica)."""
        stats = await asyncio.to_thread(self.engine.stats)
        return {"prefix_keys": self.served.snapshot(), "engine": dataclasses.asdict(stats)}

    def check_health(self) -> None:
        if not self.engine.is_running:
            raise RuntimeError("the engine's step loop has stopped")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
