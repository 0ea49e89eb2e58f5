"""The prefix-aware routing decision and its keys, without Ray (pure functions)."""

from __future__ import annotations

import random

import pytest

from gateway.cluster.prefix_keys import PrefixSummary, matched_blocks, prefix_keys
from gateway.cluster.routing_policy import ReplicaView, RoundRobin, RoutingThresholds, choose_by_prefix, power_of_two

SYSTEM_A = list(range(1000, 1128))  # 4 blocks
SYSTEM_B = list(range(2000, 2128))


def held(*prompts, namespace: str = "") -> PrefixSummary:
    s = PrefixSummary(1000)
    for p in prompts:
        s.add(prefix_keys(p, namespace))
    return s


def test_keys_are_shared_exactly_by_shared_leading_blocks():
    a = prefix_keys(SYSTEM_A + [1, 2, 3] * 20)
    b = prefix_keys(SYSTEM_A + [4, 5, 6] * 20)
    assert a[:4] == b[:4] and a[4] != b[4]
    assert prefix_keys(SYSTEM_A[:31]) == []  # no complete block, no key


def test_namespace_is_part_of_the_key():
    assert prefix_keys(SYSTEM_A, "tenant-1") != prefix_keys(SYSTEM_A, "tenant-2")
    assert set(prefix_keys(SYSTEM_A, "t1")).isdisjoint(prefix_keys(SYSTEM_A, ""))


def test_match_stops_at_the_first_missing_block():
    keys = prefix_keys(SYSTEM_A + SYSTEM_B)
    s = PrefixSummary(100)
    s.add([keys[0], keys[1], keys[3]])
    assert matched_blocks(keys, s) == 2


def test_summary_forgets_least_recently_used_first():
    s = PrefixSummary(3)
    s.add([1, 2, 3])
    s.add([1])  # 1 is now the most recent
    s.add([4])
    assert 2 not in s and {1, 3, 4} <= set(s.snapshot())


def test_routes_to_the_replica_holding_the_prefix():
    replicas = [ReplicaView("r0", 0, held(SYSTEM_A)), ReplicaView("r1", 0, held(SYSTEM_B))]
    d = choose_by_prefix(prefix_keys(SYSTEM_B + [7] * 40), replicas, RoutingThresholds())
    assert (d.replica_id, d.reason, d.matched_blocks) == ("r1", "prefix", 4)


def test_another_tenants_prefix_does_not_attract():
    replicas = [ReplicaView("r0", 3, held(SYSTEM_A, namespace="t1")), ReplicaView("r1", 0, held())]
    d = choose_by_prefix(prefix_keys(SYSTEM_A, "t2"), replicas, RoutingThresholds())
    assert (d.replica_id, d.reason) == ("r1", "load")


def test_a_short_match_falls_back_to_least_loaded():
    replicas = [ReplicaView("r0", 2, held(SYSTEM_A[:32])), ReplicaView("r1", 1, held())]
    d = choose_by_prefix(prefix_keys(SYSTEM_A + SYSTEM_B), replicas, RoutingThresholds(cache_threshold=0.5))
    assert (d.replica_id, d.reason) == ("r1", "load")


def test_imbalanced_loads_override_the_prefix_match():
    t = RoutingThresholds(balance_abs_threshold=4, balance_rel_threshold=1.5)
    replicas = [ReplicaView("r0", 10, held(SYSTEM_A)), ReplicaView("r1", 1, held())]
    assert choose_by_prefix(prefix_keys(SYSTEM_A), replicas, t).replica_id == "r1"
    replicas[0].load = 5  # 4 above: still balanced by the absolute threshold
    assert choose_by_prefix(prefix_keys(SYSTEM_A), replicas, t).reason == "prefix"


def test_no_replica_is_an_error():
    with pytest.raises(ValueError):
        choose_by_prefix([1], [], RoutingThresholds())


def test_round_robin_and_power_of_two_baselines():
    replicas = [ReplicaView("r1", 0), ReplicaView("r0", 0)]
    rr = RoundRobin()
    assert [rr.choose(replicas).replica_id for _ in range(4)] == ["r0", "r1", "r0", "r1"]
    replicas[0].load = 9
    assert {power_of_two(replicas, random.Random(s)).replica_id for s in range(10)} == {"r0"}
