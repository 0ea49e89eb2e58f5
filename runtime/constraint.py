"""The one interface through which the runtime drives a grammar (implemented in `grammar/`).

The runtime never imports xgrammar or `grammar/` directly: a request carries a `CompiledConstraint`,
whose `new_matcher()` gives a `TokenMatcher`. The protocols below are exactly the methods the
runtime calls (decoding.py, completeness.py, intake.py) -- nothing is probed with hasattr.
Bitmasks are int32 tensors of shape [batch, ceil(vocab / 32)], bit j of word i allowing token
32 * i + j.

Strict requests (budget-aware closing, loop breaking) use the second group of methods; a matcher
that cannot plan completions says so with `supports_strict = False` and is never asked for them.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TokenMatcher(Protocol):
    # -- every constrained request ---------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token mask of the current state into `bitmask[row]`."""

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar forbids it."""

    def is_terminated(self) -> bool:
        """True once the grammar accepted its end (the stop token was accepted)."""

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Tokens the grammar forces from the current state (may be empty); not accepted yet.
        `learn=False`: the caller inserts them without the model (direct jump-forward), so the
        matcher must not take them for the model's own choices."""

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids` the grammar accepts in a row from the current
        state (state unchanged): a draft is cut there before any row is spent on it."""

    @property
    def withholds_output(self) -> bool:
        """Whether nothing of the output may be sent before it is whole (its check may roll
        some of it back: `output_verdict`)."""

    def output_verdict(self, room: int | None = None) -> int | None:
        """Once the output is whole (stop token accepted, or complete at the budget): None if it
        stands; n > 0 if the matcher found a value breaking a keyword it checks and rolled back
        its last n tokens (the runtime drops them and decodes on); < 0 if it still fails with
        every rewrite spent. `room` (strict requests): the budget left after the output; the
        rollback then leaves the rewrite's completion room in the budget."""

    # -- strict requests only (see runtime/decode/completeness.py) ---------------------------------
    @property
    def supports_strict(self) -> bool:
        """Whether the methods below are implemented (False: strict requests decode unguarded)."""

    def is_completed(self) -> bool:
        """Whether the output so far is a whole value (the stop token would be accepted)."""

    def completion_plan(self) -> list[int] | None:
        """Tokens of a shortest path from here to a complete value (None: unknown)."""

    def completion_bound_after(self, token_id: int) -> int | None:
        """Length of that path after accepting `token_id` (on a fork; None if refused or unknown)."""

    def may_expand(self, token_id: int) -> bool:
        """Whether `token_id` may commit the output to more structure (its budget is then checked)."""

    def closes_value(self, token_id: int) -> bool:
        """Whether `token_id` ends a value (loop breaking stops steering after it)."""

    def fill_plan_bitmask(self, bitmask: torch.Tensor, row: int, token_id: int) -> None:
        """Allow only `token_id` (the next token of a stored plan)."""

    def fill_closing_bitmask(
        self, bitmask: torch.Tensor, row: int, tight: bool = False, plan_token: int | None = None
    ) -> None:
        """Only tokens on a shortest completion path; `tight`: the plan's own next token only."""

    def fill_value_closing_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Only tokens that end the current value; False (mask untouched) when none is allowed now."""


class CompiledConstraint(Protocol):
    def new_matcher(self) -> TokenMatcher:
        """A fresh matcher at the grammar's start state (cheap: shares the compiled grammar)."""

    def min_completion_tokens(self) -> int | None:
        """Tokens of the smallest output the grammar allows (None: unknown). Strict requests
        whose budget is below it are refused at submission."""
