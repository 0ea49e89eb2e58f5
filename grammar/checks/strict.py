"""The strict methods of runtime.constraint.TokenMatcher, shared by both engines' matchers.

Budget-aware closing and loop breaking (runtime/decode/completeness.py) ask a matcher for completion
plans, bounds and closing masks. All of that is grammar/checks/closing.py's planner over a `PlanMatcher`
(the engine's own state behind a small interface), plus the value check's repairs; so one
implementation serves xgrammar (grammar/engines/xgrammar/matcher.py) and llguidance (grammar/engines/llguidance/matcher.py). A
matcher that mixes `StrictMethods` in provides:

- `_plan`: a `PlanMatcher` over its live state (planning forks it; nothing here changes the state
  except `completion_bound_after`, which accepts one token and rolls it back);
- `_closing`: the `ClosingVocab` (None: no planning; the guard then never closes);
- `values`: its `ValueCheck` or None;
- `rechecks`: its `RollbackCheck` (grammar/checks/rollback.py) or None, and `rollback`;
- `fill_bitmask`, `is_terminated` and `is_completed` (as the TokenMatcher protocol has them).

With a value check, a plan that would write a repeated name or item has that token replaced by
another the check allows (a character that grows the name first) and is re-planned from there, or
is dropped; bounds count the repaired plan where it is longer (`completion_bound`, and
`completion_bound_after` while a unique array is open), so strict mode's budget and its smallest
accepted budget hold for outputs whose next items must differ from the earlier ones.
"""

from __future__ import annotations

import numpy as np

from grammar.checks.closing import (
    allowed_subset,
    completion_bound,
    completion_bound_after,
    completion_plan,
    fill_closing_bitmask,
    fill_plan_bitmask,
    fill_value_closing_bitmask,
    new_bitmask,
)
from grammar.engines.token_mask import allowed_ids, is_allowed

MAX_PLAN_REPAIRS = 4  # repeats replaced in one completion plan before it is given up
MAX_REPAIR_CHOICES = 8  # other tokens tried in place of one that would write a repeat
MAX_HELD_REPAIRS = 32  # plan tokens replaced by a held family's own (a listed value is a few tokens)
MAX_ROOM_STEPS = 8  # further rollbacks after a rewrite's (1, 2, 4... tokens at least), to leave its plan room


