"""Turning the engine's per-event callbacks into what callers consume: an async iterator of
`StreamEvent`s (the gateway), or whole `GenerateResult`s (library users, tests, benches).

`emit` callbacks run on the engine thread; everything here hands their events over to the caller's
thread or event loop and never touches engine state.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import AsyncIterator, Callable

from runtime.api import EngineError, GenerateRequest, GenerateResult, StreamEvent

Emit = Callable[[StreamEvent], None]
Enqueue = Callable[[GenerateRequest, Emit], None]


def stream_events(enqueue: Enqueue, abort: Callable[[str], None], spec: GenerateRequest) -> AsyncIterator[StreamEvent]:
    """Queue `spec` (refusals raise here) and return its events for the running event loop."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()

    def emit(ev: StreamEvent) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:  # the caller's loop is gone: nobody is listening
            abort(ev.rid)

    enqueue(spec, emit)
    return _events(spec.rid, events, abort)


async def _events(rid: str, events: asyncio.Queue, abort: Callable[[str], None]) -> AsyncIterator[StreamEvent]:
    done = False
    try:
        while not done:
            ev = await events.get()
            done = ev.finished
            yield ev
    finally:
        if not done:  # the consumer stopped listening (client disconnect): free its KV now
            abort(rid)


def collect_results(enqueue: Enqueue, specs: list[GenerateRequest], timeout: float | None) -> list[GenerateResult]:
    """Queue all `specs` at once (so they batch) and block until every one finished."""
    parts: dict[str, list[StreamEvent]] = defaultdict(list)
    done = threading.Semaphore(0)

    def make_emit(rid: str) -> Emit:
        def emit(ev: StreamEvent) -> None:
            parts[rid].append(ev)
            if ev.finished:
                done.release()

        return emit

    for spec in specs:
        enqueue(spec, make_emit(spec.rid))
    for _ in specs:
        if not done.acquire(timeout=timeout):
            raise TimeoutError("generate_many: timed out")
    results = []
    for spec in specs:
        evs = parts[spec.rid]
        last = evs[-1]
        if last.finish_reason == "error":
            raise EngineError(last.error or "engine error", code="engine_error")
        results.append(
            GenerateResult(
                rid=spec.rid,
                text="".join(e.text for e in evs),
                token_ids=[t for e in evs for t in e.token_ids],
                finish_reason=last.finish_reason,
                prompt_tokens=last.prompt_tokens,
                cached_tokens=last.cached_tokens,
                completion_tokens=last.completion_tokens,
                logprobs=None if spec.sampling.logprobs is None else [x for e in evs for x in e.logprobs or ()],
                closed_at_budget=last.closed_at_budget,
            )
        )
    return results
