"""/metrics for a cluster: each replica's engine counters (label `replica`) and the router's
decisions (labels `replica`, `reason`: prefix | load | round_robin | power_of_two).

Registered into the gateway's own registry (`GatewayMetrics.registry`), next to the cluster-wide
totals the gateway already exports from `ClusterEngineClient.stats()`.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.cluster.routing_log import ROUTING_LOG

REPLICA_COUNTERS = (
    ("prompt_tokens", "jumpgate_replica_prompt_tokens", "Prompt tokens admitted, by replica."),
    (
        "cached_prompt_tokens",
        "jumpgate_replica_cached_prompt_tokens",
        "Prompt tokens served from the prefix cache, by replica.",
    ),
    ("generated_tokens", "jumpgate_replica_generation_tokens", "Tokens generated, by replica."),
)
REPLICA_GAUGES = (
    ("running_requests", "jumpgate_replica_running_requests", "Requests running, by replica."),
    ("waiting_requests", "jumpgate_replica_waiting_requests", "Requests waiting, by replica."),
    ("kv_slots_tree", "jumpgate_replica_cached_tokens", "Tokens the device prefix cache holds, by replica."),
)


class ClusterCollector:
    """A prometheus_client collector reading the routing log at scrape time."""

    def collect(self) -> Iterator[Metric]:
        decisions, replica_stats = ROUTING_LOG.snapshot()
        routed = CounterMetricFamily(
            "jumpgate_router_decisions", "Requests routed, by replica and reason.", labels=("replica", "reason")
        )
        for (replica, reason), n in sorted(decisions.items()):
            routed.add_metric((replica, reason), n)
        yield routed
        engines = {replica: s.get("engine", {}) for replica, s in sorted(replica_stats.items())}
        for key, name, help in REPLICA_COUNTERS:
            family = CounterMetricFamily(name, help, labels=("replica",))
            for replica, stats in engines.items():
                family.add_metric((replica,), float(stats.get(key, 0)))
            yield family
        for key, name, help in REPLICA_GAUGES:
            family = GaugeMetricFamily(name, help, labels=("replica",))
            for replica, stats in engines.items():
                family.add_metric((replica,), float(stats.get(key, 0)))
            yield family
        hit_rate = GaugeMetricFamily(
            "jumpgate_replica_prefix_cache_hit_rate",
            "Share of a replica's admitted prompt tokens served from its prefix cache.",
            labels=("replica",),
        )
        for replica, stats in engines.items():
            prompt = stats.get("prompt_tokens", 0)
            hit_rate.add_metric((replica,), stats.get("cached_prompt_tokens", 0) / prompt if prompt else 0.0)
        yield hit_rate


def register_cluster_metrics(registry: Any) -> None:
    registry.register(ClusterCollector())
