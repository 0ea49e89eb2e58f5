"""Which waiting requests to admit first: cache-aware ordering policies (SGLang's schedule_policy).

`lpm` (longest prefix match first) and `dfs-weight` order the waiting queue so that requests
sharing cached prefixes run together and the cache is hit before it is evicted; `fcfs` and
`random` are the baselines. `lpm` falls back to FCFS for a round when the queue is so long that
computing every match would cost more than it saves.

Pure ordering: a policy reads the cache only through `PrefixIndex` (the cache manager) and
changes nothing, so it can be unit-tested with a fake index.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Hashable, Protocol, Sequence

from runtime.request import Req

POLICIES = ("lpm", "dfs-weight", "fcfs", "random")
LPM_FALLBACK_QUEUE_LEN = 128


class PrefixIndex(Protocol):
    def match_length(self, r: Req) -> int:
        """Tokens of `r`'s prompt the prefix cache holds (no side effects)."""

    def prefix_path(self, r: Req) -> Sequence[Hashable]:
        """The cache tree's nodes from the root down to where `r`'s match ends (empty: none)."""


class SchedulePolicy:
    def __init__(self, policy: str, seed: int = 0):
        if policy not in POLICIES:
            raise ValueError(f"schedule_policy: unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.rng = random.Random(seed)

    def order(self, waiting: list[Req], index: PrefixIndex) -> list[Req]:
        """The policy's order, then by priority (stable): online requests before background ones
        whenever both wait, each class in the policy's order."""
        ordered = self.policy_order(waiting, index)
        if any(r.spec.priority for r in waiting):
            ordered.sort(key=lambda r: r.spec.priority)
        return ordered

    def policy_order(self, waiting: list[Req], index: PrefixIndex) -> list[Req]:
        if self.policy == "fcfs" or (self.policy == "lpm" and len(waiting) > LPM_FALLBACK_QUEUE_LEN):
            return list(waiting)
        if self.policy == "random":
            out = list(waiting)
            self.rng.shuffle(out)
            return out
        if self.policy == "lpm":
            # Stable sort: ties keep arrival order.
            return sorted(waiting, key=lambda r: -index.match_length(r))
        return dfs_weight_order(waiting, index)


def dfs_weight_order(waiting: list[Req], index: PrefixIndex) -> list[Req]:
    """SGLang's dfs-weight: each request hangs at the cache-tree node where its match ends; a
    node weighs as many requests as hang in its subtree. Visiting the tree depth first, heavier
    children first, runs the requests that share a cached prefix back to back, the most shared
    prefix first. Only the nodes on some request's path are visited (not the whole tree)."""
    at_node: dict[Hashable, list[Req]] = defaultdict(list)
    weight: dict[Hashable, int] = defaultdict(int)
    children: dict[Hashable, list[Hashable]] = defaultdict(list)
    root = object()  # above every namespace's root: requests with no match hang here
    for r in waiting:
        path = [root, *index.prefix_path(r)]
        at_node[path[-1]].append(r)
        for parent, node in zip(path, path[1:]):
            if node not in weight:
                children[parent].append(node)
        for node in path:
            weight[node] += 1
    out: list[Req] = []
    stack: list[tuple[Hashable, bool]] = [(root, False)]
    while stack:  # post-order without recursion (a deep tree must not hit the recursion limit)
        node, expanded = stack.pop()
        if expanded:
            out.extend(at_node[node])
            continue
        stack.append((node, True))
        # heaviest child visited first; sorted() is stable, so equal weights keep arrival order
        heaviest_first = sorted(children[node], key=lambda c: -weight[c])
        stack.extend((child, False) for child in reversed(heaviest_first))
    return out
