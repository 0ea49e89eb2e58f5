"""What the router decided and what the replicas reported, readable by the gateway (/metrics) and
benches in the same process."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from gateway.cluster.routing_policy import Decision


class RoutingLog:
    """Decisions so far, by (replica, reason), and each replica's last reported routing stats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decisions: Counter[tuple[str, str]] = Counter()
        self.replica_stats: dict[str, dict[str, Any]] = {}

    def record(self, decision: Decision) -> None:
        with self._lock:
            self.decisions[(decision.replica_id, decision.reason)] += 1

    def report(self, replica_id: str, stats: dict[str, Any]) -> None:
        with self._lock:
            self.replica_stats[replica_id] = stats

    def forget(self, live_replica_ids: set[str]) -> None:
        with self._lock:
            for rid in list(self.replica_stats):
                if rid not in live_replica_ids:
                    del self.replica_stats[rid]

    def snapshot(self) -> tuple[dict[tuple[str, str], int], dict[str, dict[str, Any]]]:
        with self._lock:
            return dict(self.decisions), dict(self.replica_stats)

    def reset(self) -> None:
        with self._lock:
            self.decisions.clear()


ROUTING_LOG = RoutingLog()
