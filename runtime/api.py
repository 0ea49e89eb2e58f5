"""The engine's client interface: the only thing the gateway (or a library user) talks to.

Kept narrow on purpose (submit/stream, abort, stats, explain) so one gateway can later route to
several engine replicas by prefix hash without changing its own code.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Protocol

from runtime.constraint import CompiledConstraint
from runtime.sampling import SamplingParams

JumpForwardMode = Literal["verify", "direct", "off"]
FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(Exception):
    """A request the engine refuses; `code` maps onto an HTTP status in the gateway."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code  # invalid_request | context_length_exceeded | overloaded | engine_stopped
        self.param = param


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: CompiledConstraint | None = None  # grammar; None = free text
    jump_forward: JumpForwardMode | None = None  # None = the engine's default
    strict: bool = False  # strict JSON: budget-aware closing / loop breaking may apply
    namespace: str = ""  # cache namespace (tenant + cache_salt): no prefix is shared across namespaces
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class StreamEvent:
    """One increment of a request's output. The last event has `finished=True`."""

    rid: str
    text: str = ""  # new text since the previous event (never half a UTF-8 character)
    token_ids: list[int] = field(default_factory=list)  # new token ids since the previous event
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class GenerateResult:
    rid: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class EngineClient(Protocol):
    model_name: str
    max_context: int  # longest prompt + output one request may have (tokens)
    is_running: bool  # the step loop is alive (read without touching the engine thread)

    def submit(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """Queue `req` and stream its events; raises EngineError at once on a refusal
        (prompt too long for the context or the KV pool, queue full)."""

    def abort(self, rid: str) -> None:
        """Cancel a queued or running request; its KV slots are freed (prefix stays cached)."""

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: tokens, cached tokens, KV slots free/used/tree-held, queue sizes."""

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> dict[str, Any]:
        """How much of `prompt_ids` is cached (by tier), without generating anything."""
