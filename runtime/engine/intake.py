"""Request intake: refusing bad requests at submission, and setting up an accepted one.

`validate` runs on the caller's thread (a refusal raises EngineError before anything is queued);
`new_request` runs on the engine thread when the request leaves the inbox (making a matcher can
raise: only that request fails). Neither touches engine state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from runtime.api import EngineError, GenerateRequest, StreamEvent
from runtime.decode.completeness import MAX_DIGITS, CompletionGuard
from runtime.decode.decoding import JUMP_FORWARD_MODES, SPECULATIVE_MODES
from runtime.decode.detokenizer import IncrementalDetokenizer
from runtime.decode.lookup import LookupDraft, SharedDrafts
from runtime.decode.row_cost import PRIOR_SHARE, RowCost
from runtime.request import Req


@dataclass(frozen=True)
class Limits:
    max_context: int
    kv_pool_tokens: int
    vocab_size: int


def validate(spec: GenerateRequest, limits: Limits) -> GenerateRequest:
    """`spec` with its output budget clamped to the room the context leaves, or EngineError."""
    n = len(spec.prompt_ids)
    if n == 0:
        raise EngineError("prompt is empty", param="messages")
    try:
        spec.sampling.validate()
    except ValueError as e:
        field, _, _why = str(e).partition(":")
        raise EngineError(str(e), param=field.strip()) from e
    limit = min(limits.max_context, limits.kv_pool_tokens)
    if n >= limit:
        where = "context length" if limits.max_context <= limits.kv_pool_tokens else "KV pool size"
        raise EngineError(
            f"prompt is {n} tokens, over the {where} of {limit} tokens (one more is needed to answer)",
            code="context_length_exceeded",
            param="messages",
        )
    if spec.jump_forward is not None and spec.jump_forward not in JUMP_FORWARD_MODES:
        raise EngineError(f"jump_forward: must be one of {', '.join(JUMP_FORWARD_MODES)}", param="jump_forward")
    if spec.speculative is not None and spec.speculative not in SPECULATIVE_MODES:
        raise EngineError(f"speculative: must be one of {', '.join(SPECULATIVE_MODES)}", param="speculative")
    if not all(0 <= t < limits.vocab_size for t in spec.prompt_ids):
        raise EngineError("prompt holds token ids outside the vocabulary", param="prompt")
    for param, ids in (
        ("logit_bias", spec.sampling.logit_bias),
        ("stop_token_ids", spec.sampling.stop_token_ids),
        ("keep_special_ids", spec.keep_special_ids),
    ):
        outside = [t for t in ids if not 0 <= t < limits.vocab_size]
        if outside:
            raise EngineError(
                f"{param}: token id {outside[0]} is outside the vocabulary (0..{limits.vocab_size - 1})", param=param
            )
    # The output may use whatever room the context leaves.
    max_new = min(spec.sampling.max_new_tokens, limit - n)
    if spec.strict and spec.constraint is not None:
        need = spec.constraint.min_completion_tokens()
        if need is not None and max_new < need:
            raise EngineError(
                f"max_tokens is {max_new}, but the smallest output the schema allows needs {need} tokens; "
                f"raise max_tokens to at least {need}",
                param="max_tokens",
            )
    return replace(spec, sampling=replace(spec.sampling, max_new_tokens=max_new))


def new_request(
    spec: GenerateRequest,
    emit: Callable[[StreamEvent], None],
    tokenizer,
    *,
    default_jump_forward: str,
    loop_breaking: bool,
    max_number_digits: int = MAX_DIGITS,
    lookup: LookupSettings | None = None,
) -> Req:
    """The engine's state for a validated `spec`: its matcher, strict guard and generator."""
    gen = None
    if not spec.sampling.greedy:
        gen = torch.Generator().manual_seed(
            spec.sampling.seed if spec.sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        )
    matcher = spec.constraint.new_matcher() if spec.constraint is not None else None
    guard = None
    if matcher is not None and spec.strict and matcher.supports_strict:
        guard = CompletionGuard(loop_breaking=loop_breaking, max_number_digits=max_number_digits)
    return Req(
        spec=spec,
        emit=emit,
        detok=IncrementalDetokenizer(tokenizer, spec.sampling.stop, spec.keep_special_ids),
        matcher=matcher,
        guard=guard,
        jump_forward=(spec.jump_forward or default_jump_forward) if spec.constraint is not None else "off",
        generator=gen,
        lookup=lookup.for_request(spec.speculative, spec.prompt_ids, spec.namespace) if lookup is not None else None,
    )


@dataclass(frozen=True)
class LookupSettings:
    """The engine's prompt-lookup defaults (engine_config.py's `speculative*` settings) and the row
    cost its requests' drafts share: fixed, or fitted on the engine's decode steps (row_cost.py)."""

    mode: str
    max_tokens: int
    row_cost: RowCost
    shared: SharedDrafts | None = None  # outputs shared by prompts that begin alike (--speculative-shared)

    @classmethod
    def build(cls, mode: str, max_tokens: int, row_cost: float | None, shared: bool = False) -> LookupSettings:
        cost = RowCost(PRIOR_SHARE) if row_cost is None else RowCost.fixed(row_cost)
        return cls(mode, max_tokens, cost, SharedDrafts() if shared else None)

    @classmethod
    def of(cls, cfg) -> LookupSettings:
        """From an EngineConfig's `speculative*` settings."""
        return cls.build(cfg.speculative, cfg.speculative_tokens, cfg.speculative_row_cost, cfg.speculative_shared)

    def for_request(
        self, requested: str | None, prompt_ids: list[int] | None = None, namespace: str = ""
    ) -> LookupDraft | None:
        """A request's draft state; with its `prompt_ids`, it also drafts from (and adds to) the
        outputs of the requests whose prompts begin as its own does, in its cache namespace."""
        if (requested or self.mode) != "ngram":
            return None
        shared = None
        if self.shared is not None and prompt_ids is not None:
            shared = self.shared.group(namespace, prompt_ids)
        return LookupDraft(self.max_tokens, self.row_cost, shared, len(prompt_ids or ()))

    def made(self, running: list[Req]) -> dict[str, int]:
        """Output tokens of each running request before a step (where the cost is measured)."""
        return {r.rid: len(r.output_ids) for r in running} if self.row_cost.measured else {}

    def observe(self, plan: list[tuple[Req, int]], made: dict[str, int], seconds: float) -> None:
        """A step of `seconds`: if it was a decode step (every request already past its prompt
        before it), its rows and the tokens it yielded go to the row cost."""
        if made and all(made.get(r.rid, 0) > 0 for r, _ in plan):
            yielded = sum(len(r.output_ids) - made[r.rid] for r, _ in plan)
            self.row_cost.observe(sum(n for _, n in plan), yielded, seconds)
