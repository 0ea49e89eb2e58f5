"""A request's state inside the engine (the nano-vllm `Sequence`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from runtime.api import GenerateRequest, StreamEvent
from runtime.completeness import CompletionGuard
from runtime.constraint import TokenMatcher
from runtime.detokenizer import IncrementalDetokenizer


@dataclass
class Req:
    spec: GenerateRequest
    emit: Callable[[StreamEvent], None]
    detok: IncrementalDetokenizer
    matcher: TokenMatcher | None = None
    guard: CompletionGuard | None = None  # strict JSON: budget closing and loop breaking
    jump_forward: str = "off"
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)  # verify mode: forced tokens awaiting verification
    # KV state: positions [0, kv_len) of all_ids have KV in the slots of row `row`;
    # [0, cached_len) of those are the prefix cache's (locked via `node`), the rest are ours.
    row: int | None = None
    kv_len: int = 0
    cached_len: int = 0
    node: Any = None
    # During a forward pass: the end of the positions given slots by this pass. Slots of
    # [kv_len, pass_end) are not accounted in kv_len yet; if the step fails before its bookkeeping
    # finishes, releasing the request frees them too (otherwise they would leak from the pool).
    pass_end: int | None = None
    prompt_cached_tokens: int | None = None  # reported cached_tokens (set at first admission)
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    jump_forward_tokens: int = 0
    # Token ids accepted since the last emitted event (sent with the next event).
    unsent_ids: list[int] = field(default_factory=list)
    pending_text: str = ""  # text of those tokens that is safe to emit

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def prompt_ids(self) -> list[int]:
        return self.spec.prompt_ids

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    def all_ids(self) -> list[int]:
        return self.spec.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.spec.prompt_ids) + len(self.output_ids)

    def pending_ids(self) -> list[int]:
        """Tokens to feed next: those without KV, then the unverified draft."""
        return self.all_ids()[self.kv_len :] + self.draft

    @property
    def in_prefill(self) -> bool:
        return self.seq_len - self.kv_len > 1

    @property
    def owned_slots(self) -> int:
        return self.kv_len - self.cached_len
