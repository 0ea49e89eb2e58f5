"""RowCost (runtime/decode/row_cost.py): a draft row's cost fitted on decode steps."""

from __future__ import annotations

import pytest

from runtime.decode.lookup import LookupDraft
from runtime.decode.row_cost import DECAY, MAX_SHARE, MIN_SHARE, PRIOR_SHARE, RowCost


def feed(cost: RowCost, fixed_s: float, per_row_s: float, steps: int = 60, requests: int = 4) -> None:
    """Decode steps of `requests` requests with 0-3 draft rows each, one token yielded per request."""
    for i in range(steps):
        rows = requests * (1 + i % 4)
        cost.observe(rows, requests, fixed_s + per_row_s * rows)


def test_the_share_is_the_slope_over_the_seconds_per_token():
    cost = RowCost(PRIOR_SHARE)
    feed(cost, fixed_s=0.010, per_row_s=0.001)
    # the decayed weight levels off at 1 / (1 - DECAY); the step count does not
    assert cost.steps == 60 and cost.w == pytest.approx((1 - DECAY**60) / (1 - DECAY))
    # a row adds 1 ms; a step yields 4 tokens for 10 ms + 1 ms a row (8-26 ms): about 4 ms a token
    per_token = cost.per_token
    assert 0.003 < per_token < 0.006
    assert cost.share == pytest.approx(0.001 / per_token, rel=1e-6)


def test_rows_that_cost_more_make_a_higher_share():
    cheap, dear = RowCost(PRIOR_SHARE), RowCost(PRIOR_SHARE)
    feed(cheap, fixed_s=0.020, per_row_s=0.0002)  # a GPU-like step: the rows nearly free
    feed(dear, fixed_s=0.004, per_row_s=0.002)  # compute-bound rows: most of the step
    assert cheap.share < 0.1 < dear.share


def test_the_prior_holds_until_the_rows_vary():
    cost = RowCost(PRIOR_SHARE)
    for _ in range(100):  # always 4 rows: no slope to fit
        cost.observe(4, 4, 0.02)
    assert cost.share == PRIOR_SHARE
    few = RowCost(PRIOR_SHARE)
    feed(few, 0.01, 0.001, steps=3)  # too few steps
    assert few.share == PRIOR_SHARE


def test_the_share_is_clamped():
    flat = RowCost(PRIOR_SHARE)
    feed(flat, fixed_s=0.02, per_row_s=-0.001)  # noise can fit a falling line
    assert flat.share == MIN_SHARE
    steep = RowCost(PRIOR_SHARE)
    for i in range(60):  # more tokens than rows (a pass yields at most one a row): seconds a token tiny
        steep.observe(1 + i % 4, 100, 0.01 * (1 + i % 4))
    assert steep.share == MAX_SHARE


def test_a_fixed_cost_ignores_the_steps_and_bad_observations_are_dropped():
    fixed = RowCost.fixed(0.3)
    feed(fixed, 0.01, 0.001)
    assert fixed.share == 0.3 and fixed.steps == 0
    cost = RowCost(PRIOR_SHARE)
    for rows, tokens, seconds in ((0, 4, 0.01), (4, 0, 0.01), (4, 4, 0.0)):
        cost.observe(rows, tokens, seconds)
    assert cost.steps == 0


def test_drafts_follow_the_shared_cost_as_it_changes():
    cost = RowCost(PRIOR_SHARE)
    lk = LookupDraft(max_tokens=8, row_cost=cost)
    for i in range(20):
        lk.verified(2, i % 2)  # about one token kept in three tried
    assert 0.25 < lk.rate < 0.4
    assert lk.worth() == 2  # rate and rate**2 above the prior 0.1
    feed(cost, fixed_s=0.004, per_row_s=0.004)  # now a row costs about 40% of a token
    assert cost.share > lk.rate
    assert lk.worth() == 0 and lk.row_cost == cost.share
