"""Per-request sampling parameters (the engine's view; the gateway maps OpenAI fields onto these)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    min_p: float = 0.0
    seed: int | None = None  # per-request generator: the same seed gives the same output
    stop: list[str] = field(default_factory=list)  # stop strings, never included in the text
    stop_token_ids: list[int] = field(default_factory=list)  # extra ids besides the model's EOS
    ignore_eos: bool = False
    # Log-probabilities of the chosen tokens: None = off (nothing computed), k = also the k most
    # likely alternatives (0..MAX_TOP_LOGPROBS). See runtime/logprobs.py for what they are.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens: must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p: must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k: must be -1 (off) or >= 1")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p: must be in [0, 1]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs: must be in [0, {MAX_TOP_LOGPROBS}]")
