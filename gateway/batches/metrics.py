"""The Batch API's Prometheus series, in the gateway's registry: lines answered by outcome, lines in
flight, and batches by status (read from the store at each scrape)."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.batches.objects import BatchStatus

STATUSES: tuple[str, ...] = BatchStatus.__args__  # type: ignore[attr-defined]


class BatchesByStatus:
    """Collector: jumpgate_batches{status} (every status, zeros included)."""

    def __init__(self, statuses: Callable[[], list[str]]):
        self.statuses = statuses

    def collect(self) -> Iterator[Metric]:
        tally = Tally(self.statuses())
        family = GaugeMetricFamily("jumpgate_batches", "Batches by status (all tenants).", labels=["status"])
        for status in STATUSES:
            family.add_metric([status], tally.get(status, 0))
        yield family


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry, statuses: Callable[[], list[str]]):
        self.requests = Counter(
            "jumpgate_batch_requests",
            "Batch lines answered, by outcome (completed: a 2xx "
            "answer in the output file; failed: an error in the error file).",
            ("status",),
            registry=registry,
        )
        self.in_flight = Gauge(
            "jumpgate_batch_requests_in_flight", "Batch lines being answered now.", registry=registry
        )
        registry.register(BatchesByStatus(statuses))  # type: ignore[arg-type]

    def answered(self, ok: bool) -> None:
        self.requests.labels(status="completed" if ok else "failed").inc()
