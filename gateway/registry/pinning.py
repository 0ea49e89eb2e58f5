"""Pinned schema prefixes: `POST /v1/schemas` with `"pin": true`.

A pinned schema's prompt prefix (the system block: the given system prompt + the tools text or
the schema instructions, exactly as `PromptRenderer` builds it for a chat request that uses the
schema) is prefilled at upload and kept resident in the engine's device KV cache within the
engine's pin budget (`EngineClient.pin_prefix`). The prefix ends where the first user turn starts, so
every chat request with that system prompt and schema shares it.

The registry records each pin (`SchemaRegistry.set_pin`), and `restore_pins` re-applies them when
the server starts, so a restart does not silently drop what an operator pinned.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from gateway.errors import APIError, bad_request
from gateway.pipeline.preparation import cache_namespace
from gateway.pipeline.prompt import PromptRenderer, schema_instructions
from gateway.pipeline.schema_registry import SchemaRegistry
from gateway.protocol import SystemMessage, UserMessage
from runtime.api import EngineClient, EngineError
from runtime.engine.scheduler import common_prefix_len

log = logging.getLogger("jumpgate.gateway.pinning")


def pin_name(schema_id: str) -> str:
    return f"schema:{schema_id}"


def schema_prefix_ids(renderer: PromptRenderer, kind: str, payload: Any, system_prompt: str | None) -> list[int]:
    """Token ids of the rendered prompt up to where the user turn starts."""
    tools = list(payload) if kind == "tools" else None
    instructions = schema_instructions(kind, payload)
    head = [SystemMessage(content=system_prompt)] if system_prompt else []

    def template(turns: list[dict[str, Any]], **kwargs: Any) -> str:
        return renderer.apply_template(turns, tools, **kwargs)

    def render(user: str) -> tuple[str, list[dict[str, str]]]:
        turns, _, _ = renderer.chat_turns([*head, UserMessage(content=user)], tools, instructions, (kind, payload))
        return template(turns, add_generation_prompt=True), turns

    text, turns = render("")
    cut = 0
    if turns and turns[0]["role"] == "system":
        system_only = template(turns[:1], add_generation_prompt=False)
        if text.startswith(system_only):
            cut = len(system_only)
    if not cut:  # no system turn of ours (the template may add its own): the text both renders share
        other, _ = render("x")
        cut = next((i for i, (a, b) in enumerate(zip(text, other)) if a != b), min(len(text), len(other)))
    full = renderer.encode(text)
    return full[: common_prefix_len(full, renderer.encode(text[:cut]))]


async def pin_schema(
    engine: EngineClient,
    renderer: PromptRenderer,
    namespace: str,
    schema_id: str,
    kind: str,
    payload: Any,
    system_prompt: str | None,
) -> int:
    """Pin the schema's prefix; 400 when the engine cannot pin or the pin budget is exhausted."""
    ids = await anyio.to_thread.run_sync(schema_prefix_ids, renderer, kind, payload, system_prompt)
    if not ids:
        raise bad_request("The schema renders no prompt prefix to pin.", "pin")
    try:
        return await anyio.to_thread.run_sync(
            lambda: engine.pin_prefix(ids, namespace=namespace, name=pin_name(schema_id))
        )
    except EngineError as exc:
        raise bad_request(exc.message, "pin", code=exc.code if exc.code != "invalid_request" else None) from exc


async def unpin_schema(engine: EngineClient, namespace: str, schema_id: str) -> None:
    await anyio.to_thread.run_sync(lambda: engine.unpin_prefix(namespace=namespace, name=pin_name(schema_id)))


async def restore_pins(engine: EngineClient, renderer: PromptRenderer, registry: SchemaRegistry) -> int:
    """Re-apply every recorded pin, oldest first (at start, the engine running). A pin that no
    longer fits (a smaller pin budget, a changed template) is logged and skipped: the server still
    starts, and the record stays for a later start. Returns how many pins were applied."""
    applied = 0
    for pinned in registry.pinned():
        entry = pinned.entry
        try:
            tokens = await pin_schema(
                engine,
                renderer,
                cache_namespace(pinned.tenant, None),
                entry.id,
                entry.kind,
                entry.payload,
                pinned.system_prompt,
            )
        except APIError as exc:
            log.warning("could not re-pin schema %s (tenant %r) at start: %s", entry.id, pinned.tenant, exc.message)
            continue
        except Exception:  # a broken record must not stop the server
            log.exception("could not re-pin schema %s (tenant %r) at start", entry.id, pinned.tenant)
            continue
        applied += 1
        log.info("re-pinned schema %s (tenant %r): %d tokens", entry.id, pinned.tenant, tokens)
    return applied
