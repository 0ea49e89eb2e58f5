"""A think block, then the request's own grammar: one constraint the runtime drives as any other.

The block is its own small grammar (markers.py's `think_tag`: free text up to the end marker),
the answer the request's compiled grammar (a JSON schema, tool calls, ...) from its start state,
or nothing (free text) for a request that only needs the block bounded. `ThinkThenMatcher` runs
the block's matcher until it completes, then the answer's. The answer's grammar therefore
applies only after the block ends, and everything the runtime asks of a strict request counts
both: a completion plan is the way out of the block followed by the answer's shortest plan, so
budget-aware closing ends the block in time for the answer to complete inside `max_tokens`.

The block's way out is its end marker and what follows it, in the tokenizer's encoding: the
shortest tail of that text (with the opening marker before it, while that is being written)
which the block's matcher accepts to completion (one token where the model already wrote most
of the marker). The generic closing planner is not used inside the
block: in free text it has no reason to head for the marker. A thinking budget (tokens of the
block, its markers included) closes the block by force once spent: from then on only the way
out is allowed. Loop breaking (a block that repeats itself) closes the block the same way.

Both parts are `runtime.constraint` matchers (typed structurally: grammar imports no runtime).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_NO_BUDGET = 1 << 62
_ANSWER_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # compiled answer -> its plan from the start


class ThinkThenConstraint:
    """CompiledConstraint: `think` (the block's compiled grammar), then `answer` (None: free text)."""

    def __init__(
        self, think: Any, answer: Any | None, opening: str, way_out: str, encode: Any, budget: int | None = None
    ) -> None:
        """`opening`: the begin marker the model must write first ("" where the prompt opened the
        block); `way_out`: the end marker and what follows it; `encode(text)`: the tokenizer's ids."""
        self.think = think
        self.answer = answer
        # the texts that may end the block from some state, shortest first: a tail of the whole
        # way (the opening too, while it is still being written)
        whole = opening + way_out
        self._tails = [encode(whole[i:]) for i in range(len(whole) - 1, -1, -1)]
        self.budget = _NO_BUDGET if budget is None else max(0, int(budget))
        self._memo: dict[str, Any] = {}

    def new_matcher(self) -> ThinkThenMatcher:
        return ThinkThenMatcher(self)

    def min_completion_tokens(self) -> int | None:
        if "min" not in self._memo:
            self._memo["min"] = _length(self.new_matcher().completion_plan())
        return self._memo["min"]

    def answer_plan(self) -> list[int] | None:
        """The answer's shortest completion from its start ([] for free text): the same for every
        request of that grammar, so planned once per compiled answer (a large schema's plan is
        milliseconds), not once per request."""
        if self.answer is None:
            return []
        try:
            return _ANSWER_PLANS[self.answer]
        except KeyError:
            plan = _ANSWER_PLANS[self.answer] = self.answer.new_matcher().completion_plan()
            return plan
        except TypeError:  # a handle that cannot be weakly referenced: planned per constraint
            if "answer" not in self._memo:
                self._memo["answer"] = self.answer.new_matcher().completion_plan()
            return self._memo["answer"]

    def answer_plan_length(self) -> int | None:
        return _length(self.answer_plan())

    def __getattr__(self, name: str) -> Any:
        # the answer's report (fidelity, value check...) is the request's
        if name in ("think", "answer", "budget", "_memo", "_tails"):
            raise AttributeError(name)
        return getattr(self.answer, name)


def _length(plan: list[int] | None) -> int | None:
    return None if plan is None else len(plan)


class ThinkThenMatcher:
    def __init__(self, constraint: ThinkThenConstraint) -> None:
        self.constraint = constraint
        self.think = constraint.think.new_matcher()
        self.answer = None if constraint.answer is None else constraint.answer.new_matcher()
        self.in_block = True
        self.block_tokens = 0
        self._closed_now = False  # the last accepted token ended the block
        self._way_out: list[int] | None = None
        self._way_out_at = -1  # block_tokens when _way_out was found

    # -- every constrained request -------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.in_block:
            if self.block_tokens >= self.constraint.budget:
                self._close_block(bitmask, row)  # the budget is spent: close it
            else:
                self.think.fill_bitmask(bitmask, row)
        elif self.answer is not None:
            self.answer.fill_bitmask(bitmask, row)
        else:
            bitmask[row] = -1

    def accept(self, token_id: int) -> bool:
        self._closed_now = False
        if not self.in_block:
            return True if self.answer is None else self.answer.accept(token_id)
        if not self.think.accept(token_id):
            return False
        self.block_tokens += 1
        if self.think.is_completed():
            self.in_block = False
            self._closed_now = True
        return True

    def is_terminated(self) -> bool:
        return not self.in_block and self.answer is not None and self.answer.is_terminated()

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        if self.in_block:
            return self.think.jump_forward_tokens(learn) if self.block_tokens < self.constraint.budget else []
        return [] if self.answer is None else self.answer.jump_forward_tokens(learn)

    def valid_prefix(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` accepted in a row (state unchanged): the block's, then
        the answer's from its start once they close the block. A draft stops where the thinking
        budget is spent (the way out is then forced, not drafted)."""
        if not self.in_block:
            return len(token_ids) if self.answer is None else self.answer.valid_prefix(token_ids)
        room = self.constraint.budget - self.block_tokens
        taken = 0
        closed = False
        for t in token_ids:
            if taken >= room or not self.think.accept(t):
                break
            taken += 1
            if self.think.is_completed():
                closed = True
                break
        self.think.rollback(taken)
        if not closed:
            return taken
        rest = token_ids[taken:]
        return taken + (len(rest) if self.answer is None else self.answer.valid_prefix(rest))

    @property
    def withholds_output(self) -> bool:
        return self.answer is not None and self.answer.withholds_output

    def output_verdict(self, room: int | None = None) -> int | None:
        return None if self.answer is None else self.answer.output_verdict(room)

    # -- strict requests -------------------------------------------------------------------------
    @property
    def supports_strict(self) -> bool:
        return self.think.supports_strict and (self.answer is None or self.answer.supports_strict)

    def is_completed(self) -> bool:
        if self.in_block:
            return False
        return True if self.answer is None else self.answer.is_completed()

    def way_out(self) -> list[int] | None:
        """The block's shortest way out from here (tokens; None: none of the tails completes it)."""
        if self._way_out_at != self.block_tokens:
            self._way_out, self._way_out_at = self._find_way_out(), self.block_tokens
        return self._way_out

    def _find_way_out(self) -> list[int] | None:
        for ids in self.constraint._tails:
            taken = 0
            for t in ids:
                if not self.think.accept(t):
                    break
                taken += 1
            done = taken == len(ids) and self.think.is_completed()
            self.think.rollback(taken)
            if done:
                return list(ids)
        return None

    def _answer_plan(self) -> list[int] | None:
        return [] if self.answer is None else self.answer.completion_plan()

    def completion_plan(self) -> list[int] | None:
        if not self.in_block:
            return self._answer_plan()
        way_out = self.way_out()
        answer = self.constraint.answer_plan()  # the answer's matcher is still at its start
        return None if way_out is None or answer is None else way_out + answer

    def completion_bound_after(self, token_id: int) -> int | None:
        if not self.in_block:
            return 0 if self.answer is None else self.answer.completion_bound_after(token_id)
        answer = self.constraint.answer_plan_length()
        if answer is None or not self.think.accept(token_id):
            return None
        try:
            way_out = [] if self.think.is_completed() else self._find_way_out()
        finally:
            self.think.rollback(1)
        return None if way_out is None else len(way_out) + answer

    def may_expand(self, token_id: int) -> bool:
        if self.in_block:
            return False  # the block is free text: no token commits it to more
        return self.answer is not None and self.answer.may_expand(token_id)

    def closes_value(self, token_id: int) -> bool:
        if self.in_block or self._closed_now:  # (asked after the token): the block's end closes it
            return self._closed_now
        return self.answer is not None and self.answer.closes_value(token_id)

    def fill_plan_bitmask(self, bitmask: torch.Tensor, row: int, token_id: int) -> None:
        # the answer's own: its value check may clear a plan token that would repeat an item
        part = self.think if self.in_block or self.answer is None else self.answer
        part.fill_plan_bitmask(bitmask, row, token_id)

    def _close_block(self, bitmask: torch.Tensor, row: int, plan_token: int | None = None) -> None:
        plan = self.way_out()
        token = plan_token if plan_token is not None else (plan[0] if plan else None)
        if token is None:
            self.think.fill_bitmask(bitmask, row)
        else:
            self.think.fill_plan_bitmask(bitmask, row, token)

    def fill_closing_bitmask(
        self, bitmask: torch.Tensor, row: int, tight: bool = False, plan_token: int | None = None
    ) -> None:
        if self.in_block:
            self._close_block(bitmask, row, plan_token)
        elif self.answer is not None:
            self.answer.fill_closing_bitmask(bitmask, row, tight, plan_token)
        else:
            bitmask[row] = -1

    def fill_value_closing_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        if self.in_block:  # a block that repeats itself: its way out
            self._close_block(bitmask, row)
            return True
        return self.answer is not None and self.answer.fill_value_closing_bitmask(bitmask, row)
