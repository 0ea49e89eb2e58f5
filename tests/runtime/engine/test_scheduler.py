"""Scheduler, ordering policies and cache manager without a model: the real radix tree over a bare
slot allocator (no KV tensors), requests set up by hand, passes simulated by `fake_pass`."""

from __future__ import annotations

import pytest

from runtime.api import GenerateRequest
from runtime.counters import EngineCounters
from runtime.engine.policies import SchedulePolicy, dfs_weight_order
from runtime.engine.scheduler import RequestCounts, Scheduler
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.pool import ReqToTokenTable, SlotAllocator
from runtime.kvcache.radix_cache import RadixCache
from runtime.request import Req


def req(ids: list[int], arrival: float = 0.0) -> Req:
    return Req(spec=GenerateRequest(prompt_ids=list(ids)), emit=lambda ev: None, detok=None, arrival=arrival)


def setup(policy: str = "fcfs", slots: int = 64, rows: int = 4, chunk: int = 1024):
    counters = EngineCounters()
    cache = CacheManager(RadixCache(SlotAllocator(slots)), ReqToTokenTable(rows, 256), counters)
    sched = Scheduler(SchedulePolicy(policy), cache, counters, RequestCounts(100), chunk)
    return sched, cache, counters


def cache_prefix(cache: CacheManager, ids: list[int]) -> None:
    """Put `ids` in the tree as if a finished request had computed them."""
    cache.prefix_cache.insert(ids, cache.allocator.alloc(len(ids)))


def queue(sched: Scheduler, *reqs: Req) -> None:
    for r in reqs:
        assert sched.counts.try_submit()
        sched.add(r)


def fake_pass(cache: CacheManager, plan: list[tuple[Req, int]]) -> None:
    """What the model runner and decoder do to KV bookkeeping: slots for the fed tokens."""
    for r, n in plan:
        slots = cache.allocator.alloc(n)
        cache.req_table.write(r.row, r.kv_len, slots)
        r.kv_len += n


A = list(range(100, 132))  # a 32-token prefix
B = list(range(500, 540))  # 40 tokens sharing nothing with A


# ---------------------------------------------------------------------------- ordering policies


class FakeIndex:
    """PrefixIndex with scripted match lengths and tree paths."""

    def __init__(self, lengths=None, paths=None):
        self.lengths, self.paths = lengths or {}, paths or {}

    def match_length(self, r: Req) -> int:
        return self.lengths.get(r.rid, 0)

    def prefix_path(self, r: Req):
        return self.paths.get(r.rid, ())


def test_lpm_orders_by_cached_prefix_length_ties_in_arrival_order():
    reqs = [req([i]) for i in range(4)]
    index = FakeIndex(lengths={reqs[1].rid: 5, reqs[2].rid: 40, reqs[3].rid: 5})
    assert SchedulePolicy("lpm").order(reqs, index) == [reqs[2], reqs[1], reqs[3], reqs[0]]
    assert SchedulePolicy("fcfs").order(reqs, index) == reqs


def test_dfs_weight_visits_the_heavier_subtree_first_and_unmatched_last():
    q1, px1, py1, q2, px2, none = (req([i]) for i in range(6))
    # tree: root -> P -> {X, Y}, root -> Q; X holds two requests, Y one, Q two
    paths = {q1.rid: ("Q",), q2.rid: ("Q",), px1.rid: ("P", "X"), px2.rid: ("P", "X"), py1.rid: ("P", "Y")}
    order = dfs_weight_order([q1, px1, py1, none, q2, px2], FakeIndex(paths=paths))
    assert order == [px1, px2, py1, q1, q2, none]


def test_dfs_weight_groups_by_the_radix_cache_not_by_the_prompts():
    sched, cache, _ = setup("dfs-weight")
    a1, b1, a2 = req(A + [1, 2]), req(B), req(A + [3, 4])
    # nothing cached: the shared prompt head alone does not group a1 and a2
    assert dfs_weight_order([a1, b1, a2], cache) == [a1, b1, a2]
    cache_prefix(cache, A)  # now the tree holds their prefix: they run back to back
    assert dfs_weight_order([a1, b1, a2], cache) == [a1, a2, b1]
    assert [len(n.key) for n in cache.prefix_path(a1)] == [0, len(A)]  # root, then A's node


# ---------------------------------------------------------------------------- admission


def test_lpm_beats_fcfs_on_cache_hits_when_admission_would_evict():
    hits = {}
    for policy in ("fcfs", "lpm"):
        sched, cache, counters = setup(policy, slots=64)
        cache_prefix(cache, A)  # 32 of 64 slots held by the tree (evictable)
        b, a = req(B), req(A + [7])
        queue(sched, b, a)  # B arrived first: FCFS admits it and evicts A to make room
        sched.schedule()
        hits[policy] = counters.cached_prompt_tokens
    assert hits == {"fcfs": 0, "lpm": len(A)}


def test_admission_respects_the_chunked_prefill_budget():
    sched, cache, _ = setup(chunk=50, slots=256)
    r1, r2, r3 = req(range(30)), req(range(1000, 1030)), req(range(2000, 2030))
    queue(sched, r1, r2, r3)
    plan = sched.schedule().plan
    assert [(r, n) for r, n in plan] == [(r1, 30), (r2, 20)]  # r2 gets the rest of the budget as a chunk
    assert sched.waiting == [r3] and sched.counts.queued == 1


def test_admission_respects_the_kv_budget_and_rows():
    sched, cache, _ = setup(slots=64, rows=4)
    r1, r2 = req(range(40)), req(range(1000, 1040))
    queue(sched, r1, r2)
    assert [r for r, _ in sched.schedule().plan] == [r1]  # 40 + 40 > 64 slots
    assert sched.waiting == [r2]

    sched, cache, _ = setup(slots=256, rows=1)
    queue(sched, req([1, 2, 3]), req([4, 5, 6]))
    assert len(sched.schedule().plan) == 1  # one row free


def test_a_request_larger_than_the_pool_is_reported_unservable():
    sched, _, _ = setup(slots=16)
    r = req(range(40))
    queue(sched, r)
    s = sched.schedule()
    assert s.plan == [] and s.unservable is r


# ---------------------------------------------------------------------------- retraction


def test_retraction_picks_the_request_with_most_private_slots():
    sched, cache, counters = setup(slots=256, rows=4)
    cache_prefix(cache, A)
    shared_short = req(A + list(range(10)), arrival=1.0)  # 32 cached + 10 private
    shared_long = req(A + list(range(20)), arrival=2.0)  # 32 cached + 20 private
    private = req(list(range(600, 612)), arrival=3.0)  # 12 private, the latest arrival
    queue(sched, shared_short, shared_long, private)
    fake_pass(cache, sched.schedule().plan)
    assert [r.owned_slots for r in (shared_short, shared_long, private)] == [10, 20, 12]
    assert sched.retract_one()
    assert sched.waiting[0] is shared_long and shared_long not in sched.running and shared_long.row is None
    assert counters.retractions == 1 and sched.counts.queued == 1
    cache.check_invariant(sum(r.owned_slots for r in sched.running))
    # its computed prompt stayed in the cache: coming back is a hit (all but the last token, always fed)
    assert cache.match_length(shared_long) == shared_long.seq_len - 1


def test_retraction_tie_goes_to_the_latest_arrival():
    sched, cache, _ = setup(slots=256, rows=4)
    first, second = req(range(10), arrival=1.0), req(range(300, 310), arrival=2.0)
    queue(sched, first, second)
    fake_pass(cache, sched.schedule().plan)
    assert first.owned_slots == second.owned_slots == 10
    assert sched.retract_one() and sched.waiting == [second] and sched.running == [first]
    assert not sched.retract_one()  # the last running request is never retracted


# ---------------------------------------------------------------------------- cache manager


def test_cache_manager_progress_and_release_keep_the_slot_accounting():
    sched, cache, _ = setup(slots=128, rows=2)
    r = req(A + [1, 2, 3])
    queue(sched, r)
    fake_pass(cache, sched.schedule().plan)
    cache.cache_progress(r)  # the computed prompt goes into the tree; r re-locks it
    assert r.cached_len == r.kv_len == len(A) + 3 and r.owned_slots == 0
    cache.check_invariant(sum(x.owned_slots for x in sched.running))
    assert cache.match_length(req(A + [1, 2, 3, 9])) == len(A) + 3
    sched.remove(r)
    cache.release(r)
    assert r.row is None and cache.free_rows == 2
    assert cache.allocator.num_free + cache.prefix_cache.total_size == 128
    cache.check_invariant(0)


def test_pins_are_budgeted_and_released():
    from runtime.api import EngineError

    _, cache, _ = setup(slots=128)
    cache_prefix(cache, A)
    cache.check_pin_budget(len(A), budget=40)
    assert cache.pin(("", "a"), A, "") == len(A) and cache.pinned(("", "a")) == len(A)
    with pytest.raises(EngineError) as e:
        cache.check_pin_budget(10, budget=40)
    assert e.value.code == "pin_budget_exceeded"
    assert cache.prefix_cache.evictable_size == 0  # pinned: nothing to evict
    assert cache.unpin(("", "a")) == len(A) and cache.prefix_cache.evictable_size == len(A)
