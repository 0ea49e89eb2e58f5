"""Strict JSON always completes: budget-aware closing and loop breaking (the engine's side).

A grammar guarantees each token's form, not that the value ever ends. For strict requests the
engine keeps a bound on how many tokens the grammar still needs to reach a complete value
(the length of `matcher.completion_plan()`, simulated on a forked matcher) and, once the remaining budget comes
within that bound, switches to *closing*: only tokens on a shortest completion path stay allowed,
the model choosing among them. Separately, when the output degenerates into repetition (the same
token pattern again and again, a number growing digit by digit), the current value is steered to
close at the next point the grammar allows; inside a string, repetition is also judged on its
characters (a URL or a path that keeps re-growing), and a run without whitespace has a length cap.
A run of digits (a number's integer part, fraction or exponent) is bounded: once it holds
`max_number_digits` (16 by default, `--max-number-digits`) the number ends at the next token the
grammar allows: a closer, or the stop token where the number is the whole output (so no run is
longer where each digit is one token, as in SmolLM2's vocabulary); where no token can end it yet
(a `minimum` not reached), the shortest completion plan leads it to the nearest end.
Neither fires on well-behaved output, so such output is identical to plain constrained decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.constraint import TokenMatcher

CLOSING_MARGIN = 3  # extra tokens kept in hand: the model's closing choices may differ from the simulation's
RECHECK_EVERY = 16  # recompute the bound this often (tokens) while far from the budget
CHECK_SLACK = 24  # ...and every token once the budget is within bound + this
# The longest completion plan there is (grammar/checks/closing.py's MAX_PLAN_TOKENS; a longer one is "no
# plan"). One token can raise the bound by any amount up to this (`,{` opening an item with dozens
# of required properties), so while the budget left is within FAR_TOKENS every expanding token is
# checked before it is taken; beyond it, no bound that exists can outgrow the budget before the
# next scheduled re-check.
MAX_BOUND = 1024
FAR_TOKENS = MAX_BOUND + CHECK_SLACK + RECHECK_EVERY

# Repetition: a suffix made of >= MIN_REPEATS copies of a pattern of <= MAX_PERIOD tokens,
# spanning >= MIN_SPAN tokens.
MIN_REPEATS = 3
MIN_SPAN = 12
MAX_PERIOD = 16
MAX_DIGITS = 16  # a run of this many digits must end: a runaway number (the default of --max-number-digits)

# Repetition inside a string, judged on characters (token splits of a repeated URL or path vary
# from copy to copy): within the last TEXT_WINDOW characters of the current text run, a span
# that is exactly periodic, or whose 8-grams are mostly repeats ("https://a.b/1/https://a.b/2/").
TEXT_TAIL = 256  # characters of output the engine hands the guard after each token
TEXT_WINDOW = 160
MIN_TEXT_SPAN = 48  # shorter runs are never judged repetitive
MAX_TEXT_PERIOD = 64
GRAM = 8
MAX_DISTINCT_GRAMS = 0.55  # share of distinct 8-grams at or below which a run repeats itself
MAX_RUN = 200  # a run without whitespace or quote (a URL, a path) longer than this is a runaway


def has_periodic_suffix(
    ids: list[int], min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN, max_period: int = MAX_PERIOD
) -> bool:
    n = len(ids)
    for period in range(1, max_period + 1):
        span = max(min_span, period * min_repeats)
        if span > n:
            break
        tail = ids[n - span :]
        if tail[period:] == tail[:-period]:
            return True
    return False


def trailing_digits(text_tail: str) -> int:
    """How many digits end `text_tail` (an ASCII run: a number's integer part, fraction or exponent)."""
    digits = 0
    for ch in reversed(text_tail):
        if not "0" <= ch <= "9":
            break
        digits += 1
    return digits


def runaway_number(text_tail: str, max_digits: int = MAX_DIGITS) -> bool:
    return trailing_digits(text_tail) >= max_digits


def current_run(text_tail: str) -> str:
    """The text since the last quote: the current string's content (or a number, a literal)."""
    return text_tail.rpartition('"')[2]


def repetitive_text(text_tail: str) -> bool:
    """Does the current run end in repeated text: a period of <= MAX_TEXT_PERIOD characters seen
    >= MIN_REPEATS times, or a window made mostly of repeated 8-grams (near-copies)?"""
    run = current_run(text_tail)[-TEXT_WINDOW:]
    if len(run) < MIN_TEXT_SPAN:
        return False
    for period in range(1, MAX_TEXT_PERIOD + 1):
        span = max(MIN_TEXT_SPAN, period * MIN_REPEATS)
        if span > len(run):
            break
        tail = run[-span:]
        if tail[period:] == tail[:-period]:
            return True
    grams = [run[i : i + GRAM] for i in range(len(run) - GRAM + 1)]
    return len(set(grams)) <= MAX_DISTINCT_GRAMS * len(grams)


def runaway_run(text_tail: str) -> bool:
    """A string that grew past MAX_RUN characters without a space: a URL or path gone on too long."""
    run = current_run(text_tail)
    return len(run) > MAX_RUN and not any(c.isspace() for c in run[-MAX_RUN - 1 :])


@dataclass
class CompletionGuard:
    """Per-request state of closing and loop breaking.

    While closing, the request follows the plan made when closing began (or when the model last
    left it): the model may choose another allowed token, but a plan re-computed from a later
    state could differ from the rest of the stored one (the planner avoids states it has met on
    its own path), and only the stored one is known to fit the budget."""

    loop_breaking: bool = True
    max_number_digits: int = MAX_DIGITS
    closing: bool = False  # budget closing: stays on until the value is complete
    close_value: bool = False  # loop breaking: close the current value at the next chance
    bound: int | None = None
    tight: bool = False
    checked_at: int = -1
    loops_broken: int = 0
    in_digits: bool = False  # the loop being broken ends in a digit run: it must end even where no closer fits yet
    plan: list[int] | None = None  # the last plan's tokens (None: unknown, or left by the output)
    plan_at: int = 0  # output length when `plan` was made
    _next: int | None = None  # closing: index in `plan` of the token being chosen
    _at: int = 0  # output length at the last `before_choice`
    _vetted: tuple[int, int] | None = None  # (token, bound after it) of the last check `allows` made

    def restart(self) -> None:
        """Forget plans and closing after the output was rolled back (a value written again)."""
        self.closing = self.close_value = self.tight = self.in_digits = False
        self.bound = self.plan = self._next = self._vetted = None
        self.checked_at = -1
        self.plan_at = self._at = 0

    def _replan(self, matcher: TokenMatcher, produced: int) -> None:
        self.plan = matcher.completion_plan()
        self.bound = None if self.plan is None else len(self.plan)
        self.plan_at = produced

    def before_choice(self, matcher: TokenMatcher, produced: int, max_new: int) -> None:
        """Decide whether the next token must be on a shortest completion path."""
        remaining = max_new - produced
        self._next = None
        self._at = produced
        self._vetted = None
        if not self.closing:
            # Where the last plan found none (no completion within MAX_BOUND tokens: a schema
            # whose greedy plan writes optional properties), replanning on every token would walk
            # that far again for each one (seconds a token on a large schema): every RECHECK_EVERY.
            due = (
                self.checked_at < 0
                or produced - self.checked_at >= RECHECK_EVERY
                or (self.bound is not None and remaining <= self.bound + CHECK_SLACK)
            )
            if due:
                self._replan(matcher, produced)
                self.checked_at = produced
            if self.bound is None or remaining > self.bound + CLOSING_MARGIN:
                return
            self.closing = True
        idx = produced - self.plan_at
        if self.plan is None or not 0 <= idx <= len(self.plan):
            self._replan(matcher, produced)  # the model left the plan (or there was none)
            idx = 0
        if self.plan is None:  # no plan known: the closing mask plans on its own
            self.tight = True
            return
        self.bound = len(self.plan) - idx
        self.tight = remaining <= self.bound + 1  # no slack left: the plan's token only
        if idx < len(self.plan):
            self._next = idx

    def allows(self, matcher: TokenMatcher, token_id: int, remaining: int) -> bool:
        """May the model's choice `token_id` be taken with `remaining` tokens of budget left
        (this one included)? Not if it commits the output to more than the rest of the budget can
        complete (a new array item of a large object, say): one token can raise the bound by more
        than CLOSING_MARGIN, so near the budget such tokens are checked before they are taken.
        The bound a check finds becomes the guard's bound once the token is taken (`after_token`):
        a bound left at its value from before the token would let the budget run past it
        before the next re-check noticed."""
        if self.bound is None:
            return True
        if self.closing:
            if self.tight or self._next is None or token_id == self.plan[self._next]:
                return True
        elif remaining > FAR_TOKENS:
            return True
        elif not matcher.may_expand(token_id):
            return True
        else:
            idx = self._at - self.plan_at
            if self.plan is not None and 0 <= idx < len(self.plan) and token_id == self.plan[idx]:
                self._vetted = (token_id, len(self.plan) - idx - 1)  # the stored plan's own next token
                return True
        after = matcher.completion_bound_after(token_id)
        ok = after is not None and after <= remaining - 1
        if ok:
            self._vetted = (token_id, after)
        return ok

    def allows_unchosen(self, matcher: TokenMatcher, token_id: int, remaining: int) -> bool:
        """May forced `token_id` go in without the model choosing it (direct jump-forward)? Call
        after `before_choice`. While closing, only the plan's own next token may: a forced span
        split into more tokens than the plan's would spend budget the plan counted on."""
        if self.closing:
            return self.plan is not None and self._next is not None and token_id == self.plan[self._next]
        return self.allows(matcher, token_id, remaining)

    def fallback_token(self, matcher: TokenMatcher) -> int | None:
        """A token that is always allowed: the next one on a shortest completion path."""
        if self.closing and self._next is not None:
            return self.plan[self._next]
        plan = matcher.completion_plan()
        return plan[0] if plan else None

    def after_token(self, output_ids: list[int], text_tail: str, closed_value: bool) -> None:
        if self.plan is not None:  # still on the stored plan?
            idx = len(output_ids) - 1 - self.plan_at
            if not (0 <= idx < len(self.plan) and self.plan[idx] == output_ids[-1]):
                self.plan = None
        if self._vetted is not None and not self.closing:
            token, after = self._vetted
            self._vetted = None
            if output_ids and output_ids[-1] == token:  # the checked token was taken: its bound is now
                self.bound = after
                self.checked_at = len(output_ids)
        if self.close_value and closed_value:
            self.close_value = False
        if self.loop_breaking and not self.closing and not self.close_value:
            if (
                has_periodic_suffix(output_ids)
                or runaway_number(text_tail, self.max_number_digits)
                or repetitive_text(text_tail)
                or runaway_run(text_tail)
            ):
                self.close_value = True
                self.in_digits = trailing_digits(text_tail) > 0
                self.loops_broken += 1

    def fill_mask(self, matcher: TokenMatcher, mask: torch.Tensor, row: int) -> None:
        if self.closing:
            if self._next is not None:
                token = self.plan[self._next]
                if self.tight:
                    matcher.fill_plan_bitmask(mask, row, token)
                else:
                    matcher.fill_closing_bitmask(mask, row, False, plan_token=token)
            else:
                matcher.fill_closing_bitmask(mask, row, self.tight)
        elif self.close_value:
            if matcher.fill_value_closing_bitmask(mask, row):
                return
            if self.in_digits:  # nothing ends the number yet: the shortest way to an end, not more digits
                matcher.fill_closing_bitmask(mask, row, False)
            else:
                matcher.fill_bitmask(mask, row)
        else:
            matcher.fill_bitmask(mask, row)
