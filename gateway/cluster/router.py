"""The prefix-aware request router, on Ray Serve's public request-router API.

Ray Serve runs a deployment handle's router in the handle's process (here: the gateway), so the
router keeps, per replica, the prefix keys of what it sent there (immediately: the replica's own
report arrives only every `request_routing_stats_period_s`), merged with what the replica reports,
plus the requests in flight to it. `routing_log.ROUTING_LOG` records decisions and the replicas' latest
reports for /metrics and benches.

Ray Serve ships this module to the handle's process by value (cloudpickle), so shared state lives in
`routing_log`, which is referenced as a module (by name) and so is the process's own.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from gateway.cluster import routing_log
from gateway.cluster.prefix_keys import BLOCK_TOKENS, PrefixSummary, prefix_keys
from gateway.cluster.routing_policy import (
    POLICIES,
    Decision,
    ReplicaView,
    RoundRobin,
    RoutingThresholds,
    choose_by_prefix,
    least_loaded,
    power_of_two,
)
from runtime.api import GenerateRequest

ROUTED_METHODS = {"generate", "pin_prefix", "explain_prefix", "unpin_prefix"}  # routed by their prompt's prefix
RECORDED_METHODS = {"generate", "pin_prefix"}  # these leave the prefix cached on the chosen replica


def replica_name(replica_id: ReplicaID) -> str:
    return replica_id.unique_id


class PrefixAwareRouter(RequestRouter):
    def initialize_state(
        self,
        policy: str = "prefix",
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.5,
        summary_blocks: int = 4096,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}, not {policy!r}")
        self.policy = policy
        self.thresholds = RoutingThresholds(cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.summary_blocks = summary_blocks
        self.sent: dict[str, PrefixSummary] = {}  # replica -> keys of what this router sent there
        self.load: Counter[str] = Counter()  # replica -> requests in flight
        self.round_robin = RoundRobin()
        self.rng = random.Random(seed)
        self.merged: dict[str, int] = {}  # replica -> id of the last reported key list merged

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_name = {replica_name(r.replica_id): r for r in candidate_replicas}
        self._forget_gone(set(by_name))
        views = [self._view(name, r) for name, r in by_name.items()]
        keys = self._keys(pending_request)
        if keys is None:  # stats and other calls: least loaded first
            return [[by_name[least_loaded(views).replica_id]], list(candidate_replicas)]
        decision = self._decide(keys, views)
        if pending_request is not None and pending_request.metadata.call_method in RECORDED_METHODS:
            self.sent.setdefault(decision.replica_id, PrefixSummary(self.summary_blocks)).add(keys)
            routing_log.ROUTING_LOG.record(decision)
        chosen = by_name[decision.replica_id]
        return [[chosen], [r for r in candidate_replicas if r is not chosen]]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Ray Serve calls this with every new set of replica infos, which it rebroadcasts whenever a
        replica's routing stats change: /metrics then shows each replica's latest report even when
        nothing has been routed since (a finished or aborted request leaves the running count)."""
        super().update_replicas(replicas)
        live = set()
        for replica in replicas:
            name = replica_name(replica.replica_id)
            live.add(name)
            if replica.routing_stats:
                routing_log.ROUTING_LOG.report(name, replica.routing_stats)
        routing_log.ROUTING_LOG.forget(live)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self.load[replica_name(replica_id)] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        name = replica_name(replica_id)
        self.load[name] = max(0, self.load[name] - 1)

    def _decide(self, keys: list[int], views: list[ReplicaView]) -> Decision:
        if self.policy == "round_robin":
            return self.round_robin.choose(views)
        if self.policy == "power_of_two":
            return power_of_two(views, self.rng)
        return choose_by_prefix(keys, views, self.thresholds)

    def _view(self, name: str, replica: RunningReplica) -> ReplicaView:
        held = self.sent.setdefault(name, PrefixSummary(self.summary_blocks))
        stats = replica.routing_stats or {}
        if stats:
            routing_log.ROUTING_LOG.report(name, stats)
            reported = stats.get("prefix_keys")
            if reported and self.merged.get(name) != id(reported):  # each report merged once
                self.merged[name] = id(reported)
                held.add(k for k in reported if k not in held)  # a replica may know more than this router
        return ReplicaView(name, self.load[name], held)

    def _forget_gone(self, live: set[str]) -> None:
        for name in [n for n in self.sent if n not in live]:
            del self.sent[name]  # a restarted replica comes back empty, under a new id
            self.load.pop(name, None)
            self.merged.pop(name, None)
        routing_log.ROUTING_LOG.forget(live)

    @staticmethod
    def _keys(pending_request: PendingRequest | None) -> list[int] | None:
        if pending_request is None or pending_request.metadata.call_method not in ROUTED_METHODS:
            return None
        args = pending_request.args
        if not args:
            return None
        first = args[0]
        if isinstance(first, GenerateRequest):
            return prefix_keys(first.prompt_ids, first.namespace, BLOCK_TOKENS)
        if isinstance(first, list):
            namespace = args[1] if len(args) > 1 else pending_request.kwargs.get("namespace", "")
            return prefix_keys(first, namespace, BLOCK_TOKENS)
        return None