class StrictMethods:
    __slots__ = ()

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
        if self.is_terminated():
            return 0
        bound = completion_bound(self._plan, self._closing)
        if bound is None or (self.values is None and not self._holds()):
            return bound
        plan = self.completion_plan()
        return bound if plan is None else max(bound, len(plan))

    def completion_plan(self) -> list[int] | None:
        """The tokens of that bound's path (what a request follows once its budget is tight)."""
        if not self._closing:
            return None
        if self.is_terminated():
            return []
        plan = completion_plan(self._plan, self._closing)
        if plan is not None and self.values is not None:
            plan = self._repaired(plan)
        return self._held_plan(plan) if plan is not None and self._holds() else plan

    def _holds(self) -> bool:
        return self.rechecks is not None and self.rechecks.holds

    def _held_plan(self, plan: list[int]) -> list[int]:
        """`plan` with each token that a held value's family refuses (grammar/checks/value_family.py:
        dependabot's ecosystem, which only a root `else` lists) replaced by the family's longest
        allowed token, re-planned from there. Else the plan, and so the budget's closing, writes
        the grammar's shortest value (`""`), which the check refuses again, at the budget's edge."""
        checks, fork, text, at, repairs = self.rechecks, self._plan.fork(), self.rechecks.text, 0, 0
        while at < len(plan):
            token = plan[at]
            if checks.may_hold(text):
                mask = new_bitmask(self._closing.vocab_size)
                fork.fill_mask(mask, 0)
                words = mask[0].numpy().view(np.uint32)
                if checks.hold(words, text) and not is_allowed(words, token):
                    repairs += 1
                    if repairs > MAX_HELD_REPAIRS:
                        return plan
                    choices = sorted(allowed_ids(words).tolist(), key=lambda t: -len(checks.spelled(t)))
                    tail = self._replanned(fork, choices)
                    if tail is None:
                        return plan  # no way through the family: it stands aside, as the mask's does
                    plan, token = plan[:at] + tail, tail[0]
                    text += checks.spelled(token)
                    at += 1
                    continue
            if not fork.accept(token):
                return plan
            text += checks.spelled(token)
            at += 1
        return plan

    def _repaired(self, plan: list[int]) -> list[int] | None:
        """`plan` with each token that would repeat a name or an item replaced by another the
        check allows (a single character that grows the name first), re-planned from there."""
        for _ in range(MAX_PLAN_REPAIRS):
            cut = self.values.first_violation(plan)
            if cut is None:
                return plan
            fork = self._plan.fork()
            if not all(fork.accept(t) for t in plan[:cut]):
                return None
            mask = new_bitmask(self._closing.vocab_size)
            fork.fill_mask(mask, 0)
            tail = self._replanned(fork, self.values.ban_after(plan[:cut], mask, 0))
            if tail is None:
                return None
            plan = plan[:cut] + tail
        return plan if self.values.first_violation(plan) is None else None

    def _replanned(self, fork, choices) -> list[int] | None:
        """The first of `choices` (at most MAX_REPAIR_CHOICES) that `fork` accepts and can complete
        from, then that completion; `fork` is left after the chosen token. None: no choice leads
        through (`fork` as it was)."""
        for choice in choices[:MAX_REPAIR_CHOICES]:
            if choice in self._closing.special_ids or not fork.accept(choice):
                continue
            rest = completion_plan(fork, self._closing)
            if rest is not None:
                return [choice] + rest
            fork.rollback(1)
        return None

    def may_expand(self, token_id: int) -> bool:
        """Whether `token_id` may commit the output to more than it needs now (so its budget is
        checked): a token with structure in it (`,` `[` `{` `"` a newline), or any token where no
        open string could end now. There a token without structure still chooses a branch: a
        tool's name (`create` needs a date-time or two more than `calc`), a property's name, an
        enum member. Only inside text that may end here (a free string) does content leave the
        shortest completion as it was."""
        if self._closing is None:
            return False
        if token_id in self._closing.expanding:
            return True
        if not self.is_terminated():
            forced = self._plan.forced_tokens()
            if forced:
                # the text is forced, but not its tokens: a marker that is one token in the
                # tokenizer (`<｜tool▁call▁begin｜>`) may also be spelled in a dozen pieces, more
                # than the plan counted
                return token_id != forced[0]
        return self._chooses_branch()

    def _chooses_branch(self) -> bool:
        """Is there a choice here that a token without structure could make? Not where the
        grammar forces the text (there is one way on), nor where a string closer is allowed (an
        open string, or text, that may end now: content leaves the shortest completion as it was)."""
        if self.is_terminated() or self._plan.forced_tokens():
            return False
        mask = new_bitmask(self._closing.vocab_size)
        self._plan.fill_mask(mask, 0)
        return not allowed_subset(mask[0], self._closing.quoted).numel()

    def completion_bound_after(self, token_id: int) -> int | None:
        """`completion_bound` after accepting `token_id` (on a fork; None if refused or unknown).
        With a value check the token is accepted here and rolled back, so that the bound counts
        the plan repaired around repeats (a new item of a unique array that must differ)."""
        if self._closing is None or self.is_terminated():
            return None
        token_id = int(token_id)
        if token_id in self._closing.stop_set:
            # the stop token ends a complete value (decided here: a planner never takes it, and
            # llguidance could not roll back over it)
            return 0 if self.is_completed() else None
        if token_id in self._closing.special_ids:
            return None  # no grammar writes a special token as text
        bound = completion_bound_after(self._plan, self._closing, token_id)
        steers = self.values is not None and self.values.may_steer()
        if bound is None or not (steers or self._holds()):
            return bound
        if not self._plan.accept(token_id):
            return None
        follow = [c for c in (self.values, self.rechecks) if c is not None]
        for check in follow:
            check.accept(token_id)
        try:
            plan = self.completion_plan()
        finally:
            self._plan.rollback(1)
            for check in follow:
                check.rollback(1)
        return bound if plan is None else max(bound, len(plan))

    def fill_plan_bitmask(self, bitmask, row: int, token_id: int) -> None:
        """Allow only `token_id` (the next token of a plan from `completion_plan`)."""
        fill_plan_bitmask(bitmask, row, token_id)
        if self.values is not None and not self.is_terminated():
            self.values.ban(bitmask, row)

    def fill_closing_bitmask(self, bitmask, row: int, tight: bool = False, plan_token: int | None = None) -> None:
        """Closing mode: only tokens on a shortest completion path (the stop token once complete);
        `tight`: only the plan's own next token; `plan_token`: that token, from a stored plan."""
        if self._closing is None or self.is_terminated():
            self.fill_bitmask(bitmask, row)
            return
        fill_closing_bitmask(self._plan, self._closing, bitmask, row, tight, plan_token)
        if self.values is not None and self.values.ban(bitmask, row) < 0 and plan_token is None:
            # closing's own one-step planner does not know the check: take the repaired plan's token
            plan = self.completion_plan()
            if plan:
                fill_plan_bitmask(bitmask, row, plan[0])
        self._ban_rewrites(bitmask, row)

    def fill_value_closing_bitmask(self, bitmask, row: int) -> bool:
        """Loop breaking: only tokens that end the current value; False when none is allowed now."""
        if self._closing is None or self.is_terminated():
            return False
        if not fill_value_closing_bitmask(self._plan, self._closing, bitmask, row):
            return False
        if self.values is not None and self.values.ban(bitmask, row) < 0:
            self.fill_bitmask(bitmask, row)  # every closer would repeat an item: the value goes on
            return False
        self._ban_rewrites(bitmask, row)
        return True

    def _ban_rewrites(self, bitmask, row: int) -> None:
        if self.rechecks is not None and not self.is_terminated():
            self.rechecks.ban(bitmask, row)

    # -- check-and-roll-back (grammar/checks/rollback.py): every constrained request -----------

    @property
    def withholds_output(self) -> bool:
        """Whether the output must not be sent before it is whole (a check may roll some back)."""
        return self.rechecks is not None

    def output_verdict(self, room: int | None = None) -> int | None:
        """For a whole output: None if it stands; n > 0 when a value broke a checked keyword and
        this matcher rolled back its last n tokens to write it again; EXHAUSTED (< 0) when the
        rewrites are spent. `room`: the budget left after the output (strict requests): the
        rollback then goes back until the completion plan, held family included, fits in it."""
        if self.rechecks is None:
            return None
        verdict = self.rechecks.verdict(self._extends_at if self._closing else None)
        if verdict is not None and verdict > 0:
            self.rollback(verdict)
            if room is not None:
                verdict += self._make_room(room + verdict)
        return verdict

    def _extends_at(self, back: int, before: bytes) -> bool:
        """After rolling back `back` tokens and writing `before` (one character a token), may the
        grammar write anything but a closing bracket? (A failing container is reopened at its bracket
        to write what it misses; where its properties are spent, bitbucket-pipelines' `image`
        written in declared order, reopening only wrote the same text again.) True where unknown."""
        fork = self._plan.fork()
        fork.rollback(back)
        singles = self._closing.single_bytes
        for byte in before:
            if byte not in singles or not fork.accept(singles[byte]):
                return True
        mask = new_bitmask(self._closing.vocab_size)
        fork.fill_mask(mask, 0)
        spelled = self.rechecks.spelled
        return any(spelled(int(t))[:1] not in (b"}", b"]") for t in allowed_ids(mask[0].numpy().view(np.uint32)))

    def _make_room(self, left: int) -> int:
        """Roll back further while the plan from here needs more than `left` tokens; returns how
        many more. A value the budget's closing wrote at the budget's edge (the grammar's shortest,
        `""`) is rewritten as a listed value only where the budget has room for one: without this
        each rewrite had the same few tokens and wrote `""` again until the rewrites ran out."""
        extra = 0
        for step in range(MAX_ROOM_STEPS):
            bound = self.completion_bound()
            if bound is None or bound <= left + extra:
                break
            # back through forced text (a name) the bound grows by what is freed: go back further
            more = min(max(bound - left - extra, 1 << step), self.rechecks.tokens)
            if more <= 0:
                break
            self.rollback(more)
            extra += more
        return extra

    def closes_value(self, token_id: int) -> bool:
        return self._closing is not None and self._closing.is_closer(token_id)
