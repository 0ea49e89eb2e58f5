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
    # likely alternatives (0..MAX_TOP_LOGPROBS). See runtime/decode/logprobs.py for what they are.
    logprobs: int | None = None
    # Penalties and biases (runtime/decode/penalties.py), applied to the logits before the grammar mask,
    # so a token the mask forbids stays forbidden whatever its bias.
    presence_penalty: float = 0.0  # subtracted once from each token already in the output (OpenAI)
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output (OpenAI)
    repetition_penalty: float = (
        1.0  # divides positive / multiplies negative logits of prompt and output tokens (CTRL, HF)
    )
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # the stop tokens are forbidden until this many tokens are out

    @property
    def adjusts_logits(self) -> bool:
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )

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
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name}: must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError("repetition_penalty: must be in (0, 2]")
        if any(not -100 <= b <= 100 for b in self.logit_bias.values()):
            raise ValueError("logit_bias: each bias must be in [-100, 100]")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError("min_tokens: must be in [0, max_tokens]")
