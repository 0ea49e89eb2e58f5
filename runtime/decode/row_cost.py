"""What one more row of a decode pass costs, measured from the engine's own steps.

A prompt-lookup draft token pays when its chance of being kept beats the cost of its row as a
share of what the pass spends per output token: a pass of `t` seconds that yields `T` tokens
gains `p` tokens for `b` more seconds, and `(T + p) / (t + b) > T / t` exactly when
`p > b * T / t`. `RowCost` fits each decode step's seconds against its rows (a line, decayed so it
follows the load) and keeps `share = b / (t / T)`. On a GPU, where a row is nearly free, drafts
run long; on a CPU whose attention is compute-bound, where a row costs a real slice of the step,
they run shorter, at higher acceptance only. A fixed share (`--speculative-row-cost C`)
replaces the measurement.
"""

from __future__ import annotations

PRIOR_SHARE = 0.1  # until enough steps are seen (what the fixed default was, tuned on AMX)
# Weight of the past per observed step: the fit follows the last ~50 steps.
DECAY = 0.98
# Steps (in decayed weight) and spread of their row counts needed before the fit is used.
MIN_WEIGHT = 8.0
MIN_ROW_VARIANCE = 0.25
# The share stays within these: a slope fitted on a noisy host may come out 0 or above the step.
MIN_SHARE, MAX_SHARE = 0.01, 0.95


class RowCost:
    """The cost of one more decode row as a share of the step's cost per output token."""

    __slots__ = ("share", "measured", "steps", "w", "sx", "sy", "sxx", "sxy", "per_token")

    def __init__(self, share: float, measured: bool = True) -> None:
        self.share = share  # fixed, or the prior until enough steps are seen
        self.measured = measured
        self.steps = 0  # decode steps observed (w, their decayed weight, levels off near 50)
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.per_token = 0.0  # decayed mean of seconds per output token

    @classmethod
    def fixed(cls, share: float) -> RowCost:
        return cls(share, measured=False)

    def slope(self) -> float | None:
        """Seconds per row of the decayed line fit, or None while the rows seen vary too little."""
        if self.w < MIN_WEIGHT:
            return None
        mean_x = self.sx / self.w
        var_x = self.sxx / self.w - mean_x * mean_x
        if var_x < MIN_ROW_VARIANCE:
            return None
        return (self.sxy / self.w - mean_x * self.sy / self.w) / var_x

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        """One decode step: `rows` query rows fed, `tokens` output tokens it yielded, in `seconds`."""
        if not self.measured or rows <= 0 or tokens <= 0 or seconds <= 0.0:
            return
        self.steps += 1
        self.w = DECAY * self.w + 1.0
        self.sx = DECAY * self.sx + rows
        self.sy = DECAY * self.sy + seconds
        self.sxx = DECAY * self.sxx + rows * rows
        self.sxy = DECAY * self.sxy + rows * seconds
        self.per_token = (
            DECAY * self.per_token + (1.0 - DECAY) * (seconds / tokens) if self.per_token else seconds / tokens
        )
        b = self.slope()
        if b is not None:
            self.share = min(MAX_SHARE, max(MIN_SHARE, b / self.per_token))
