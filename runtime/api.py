"""The engine's client interface: the only thing the gateway (or a library user) talks to.

Kept narrow on purpose (submit/stream, abort, stats, explain) so one gateway can later route to
several engine replicas by prefix hash without changing its own code.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Literal, Protocol

from runtime.constraint import CompiledConstraint
from runtime.decode.sampling import SamplingParams

JumpForwardMode = Literal["verify", "direct", "off"]
SpeculativeMode = Literal["ngram", "off"]
FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(Exception):
    """A request the engine refuses; `code` maps onto an HTTP status in the gateway."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code  # invalid_request | context_length_exceeded | overloaded | engine_stopped
        self.param = param


# The error of a strict request whose output kept breaking a keyword only the check of the finished
# value enforces (check-and-roll-back), every rewrite spent: "value_retries_exhausted: <why>".
VALUE_RETRIES_EXHAUSTED = "value_retries_exhausted"
# the error text a request in flight ends with when the engine stops under it (a 503, not a 500)
ENGINE_STOPPED = "engine stopped"

BACKGROUND_PRIORITY = 1  # GenerateRequest.priority of work that yields to online requests (batches)


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: CompiledConstraint | None = None  # grammar; None = free text
    jump_forward: JumpForwardMode | None = None  # None = the engine's default
    speculative: SpeculativeMode | None = None  # prompt-lookup drafts; None = the engine's default
    strict: bool = False  # strict JSON: budget-aware closing / loop breaking may apply
    # the output must fit its checked keywords: with the rewrites of check-and-roll-back spent, fail
    # (VALUE_RETRIES_EXHAUSTED) rather than finish with a value that breaks them
    refuse_unfit: bool = False
    namespace: str = ""  # cache namespace (tenant + cache_salt): no prefix is shared across namespaces
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    # admission class: waiting requests of a lower value are admitted first (0 online traffic,
    # BACKGROUND_PRIORITY the Batch API's lines), and a background request is retracted first
    priority: int = 0
    # special tokens whose text the output keeps (skip_special_tokens drops the others): the
    # markers the request's output format writes as special tokens, for the caller's parser
    keep_special_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one output token (see runtime/decode/logprobs.py for which distribution).

    `top` holds the most likely tokens of the same distribution, best first (as many as the
    request's `logprobs` asked for; never a token the grammar masked out). `forced`: the token was
    written by direct-mode jump-forward without a forward pass, so there is no distribution:
    logprob 0.0 (the grammar allowed nothing else) and `top` is just the token itself."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    forced: bool = False


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
    # The last event of a strict request whose value budget closing completed: it ended `stop`
    # (the grammar finished) but the budget, not the model, decided where (runtime/decode/completeness.py).
    closed_at_budget: bool = False
    # The last event: seconds from the step that chose the first output token to the one that
    # chose the last (so divided by completion_tokens - 1, the mean decode step).
    decode_seconds: float = 0.0
    # One record per token of the new text (the final EOS / stop token has none, as it has no
    # text); None unless the request's sampling asked for logprobs.
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerateResult:
    rid: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None  # as in StreamEvent, for the whole output
    closed_at_budget: bool = False  # as in StreamEvent


@dataclass(frozen=True)
class EngineInfo:
    """What the engine serves, fixed at start (banner, grammar service set-up, /v1/models)."""

    model_name: str
    device: str  # "cpu" | "cuda:0" ...
    dtype: str  # activation / KV dtype, e.g. "float32"
    weights: str  # linear-layer weight format actually used: fp32 | bf16 | q8 | q4
    weights_reason: str  # why that format (auto's choice, or "requested")
    attention_backend: str  # torch | triton | cpu
    kv_pool_tokens: int
    max_context: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's gauges and counters, made on the engine thread between steps
    (never a live view: the gateway may read it from any thread while the engine keeps running).

    Gauges describe now; counters only grow (until `flush_cache`, which benches use to restart them).
    """

    # gauges
    running_requests: int = 0
    waiting_requests: int = 0
    kv_slots_total: int = 0
    kv_slots_free: int = 0
    kv_slots_tree: int = 0  # held by the prefix cache (device tier)
    kv_slots_evictable: int = 0  # tree slots no running request locks
    kv_slots_request_only: int = 0  # held by running requests and not (yet) by the tree
    # sliding-window models: the window layers' own slots (runtime/kvcache/window_pool.py); 0: none
    kv_window_slots_total: int = 0
    kv_window_slots_free: int = 0
    # a prompt-lookup draft row's cost as a share of a decode step's per output token (row_cost.py)
    lookup_row_cost: float = 0.0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)  # "device"/"host"/"disk" -> tokens held now
    # counters
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    generated_tokens: int = 0
    forward_passes: int = 0
    forward_tokens: int = 0
    jump_forward_tokens: int = 0  # tokens written by jump-forward (accepted drafts + direct)
    jump_forward_rejected: int = 0  # draft tokens rolled back by verification
    lookup_draft_tokens: int = 0  # prompt-lookup draft tokens queued for verification
    lookup_accepted_tokens: int = 0  # of which verification kept
    lookup_rejected_tokens: int = 0  # of which verification rolled back
    retractions: int = 0
    closed_at_budget: int = 0  # strict requests whose value budget closing completed (they end `stop`)
    value_rewrites: int = 0  # values rolled back and written again by check-and-roll-back
    rewritten_tokens: int = 0  # tokens those rewrites dropped
    value_rewrites_exhausted: int = 0  # outputs still failing the check with no rewrite left
    evicted_tokens: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    ttft_seconds_sum: float = 0.0
    engine_seconds: float = 0.0  # time inside step()
    forward_seconds: float = 0.0  # of which the model runner's pass (the rest: scheduling, decoding, output)
    tree_seconds: float = 0.0  # of which: prefix-cache bookkeeping
    tier_counters: dict[str, int] = field(default_factory=dict)  # host/disk tier counters (hicache_*, disk_*)

    @property
    def prefix_hit_rate(self) -> float:
        """Share of admitted prompt tokens that came from the prefix cache (0 before any)."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Flat numbers (benches print them as JSON)."""
        out = {k: v for k, v in asdict(self).items() if not isinstance(v, dict)}
        out.update({f"requests_{k}": v for k, v in self.requests_finished.items()})
        out.update({f"cached_tokens_{k}": v for k, v in self.cached_tokens_by_tier.items()})
        out.update(self.tier_counters)
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out


@dataclass(frozen=True)
class PrefixExplanation:
    """How much of a prompt the cache holds, tier by tier, without generating anything.

    The tiers are nested: the device holds a prefix, the host may hold more beyond it, the disk
    more again; `cached_tokens` is where the prompt leaves the cache altogether (the sum)."""

    prompt_tokens: int
    cached_tokens: int
    by_tier: dict[str, int]  # "device" / "host" / "disk" -> tokens of the prompt found there


class EngineClient(Protocol):
    """Everything the gateway may use of an engine (the in-process `Engine`, a fake in tests, a
    remote replica later). Blocking methods are called off the event loop."""

    info: EngineInfo
    tokenizer: Any  # a Hugging Face tokenizer (encode / decode / chat template)

    @property
    def is_running(self) -> bool:
        """The step loop is alive (read without touching the engine thread)."""

    def submit(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        """Queue `req` and stream its events; raises EngineError at once on a refusal
        (prompt too long for the context or the KV pool, queue full)."""

    def abort(self, rid: str) -> None:
        """Cancel a queued or running request; its KV slots are freed (prefix stays cached)."""

    def stats(self) -> EngineStats:
        """A snapshot made on the engine thread (blocking; call it off the event loop)."""

    def explain_prefix(self, prompt_ids: list[int], namespace: str = "") -> PrefixExplanation:
        """How much of `prompt_ids` is cached (by tier), without generating anything (blocking)."""

    def pin_prefix(self, token_ids: list[int], namespace: str = "", name: str | None = None) -> int:
        """Prefill and keep resident; returns the pinned length. EngineError(code="pin_budget_exceeded")
        past the pin budget, (code="pinning_unavailable") without a prefix cache (blocking)."""

    def unpin_prefix(self, token_ids: list[int] | None = None, namespace: str = "", name: str | None = None) -> int:
        """Release a pin (by name or ids); returns the tokens released (blocking)."""

    def shutdown(self) -> None: ...
