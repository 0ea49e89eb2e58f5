"""Which waiting requests to admit next: cache-aware ordering policies.

`lpm` (longest prefix match first) and `dfs-weight` (SGLang's schedule_policy) order the waiting
queue so that requests sharing cached prefixes run together and the cache is hit before it is
evicted; `fcfs` and `random` are the baselines. `lpm` falls back to FCFS for a round when the
queue is so long that computing every match would cost more than it saves.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from runtime.request import Req

POLICIES = ("lpm", "dfs-weight", "fcfs", "random")
LPM_FALLBACK_QUEUE_LEN = 128
# A waiting request that shares this many more tokens with a request being prefilled than with
# the cache waits for that prefill to land in the cache instead of computing the prefix twice.
SHARED_PREFIX_WAIT_TOKENS = 64
_DFS_PROBE_TOKENS = 1024  # prompt head used to build the dfs-weight trie
_DFS_CHUNK = 16


class SchedulePolicy:
    def __init__(self, policy: str, seed: int = 0):
        if policy not in POLICIES:
            raise ValueError(f"schedule_policy: unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.rng = random.Random(seed)

    def order(self, waiting: list[Req], match_len: Callable[[Req], int]) -> list[Req]:
        if self.policy == "fcfs" or (self.policy == "lpm" and len(waiting) > LPM_FALLBACK_QUEUE_LEN):
            return list(waiting)
        if self.policy == "random":
            out = list(waiting)
            self.rng.shuffle(out)
            return out
        if self.policy == "lpm":
            # Stable sort: ties keep arrival order.
            return sorted(waiting, key=lambda r: -match_len(r))
        return _dfs_weight_order(waiting)


def _dfs_weight_order(waiting: list[Req]) -> list[Req]:
    """Visit a trie of the waiting prompts depth first, heavier subtrees (more requests) first, so
    requests that share a prefix run back to back."""
    root: dict = {"kids": {}, "reqs": [], "weight": 0}
    for r in waiting:
        node = root
        node["weight"] += 1
        ids = r.all_ids()[:_DFS_PROBE_TOKENS]
        for i in range(0, len(ids), _DFS_CHUNK):  # chunks of tokens keep the trie small
            node = node["kids"].setdefault(tuple(ids[i : i + _DFS_CHUNK]), {"kids": {}, "reqs": [], "weight": 0})
            node["weight"] += 1
        node["reqs"].append(r)
    out: list[Req] = []
    stack = [root]
    while stack:
        node = stack.pop()
        out.extend(node["reqs"])
        # Push lighter first so the heaviest child is visited next.
        stack.extend(sorted(node["kids"].values(), key=lambda n: n["weight"]))
    return out


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
