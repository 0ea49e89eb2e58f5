"""`jumpgate serve` flags → EngineConfig and gateway Settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.cli import build_grammar_service, build_parser, engine_config, gateway_settings


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


def test_grammar_cache_memory_flag_bounds_the_service(monkeypatch, tmp_path):
    made = {}

    class RecordingService:  # stands in for grammar.service.GrammarService: only its arguments matter here
        def __init__(self, *args, **kw):
            made.update(kw)

        def warm_from_disk(self):
            return 0

    monkeypatch.setattr("grammar.service.GrammarService", RecordingService)
    engine = SimpleNamespace(tokenizer=[0] * 10, model_config=SimpleNamespace(vocab_size=10), eos_ids={2})
    build_grammar_service(engine, parse("--grammar-cache-dir", str(tmp_path)))
    assert made["max_memory_bytes"] == 512 << 20
    build_grammar_service(engine, parse("--grammar-cache-dir", str(tmp_path), "--grammar-cache-memory-mb", "64"))
    assert made["max_memory_bytes"] == 64 << 20


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1.5"])
def test_grammar_cache_memory_flag_refuses_bad_values(value, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--grammar-cache-memory-mb", value)
    assert exc.value.code == 2
    assert "--grammar-cache-memory-mb" in capsys.readouterr().err
