"""Prompt-lookup drafts (runtime/decode/lookup.py): the n-gram index and the adaptive length."""

from __future__ import annotations

import pytest

from runtime.decode import lookup
from runtime.decode.lookup import (
    MAX_NGRAM,
    PROBE_EVERY,
    SHARED_PREFIX,
    LookupDraft,
    NgramIndex,
    SharedDrafts,
    SharedOutputs,
)


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


# ---------------------------------------------------------------- outputs shared by a group


def test_a_request_drafts_what_another_of_its_group_wrote():
    group = SharedOutputs()
    prompt = [100, 101, 102]
    first = LookupDraft(max_tokens=4, row_cost=0.0, shared=group, start=len(prompt))
    tokens = prompt + [7, 8, 9, 10, 11]
    first.propose(tokens, [], room=4)  # publishes its output so far
    second = LookupDraft(max_tokens=4, row_cost=0.0, shared=group, start=len(prompt))
    # its own prompt and output hold no [7, 8]; the first request's output does
    assert second.propose(prompt + [7, 8], [], room=4) == [9, 10, 11]
    # the first request writes on: the group sees it at its next propose
    tokens += [12, 13]
    first.propose(tokens, [], room=4)
    assert second.propose(prompt + [7, 8, 9, 10, 11], [], room=4) == [12, 13]


def test_a_requests_own_match_wins_a_tie_and_a_longer_shared_one_wins():
    group = SharedOutputs()
    other = LookupDraft(max_tokens=4, row_cost=0.0, shared=group, start=2)
    other.propose([50, 51, 1, 2, 3, 4, 20, 21], [], room=4)
    own = LookupDraft(max_tokens=4, row_cost=0.0, shared=group, start=6)
    # own tokens: [3, 4] followed by 30; the group: [1, 2, 3, 4] followed by 20
    assert own.propose([8, 3, 4, 30, 9, 9, 3, 4], [], room=2) == [30, 9]  # a 2-gram each: its own
    assert own.propose([9, 3, 4, 30, 1, 2, 3, 4], [], room=2) == [20, 21]  # the group's 4-gram


def test_groups_are_kept_apart_by_namespace_and_prompt_start():
    drafts = SharedDrafts()
    prompt = list(range(200))
    a = drafts.group("", prompt)
    assert drafts.group("", prompt[:SHARED_PREFIX] + [7, 7]) is a  # only the first tokens name the group
    assert drafts.group("tenant-b", prompt) is not a
    assert drafts.group("", [1] + prompt[1:]) is not a


def test_the_least_recently_joined_groups_are_dropped(monkeypatch):
    monkeypatch.setattr(lookup, "SHARED_GROUPS", 2)
    drafts = SharedDrafts()
    a = drafts.group("", [1])
    drafts.group("", [2])
    assert drafts.group("", [1]) is a  # used again: now the most recent
    drafts.group("", [3])  # drops [2]
    assert drafts.group("", [1]) is a
    assert len(drafts.groups) == 2 and ("", (2,)) not in drafts.groups


def test_dropped_sources_draft_nothing_and_the_index_is_rebuilt_past_its_bound(monkeypatch):
    monkeypatch.setattr(lookup, "SHARED_SOURCES", 2)
    monkeypatch.setattr(lookup, "SHARED_KEYS", 40)
    group = SharedOutputs()
    old = group.join([5, 6, 7, 8, 9], 0)
    group.publish(old, [5, 6, 7, 8, 9])
    assert group.match([5, 6], 0, 3, own=-1) == (2, [7, 8, 9])
    for k in range(2):  # two newer sources: the first is dropped
        sid = group.join([k, 40 + k, 41 + k, 42 + k], 0)
        group.publish(sid, [k, 40 + k, 41 + k, 42 + k])
    assert group.match([5, 6], 0, 3, own=-1) == (0, [])
    big = group.join(list(range(300, 330)), 0)
    # past SHARED_KEYS: the group keeps the newest sources within half of it (here the publisher alone)
    group.publish(big, list(range(300, 330)))
    assert list(group.sources) == [big]
    assert all(sid == big for sid, _ in group.ends.values())
    assert group.match([300, 301], 0, 2, own=-1) == (2, [302, 303])


def test_a_long_output_is_indexed_up_to_its_cap(monkeypatch):
    monkeypatch.setattr(lookup, "SOURCE_TOKENS", 4)
    group = SharedOutputs()
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    sid = group.join(tokens, 2)  # output from position 2: positions 2..5 indexed
    group.publish(sid, tokens)
    assert group.match([4, 5], 0, 1, own=-1) == (2, [6])  # [4, 5] ends at 5
    assert group.match([5, 6], 0, 1, own=-1) == (0, [])  # would end at 6: past the cap


def test_a_source_that_shrank_drafts_only_what_it_still_holds():
    group = SharedOutputs()
    tokens = [1, 2, 3, 4, 5]
    sid = group.join(tokens, 0)
    group.publish(sid, tokens)
    del tokens[3:]  # a rewind cut the live list
    assert group.match([3, 4], 0, 3, own=-1) == (0, [])  # [3, 4] led to position 4, now gone
    assert group.match([1, 2], 0, 3, own=-1) == (2, [3])


def test_a_rewound_source_forgets_what_followed_the_cut_and_indexes_what_is_written_again():
    group = SharedOutputs()
    prompt = [100, 101]
    writer = LookupDraft(max_tokens=4, row_cost=0.0, shared=group, start=len(prompt))
    tokens = prompt + [1, 2, 3, 4, 5]
    writer.propose(tokens, [], room=4)
    assert group.match([2, 3], 0, 2, own=-1) == (2, [4, 5])
    del tokens[5:]  # the matcher rolled back [4, 5]: the engine cuts the list, then tells the draft
    writer.forget_from(len(tokens))
    assert writer.index.indexed == 0  # its own index starts again, as before
    assert group.match([2, 3], 0, 2, own=-1) == (0, [])  # [2, 3] led to position 5, past the cut
    tokens += [8, 9]  # rewritten: the new tokens are indexed at the next propose
    writer.propose(tokens, [], room=4)
    assert group.match([2, 3], 0, 2, own=-1) == (2, [8, 9])
    assert group.match([3, 8], 0, 2, own=-1) == (2, [9])  # an n-gram only the rewrite holds
