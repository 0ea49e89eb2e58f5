"""Prompt-lookup drafts (runtime/decode/lookup.py): the n-gram index and the adaptive length."""

from __future__ import annotations

import pytest

from runtime.decode.lookup import MAX_NGRAM, PROBE_EVERY, LookupDraft, NgramIndex


def test_the_continuation_follows_the_latest_earlier_occurrence_of_the_longest_ngram():
    tokens = [1, 2, 3, 4, 9, 9, 2, 3, 4, 7, 8, 5, 2, 3, 4]
    index = NgramIndex()
    index.update(tokens)
    # [2, 3, 4] ended at 4 (then 9 9) and at 9 (then 7 8): the latest wins
    assert index.continuation(tokens, [], 3) == [7, 8, 5]
    # a longer match beats a later shorter one: [1, 2, 3, 4] occurs only at the start
    tokens2 = [1, 2, 3, 4, 6, 0, 2, 3, 4, 7, 1, 2, 3, 4]
    index2 = NgramIndex()
    index2.update(tokens2)
    assert index2.continuation(tokens2, [], 2) == [6, 0]


def test_no_match_and_single_token_matches_draft_nothing():
    tokens = [5, 6, 7, 8, 5]  # only the 1-gram [5] repeats: below MIN_NGRAM
    index = NgramIndex()
    index.update(tokens)
    assert index.continuation(tokens, [], 4) == []
    assert index.continuation(tokens, [], 0) == []


def test_a_queued_draft_extends_the_context_it_is_looked_up_from():
    tokens = [10, 11, 12, 13, 14, 15, 0, 10]
    index = NgramIndex()
    index.update(tokens)
    # on its own the tail [0, 10] has no earlier match; with the forced draft [11] queued after it,
    # [10, 11] does, and what followed it there is drafted
    assert index.continuation(tokens, [], 3) == []
    assert index.continuation(tokens, [11], 3) == [12, 13, 14]


def test_the_index_grows_with_the_output_and_starts_again_after_a_rewind():
    tokens = [1, 2, 3, 9]
    index = NgramIndex()
    index.update(tokens)
    tokens += [1, 2]
    index.update(tokens)
    assert index.indexed == len(tokens)
    assert index.continuation(tokens, [], 2) == [3, 9]
    del tokens[2:]  # rewound: positions past the cut no longer hold what was indexed
    tokens += [4, 1, 2]
    index.update(tokens)
    assert index.continuation(tokens, [], 2) == [4, 1]
    assert max(index.ends.values()) < len(tokens)


def test_ngrams_longer_than_max_are_not_indexed():
    index = NgramIndex()
    index.update(list(range(10)))
    assert max(len(k) for k in index.ends) == MAX_NGRAM


def test_the_draft_length_follows_the_acceptance_rate():
    lk = LookupDraft(max_tokens=8, row_cost=0.1)
    start = lk.worth()
    assert 1 <= start <= 8
    for _ in range(20):
        lk.verified(8, 8)  # everything kept
    assert lk.worth() == 8
    for _ in range(40):
        lk.verified(4, 0)  # nothing kept
    assert lk.rate < lk.row_cost
    assert lk.worth() == 0


def test_a_request_whose_drafts_do_not_pay_still_probes_now_and_then():
    lk = LookupDraft(max_tokens=8, row_cost=0.5)
    for _ in range(40):
        lk.verified(4, 0)
    lengths = [lk.worth() for _ in range(PROBE_EVERY * 2)]
    assert lengths.count(1) == 2 and set(lengths) == {0, 1}


def test_propose_caps_at_the_room_left():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    lk = LookupDraft(max_tokens=8, row_cost=0.0)
    assert lk.propose(tokens, [], 2) == [3, 4]
    assert lk.propose(tokens, [], 0) == []


@pytest.mark.parametrize("drafted,accepted", [(0, 0), (3, 3), (3, 1)])
def test_verified_counts_one_failure_at_most(drafted, accepted):
    lk = LookupDraft(max_tokens=8, row_cost=0.1)
    before_a, before_t = lk.accepted, lk.tried
    lk.verified(drafted, accepted)
    if drafted == 0:
        assert (lk.accepted, lk.tried) == (before_a, before_t)
    else:
        failures = (lk.tried - 0.9 * before_t) - (lk.accepted - 0.9 * before_a)
        assert failures == pytest.approx(1 if accepted < drafted else 0)
