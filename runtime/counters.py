"""The engine's cumulative counters, typed (the numbers behind `EngineStats`).

Owned by the engine thread: the scheduler, cache manager, decoder and engine add to one shared
`EngineCounters` while they run a step; other threads only ever see copies (`Engine.stats()`
builds its snapshot on the engine thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class EngineCounters:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    forward_passes: int = 0
    forward_tokens: int = 0
    jump_forward_tokens: int = 0
    jump_forward_rejected: int = 0
    lookup_draft_tokens: int = 0
    lookup_accepted_tokens: int = 0
    lookup_rejected_tokens: int = 0
    retractions: int = 0
    closed_at_budget: int = 0
    value_rewrites: int = 0
    rewritten_tokens: int = 0
    value_rewrites_exhausted: int = 0
    requests_finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    ttft_seconds_sum: float = 0.0
    engine_seconds: float = 0.0
    forward_seconds: float = 0.0  # the model runner's share of engine_seconds
    tree_seconds: float = 0.0

    def count_finished(self, reason: str) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, {} if f.name == "requests_finished" else type(getattr(self, f.name))())

    def copy_values(self) -> dict:
        """Field values for an EngineStats snapshot (the dict copied, not shared)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["requests_finished"] = dict(self.requests_finished)
        return out
