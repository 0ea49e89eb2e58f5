"""Prometheus text exposition: counters, gauges, histograms, engine and grammar stats."""

from __future__ import annotations

import re

import pytest

from gateway.metrics import Counter, Gauge, GatewayMetrics, Histogram, render_engine_stats

LINE = re.compile(r'^(# (HELP|TYPE) \S+ .+|[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="[^"]*",?)*\})? \S+)$')


def test_counter_with_labels():
    c = Counter("requests_total", "Requests.", ("route", "outcome"))
    c.inc(route="chat", outcome="success")
    c.inc(2, route="chat", outcome="success")
    c.inc(route="chat", outcome="rejected")
    lines = c.render()
    assert lines[:2] == ["# HELP jumpgate_requests_total Requests.", "# TYPE jumpgate_requests_total counter"]
    assert 'jumpgate_requests_total{route="chat",outcome="success"} 3' in lines
    assert 'jumpgate_requests_total{route="chat",outcome="rejected"} 1' in lines
    with pytest.raises(ValueError):
        c.inc(-1, route="chat", outcome="x")
    with pytest.raises(ValueError):
        c.inc(route="chat")


def test_label_values_are_escaped():
    g = Gauge("g", "G.", ("name",))
    g.set(1.5, name='a"b\\c\nd')
    assert g.render()[-1] == 'jumpgate_g{name="a\\"b\\\\c\\nd"} 1.5'


def test_histogram_buckets_are_cumulative():
    h = Histogram("latency_seconds", "Latency.", (0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    lines = h.render()
    assert 'jumpgate_latency_seconds_bucket{le="0.1"} 2' in lines  # le is inclusive
    assert 'jumpgate_latency_seconds_bucket{le="1"} 3' in lines
    assert 'jumpgate_latency_seconds_bucket{le="+Inf"} 4' in lines
    assert "jumpgate_latency_seconds_count 4" in lines
    assert "jumpgate_latency_seconds_sum 3.65" in lines


def test_full_render_is_valid_exposition():
    m = GatewayMetrics()
    m.prompt_tokens.inc(100)
    m.ttft.observe(0.2)
    text = m.render({"running_requests": 2, "kv_slots_total": 100, "kv_slots_free": 60, "kv_slots_tree": 30,
                     "jump_forward_tokens": 7.0, "weird key!": 1, "nested": {"x": 2}, "name": "not a number"},
                    {"memory_hits": 3, "misses": 1, "compile_seconds_total": 0.5})
    assert text.endswith("\n")
    for line in text.strip().split("\n"):
        assert LINE.match(line), line
    assert "jumpgate_prompt_tokens_total 100" in text
    assert "jumpgate_kv_slots_used 40" in text and "jumpgate_kv_slots_free 60" in text
    assert "jumpgate_kv_slots_tree_held 30" in text and "jumpgate_kv_pool_slots 100" in text
    assert "# TYPE jumpgate_jump_forward_tokens_total counter" in text
    assert "jumpgate_engine_weird_key_ 1" in text and "jumpgate_engine_nested_x 2" in text
    assert "jumpgate_grammar_cache_hits_total 3" in text and "jumpgate_grammar_cache_misses_total 1" in text
    assert "jumpgate_grammar_compile_seconds_total 0.5" in text
    names = [line.split()[2] for line in text.split("\n") if line.startswith("# TYPE")]
    assert len(names) == len(set(names))  # each metric family declared once


def test_engine_stats_ignore_non_numbers():
    assert render_engine_stats({"status": "ok"}) == []
