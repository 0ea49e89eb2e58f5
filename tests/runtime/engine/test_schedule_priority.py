"""Admission classes (GenerateRequest.priority): online requests are admitted and kept before
background (Batch API) ones under every ordering policy, each class in the policy's own order."""

from __future__ import annotations

import pytest

from runtime.api import BACKGROUND_PRIORITY, GenerateRequest
from runtime.counters import EngineCounters
from runtime.engine.policies import POLICIES, SchedulePolicy
from runtime.engine.scheduler import RequestCounts, Scheduler
from runtime.kvcache.cache_manager import CacheManager
from runtime.kvcache.pool import ReqToTokenTable, SlotAllocator
from runtime.kvcache.radix_cache import RadixCache
from runtime.request import Req


def req(ids, priority: int = 0, arrival: float = 0.0) -> Req:
    return Req(
        spec=GenerateRequest(prompt_ids=list(ids), priority=priority), emit=lambda ev: None, detok=None, arrival=arrival
    )


def ids(reqs) -> set[str]:
    return {r.rid for r in reqs}


class LengthIndex:
    def __init__(self, lengths):
        self.lengths = lengths

    def match_length(self, r: Req) -> int:
        return self.lengths.get(r.rid, 0)

    def prefix_path(self, r: Req):
        return ("P",) if self.lengths.get(r.rid) else ()


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_online_requests_come_before_background_ones_in_every_policy(policy):
    batch = [req([i], BACKGROUND_PRIORITY) for i in range(3)]
    online = [req([10 + i]) for i in range(2)]
    waiting = [batch[0], online[0], batch[1], batch[2], online[1]]
    index = LengthIndex({batch[1].rid: 30, online[1].rid: 5})  # the batch line has the longer cached prefix
    order = SchedulePolicy(policy).order(waiting, index)
    assert ids(order[:2]) == ids(online) and ids(order[2:]) == ids(batch)
    if policy == "lpm":  # within each class the policy still decides
        assert order == [online[1], online[0], batch[1], batch[0], batch[2]]


def test_random_policy_keeps_the_classes_apart():
    batch, online = [req([i], BACKGROUND_PRIORITY) for i in range(4)], [req([9]), req([8])]
    order = SchedulePolicy("random", seed=3).order(batch + online, LengthIndex({}))
    assert ids(order[:2]) == ids(online)


def test_all_online_keeps_the_policy_order():
    reqs = [req([i]) for i in range(4)]
    index = LengthIndex({reqs[2].rid: 40, reqs[1].rid: 5})
    assert SchedulePolicy("lpm").order(reqs, index) == [reqs[2], reqs[1], reqs[0], reqs[3]]


def test_scheduler_admits_the_online_request_into_the_last_row_and_retracts_background_first():
    counters = EngineCounters()
    cache = CacheManager(RadixCache(SlotAllocator(256)), ReqToTokenTable(2, 256), counters)
    sched = Scheduler(SchedulePolicy("fcfs"), cache, counters, RequestCounts(100), 1024)
    b1, b2 = req(range(100, 110), BACKGROUND_PRIORITY, 1.0), req(range(200, 210), BACKGROUND_PRIORITY, 2.0)
    online = req(range(300, 330), arrival=3.0)
    for r in (b1, b2, online):
        assert sched.counts.try_submit()
        sched.add(r)
    plan = sched.schedule().plan  # two rows: the online request and the earliest batch line
    assert [r for r, _ in plan] == [online, b1] and sched.waiting == [b2]
    for r, n in plan:
        slots = cache.allocator.alloc(n)
        cache.req_table.write(r.row, r.kv_len, slots)
        r.kv_len += n
    assert online.owned_slots > b1.owned_slots
    assert sched.retract_one()  # the batch line goes back although the online one holds more slots
    assert sched.running == [online] and sched.waiting[0] is b1
