"""Which replica serves a request: the decision alone, without Ray (unit-tested directly).

Cache-aware like SGLang's router: while the replicas' loads are balanced, the request goes to the
replica holding the longest prefix of it if that match covers more than `cache_threshold` of the
prompt's blocks; otherwise (no good match, or loads imbalanced) to the least-loaded replica.
Loads count as imbalanced when the busiest has more than `balance_abs_threshold` requests above
the idlest and more than `balance_rel_threshold` times its load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from gateway.cluster.prefix_keys import PrefixSummary, matched_blocks

POLICIES = ("prefix", "round_robin", "power_of_two")


@dataclass
class ReplicaView:
    replica_id: str
    load: int  # requests routed to it and not completed yet
    held: PrefixSummary = field(default_factory=lambda: PrefixSummary(1))


@dataclass(frozen=True)
class Decision:
    replica_id: str
    reason: str  # "prefix" (longest match) | "load" (least loaded) | "round_robin" | "power_of_two"
    matched_blocks: int = 0


@dataclass(frozen=True)
class RoutingThresholds:
    cache_threshold: float = 0.5  # least matched share of the prompt's blocks to route by prefix
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5


def imbalanced(loads: Sequence[int], t: RoutingThresholds) -> bool:
    lo, hi = min(loads), max(loads)
    return hi - lo > t.balance_abs_threshold and hi > t.balance_rel_threshold * lo


def least_loaded(replicas: Sequence[ReplicaView]) -> ReplicaView:
    # ties go to the replica holding least (most room to cache something new)
    return min(replicas, key=lambda r: (r.load, len(r.held), r.replica_id))


def choose_by_prefix(keys: Sequence[int], replicas: Sequence[ReplicaView], t: RoutingThresholds) -> Decision:
    if not replicas:
        raise ValueError("no replica to route to")
    if keys and not imbalanced([r.load for r in replicas], t):
        matches = [(matched_blocks(keys, r.held), r) for r in replicas]
        best_match = max(m for m, _ in matches)
        if best_match and best_match / len(keys) > t.cache_threshold:
            best = least_loaded([r for m, r in matches if m == best_match])
            return Decision(best.replica_id, "prefix", best_match)
    return Decision(least_loaded(replicas).replica_id, "load", 0)


class RoundRobin:
    """The baseline the bench compares against (in replica-id order, so it is reproducible)."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaView]) -> Decision:
        ordered = sorted(replicas, key=lambda r: r.replica_id)
        pick = ordered[self._next % len(ordered)]
        self._next += 1
        return Decision(pick.replica_id, "round_robin")


def power_of_two(replicas: Sequence[ReplicaView], rng: random.Random) -> Decision:
    """Ray Serve's default: the less loaded of two random replicas."""
    pair = rng.sample(list(replicas), min(2, len(replicas)))
    pick = min(pair, key=lambda r: r.load)
    return Decision(pick.replica_id, "power_of_two")
