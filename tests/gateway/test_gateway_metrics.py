"""/metrics exposition: gateway series, one EngineStats and one grammar snapshot per scrape."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from grammar import GrammarServiceStats
from runtime.api import EngineStats

STATS = EngineStats(
    running_requests=2,
    waiting_requests=3,
    kv_slots_total=100,
    kv_slots_free=60,
    kv_slots_tree=30,
    kv_slots_evictable=25,
    kv_slots_request_only=10,
    lookup_row_cost=0.25,
    cached_tokens_by_tier={"device": 30, "host": 200, "disk": 900},
    prompt_tokens=400,
    cached_prompt_tokens=100,
    generated_tokens=50,
    forward_passes=20,
    forward_tokens=450,
    jump_forward_tokens=7,
    jump_forward_rejected=2,
    lookup_draft_tokens=9,
    lookup_accepted_tokens=6,
    retractions=1,
    evicted_tokens=64,
    requests_finished={"stop": 4, "length": 1},
    ttft_seconds_sum=1.5,
    engine_seconds=3.0,
    tree_seconds=0.25,
    tier_counters={"hicache_loaded_host_tokens": 128, "disk_pages_read": 3},
)
GRAMMAR = GrammarServiceStats(
    memory_hits=3,
    disk_hits=2,
    misses=1,
    compile_errors=4,
    compile_timeouts=5,
    compile_seconds_total=0.5,
    compile_seconds_max=0.3,
    memory_entries=6,
    memory_bytes=4096,
    compile_memory_errors=7,
    compile_processes_replaced=8,
    compile_unserializable=9,
)


def families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    for s in fams[family].samples:
        if s.name == (sample or family) and s.labels == labels:
            return s.value
    raise KeyError((family, sample, labels))


def test_gateway_series_have_their_types():
    m = GatewayMetrics()
    m.request_finished("chat", "success")
    m.request_finished("chat", "success")
    m.request_finished("completions", "rejected")
    m.prompt_tokens.inc(100)
    m.in_flight.set(3)
    for seconds in (0.05, 0.2, 7.0):
        m.ttft.observe(seconds)
    f = families(m.render())
    assert f["jumpgate_requests"].type == "counter"
    assert value(f, "jumpgate_requests", "jumpgate_requests_total", route="chat", outcome="success") == 2
    assert value(f, "jumpgate_requests", "jumpgate_requests_total", route="completions", outcome="rejected") == 1
    assert m.requests_counted("chat", "success") == 2 and m.requests_counted("chat", "cancelled") == 0
    assert f["jumpgate_prompt_tokens"].type == "counter"
    assert value(f, "jumpgate_prompt_tokens", "jumpgate_prompt_tokens_total") == 100
    assert f["jumpgate_gateway_in_flight_requests"].type == "gauge"
    assert value(f, "jumpgate_gateway_in_flight_requests") == 3
    ttft = "jumpgate_time_to_first_token_seconds"
    assert f[ttft].type == "histogram"
    assert value(f, ttft, ttft + "_bucket", le="0.05") == 1  # le is inclusive
    assert value(f, ttft, ttft + "_bucket", le="0.25") == 2
    assert value(f, ttft, ttft + "_bucket", le="+Inf") == 3 and value(f, ttft, ttft + "_count") == 3
    assert not any(name.endswith("_created") for fam in f.values() for name in (s.name for s in fam.samples))


def test_each_app_has_its_own_registry():
    a, b = GatewayMetrics(), GatewayMetrics()
    a.request_finished("chat", "success")
    assert a.requests_counted("chat", "success") == 1 and b.requests_counted("chat", "success") == 0


def test_engine_snapshot_counters_and_gauges():
    f = families(GatewayMetrics().render(STATS))
    gauges = {
        "jumpgate_running_requests": 2,
        "jumpgate_waiting_requests": 3,
        "jumpgate_kv_pool_slots": 100,
        "jumpgate_kv_slots_free": 60,
        "jumpgate_kv_slots_used": 40,
        "jumpgate_kv_slots_tree_held": 30,
        "jumpgate_kv_slots_evictable": 25,
        "jumpgate_kv_slots_request_only": 10,
        "jumpgate_lookup_row_cost": 0.25,
        "jumpgate_prefix_cache_hit_rate": 0.25,
    }
    for name, expected in gauges.items():
        assert f[name].type == "gauge" and value(f, name) == expected, name
    counters = {
        "jumpgate_engine_prompt_tokens": 400,
        "jumpgate_engine_cached_prompt_tokens": 100,
        "jumpgate_engine_generated_tokens": 50,
        "jumpgate_forward_passes": 20,
        "jumpgate_forward_tokens": 450,
        "jumpgate_jump_forward_tokens": 7,
        "jumpgate_jump_forward_rejected_tokens": 2,
        "jumpgate_lookup_draft_tokens": 9,
        "jumpgate_lookup_accepted_tokens": 6,
        "jumpgate_retractions": 1,
        "jumpgate_evicted_tokens": 64,
        "jumpgate_engine_first_token_seconds": 1.5,
        "jumpgate_engine_step_seconds": 3.0,
        "jumpgate_prefix_cache_seconds": 0.25,
        "jumpgate_hicache_loaded_host_tokens": 128,
        "jumpgate_disk_pages_read": 3,
    }
    for name, expected in counters.items():
        assert f[name].type == "counter" and value(f, name, name + "_total") == expected, name
    for tier, tokens in {"device": 30, "host": 200, "disk": 900}.items():
        assert value(f, "jumpgate_cached_tokens", tier=tier) == tokens
    assert f["jumpgate_requests_finished"].type == "counter"
    assert value(f, "jumpgate_requests_finished", "jumpgate_requests_finished_total", reason="stop") == 4
    assert value(f, "jumpgate_requests_finished", "jumpgate_requests_finished_total", reason="length") == 1


def test_hit_rate_before_any_prompt_is_zero():
    f = families(GatewayMetrics().render(EngineStats()))
    assert value(f, "jumpgate_prefix_cache_hit_rate") == 0


def test_grammar_snapshot():
    f = families(GatewayMetrics().render(None, GRAMMAR))
    counters = {
        "jumpgate_grammar_cache_hits": 3,
        "jumpgate_grammar_cache_disk_hits": 2,
        "jumpgate_grammar_cache_misses": 1,
        "jumpgate_grammar_compile_errors": 4,
        "jumpgate_grammar_compile_timeouts": 5,
        "jumpgate_grammar_compile_seconds": 0.5,
        "jumpgate_grammar_compile_memory_errors": 7,
        "jumpgate_grammar_compile_processes_replaced": 8,
        "jumpgate_grammar_compile_unserializable": 9,
    }
    for name, expected in counters.items():
        assert f[name].type == "counter" and value(f, name, name + "_total") == expected, name
    gauges = {
        "jumpgate_grammar_memory_entries": 6,
        "jumpgate_grammar_memory_bytes": 4096,
        "jumpgate_grammar_compile_seconds_max": 0.3,
    }
    for name, expected in gauges.items():
        assert f[name].type == "gauge" and value(f, name) == expected, name
    assert "jumpgate_running_requests" not in f  # no engine snapshot this scrape: no engine series


def test_full_render_declares_each_family_once():
    text = GatewayMetrics().render(STATS, GRAMMAR).decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names))
    families(text.encode())  # and Prometheus's own parser reads all of it


def test_scrape_reads_engine_stats_off_the_event_loop(gateway_client, fake_engine):
    import asyncio

    seen = []

    def stats():
        try:
            asyncio.get_running_loop()
            seen.append("event loop")
        except RuntimeError:
            seen.append("worker thread")
        return STATS

    fake_engine.stats = stats
    f = families(gateway_client().get("/metrics").content)
    assert seen == ["worker thread"]  # one snapshot per scrape, taken where blocking is fine
    assert value(f, "jumpgate_running_requests") == 2


def test_scrape_survives_a_failing_engine(gateway_client, fake_engine):
    def stats():
        raise RuntimeError("engine thread gone")

    fake_engine.stats = stats
    resp = gateway_client().get("/metrics")
    f = families(resp.content)
    assert resp.status_code == 200 and "jumpgate_requests" in f and "jumpgate_running_requests" not in f
    assert "jumpgate_grammar_cache_misses" in f  # the other source still reports
