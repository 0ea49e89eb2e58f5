"""A scripted `runtime.api.EngineClient` for gateway unit tests: no model, no engine thread.

`reply(req) -> str` is streamed in 3-character pieces (with scripted logprob records, one per
token of the piece, when the request asks: see `fake_logprobs`); `refuse` makes `submit` raise; the recorded
`submitted` / `aborted` / `explained` / `pins` let a test see what the gateway asked for.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from runtime.api import (
    EngineClient,
    EngineError,
    EngineInfo,
    EngineStats,
    GenerateRequest,
    PrefixExplanation,
    StreamEvent,
    TokenLogprob,
)


def fake_logprobs(token_ids: list[int], top_count: int) -> list[TokenLogprob]:
    """Token j of a piece scores -0.25 * (j + 1); its alternatives are the next ids, each 1.0 lower."""
    records = []
    for j, tok in enumerate(token_ids):
        value = -0.25 * (j + 1)
        top = tuple((tok + a, value - a) for a in range(top_count))
        records.append(TokenLogprob(token_id=tok, logprob=value, top=top, forced=j == 2))
    return records


class FakeEngine:
    def __init__(
        self,
        tokenizer,
        *,
        max_context=2048,
        kv_pool_tokens=4096,
        reply=None,
        delay=0.0,
        finish_reason="stop",
        cached_tokens=3,
        pin_budget: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.model_name = "SmolLM2-135M-Instruct"
        self.max_context = max_context  # tests change these; `info` follows them
        self.kv_pool_tokens = kv_pool_tokens
        self.is_running = True
        self.reply = reply or (lambda req: "Hello there!")
        self.delay = delay
        self.finish_reason = finish_reason
        self.cached_tokens = cached_tokens
        self.closed_at_budget = False  # the final event's flag (strict closing completed the value)
        self.error: str | None = None  # the final event's error (with finish_reason "error")
        self.pin_budget = pin_budget  # None: this engine cannot pin (no prefix cache)
        self.refuse: EngineError | None = None  # raised from submit
        self.submitted: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.explained: list[tuple[list[int], str]] = []
        self.pins: dict[tuple[str, str], int] = {}
        self.vocab_size = len(tokenizer)

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(
            model_name=self.model_name,
            device="cpu",
            dtype="float32",
            weights="fp32",
            weights_reason="fake",
            attention_backend="torch",
            kv_pool_tokens=self.kv_pool_tokens,
            max_context=self.max_context,
            vocab_size=self.vocab_size,
            eos_token_ids=(2,),
        )

    def submit(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        if self.refuse is not None:
            raise self.refuse
        if len(req.prompt_ids) >= min(self.max_context, self.kv_pool_tokens):
            raise EngineError("prompt too long", code="context_length_exceeded", param="messages")
        self.submitted.append(req)
        return self._events(req)

    async def _events(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        text = self.reply(req)
        pieces = [text[i : i + 3] for i in range(0, len(text), 3)] or [""]
        done = False
        try:
            for i, piece in enumerate(pieces):
                if self.delay:
                    await asyncio.sleep(self.delay)
                done = i == len(pieces) - 1
                count = req.sampling.logprobs
                yield StreamEvent(
                    logprobs=None
                    if count is None
                    else fake_logprobs(self.tokenizer.encode(piece, add_special_tokens=False), count),
                    rid=req.rid,
                    text=piece,
                    token_ids=[7],
                    finished=done,
                    finish_reason=self.finish_reason if done else None,
                    prompt_tokens=len(req.prompt_ids),
                    cached_tokens=min(self.cached_tokens, len(req.prompt_ids)),
                    completion_tokens=i + 1,
                    closed_at_budget=done and self.closed_at_budget,
                    error=self.error if done else None,
                )
        finally:
            if not done:
                self.abort(req.rid)

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    def stats(self) -> EngineStats:
        return EngineStats(
            running_requests=1,
            waiting_requests=2,
            kv_slots_total=4096,
            kv_slots_free=4000,
            kv_slots_tree=90,
            kv_slots_request_only=6,
            jump_forward_tokens=5,
            jump_forward_rejected=1,
            prompt_tokens=10,
        )

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> PrefixExplanation:
        self.explained.append((list(prompt_ids), namespace))
        n = min(10, len(prompt_ids))
        return PrefixExplanation(
            prompt_tokens=len(prompt_ids), cached_tokens=n, by_tier={"device": n, "host": 0, "disk": 0}
        )

    def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        if self.pin_budget is None:
            raise EngineError("pinning needs the prefix cache", code="pinning_unavailable")
        key = (namespace, name or repr(list(token_ids)))
        if key not in self.pins:
            if sum(self.pins.values()) + len(token_ids) > self.pin_budget:
                raise EngineError("over the pin budget", code="pin_budget_exceeded", param="pin")
            self.pins[key] = len(token_ids)
        return self.pins[key]

    def unpin_prefix(self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None) -> int:
        return self.pins.pop((namespace, name or repr(list(token_ids or []))), 0)

    def shutdown(self) -> None:
        self.is_running = False


def _implements_client(engine: FakeEngine) -> EngineClient:
    return engine  # a type checker verifies FakeEngine against the protocol here
