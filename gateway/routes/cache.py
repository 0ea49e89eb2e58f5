"""POST /v1/cache/explain: how much of a chat request's prompt is already cached, and where the
cached prefix ends. Same body as a chat completion; nothing is generated or queued."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from gateway.preparation import prepare_chat
from gateway.protocol import CacheBoundary, CachedTier, CacheExplainRequest, CacheExplanation
from gateway.services import GatewayServices


def read_explanation(info: dict[str, Any], prompt_tokens: int) -> tuple[int, list[CachedTier]]:
    """(cached tokens, by tier) from engine.explain_prefix's dict, tolerant of its exact keys."""
    tiers_raw = info.get("by_tier", info.get("tiers", info.get("cached_by_tier", {})))
    tiers: list[CachedTier] = []
    if isinstance(tiers_raw, dict):
        tiers = [CachedTier(tier=str(k), tokens=int(v)) for k, v in tiers_raw.items() if isinstance(v, (int, float))]
    elif isinstance(tiers_raw, list):
        for item in tiers_raw:
            if isinstance(item, dict) and "tier" in item:
                tiers.append(CachedTier(tier=str(item["tier"]), tokens=int(item.get("tokens", 0))))
    cached = info.get("cached_tokens", info.get("matched_tokens", info.get("prefix_len")))
    if cached is None:
        cached = sum(t.tokens for t in tiers)
    cached = max(0, min(int(cached), prompt_tokens))
    if not tiers and cached:
        tiers = [CachedTier(tier="device", tokens=cached)]
    return cached, tiers


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
        prepared = await prepare_chat(
            data, engine=s.engine, grammar_service=s.grammar, renderer=s.renderer,
            registry=s.registry, settings=s.settings, tenant=tenant, compile=False,
        )
        ids = prepared.prompt_ids
        # explain_prefix reads the radix tree; run it off the event loop in case it takes a lock
        info = await anyio.to_thread.run_sync(s.engine.explain_prefix, ids, prepared.namespace)
        cached, tiers = read_explanation(info if isinstance(info, dict) else {}, len(ids))
        index = int(info.get("prefix_end", cached)) if isinstance(info, dict) else cached
        before, after = await anyio.to_thread.run_sync(s.renderer.boundary_context, ids, index)
        return CacheExplanation(
            model=prepared.model,
            prompt_tokens=len(ids),
            cached_tokens=cached,
            cached_by_tier=tiers,
            boundary=CacheBoundary(token_index=index, text_before=before, text_after=after),
            namespace_salted=bool(data.cache_salt),
        )
