"""grammar/checks/plan_state.py on its own (a stub matcher): a plan is kept by its exact state and
limit, never where the matcher knows no exact state or the walk says it may not be kept; rests after
forced text are kept from each point a complete, pure walk passed. And closing.py's `allowed_subset`
against the torch bit test it replaced. The real planner's kept plans: test_plan_names.py."""

from __future__ import annotations

import torch

from grammar.checks.closing import allowed_subset
from grammar.checks.plan_state import Rests, kept_plan


class Stub:
    def __init__(self, key):
        self.key, self.memo = key, {}

    def plan_key(self):
        return self.key

    def plans(self):
        return self.memo


def _walk(plan, pure, calls):
    def walk():
        calls.append(1)
        return plan, pure

    return walk


def test_a_plan_is_kept_by_exact_state_and_limit():
    m, calls = Stub(((1, 2), None)), []
    assert kept_plan(m, 10, _walk([5, 6], True, calls)) == [5, 6]
    assert kept_plan(m, 10, _walk([7], True, calls)) == [5, 6] and len(calls) == 1  # kept
    assert kept_plan(m, 20, _walk([7], True, calls)) == [7] and len(calls) == 2  # another limit
    m.key = ((1, 3), None)
    assert kept_plan(m, 10, _walk(None, True, calls)) is None
    assert kept_plan(m, 10, _walk([8], True, calls)) is None and len(calls) == 3  # "no plan" is kept too


def test_nothing_is_kept_without_a_state_or_from_a_walk_cut_short():
    m, calls = Stub(None), []
    kept_plan(m, 10, _walk([1], True, calls))
    kept_plan(m, 10, _walk([1], True, calls))
    m.key = ((4,), None)
    kept_plan(m, 10, _walk([2], False, calls))
    assert kept_plan(m, 10, _walk([3], True, calls)) == [3] and len(calls) == 4
    assert Rests.of(Stub(None)) is None


def test_rests_are_kept_from_each_point_a_pure_complete_walk_passed():
    m = Stub(((1,), None))
    rests = Rests.of(m)
    assert rests.at(2) is None
    m.key = ((1, 9), None)
    assert rests.at(5) is None
    rests.keep([0, 1, 2, 3, 4, 5, 6], True)
    assert Rests.of(m).at(0) == (5, 6)
    m.key = ((1,), None)
    assert Rests.of(m).at(0) == (2, 3, 4, 5, 6)
    cut = Stub(((2,), None))
    walk = Rests.of(cut)
    walk.at(1)
    walk.keep([0, 1, 2], False)  # a way-out search in it was cut short
    assert Rests.of(cut).at(1) is None


def test_allowed_subset_is_the_torch_bit_test():
    gen = torch.Generator().manual_seed(7)
    mask = torch.randint(-(2**31), 2**31 - 1, (1, 40), dtype=torch.int32, generator=gen)
    ids = torch.randperm(40 * 32, generator=gen)[:300]
    reference = ids[((mask[0][ids >> 5] >> (ids & 31).to(torch.int32)) & 1).bool()]
    assert allowed_subset(mask[0], ids).tolist() == reference.tolist()
    assert allowed_subset(mask[0], ids[:0]).numel() == 0
