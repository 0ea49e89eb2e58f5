"""POST /v1/cache/explain: how much of a chat request's prompt is already cached, and where the
cached prefix ends. Same body as a chat completion; nothing is generated or queued."""

from __future__ import annotations

import anyio
from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.cache_explain.protocol import CacheBoundary, CachedTier, CacheExplanation
from gateway.pipeline.preparation import prepare_chat
from gateway.protocol import CacheExplainRequest
from gateway.services import GatewayServices
from runtime.api import PrefixExplanation


def cached_tiers(info: PrefixExplanation) -> list[CachedTier]:
    """Tokens of the prompt found in each tier, in the engine's order (device, host, disk)."""
    return [CachedTier(tier=tier, tokens=tokens) for tier, tokens in info.by_tier.items()]


class CacheController(Controller):
    path = "/cache"
    tags = ["cache"]

    @post("/explain", status_code=200, summary="Explain prefix-cache reuse for a chat request")
    async def explain(
        self,
        data: JSONBody[CacheExplainRequest],
        services: NamedDependency[GatewayServices],
        tenant: NamedDependency[str],
    ) -> CacheExplanation:
        s = services
        prepared = await prepare_chat(data, s, tenant, compile=False)
        ids = prepared.prompt_ids
        # explain_prefix reads the radix tree; run it off the event loop in case it takes a lock
        info = await anyio.to_thread.run_sync(s.engine.explain_prefix, ids, prepared.namespace)
        index = cached = min(info.cached_tokens, len(ids))  # the cached prefix ends where the cache does
        before, after = await anyio.to_thread.run_sync(s.renderer.boundary_context, ids, index)
        return CacheExplanation(
            model=prepared.model,
            prompt_tokens=len(ids),
            cached_tokens=cached,
            cached_by_tier=cached_tiers(info),
            boundary=CacheBoundary(token_index=index, text_before=before, text_after=after),
            namespace_salted=bool(data.cache_salt),
        )
