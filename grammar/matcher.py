"""Per-request grammar state for the engine (implements runtime.constraint.TokenMatcher).

Each request gets its own `XGrammarMatcher` over a shared compiled grammar. Besides masking,
it drafts jump-forward tokens: the text the grammar forces from the current state, tokenized the
way the model was seen to write it (`grammar/draft_split.py`; the tokenizer's own encoding where
nothing was seen yet), cut to the longest prefix the grammar accepts so the draft is always
grammar-valid (the engine then verifies it against the model). While a drafted span is being
written, each accepted token teaches the shared splitter how the model splits that text.

For JSON kinds and tool calls a value check (grammar/value_check.py) rides along: every mask it
fills (plain, closing, loop breaking) has the tokens the check forbids cleared (a repeated name or
unique item, an object closed before its dependentRequired names), drafts stop before such a
token, and a completion plan that would write one has that token replaced by another the check
allows (a character that grows the name first) and is re-planned from there, or is dropped.
Bounds count the repaired plan where it is longer (`completion_bound`, and `completion_bound_after`
while a unique array is open), so strict mode's budget and its smallest accepted budget hold for
outputs whose next items must differ from the earlier ones.
"""

from __future__ import annotations

import xgrammar as xgr

from grammar.closing import (
    ClosingVocab,
    completion_bound,
    completion_bound_after,
    completion_plan,
    fill_closing_bitmask,
    fill_plan_bitmask,
    fill_value_closing_bitmask,
)
from grammar.draft_split import DraftSplitter, Encode, ForcedSpanWatch
from grammar.token_mask import allow_only
from grammar.value_check import ValueCheck, without_repeats

MAX_PLAN_REPAIRS = 4  # repeats replaced in one completion plan before it is given up
MAX_REPAIR_CHOICES = 8  # other tokens tried in place of one that would write a repeat


