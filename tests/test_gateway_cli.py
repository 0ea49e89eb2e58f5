"""`jumpgate serve` flags → EngineConfig and gateway Settings."""

from __future__ import annotations

from gateway.cli import build_parser, engine_config, gateway_settings


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_defaults():
    args = parse()
    cfg, settings = engine_config(args), gateway_settings(args, environ={})
    assert cfg.model is None and cfg.radix_cache and cfg.jump_forward == "verify" and cfg.schedule_policy == "lpm"
    assert settings.host == "127.0.0.1" and settings.port == 8000 and settings.api_keys == []
    assert settings.max_concurrent_requests == cfg.max_running_requests + cfg.max_waiting_requests


def test_flags_map_through():
    args = parse("--model", "/m", "--host", "127.0.0.2", "--port", "9000", "--kv-pool-tokens", "1000",
                 "--schedule-policy", "fcfs", "--jump-forward", "off", "--no-radix-cache", "--registry-dir", "/r",
                 "--grammar-cache-dir", "/g", "--api-key", "a", "--api-key", "b", "--max-body-bytes", "5000",
                 "--max-tokens-limit", "77", "--max-n", "3", "--max-waiting-requests", "9",
                 "--max-running-requests", "4", "--chunked-prefill-tokens", "128", "--device", "cpu",
                 "--log-level", "debug")
    cfg, s = engine_config(args), gateway_settings(args, environ={"JUMPGATE_API_KEYS": "c, d"})
    assert (cfg.model, cfg.kv_pool_tokens, cfg.schedule_policy, cfg.jump_forward, cfg.radix_cache) == (
        "/m", 1000, "fcfs", "off", False)
    assert (cfg.max_waiting_requests, cfg.max_running_requests, cfg.chunked_prefill_tokens, cfg.device) == (
        9, 4, 128, "cpu")
    assert (s.host, s.port, s.registry_dir, s.max_body_bytes, s.max_tokens_limit, s.max_n, s.log_level) == (
        "127.0.0.2", 9000, "/r", 5000, 77, 3, "debug")
    assert s.api_keys == ["a", "b", "c", "d"] and s.max_concurrent_requests == 13
    assert args.grammar_cache_dir == "/g"
    s.validate()
