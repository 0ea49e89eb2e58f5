"""Pinned schema prefixes: `POST /v1/schemas` with `"pin": true`.

A pinned schema's prompt prefix (the system block: the given system prompt + the tools text or
the schema instructions, exactly as `PromptRenderer` builds it for a chat request that uses the
schema) is prefilled at upload and kept resident in the engine's device KV cache within the
engine's pin budget (`EngineClient.pin_prefix`). The prefix ends where the first user turn starts, so
every chat request with that system prompt and schema shares it.
"""

from __future__ import annotations

from typing import Any

import anyio

from gateway.errors import bad_request
from gateway.prompt import PromptRenderer, schema_instructions
from gateway.protocol import SystemMessage, UserMessage
from runtime.api import EngineClient, EngineError
from runtime.scheduler import common_prefix_len


def pin_name(schema_id: str) -> str:
    return f"schema:{schema_id}"


def schema_prefix_ids(renderer: PromptRenderer, kind: str, payload: Any, system_prompt: str | None) -> list[int]:
    """Token ids of the rendered prompt up to where the user turn starts."""
    tools = list(payload) if kind == "tools" else None
    instructions = schema_instructions(kind, payload)
    head = [SystemMessage(content=system_prompt)] if system_prompt else []
    template = renderer.tokenizer.apply_chat_template

    def render(user: str) -> tuple[str, list[dict[str, str]]]:
        turns, _ = renderer.chat_turns([*head, UserMessage(content=user)], tools, instructions, (kind, payload))
        return template(turns, tokenize=False, add_generation_prompt=True), turns

    text, turns = render("")
    cut = 0
    if turns and turns[0]["role"] == "system":
        system_only = template(turns[:1], tokenize=False, add_generation_prompt=False)
        if text.startswith(system_only):
            cut = len(system_only)
    if not cut:  # no system turn of ours (the template may add its own): the text both renders share
        other, _ = render("x")
        cut = next((i for i, (a, b) in enumerate(zip(text, other)) if a != b), min(len(text), len(other)))
    full = renderer.encode(text)
    return full[:common_prefix_len(full, renderer.encode(text[:cut]))]


async def pin_schema(engine: EngineClient, renderer: PromptRenderer, namespace: str, schema_id: str, kind: str,
                     payload: Any, system_prompt: str | None) -> int:
    """Pin the schema's prefix; 400 when the engine cannot pin or the pin budget is exhausted."""
    ids = await anyio.to_thread.run_sync(schema_prefix_ids, renderer, kind, payload, system_prompt)
    if not ids:
        raise bad_request("The schema renders no prompt prefix to pin.", "pin")
    try:
        return await anyio.to_thread.run_sync(
            lambda: engine.pin_prefix(ids, namespace=namespace, name=pin_name(schema_id)))
    except EngineError as exc:
        raise bad_request(exc.message, "pin", code=exc.code if exc.code != "invalid_request" else None) from exc


async def unpin_schema(engine: EngineClient, namespace: str, schema_id: str) -> None:
    await anyio.to_thread.run_sync(lambda: engine.unpin_prefix(namespace=namespace, name=pin_name(schema_id)))
