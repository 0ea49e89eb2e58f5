"""The body of POST /v1/cache/explain's answer: how much of a prompt is cached, in which tier, where it ends."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct


class CachedTier(Struct):
    tier: str
    tokens: int


class CacheBoundary(Struct):
    token_index: int  # prompt tokens [0, token_index) are cached
    text_before: str  # ~40 characters of the prompt before the boundary
    text_after: str  # ~40 characters after it


class CacheExplanation(Struct):
    model: str
    prompt_tokens: int
    cached_tokens: int
    cached_by_tier: list[CachedTier]
    boundary: CacheBoundary
    namespace_salted: bool = False
    object: Literal["cache.explanation"] = "cache.explanation"
