"""Unit tests of runtime/decode/completeness.py: the repetition detectors, the CompletionGuard state
machine on a fake matcher, and the engine's `loop_breaking` switch."""

from __future__ import annotations

import torch

from grammar import GrammarService, GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.completeness import (
    CLOSING_MARGIN,
    FAR_TOKENS,
    MAX_DIGITS,
    CompletionGuard,
    has_periodic_suffix,
    runaway_number,
)
from tests.runtime.decode.completeness_helpers import FakeMatcher

# ==== runtime/decode/completeness.py: detectors ==========================================================


def test_periodic_suffix_needs_three_copies_over_twelve_tokens():
    assert has_periodic_suffix([7] * 12)
    assert not has_periodic_suffix([7] * 11)  # too short a span
    assert has_periodic_suffix([1, 2] + [5, 6, 7, 8] * 3)  # period 4, 3 copies
    assert not has_periodic_suffix([5, 6, 7, 8] * 2 + [5, 6, 7, 9])  # broken at the end
    assert has_periodic_suffix(list(range(16)) * 3)  # the longest period
    assert not has_periodic_suffix(list(range(17)) * 2)  # period 17 > MAX_PERIOD
    assert not has_periodic_suffix(list(range(40)))
    assert not has_periodic_suffix([])


def test_runaway_number_counts_trailing_digits_only():
    assert not runaway_number("1" * (MAX_DIGITS - 1))
    assert runaway_number("x" + "1" * MAX_DIGITS)  # the run is full: the number ends next
    assert not runaway_number("1" * 20 + ".")  # the number ended
    assert not runaway_number("abc")
    assert not runaway_number("")


def drive(guard: CompletionGuard, m: FakeMatcher, out: list[int], max_new: int, token: int | None = None) -> int:
    """One decoding step as the engine runs it; returns the token taken (the model's `token`, or
    the one token a plan mask allows)."""
    guard.before_choice(m, len(out), max_new)
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    guard.fill_mask(m, mask, 0)
    kind = m.fills[-1]
    if kind[0] == "plan":
        token = kind[1]
    elif token is None:
        token = m.plan[0]
    m.take(token)
    out.append(token)
    guard.after_token(out, "", closed_value=False)
    return token


def test_guard_stays_out_of_the_way_far_from_the_budget():
    g, m, out = CompletionGuard(), FakeMatcher([1, 2, 3, 4]), []
    for i in range(20):
        drive(g, m, out, max_new=200, token=50 + i)
    assert not g.closing and not g.close_value
    assert all(f == ("plain",) for f in m.fills)
    assert m.plans_made <= 2  # the bound is re-checked every RECHECK_EVERY tokens only


class PlanlessMatcher(FakeMatcher):
    """A state from which the planner finds no completion within its limit (a large schema whose
    greedy plan writes optional properties): each try walked MAX_PLAN_TOKENS steps."""

    def completion_plan(self):
        self.plans_made += 1
        return None


def test_a_failed_plan_is_tried_again_every_recheck_only():
    """Where no plan was found the guard re-planned on every token: a second or more of grammar
    work per token on SchemaStore's citation-file-format (issue #42 item 2)."""
    g, m, out = CompletionGuard(), PlanlessMatcher([]), []
    for i in range(48):
        drive(g, m, out, max_new=64, token=50 + i)
    assert m.plans_made == 3  # at 0, 16 and 32 tokens
    assert not g.closing and g.bound is None
    g.restart()  # a rewind forgets what was known: plan at once
    drive(g, m, out, max_new=64, token=7)
    assert m.plans_made == 4


def test_guard_closes_when_the_budget_comes_within_the_bound():
    plan = [11, 12, 13, 14, 15]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 20
    while len(out) < max_new - len(plan) - CLOSING_MARGIN:
        drive(g, m, out, max_new, token=60 + len(out))  # free text: the plan stays ahead
        assert not g.closing
    drive(g, m, out, max_new, token=11)  # remaining == bound + margin: closing begins
    assert g.closing and not g.tight
    assert m.fills[-1] == ("closing", False, 11)  # the plan's class, the model choosing
    while m.plan:
        drive(g, m, out, max_new)
    assert out[-len(plan) :] == plan and len(out) <= max_new


def test_guard_follows_the_stored_plan_token_for_token_when_tight():
    plan = [21, 22, 23, 24]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 30
    while len(out) < max_new - len(plan) - 1:
        drive(g, m, out, max_new, token=70 + len(out))
    made = m.plans_made
    taken = [drive(g, m, out, max_new) for _ in plan]
    assert taken == plan and len(out) == max_new - 1
    assert [f for f in m.fills[-len(plan) :]] == [("plan", t) for t in plan]
    assert m.plans_made == made + 1  # planned once, then followed


def test_forced_tokens_go_in_unchosen_only_on_the_plan_while_closing():
    """Direct jump-forward inserts forced tokens without the model: far from the budget any
    forced token may go in; once closing, only the plan's next token (a longer split of the same
    text would spend budget the plan counted on)."""
    plan = [41, 42, 43]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 12
    g.before_choice(m, len(out), max_new)
    assert not g.closing and g.allows_unchosen(m, 77, max_new)
    while len(out) < max_new - len(plan) - CLOSING_MARGIN:
        drive(g, m, out, max_new, token=60 + len(out))
    g.before_choice(m, len(out), max_new)
    assert g.closing
    assert g.allows_unchosen(m, 41, max_new - len(out))
    assert not g.allows_unchosen(m, 77, max_new - len(out))


