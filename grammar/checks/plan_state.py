"""What grammar/checks/closing.py's planner knows of a matcher's state: the `PlanMatcher` interface it
drives, and the plans a request keeps by the exact state they start from.

Strict mode's guard (runtime/decode/completeness.py) walks the same plans again and again: the budget
check of a token walks a plan from the state after it, and once the token is taken the next re-plan
walks from that same state; the check of each token of a forced name walks on from the same state
after that name. A walk is a function of where it starts (the grammar state and the name hint's state)
and of the answers `_way_out` keeps by signature; after forced text (where a walk forgets the states it
met) the rest of a plain walk is a function of the state there. So a matcher that knows its state
exactly (`plan_key`: xgrammar's and llguidance's, `exact_key` of the tokens the engine accepted since
the grammar's start; a mask signature is not a state's identity) keeps its plans, and the rests of its
plain walks after forced text: a later walk from the same state takes the kept one, which is the walk
it would make, since the kept answers it would read are the ones the first walk read or stored. What a
walk whose way-out search was cut short by its budget found is not kept (a later walk, with more
answers kept, may find more).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from grammar.checks.plan_names import NameTail

MAX_KEPT = 256  # plans and rests kept per request (the oldest goes first): most are re-used within a few tokens

Walk = Callable[[], "tuple[list[int] | None, bool]"]  # (plan, whether it may be kept)


class PlanMatcher(Protocol):
    """What the planner needs from an engine's matcher: one grammar state it can copy, mask,
    advance and roll back. The stop token is never given to it (termination is the caller's).
    Optionally `plan_key()` (the exact state, or None) and `plans()` (the request's kept plans)."""

    def fork(self) -> PlanMatcher:
        """An independent copy of this state."""

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (xgrammar's layout)."""

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar forbids it."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    def is_completed(self) -> bool:
        """Whether the value may end here (the stop token would be allowed)."""

    def forced_tokens(self) -> list[int]:
        """The forced text from here in the model's tokens, not accepted ([] at a choice)."""

    def state_detail(self) -> bytes:
        """What tells apart two states with the same mask, beyond the mask (b"" if nothing)."""

    def names(self) -> NameTail | None:
        """The schema's required names and the name written so far here (None: no hint)."""

    def way_outs(self) -> dict[bytes, int | None]:
        """`_way_out`'s answers by state, shared by forks (one grammar, one request)."""


def exact_key(history: list[int] | None, names: NameTail | None) -> tuple | None:
    """A matcher's `plan_key`: the tokens the engine accepted since the grammar's start and the name
    hint's state (None where the tokens are not known)."""
    if history is None:
        return None
    return tuple(history), None if names is None else names.state()


def _key(m) -> tuple | None:
    key_of = getattr(m, "plan_key", None)
    return None if key_of is None else key_of()


def _keep(memo: dict, key, value) -> None:
    if len(memo) >= MAX_KEPT:
        del memo[next(iter(memo))]
    memo[key] = value


def kept_plan(matcher, limit: int, walk: Walk) -> list[int] | None:
    """The plan `walk` makes from `matcher`'s state, or the one kept for that exact state."""
    key = _key(matcher)
    if key is None:
        return walk()[0]
    memo, key = matcher.plans(), (key, limit)
    if key in memo:
        plan = memo[key]
        return None if plan is None else list(plan)
    plan, pure = walk()
    if pure:
        _keep(memo, key, None if plan is None else tuple(plan))
    return plan


class Rests:
    """One plain walk's points after forced text, and the rests kept from them."""

    __slots__ = ("_m", "_memo", "_points")

    def __init__(self, m) -> None:
        self._m, self._memo = m, m.plans()
        self._points: list[tuple[tuple, int]] = []  # (key, plan length there) of the points met

    @staticmethod
    def of(m) -> Rests | None:
        """For a walk on fork `m` (None where its state is not known exactly)."""
        return Rests(m) if _key(m) is not None else None

    def at(self, length: int) -> tuple[int, ...] | None:
        """The kept rest of a walk from `m`'s state now, just after forced text, with `length` plan
        tokens before it; None where none is kept (the point is noted, to keep this walk's rest)."""
        key = ("rest", _key(self._m))
        rest = self._memo.get(key)
        if rest is None:
            self._points.append((key, length))
        return rest

    def keep(self, plan: list[int], pure: bool) -> None:
        """The walk ended complete with `plan`: keep its rest from each point noted (if `pure`)."""
        if pure:
            for key, length in self._points:
                _keep(self._memo, key, tuple(plan[length:]))
