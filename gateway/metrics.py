"""Prometheus text exposition (format 0.0.4) with a tiny counter/gauge/histogram helper.

Gateway-side numbers (tokens, outcomes, latencies) are recorded here as requests finish; engine and
grammar numbers are read from `engine.stats()` / the grammar service at scrape time. All updates
happen on the event loop thread, so plain ints and floats suffice.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Iterable, Mapping

PREFIX = "jumpgate_"

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    items = [f'{k}="{_escape(str(v))}"' for k, v in pairs]
    return "{" + ",".join(items) + "}" if items else ""


class Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...] = ()):
        self.name = PREFIX + name
        self.help = help
        self.labelnames = labelnames

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def _key(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...] = ()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        lines = self.header()
        for key, v in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(zip(self.labelnames, key))} {_fmt(v)}")
        return lines


class Gauge(Metric):
    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...] = ()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        lines = self.header()
        for key, v in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(zip(self.labelnames, key))} {_fmt(v)}")
        return lines


class Histogram(Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float]):
        super().__init__(name, help)
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self.bounds) + 1)  # last slot: above the largest bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = self.header()
        cumulative = 0
        for bound, n in zip(self.bounds, self._counts):
            cumulative += n
            lines.append(f'{self.name}_bucket{{le="{_fmt(bound)}"}} {cumulative}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {_fmt(self.sum)}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


# Engine stats keys (first present wins) → exported gauge/counter; unknown numeric keys are exported
# as jumpgate_engine_<key> so nothing the engine reports is lost.
_ENGINE_FIELDS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("gauge", "running_requests", "Requests being decoded by the engine.",
     ("running_requests", "num_running")),
    ("gauge", "waiting_requests", "Requests queued in the engine.",
     ("waiting_requests", "num_waiting")),
    ("gauge", "kv_slots_used", "KV pool slots in use (running requests + radix tree).",
     ("kv_slots_used", "kv_used")),
    ("gauge", "kv_slots_free", "KV pool slots free.",
     ("kv_slots_free", "kv_free")),
    ("gauge", "kv_slots_tree_held", "KV pool slots held by the radix tree (cached prefixes).",
     ("kv_slots_tree", "kv_slots_tree_held", "kv_tree_held")),
    ("gauge", "kv_slots_request_only", "KV pool slots held only by running requests.",
     ("kv_slots_request_only",)),
    ("gauge", "kv_pool_slots", "KV pool size in slots.",
     ("kv_slots_total", "kv_pool_tokens")),
    ("counter", "jump_forward_tokens_total", "Tokens appended by jump-forward.",
     ("jump_forward_tokens",)),
    ("counter", "jump_forward_rejected_tokens_total", "Jump-forward draft tokens rolled back by verification.",
     ("jump_forward_rejected", "jump_forward_rejected_tokens")),
)
_GRAMMAR_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("grammar_cache_hits_total", "Grammar cache hits in memory.", ("memory_hits", "hits")),
    ("grammar_cache_disk_hits_total", "Grammar cache hits served from disk.", ("disk_hits",)),
    ("grammar_cache_misses_total", "Grammar cache misses (compiled).", ("misses",)),
    ("grammar_compile_errors_total", "Grammar specs refused.", ("compile_errors",)),
    ("grammar_compile_timeouts_total", "Grammar compiles over the time limit.", ("compile_timeouts",)),
)


class GatewayMetrics:
    def __init__(self) -> None:
        self.requests = Counter("requests_total", "Requests by route and outcome.", ("route", "outcome"))
        self.prompt_tokens = Counter("prompt_tokens_total", "Prompt tokens processed.")
        self.cached_prompt_tokens = Counter("cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.")
        self.generated_tokens = Counter("generation_tokens_total", "Tokens generated.")
        self.in_flight = Gauge("gateway_in_flight_requests", "Generation requests in flight in the gateway.")
        self.ttft = Histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds", "Time between output increments.", ITL_BUCKETS)
        self.invalid_structured_outputs = Counter(
            "structured_output_invalid_total",
            "Structured outputs that failed schema validation after generation (mode=strict: a fidelity bug).",
            ("mode", "reason"))

    def own(self) -> list[Metric]:
        return [
            self.requests, self.prompt_tokens, self.cached_prompt_tokens, self.generated_tokens, self.in_flight,
            self.ttft, self.e2e, self.itl, self.invalid_structured_outputs,
        ]

    def structured_output_invalid(self, mode: str, reason: str) -> None:
        """One structured output that failed validation after generation (gateway/output_validation.py)."""
        self.invalid_structured_outputs.inc(mode=mode, reason=reason)

    def render(
        self, engine_stats: Mapping[str, Any] | None = None, grammar_stats: Mapping[str, Any] | None = None
    ) -> str:
        lines: list[str] = []
        for metric in self.own():
            lines.extend(metric.render())
        lines.extend(render_engine_stats(engine_stats or {}))
        lines.extend(render_grammar_stats(grammar_stats or {}))
        return "\n".join(lines) + "\n"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _flatten(stats: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "_"))
        else:
            num = _number(value)
            if num is not None:
                flat[name] = num
    return flat


def _metric_name(key: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key).lower()


def render_engine_stats(stats: Mapping[str, Any]) -> list[str]:
    flat = _flatten(stats)
    if "kv_slots_used" not in flat and "kv_slots_total" in flat and "kv_slots_free" in flat:
        flat["kv_slots_used"] = flat["kv_slots_total"] - flat["kv_slots_free"]
    used: set[str] = set()
    lines: list[str] = []
    for kind, name, help, keys in _ENGINE_FIELDS:
        key = next((k for k in keys if k in flat), None)
        if key is None:
            continue
        used.add(key)
        metric = (Counter if kind == "counter" else Gauge)(name, help)
        metric._values[()] = flat[key]
        lines.extend(metric.render())
    for key in sorted(flat):
        if key in used:
            continue
        gauge = Gauge("engine_" + _metric_name(key), f"Engine stat {key!r}.")
        gauge.set(flat[key])
        lines.extend(gauge.render())
    return lines


def render_grammar_stats(stats: Mapping[str, Any]) -> list[str]:
    flat = _flatten(stats)
    lines: list[str] = []
    used: set[str] = set()
    for name, help, keys in _GRAMMAR_FIELDS:
        key = next((k for k in keys if k in flat), None)
        if key is None:
            continue
        used.add(key)
        counter = Counter(name, help)
        counter._values[()] = flat[key]
        lines.extend(counter.render())
    for key in sorted(flat):
        if key not in used:
            gauge = Gauge("grammar_" + _metric_name(key), f"Grammar stat {key!r}.")
            gauge.set(flat[key])
            lines.extend(gauge.render())
    return lines
