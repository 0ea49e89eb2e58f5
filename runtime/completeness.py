"""Strict JSON always completes: budget-aware closing and loop breaking (the engine's side).

A grammar guarantees each token's form, not that the value ever ends. For strict requests the
engine keeps a bound on how many tokens the grammar still needs to reach a complete value
(`matcher.completion_bound()`, simulated on a forked matcher) and, once the remaining budget comes
within that bound, switches to *closing*: only tokens on a shortest completion path stay allowed,
the model choosing among them. Separately, when the output degenerates into repetition (the same
token pattern again and again, a number growing digit by digit), the current value is steered to
close at the next point the grammar allows. Neither fires on well-behaved output, so such output is
identical to plain constrained decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CLOSING_MARGIN = 3  # extra tokens kept in hand: the model's closing choices may differ from the simulation's
RECHECK_EVERY = 16  # recompute the bound this often (tokens) while far from the budget
CHECK_SLACK = 24  # ...and every token once the budget is within bound + this

# Repetition: a suffix made of >= MIN_REPEATS copies of a pattern of <= MAX_PERIOD tokens,
# spanning >= MIN_SPAN tokens.
MIN_REPEATS = 3
MIN_SPAN = 12
MAX_PERIOD = 16
MAX_DIGITS = 16  # a number longer than this is a runaway


def has_periodic_suffix(ids: list[int], min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN,
                        max_period: int = MAX_PERIOD) -> bool:
    n = len(ids)
    for period in range(1, max_period + 1):
        span = max(min_span, period * min_repeats)
        if span > n:
            break
        tail = ids[n - span :]
        if tail[period:] == tail[:-period]:
            return True
    return False


def runaway_number(text_tail: str) -> bool:
    digits = 0
    for ch in reversed(text_tail):
        if not ch.isdigit():
            break
        digits += 1
    return digits > MAX_DIGITS


@dataclass
class CompletionGuard:
    """Per-request state of closing and loop breaking."""

    loop_breaking: bool = True
    closing: bool = False  # budget closing: stays on until the value is complete
    close_value: bool = False  # loop breaking: close the current value at the next chance
    bound: int | None = None
    tight: bool = False
    checked_at: int = -1
    loops_broken: int = 0

    def before_choice(self, matcher, produced: int, max_new: int) -> None:
        """Decide whether the next token must be on a shortest completion path."""
        remaining = max_new - produced
        if self.closing:
            # Re-plan every token while closing (a few steps at most); with no slack left, follow
            # the plan token for token.
            self.bound = matcher.completion_bound()
            self.tight = self.bound is None or remaining <= self.bound + 1
            return
        due = self.bound is None or produced - self.checked_at >= RECHECK_EVERY or remaining <= self.bound + CHECK_SLACK
        if due:
            self.bound = matcher.completion_bound()
            self.checked_at = produced
        if self.bound is not None and remaining <= self.bound + CLOSING_MARGIN:
            self.closing = True

    def after_token(self, output_ids: list[int], text_tail: str, closed_value: bool) -> None:
        if self.close_value and closed_value:
            self.close_value = False
        if self.loop_breaking and not self.closing and not self.close_value:
            if has_periodic_suffix(output_ids) or runaway_number(text_tail):
                self.close_value = True
                self.loops_broken += 1

    def fill_mask(self, matcher, mask: torch.Tensor, row: int) -> None:
        if self.closing:
            matcher.fill_closing_bitmask(mask, row, self.tight)
        elif self.close_value:
            if not matcher.fill_value_closing_bitmask(mask, row):
                matcher.fill_bitmask(mask, row)
        else:
            matcher.fill_bitmask(mask, row)
