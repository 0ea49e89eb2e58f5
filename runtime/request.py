"""A request's state inside the engine (the nano-vllm `Sequence`).

Owned by the engine thread: only the engine's step and its inbox handlers read or write a `Req`.
`token_ids` is one growing list (prompt, then output), so the prefix cache's keys and the pending
tokens are slices of it rather than a new concatenation per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from runtime.api import GenerateRequest, StreamEvent, TokenLogprob
from runtime.constraint import TokenMatcher
from runtime.decode.completeness import CompletionGuard
from runtime.decode.detokenizer import IncrementalDetokenizer
from runtime.decode.lookup import LookupDraft


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
    token_ids: list[int] = field(default_factory=list)  # prompt then output (set in __post_init__)
    draft: list[int] = field(default_factory=list)  # tokens awaiting verification: forced, then looked up
    lookup: LookupDraft | None = None  # prompt-lookup drafts (None: off)
    # KV state: positions [0, kv_len) of token_ids have KV in the slots of row `row`;
    # [0, cached_len) of those are the prefix cache's (locked via `node`), the rest are ours.
    row: int | None = None
    kv_len: int = 0
    cached_len: int = 0
    node: Any = None
    # Sliding-window models: window KV of positions before this is released (or was never ours:
    # the cached prefix matched at admission); runtime/kvcache/window_pool.py
    window_from: int = 0
    # During a forward pass: the end of the positions given slots by this pass. Slots of
    # [kv_len, pass_end) are not accounted in kv_len yet; if the step fails before its bookkeeping
    # finishes, releasing the request frees them too (otherwise they would leak from the pool).
    pass_end: int | None = None
    prompt_cached_tokens: int | None = None  # reported cached_tokens (set at first admission)
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None  # the last step that accepted output tokens
    finished: bool = False
    finish_reason: str | None = None
    jump_forward_tokens: int = 0
    # Token ids accepted since the last emitted event (sent with the next event).
    unsent_ids: list[int] = field(default_factory=list)
    pending_text: str = ""  # text of those tokens that is safe to emit
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)  # requests asking for logprobs
    rewind_tokens: int = 0  # output tokens to drop: a value rolled back to be rewritten (decoding.py)

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The unsent logprob records (None when the request did not ask for them)."""
        if self.spec.sampling.logprobs is None:
            return None
        records, self.unsent_logprobs = self.unsent_logprobs, []
        return records

    def __post_init__(self) -> None:
        self.token_ids = list(self.spec.prompt_ids) + self.output_ids

    def append_token(self, token_id: int) -> None:
        self.output_ids.append(token_id)
        self.token_ids.append(token_id)

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def prompt_ids(self) -> list[int]:
        return self.spec.prompt_ids

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending(self) -> int:
        """Tokens to feed next: those without KV, then the unverified draft."""
        return len(self.token_ids) - self.kv_len + len(self.draft)

    def pending_ids(self, n: int) -> list[int]:
        """The first `n` of those tokens."""
        real = self.token_ids[self.kv_len : self.kv_len + n]
        return real + self.draft[: n - len(real)] if len(real) < n else real

    @property
    def in_prefill(self) -> bool:
        return self.seq_len - self.kv_len > 1

    @property
    def owned_slots(self) -> int:
        return self.kv_len - self.cached_len

    def restart_text(self) -> None:
        """Text and logprobs again from the kept output (after a rewind; nothing was sent yet)."""
        self.detok = self.detok.restarted()
        self.pending_text = self.detok.add(list(self.output_ids)) if self.output_ids else ""
        self.unsent_ids = list(self.output_ids)
        del self.unsent_logprobs[len(self.output_ids) :]

    def progress_event(self) -> StreamEvent | None:
        """The tokens and text accepted since the last event (None if there are none, or while
        the matcher withholds the output until it is whole: it may still roll some back)."""
        if self.finished or not self.unsent_ids or (self.matcher is not None and self.matcher.withholds_output):
            return None
        ids, text = self.unsent_ids, self.pending_text
        self.unsent_ids, self.pending_text = [], ""
        return StreamEvent(
            rid=self.rid,
            text=text,
            token_ids=ids,
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=self.prompt_cached_tokens or 0,
            completion_tokens=len(self.output_ids),
            logprobs=self.take_logprobs(),
        )

    def final_event(self, error: str | None = None) -> StreamEvent:
        """The last event: whatever was not sent yet, with the finish reason."""
        text = self.pending_text + self.detok.flush()
        ids, self.unsent_ids, self.pending_text = self.unsent_ids, [], ""
        return StreamEvent(
            rid=self.rid,
            text=text,
            token_ids=ids,
            finished=True,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=self.prompt_cached_tokens or 0,
            completion_tokens=len(self.output_ids),
            error=error,
            logprobs=self.take_logprobs(),
            closed_at_budget=self.closed_at_budget,
            decode_seconds=self.decode_seconds,
        )

    @property
    def decode_seconds(self) -> float:
        """From the first output token to the last (no queueing, no prefill)."""
        if self.first_token_at is None or self.last_token_at is None:
            return 0.0
        return self.last_token_at - self.first_token_at

    @property
    def closed_at_budget(self) -> bool:
        """Ended `stop` with strict closing on: the grammar completed the value the budget closed."""
        return self.finish_reason == "stop" and self.guard is not None and self.guard.closing
