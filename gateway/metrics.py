"""Prometheus metrics (prometheus_client), one registry per app.

Gateway-side series (requests by outcome, tokens, in-flight, latency histograms) are recorded as
requests finish. Engine and grammar-service series come from one snapshot of each per scrape
(`engine.stats()` -> `runtime.api.EngineStats`, `GrammarService.stats()`), exported by
`SnapshotCollector`: counters as counters, gauges as gauges.
"""

from __future__ import annotations

from typing import Any, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runtime.api import EngineStats

# the *_created series double the output and no dashboard of ours reads them (vLLM drops them too)
prometheus_client.disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4"  # the text format generate_latest writes

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GatewayMetrics:
    """The gateway's own series, in a registry of their own (several apps may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("jumpgate_requests", "Requests by route and outcome.", ("route", "outcome"), registry=r)
        self.prompt_tokens = Counter("jumpgate_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.cached_prompt_tokens = Counter(
            "jumpgate_cached_prompt_tokens", "Prompt tokens served from the prefix cache.", registry=r
        )
        self.generated_tokens = Counter("jumpgate_generation_tokens", "Tokens generated.", registry=r)
        self.in_flight = Gauge(
            "jumpgate_gateway_in_flight_requests", "Generation requests in flight in the gateway.", registry=r
        )
        self.ttft = Histogram(
            "jumpgate_time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "jumpgate_e2e_request_latency_seconds", "End-to-end request latency.", buckets=E2E_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "jumpgate_inter_token_latency_seconds", "Time between output increments.", buckets=ITL_BUCKETS, registry=r
        )
        self.invalid_structured_outputs = Counter(
            "jumpgate_structured_output_invalid",
            "Structured outputs that failed schema validation after generation (mode=strict: a fidelity bug).",
            ("mode", "reason"),
            registry=r,
        )

    def request_finished(self, route: str, outcome: str) -> None:
        self.requests.labels(route=route, outcome=outcome).inc()

    def structured_output_invalid(self, mode: str, reason: str) -> None:
        """One structured output that failed validation after generation (gateway/pipeline/output_validation.py)."""
        self.invalid_structured_outputs.labels(mode=mode, reason=reason).inc()

    def requests_counted(self, route: str, outcome: str) -> float:
        return self.registry.get_sample_value("jumpgate_requests_total", {"route": route, "outcome": outcome}) or 0.0

    def render(self, engine: EngineStats | None = None, grammar: Any = None) -> bytes:
        """The exposition text: our series, then one engine and one grammar snapshot."""
        return generate_latest(self.registry) + generate_latest(SnapshotCollector(engine, grammar))


# (EngineStats field, metric name, help); counters get `_total` from prometheus_client
ENGINE_GAUGES = (
    ("running_requests", "jumpgate_running_requests", "Requests being decoded by the engine."),
    ("waiting_requests", "jumpgate_waiting_requests", "Requests queued in the engine."),
    ("kv_slots_total", "jumpgate_kv_pool_slots", "KV pool size in slots."),
    ("kv_slots_free", "jumpgate_kv_slots_free", "KV pool slots free."),
    ("kv_slots_tree", "jumpgate_kv_slots_tree_held", "KV pool slots held by the prefix cache."),
    ("kv_slots_evictable", "jumpgate_kv_slots_evictable", "Prefix-cache slots no running request locks."),
    ("kv_slots_request_only", "jumpgate_kv_slots_request_only", "KV pool slots held only by running requests."),
    ("kv_window_slots_total", "jumpgate_kv_window_slots", "Window-layer KV slots (sliding-window models; 0: none)."),
    ("kv_window_slots_free", "jumpgate_kv_window_slots_free", "Window-layer KV slots free."),
    (
        "lookup_row_cost",
        "jumpgate_lookup_row_cost",
        "A draft row's cost as a share of a decode step's per output token (measured or fixed).",
    ),
)
ENGINE_COUNTERS = (
    ("prompt_tokens", "jumpgate_engine_prompt_tokens", "Prompt tokens admitted by the engine."),
    (
        "cached_prompt_tokens",
        "jumpgate_engine_cached_prompt_tokens",
        "Admitted prompt tokens served from the prefix cache.",
    ),
    ("generated_tokens", "jumpgate_engine_generated_tokens", "Tokens sampled by the engine."),
    ("forward_passes", "jumpgate_forward_passes", "Model forward passes."),
    ("forward_tokens", "jumpgate_forward_tokens", "Tokens through the model's forward passes."),
    ("jump_forward_tokens", "jumpgate_jump_forward_tokens", "Tokens appended by jump-forward."),
    (
        "jump_forward_rejected",
        "jumpgate_jump_forward_rejected_tokens",
        "Jump-forward draft tokens rolled back by verification.",
    ),
    ("lookup_draft_tokens", "jumpgate_lookup_draft_tokens", "Prompt-lookup draft tokens queued for verification."),
    ("lookup_accepted_tokens", "jumpgate_lookup_accepted_tokens", "Prompt-lookup draft tokens verification kept."),
    ("retractions", "jumpgate_retractions", "Running requests sent back to the queue for lack of KV slots."),
    (
        "closed_at_budget",
        "jumpgate_strict_closed_at_budget",
        "Strict requests whose value budget closing completed before max_tokens (they finish `stop`).",
    ),
    (
        "value_rewrites",
        "jumpgate_value_rewrites",
        "Values that broke a schema keyword checked on the finished output, rolled back and written again.",
    ),
    ("rewritten_tokens", "jumpgate_value_rewritten_tokens", "Tokens dropped by those rewrites."),
    (
        "value_rewrites_exhausted",
        "jumpgate_value_rewrites_exhausted",
        "Outputs still breaking a checked keyword with every rewrite spent (strict: the request fails).",
    ),
    ("evicted_tokens", "jumpgate_evicted_tokens", "Tokens evicted from the device prefix cache."),
    ("ttft_seconds_sum", "jumpgate_engine_first_token_seconds", "Arrival-to-first-token time summed over requests."),
    ("engine_seconds", "jumpgate_engine_step_seconds", "Time spent inside engine steps."),
    (
        "forward_seconds",
        "jumpgate_engine_forward_seconds",
        "Of the engine step time, the model runner's forward passes.",
    ),
    ("tree_seconds", "jumpgate_prefix_cache_seconds", "Time of engine steps spent on prefix-cache bookkeeping."),
)
# (GrammarServiceStats field, metric name, help)
GRAMMAR_COUNTERS = (
    ("memory_hits", "jumpgate_grammar_cache_hits", "Grammar cache hits in memory."),
    ("disk_hits", "jumpgate_grammar_cache_disk_hits", "Grammar cache hits served from disk."),
    ("disk_loaded", "jumpgate_grammar_cache_disk_loaded", "Compiled grammars loaded from disk at start-up."),
    ("misses", "jumpgate_grammar_cache_misses", "Grammar cache misses (compiled)."),
    ("compile_errors", "jumpgate_grammar_compile_errors", "Grammar specs refused."),
    ("compile_timeouts", "jumpgate_grammar_compile_timeouts", "Grammar compiles over the time limit."),
    (
        "compile_memory_errors",
        "jumpgate_grammar_compile_memory_errors",
        "Grammar compiles refused past the compile memory limit (or whose compile process died).",
    ),
    (
        "compile_processes_replaced",
        "jumpgate_grammar_compile_processes_replaced",
        "Grammar compile processes killed (time or memory limit) or found dead, and started again.",
    ),
    (
        "compile_unserializable",
        "jumpgate_grammar_compile_unserializable",
        "Grammars compiled in-process (memory cache only) because their compile process could not serialize them.",
    ),
    ("compile_seconds_total", "jumpgate_grammar_compile_seconds", "Time spent compiling grammars."),
)
GRAMMAR_GAUGES = (
    ("compile_seconds_max", "jumpgate_grammar_compile_seconds_max", "Longest grammar compile so far."),
    ("memory_entries", "jumpgate_grammar_memory_entries", "Compiled grammars held in memory."),
    ("memory_bytes", "jumpgate_grammar_memory_bytes", "Bytes of compiled grammars held in memory."),
)


class SnapshotCollector:
    """One engine snapshot and one grammar-service snapshot as metric families (a
    prometheus_client Collector: `generate_latest(SnapshotCollector(...))`)."""

    def __init__(self, engine: EngineStats | None, grammar: Any = None):
        self.engine = engine
        self.grammar = grammar  # grammar.GrammarServiceStats, or None

    def collect(self) -> Iterator[Metric]:
        if self.engine is not None:
            yield from engine_families(self.engine)
        if self.grammar is not None:
            yield from grammar_families(self.grammar)


def engine_families(s: EngineStats) -> Iterator[Metric]:
    for field, name, help in ENGINE_GAUGES:
        yield GaugeMetricFamily(name, help, value=getattr(s, field))
    yield GaugeMetricFamily(
        "jumpgate_kv_slots_used",
        "KV pool slots in use (running requests + prefix cache).",
        value=s.kv_slots_total - s.kv_slots_free,
    )
    tiers = GaugeMetricFamily("jumpgate_cached_tokens", "Tokens the prefix cache holds, by tier.", labels=("tier",))
    for tier, tokens in sorted(s.cached_tokens_by_tier.items()):
        tiers.add_metric((tier,), tokens)
    yield tiers
    yield GaugeMetricFamily(
        "jumpgate_prefix_cache_hit_rate",
        "Share of admitted prompt tokens served from the prefix cache.",
        value=s.prefix_hit_rate,
    )
    for field, name, help in ENGINE_COUNTERS:
        yield CounterMetricFamily(name, help, value=getattr(s, field))
    finished = CounterMetricFamily(
        "jumpgate_requests_finished", "Requests the engine finished, by reason.", labels=("reason",)
    )
    for reason, n in sorted(s.requests_finished.items()):
        finished.add_metric((reason,), n)
    yield finished
    for key, n in sorted(s.tier_counters.items()):
        yield CounterMetricFamily(f"jumpgate_{_metric_name(key)}", f"Hierarchical cache counter {key}.", value=n)


def grammar_families(g: Any) -> Iterator[Metric]:
    for field, name, help in GRAMMAR_COUNTERS:
        yield CounterMetricFamily(name, help, value=getattr(g, field))
    for field, name, help in GRAMMAR_GAUGES:
        yield GaugeMetricFamily(name, help, value=getattr(g, field))


def _metric_name(key: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key).lower()