class XGrammarMatcher:
    __slots__ = ("_matcher", "_encode", "_special_ids", "_closing", "_splitter", "_watch", "values")

    def __init__(self, compiled: xgr.CompiledGrammar, encode: Encode, special_ids: frozenset[int],
                 closing: ClosingVocab | None = None, splitter: DraftSplitter | None = None,
                 values: ValueCheck | None = None) -> None:
        # Rollback is unlimited in xgrammar >= 0.2 (max_rollback_tokens is deprecated), which
        # jump-forward verification relies on.
        self._matcher = xgr.GrammarMatcher(compiled)
        self._encode = encode
        self._special_ids = special_ids
        self._closing = closing
        self._splitter = splitter
        self._watch: ForcedSpanWatch | None = None  # the drafted span being written, if any
        self.values = values  # repeated names/items are masked out (None: not a JSON kind)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU tensor, xgrammar layout).

        A terminated matcher allows only its stop tokens (xgrammar itself raises), so a batch
        that still holds a finished request needs no special case.
        """
        if self._matcher.is_terminated():
            allow_only(bitmask, row, self._matcher.stop_token_ids)
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        self._ban(bitmask, row)

    def _ban(self, bitmask, row: int) -> None:
        if self.values is not None and not self._matcher.is_terminated():
            self.values.ban(bitmask, row)

    def accept(self, token_id: int) -> bool:
        ok = self._matcher.accept_token(int(token_id))
        if ok and self.values is not None:
            self.values.accept(int(token_id))
        if ok and self._watch is not None and not self._watch.accepted(int(token_id)):
            self._watch = None
        return ok

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            if self.values is not None:
                self.values.rollback(num_tokens)
            self._watch = None

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def is_completed(self) -> bool:
        return self._matcher.is_completed()

    def jump_forward_string(self) -> str:
        """The text the grammar forces from here ('' when the model has a choice)."""
        if self._matcher.is_terminated():
            return ""
        return self._matcher.find_jump_forward_string()

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Forced tokens, not accepted: the forced text split as the model was seen to write it
        (else the tokenizer's own encoding), cut to the longest prefix the matcher accepts
        (checked by accepting, then rolling back). `learn`: the tokens accepted next are the
        model's choices (verify), so let them teach the splitter; False for tokens inserted
        without the model (direct)."""
        text = self.jump_forward_string()
        if not text:
            return []
        if self._splitter is None:
            draft = self._encode(text)
        else:
            draft = self._splitter.split(text)
            self._watch = ForcedSpanWatch(self._splitter, text) if learn else None
        accepted = 0
        for token_id in draft:
            # a forced text that spells a special token (e.g. "<|im_end|>") is not that token
            if token_id in self._special_ids or not self._matcher.accept_token(token_id):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return without_repeats(self.values, draft[:accepted])

    # -- strict completeness (see grammar/closing.py) ---------------------------------------

    @property
    def supports_strict(self) -> bool:
        # The guard runs even without a closing vocabulary (it then never closes), as before.
        return True

    def completion_bound(self) -> int | None:
        """Upper bound on the tokens needed to reach a complete value from here (with a value
        check: the longer of the grammar's plan and the plan repaired around repeats, which a
        unique array whose minItems asks for distinct items needs)."""
        if not self._closing:
            return None
        bound = completion_bound(self._matcher, self._closing, self._encode)
        if bound is None or self.values is None:
            return bound
        plan = self.completion_plan()
        return bound if plan is None else max(bound, len(plan))

    def completion_plan(self) -> list[int] | None:
        """The tokens of that bound's path (what a request follows once its budget is tight)."""
        if not self._closing:
            return None
        plan = completion_plan(self._matcher, self._closing, self._encode)
        return plan if plan is None or self.values is None else self._repaired(plan)

    def _repaired(self, plan: list[int]) -> list[int] | None:
        """`plan` with each token that would repeat a name or an item replaced by another the
        check allows (a single character that grows the name first), re-planned from there."""
        for _ in range(MAX_PLAN_REPAIRS):
            cut = self.values.first_violation(plan)
            if cut is None:
                return plan
            fork = self._matcher.fork()
            if not all(fork.accept_token(t) for t in plan[:cut]):
                return None
            mask = xgr.allocate_token_bitmask(1, self._closing.vocab_size)
            fork.fill_next_token_bitmask(mask, 0)
            for choice in self.values.ban_after(plan[:cut], mask, 0)[:MAX_REPAIR_CHOICES]:
                if choice in self._special_ids or not fork.accept_token(choice):
                    continue
                rest = completion_plan(fork, self._closing, self._encode)
                if rest is not None:
                    plan = plan[:cut] + [choice] + rest
                    break
                fork.rollback(1)
            else:
                return None
        return plan if self.values.first_violation(plan) is None else None

    def may_expand(self, token_id: int) -> bool:
        """Whether `token_id` may commit the output to more structure (so its budget is checked)."""
        return self._closing is not None and token_id in self._closing.expanding

    def completion_bound_after(self, token_id: int) -> int | None:
        """`completion_bound` after accepting `token_id` (on a fork; None if refused or unknown).
        With a value check the token is accepted here and rolled back, so that the bound counts
        the plan repaired around repeats (a new item of a unique array that must differ)."""
        if self._closing is None or self._matcher.is_terminated():
            return None
        bound = completion_bound_after(self._matcher, self._closing, self._encode, token_id)
        if bound is None or self.values is None or not self.values.may_steer():
            return bound
        if not self._matcher.accept_token(int(token_id)):
            return None
        self.values.accept(int(token_id))
        try:
            plan = self.completion_plan()
        finally:
            self._matcher.rollback(1)
            self.values.rollback(1)
        return bound if plan is None else max(bound, len(plan))

    def fill_plan_bitmask(self, bitmask, row: int, token_id: int) -> None:
        """Allow only `token_id` (the next token of a plan from `completion_plan`)."""
        fill_plan_bitmask(bitmask, row, token_id)
        self._ban(bitmask, row)

    def fill_closing_bitmask(self, bitmask, row: int, tight: bool = False, plan_token: int | None = None) -> None:
        """Closing mode: only tokens on a shortest completion path (the stop token once complete);
        `tight`: only the plan's own next token; `plan_token`: that token, from a stored plan."""
        if self._closing is None or self._matcher.is_terminated():
            self.fill_bitmask(bitmask, row)
            return
        fill_closing_bitmask(self._matcher, self._closing, self._encode, bitmask, row, tight, plan_token)
        if self.values is not None and self.values.ban(bitmask, row) < 0 and plan_token is None:
            # closing's own one-step planner does not know the check: take the repaired plan's token
            plan = self.completion_plan()
            if plan:
                fill_plan_bitmask(bitmask, row, plan[0])

    def fill_value_closing_bitmask(self, bitmask, row: int) -> bool:
        """Loop breaking: only tokens that end the current value; False when none is allowed now."""
        if self._closing is None or self._matcher.is_terminated():
            return False
        if not fill_value_closing_bitmask(self._matcher, self._closing, bitmask, row):
            return False
        if self.values is not None and self.values.ban(bitmask, row) < 0:
            self.fill_bitmask(bitmask, row)  # every closer would repeat an item: the value goes on
            return False
        return True

    def closes_value(self, token_id: int) -> bool:
        return self._closing is not None and self._closing.is_closer(token_id)
