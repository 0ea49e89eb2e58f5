"""What a serving process builds around its engine: the grammar service (with its disk cache
warmed) and the start-up banner. Shared by single-process `jumpgate serve` and cluster replicas."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.settings import Settings
from grammar.settings import GrammarSettings

if TYPE_CHECKING:  # runtime.api imports torch; `jumpgate serve --help` should not wait for it
    from runtime.api import EngineClient

log = logging.getLogger("jumpgate")


def build_grammar_service(engine: EngineClient, settings: GrammarSettings) -> Any:
    from grammar.service import GrammarService

    cache_dir = settings.cache_path()
    info = engine.info
    service = GrammarService(
        engine.tokenizer, info.vocab_size, cache_dir, compile_timeout_s=settings.compile_timeout_s,
        max_memory_bytes=settings.max_memory_bytes, max_disk_bytes=settings.max_disk_bytes, stop_token_ids=sorted(info.eos_token_ids) or None,
        compile_memory_bytes=settings.compile_memory_bytes, value_retries=settings.value_retries,
    )
    service.start()  # the compile processes' fork server imports xgrammar now, not on the first request
    try:
        loaded = service.warm_from_disk()
        if loaded:
            log.info("grammar cache: %d compiled grammars loaded from %s", loaded, cache_dir)
    except Exception:  # a damaged cache must not stop the server
        log.exception("grammar cache warm-up failed")
    return service


def banner(engine: EngineClient, settings: Settings) -> str:
    info = engine.info
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "no API key (open)"
    lines = [
        "Jumpgate: structured-output gateway",
        f"  model      {info.model_name}  ({info.device}, {info.dtype}, {info.attention_backend} attention)",
        f"  weights    {info.weights}: {info.weights_reason}",
        f"  context    {info.max_context} tokens",
        f"  KV pool    {info.kv_pool_tokens} tokens",
        f"  listening  http://{settings.host}:{settings.port}/v1  ({auth})",
    ]
    if settings.openapi:
        lines.append(f"  docs       http://{settings.host}:{settings.port}/docs")
    return "\n".join(lines)
