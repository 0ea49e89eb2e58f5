"""`cache_control` breakpoints as prefix pins.

The radix cache already reuses any prompt prefix it still holds; a breakpoint also keeps its
prefix resident: after the turn (when the prefix is in the cache, so pinning prefills nothing)
the prompt up to the furthest breakpoint is pinned in the engine (`EngineClient.pin_prefix`)
for the breakpoint's ttl (5 minutes, or 1 hour), refreshed by each request that marks it again.
Pins share the engine's `--pin-budget-tokens` with pinned schemas: when it is full the oldest
breakpoint pin is released; when pinning is off (budget 0) breakpoints only name what the radix
cache keeps anyway. Pinning is best effort, as Anthropic's caching is: it never fails a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from functools import partial
from typing import Any, Callable

import anyio

from gateway.messages.translate import Breakpoint, MessagesPlan
from gateway.protocol import SystemMessage, content_text
from runtime.api import EngineError
from runtime.engine.scheduler import common_prefix_len

log = logging.getLogger("jumpgate.gateway.messages")

TTL_S = {"5m": 300.0, "1h": 3600.0}
NAME_PREFIX = "messages:"


def breakpoint_end(prompt_text: str, plan: MessagesPlan) -> int | None:
    """Where the text of the furthest breakpoint ends in the rendered prompt (None: not found).
    Blocks are searched for in order, each after the previous one: the prompt holds them in the
    order of the request (system and tools first, in the system block)."""
    cursor, end = 0, None
    for mark in plan.breakpoints:
        found = locate(prompt_text, plan, mark, cursor)
        if found is not None:
            cursor = end = found
    return end


def locate(prompt_text: str, plan: MessagesPlan, mark: Breakpoint, cursor: int) -> int | None:
    if mark.message < 0:  # system or tools: the system block, which ends where the conversation starts
        first = next(
            (
                content_text(m.content)
                for m in plan.chat.messages
                if not isinstance(m, SystemMessage) and content_text(m.content)
            ),
            None,
        )
        pos = prompt_text.find(first, cursor) if first else -1
        return pos if pos > 0 else None
    if mark.text is None:  # automatic caching: the whole prompt
        return len(prompt_text)
    pos = prompt_text.find(mark.text, cursor) if mark.text else -1
    return pos + len(mark.text) if pos >= 0 else None


class MessagePins:
    """The breakpoint pins this gateway holds: (namespace, name) → expiry (monotonic seconds)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.expiry: dict[tuple[str, str], float] = {}
        self.off = False  # the engine said pinning is off: stop asking
        self.lock = asyncio.Lock()
        self.tasks: set[asyncio.Task] = set()

    def schedule(self, ids: Callable[[], list[int]], namespace: str, ttl: str) -> None:
        """Pin `ids()` (computed on a worker thread) in the background."""
        if self.off:
            return
        task = asyncio.get_running_loop().create_task(self.pin(ids, namespace, ttl))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def pin(self, make_ids: Callable[[], list[int]], namespace: str, ttl: str) -> None:
        try:
            ids = await anyio.to_thread.run_sync(make_ids)
            if not ids:
                return
            key = (namespace, NAME_PREFIX + hashlib.sha256(repr(ids).encode()).hexdigest()[:24])
            ttl_s = TTL_S.get(ttl, TTL_S["5m"])
            async with self.lock:
                await self.release(expired_only=True)
                if self.expiry.get(key, 0.0) - time.monotonic() > ttl_s / 2:
                    return  # pinned a moment ago: the engine need not be asked again yet
                for _ in range(2):
                    try:
                        await anyio.to_thread.run_sync(
                            partial(self.engine.pin_prefix, ids, namespace=key[0], name=key[1])
                        )
                    except EngineError as exc:
                        off = exc.code == "pinning_unavailable" or "pinning is off" in exc.message
                        if exc.code == "pin_budget_exceeded" and self.expiry and not off:
                            await self.release(expired_only=False)  # make room: the oldest pin goes
                            continue
                        self.off = off
                        log.debug("breakpoint not pinned: %s", exc.message)
                        return
                    self.expiry.pop(key, None)  # refreshed: it moves to the end (the newest)
                    self.expiry[key] = time.monotonic() + ttl_s
                    # released when it expires even if no request comes to find it expired
                    asyncio.get_running_loop().call_later(ttl_s + 1, self.expire)
                    return
        except Exception:  # best effort: a pin never fails the request it follows
            log.exception("pinning a cache_control breakpoint failed")

    def expire(self) -> None:
        task = asyncio.get_running_loop().create_task(self.release_expired())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def release_expired(self) -> None:
        try:
            async with self.lock:
                await self.release(expired_only=True)
        except Exception:
            log.exception("releasing expired cache_control pins failed")

    async def release(self, expired_only: bool) -> None:
        now = time.monotonic()
        for key, expires in list(self.expiry.items()):
            if expired_only and expires > now:
                continue
            del self.expiry[key]
            namespace, name = key
            await anyio.to_thread.run_sync(partial(self.engine.unpin_prefix, namespace=namespace, name=name))
            if not expired_only:
                return


def pins_of(state: Any, engine: Any) -> MessagePins:
    """The app's MessagePins (made on first use, kept in the app's state)."""
    pins = state.get("message_pins") if hasattr(state, "get") else None
    if pins is None:
        pins = MessagePins(engine)
        state["message_pins"] = pins
    return pins


def pin_breakpoints(pins: MessagePins, renderer: Any, prepared: Any, plan: MessagesPlan) -> None:
    """Pin the prompt up to the furthest breakpoint of a finished turn (nothing without marks)."""
    if not plan.breakpoints or pins.off or not prepared.prompt_text:
        return
    end = breakpoint_end(prepared.prompt_text, plan)
    if not end:
        return
    ids, text = list(prepared.prompt_ids), prepared.prompt_text

    def prefix_ids() -> list[int]:
        return ids if end >= len(text) else ids[: common_prefix_len(ids, renderer.encode(text[:end]))]

    pins.schedule(prefix_ids, prepared.namespace, plan.cache_ttl or "5m")