def test_guard_replans_when_the_model_leaves_the_plan():
    g, m, out = CompletionGuard(), FakeMatcher([31, 32, 33], detours=frozenset({99})), []
    max_new = 12
    while not g.closing:
        drive(g, m, out, max_new, token=80 + len(out))
    made = m.plans_made
    assert not g.tight
    drive(g, m, out, max_new, token=99)  # another allowed token of the plan's class
    assert g.plan is None  # left the plan
    drive(g, m, out, max_new)
    assert m.plans_made > made and g.plan == [900, 31, 32, 33]
    while m.plan:
        drive(g, m, out, max_new)
    assert out[-3:] == [31, 32, 33] and len(out) <= max_new


def test_guard_vets_expanding_choices_near_the_budget():
    g, m = CompletionGuard(), FakeMatcher([1] * 10)
    m.bound_after = {5: 40, 6: 8}  # 5 would open a big new item, 6 a small one
    g.before_choice(m, produced=0, max_new=30)
    assert not g.allows(m, 5, remaining=30)  # 40 > 29 tokens left after it
    assert g.allows(m, 6, remaining=30)
    assert g.allows(m, 7, remaining=30)  # not an expanding token: never checked
    g.before_choice(m, produced=0, max_new=FAR_TOKENS + 1)
    assert g.allows(m, 5, remaining=FAR_TOKENS + 1)  # farther than any bound can rise: not checked
    assert g.fallback_token(m) == 1


def test_a_checked_token_that_raises_the_bound_brings_the_recheck_forward():
    """Issue #16 (Kubernetes eviction-lifecycle at 384 tokens): with 44 tokens left and a bound of
    7 the model opened a new array item whose plan was 34 tokens; the guard kept the bound of 7
    until its next scheduled re-check, 16 tokens later, when 32 were left: too late to close. The
    bound a check finds is now the guard's bound once the token is taken."""
    g, m, out = CompletionGuard(loop_breaking=False), FakeMatcher([1] * 7), []
    m.bound_after = {5: 34}  # 5 opens a new item
    max_new = 60
    while len(out) < 16:
        drive(g, m, out, max_new, token=80 + len(out))  # free text: the bound stays 7
    assert not g.closing and g.bound == 7
    g.before_choice(m, len(out), max_new)
    assert g.allows(m, 5, max_new - len(out))  # 44 left, 34 needed after it: allowed (checked)
    m.plan = [1] * 34
    out.append(5)
    g.after_token(out, "", closed_value=False)
    assert g.bound == 34 and not g.closing
    while not g.closing:
        drive(g, m, out, max_new, token=80 + len(out))
    assert max_new - len(out) >= len(m.plan)  # closing began while the plan still fits
    while m.plan:
        drive(g, m, out, max_new)
    assert len(out) <= max_new


def test_loop_breaking_closes_the_current_value_once():
    g, m, out = CompletionGuard(), FakeMatcher([1, 2]), []
    for _ in range(4):
        for t in (41, 42, 43):
            out.append(t)
            g.after_token(out, "", closed_value=False)
    assert g.close_value and g.loops_broken == 1
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    g.before_choice(m, len(out), 500)
    g.fill_mask(m, mask, 0)
    assert m.fills[-1] == ("value",)
    out.append(44)
    g.after_token(out, "", closed_value=True)  # a closer ended the value
    assert not g.close_value
    g.fill_mask(m, mask, 0)
    assert m.fills[-1] == ("plain",)


def test_runaway_number_triggers_loop_breaking():
    g = CompletionGuard()
    g.after_token([1, 2, 3], '{"n":' + "9" * (MAX_DIGITS + 1), closed_value=False)
    assert g.close_value


def test_loop_breaking_off_never_steers():
    g, out = CompletionGuard(loop_breaking=False), []
    for _ in range(20):
        out.append(7)
        g.after_token(out, "7" * len(out), closed_value=False)
    assert not g.close_value and g.loops_broken == 0


def test_loop_breaking_waits_while_closing():
    g, out = CompletionGuard(closing=True), []
    for _ in range(20):
        out.append(7)
        g.after_token(out, "", closed_value=False)
    assert not g.close_value


def test_engine_wires_loop_breaking_and_strict_into_the_guard(tiny_model_dir, tokenizer):
    from runtime.engine.engine import Engine

    for flag in (True, False):
        engine = Engine(model=str(tiny_model_dir), kv_pool_tokens=2048, loop_breaking=flag)
        svc = GrammarService(engine.tokenizer, engine.model_config.vocab_size)
        handle = svc.compile(GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}))
        strict = engine.new_request(engine.validate(GenerateRequest([1, 2, 3], constraint=handle, strict=True)), print)
        loose = engine.new_request(engine.validate(GenerateRequest([1, 2, 3], constraint=handle)), print)
        assert strict.guard is not None and strict.guard.loop_breaking is flag
        assert loose.guard is None  # non-strict requests are never steered
        svc.close()
