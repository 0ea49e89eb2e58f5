"""The scheduler: which requests run in the next forward pass, and how many tokens each feeds.

Holds the waiting and running lists (nano-vllm's Scheduler). Each step it gives every decoding
request its pending tokens (retracting one if the KV pool cannot hold them), continues prefills
within the chunked-prefill budget, then admits waiting requests in the policy's order
(runtime/engine/policies.py) while rows, the chunk budget and the KV pool allow.

Ownership: the lists and every `Req` in them belong to the engine thread. `RequestCounts` is the
only state other threads touch (clients count submissions against the queue bound), under its lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from runtime.counters import EngineCounters
from runtime.engine.policies import SchedulePolicy
from runtime.kvcache.cache_manager import CacheManager
from runtime.request import Req

# A waiting request that shares this many more tokens with a request being prefilled than with
# the cache waits for that prefill to land in the cache instead of computing the prefix twice.
SHARED_PREFIX_WAIT_TOKENS = 64


class RequestCounts:
    """Submitted-not-admitted (`queued`, the waiting gauge) and submitted-not-finished
    (`unfinished`, bounded by max_running + max_waiting so a burst on an idle engine is not
    refused before the loop had a chance to admit it), shared by clients and the engine thread."""

    def __init__(self, limit: int):
        self.limit = limit
        self.queued = 0
        self.unfinished = 0
        self._lock = threading.Lock()

    def try_submit(self) -> bool:
        with self._lock:
            if self.unfinished >= self.limit:
                return False
            self.queued += 1
            self.unfinished += 1
            return True

    def admitted(self) -> None:
        with self._lock:
            self.queued -= 1

    def requeued(self) -> None:
        with self._lock:
            self.queued += 1

    def finished(self, was_queued: bool) -> None:
        with self._lock:
            self.unfinished -= 1
            self.queued -= was_queued


@dataclass
class Schedule:
    plan: list[tuple[Req, int]] = field(default_factory=list)  # (request, new tokens this pass)
    unservable: Req | None = None  # nothing runs and this head request can never fit the pool


class Scheduler:
    def __init__(
        self,
        policy: SchedulePolicy,
        cache: CacheManager,
        counters: EngineCounters,
        counts: RequestCounts,
        chunked_prefill_tokens: int,
    ):
        self.policy = policy
        self.cache = cache
        self.counters = counters
        self.counts = counts
        self.chunked_prefill_tokens = chunked_prefill_tokens
        self.waiting: list[Req] = []
        self.running: list[Req] = []

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, r: Req) -> None:
        self.waiting.append(r)
        self.cache.prefetch(r)

    def remove(self, r: Req) -> None:
        """`r` finished: drop it from whichever list holds it (if any) and count it."""
        if r in self.running:
            self.running.remove(r)
            self.counts.finished(was_queued=False)
            return
        if r in self.waiting:
            self.waiting.remove(r)
        self.counts.finished(was_queued=True)  # waiting, or refused before it was ever queued

    def schedule(self) -> Schedule:
        budget = self.chunked_prefill_tokens
        plan: list[tuple[Req, int]] = []
        for r in self.running:  # window layers: release the window KV no later token sees
            self.cache.trim_window(r)
        decoding = [r for r in self.running if not r.in_prefill]
        if not self.cache.ensure_free(sum(r.num_pending for r in decoding)):
            for r in decoding:  # drafts are optional: drop them before retracting anyone
                r.draft = []
        while decoding and not self.cache.ensure_free(sum(r.num_pending for r in decoding)):
            if not self.retract_one():
                break
            decoding = [r for r in self.running if not r.in_prefill]
        plan.extend((r, r.num_pending) for r in decoding)
        reserved = sum(n for _, n in plan)

        for r in [r for r in self.running if r.in_prefill]:
            n = min(budget, r.num_pending)
            if n <= 0 or not self.cache.ensure_free(reserved + n):
                break
            plan.append((r, n))
            reserved += n
            budget -= n
        if self.waiting and budget > 0:
            self.admit(plan, budget, reserved)
        if not plan and self.waiting and not self.running:
            return Schedule(unservable=self.waiting[0])
        if not plan and self.retract_one():  # prefills stuck on each other's slots (a small window pool)
            return self.schedule()
        return Schedule(plan)

    def admit(self, plan: list[tuple[Req, int]], budget: int, reserved: int) -> None:
        """Move waiting requests to `plan` in policy order while a row, `budget` (prompt tokens
        this pass) and the KV pool (`reserved` slots already promised) allow."""
        t0 = time.perf_counter()
        in_prefill = [r for r, _ in plan if r.in_prefill]
        for r in self.policy.order(self.waiting, self.cache):
            if budget <= 0 or self.cache.free_rows == 0:
                break
            if self.running and self.cache.loading(r):
                continue  # its prefix is being read from disk: admit it once the pages are in memory
            m = self.cache.lock_prefix(r)
            if self._waits_for_shared_prefill(r, m.length, in_prefill):
                self.cache.unlock(m)
                continue
            n = min(budget, r.seq_len - m.length)
            if not self.cache.ensure_free(reserved + n):
                self.cache.unlock(m)
                self.cache.ensure_free(reserved)  # a tiered match may have loaded into slots the plan reserved
                break
            self.cache.attach(r, m)
            if r.prompt_cached_tokens is None:  # first admission (not a retracted one coming back)
                r.prompt_cached_tokens = m.length
                self.counters.prompt_tokens += len(r.prompt_ids)
                self.counters.cached_prompt_tokens += m.length
            self.waiting.remove(r)
            self.counts.admitted()
            self.running.append(r)
            plan.append((r, n))
            in_prefill.append(r)
            reserved += n
            budget -= n
        self.counters.tree_seconds += time.perf_counter() - t0

    @staticmethod
    def _waits_for_shared_prefill(r: Req, matched: int, in_prefill: list[Req]) -> bool:
        """Another request is prefilling the same long prefix: wait a step and hit the cache."""
        return any(
            p.namespace == r.namespace
            and common_prefix_len(p.prompt_ids, r.prompt_ids) >= matched + SHARED_PREFIX_WAIT_TOKENS
            for p in in_prefill
        )

    def retract_one(self) -> bool:
        """Out of slots while decoding: send a background request before an online one, then the
        request holding most private slots (latest arrival on ties), back to the head of the queue. Its computed prefix stays in the cache,
        so resuming it is mostly a cache hit."""
        if len(self.running) <= 1:
            return False
        victim = max(self.running, key=lambda r: (r.spec.priority, r.owned_slots, r.arrival))
        victim.draft = []
        self.cache.release(victim)
        self.running.remove(victim)
        self.waiting.insert(0, victim)
        self.counts.requeued()
        self.counters.retractions += 1
        return True


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # binary search on slice equality: few C-level compares instead of a Python loop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo
