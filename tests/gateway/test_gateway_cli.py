"""`jumpgate serve` flags, generated from EngineConfig, GrammarSettings and Settings."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.cli import LAYERS, build_grammar_service, build_parser, main, serve_settings
from gateway.settings import Settings
from grammar.settings import GrammarSettings
from runtime.engine_config import EngineConfig
from runtime.settings_fields import declared


def load(*argv: str, environ: dict[str, str] | None = None):
    return serve_settings(build_parser().parse_args(["serve", *argv]), environ={} if environ is None else environ)


def refused(capsys, *argv: str) -> str:
    """Run `jumpgate serve ARGV` far enough to be refused; the error text (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_defaults_round_trip():
    """No flags give exactly the objects' own defaults."""
    config = load()
    assert config.engine == EngineConfig()
    assert config.grammar == GrammarSettings()
    assert config.gateway == Settings()
    engine = config.engine
    assert config.gateway.max_concurrent_requests == engine.max_running_requests + engine.max_waiting_requests
    assert config.gateway.grammar_compile_timeout_s == config.grammar.compile_timeout_s + 5.0


def test_every_field_has_a_flag(capsys):
    flags = []
    for layer in LAYERS:
        for f, spec in declared(layer):
            assert spec.flag or spec.derived, f"{layer.__name__}.{f.name} has neither a flag nor a source"
            assert spec.flag or f.name in {"grammar_compile_timeout_s"}, f"{f.name}: derived fields are the exception"
            flags.append(spec.flag)
        assert len(list(declared(layer))) == len(dataclasses.fields(layer)), f"{layer.__name__}: undeclared field"
    flags = [f for f in flags if f]
    assert len(flags) == len(set(flags))
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = capsys.readouterr().out
    for flag in flags:
        assert flag in help_text
    assert help_text.count("(default:") == len(flags)  # every flag shows its default


def test_flags_map_through():
    config = load(
        "--model",
        "/m",
        "--host",
        "127.0.0.2",
        "--port",
        "9000",
        "--kv-pool-tokens",
        "1000",
        "--schedule-policy",
        "fcfs",
        "--jump-forward",
        "off",
        "--no-radix-cache",
        "--registry-dir",
        "/r",
        "--grammar-cache-dir",
        "/g",
        "--api-key",
        "a",
        "--api-key",
        "b",
        "--max-body-bytes",
        "5000",
        "--max-tokens-limit",
        "77",
        "--max-n",
        "3",
        "--max-waiting-requests",
        "9",
        "--max-running-requests",
        "4",
        "--chunked-prefill-tokens",
        "128",
        "--device",
        "cpu",
        "--log-level",
        "debug",
        "--weights",
        "q8",
        "--no-cuda-graphs",
        "--served-model-name",
        "smol",
        "--no-docs",
        "--grammar-compile-timeout",
        "2.5",
        "--retry-after",
        "7",
        environ={"JUMPGATE_API_KEYS": "c, d,"},
    )
    cfg, g, s = config
    assert (cfg.model, cfg.kv_pool_tokens, cfg.schedule_policy, cfg.jump_forward, cfg.radix_cache) == (
        "/m",
        1000,
        "fcfs",
        "off",
        False,
    )
    assert (cfg.max_waiting_requests, cfg.max_running_requests, cfg.chunked_prefill_tokens, cfg.device) == (
        9,
        4,
        128,
        "cpu",
    )
    assert (cfg.weights, cfg.cuda_graphs) == ("q8", False)
    assert (s.host, s.port, s.registry_dir, s.max_body_bytes, s.max_tokens_limit, s.max_n, s.log_level) == (
        "127.0.0.2",
        9000,
        "/r",
        5000,
        77,
        3,
        "debug",
    )
    assert s.api_keys == ["a", "b", "c", "d"] and s.served_model_names == ["smol"] and not s.openapi
    assert s.max_concurrent_requests == 13 and s.retry_after_s == 7
    assert (g.cache_dir, g.compile_timeout_s, s.grammar_compile_timeout_s) == ("/g", 2.5, 7.5)


def test_explicit_concurrency_wins_over_running_plus_waiting():
    assert load("--max-concurrent-requests", "3").gateway.max_concurrent_requests == 3


def test_api_keys_from_environment_alone():
    assert load(environ={"JUMPGATE_API_KEYS": "x,y"}).gateway.api_keys == ["x", "y"]


def test_grammar_disk_cache_flags():
    assert load("--no-grammar-disk-cache").grammar.cache_path() is None
    assert str(load("--grammar-cache-dir", "/g").grammar.cache_path()) == "/g"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--port", "70000"], "--port"),  # above the bound
        (["--max-body-bytes", "100"], "--max-body-bytes"),  # below the bound
        (["--max-running-requests", "0"], "--max-running-requests"),
        (["--host-pool-tokens", "-1"], "--host-pool-tokens"),
        (["--kv-pool-tokens", "0"], "--kv-pool-tokens"),  # optional, but bounded when given
        (["--grammar-compile-timeout", "0"], "--grammar-compile-timeout"),  # exclusive bound
        (["--grammar-cache-memory-mb", "0"], "--grammar-cache-memory-mb"),
        (["--grammar-cache-memory-mb", "-5"], "--grammar-cache-memory-mb"),
        (["--grammar-cache-memory-mb", "lots"], "--grammar-cache-memory-mb"),  # not a number
        (["--grammar-cache-memory-mb", "1.5"], "--grammar-cache-memory-mb"),  # not a whole number
        (["--grammar-compile-timeout", "soon"], "--grammar-compile-timeout"),
        (["--jump-forward", "sideways"], "--jump-forward"),  # not a choice
        (["--weights", "q3"], "--weights"),
        (["--log-level", "loud"], "--log-level"),
        (["--disk-cache-dir", "/tmp/kv"], "--disk-cache-dir"),  # needs the host tier
        (["--host-pool-tokens", "64", "--page-size", "3"], "--hicache-page-tokens"),  # pages must nest
    ],
)
def test_bad_values_are_refused_with_the_flag_named(argv, flag, capsys):
    assert flag in refused(capsys, *argv)


@pytest.mark.parametrize(
    ("layer", "field", "value", "flag"),
    [
        (EngineConfig, "jump_forward", "sideways", "--jump-forward"),
        (EngineConfig, "max_running_requests", 0, "--max-running-requests"),
        (EngineConfig, "max_running_requests", True, "--max-running-requests"),  # a bool is no count
        (EngineConfig, "kv_pool_tokens", "1000", "--kv-pool-tokens"),  # text where a number belongs
        (EngineConfig, "radix_cache", "no", "--no-radix-cache"),
        (EngineConfig, "schedule_policy", None, "--schedule-policy"),  # required
        (GrammarSettings, "compile_timeout_s", -1.0, "--grammar-compile-timeout"),
        (Settings, "api_keys", [""], "--api-key"),
        (Settings, "max_n", 0, "--max-n"),
        (Settings, "grammar_compile_timeout_s", 0.0, "grammar_compile_timeout_s"),  # no flag: the field is named
    ],
)
def test_objects_refuse_bad_values_when_built_directly(layer, field, value, flag):
    with pytest.raises(ValueError) as exc:
        layer(**{field: value})
    assert str(exc.value).startswith(flag)


def test_paths_may_be_path_objects(tmp_path):
    assert EngineConfig(model=tmp_path).model == tmp_path  # library use: Engine(model=Path(...))


def test_engine_config_checks_survive_replace():
    """Engine(config, **overrides) goes through dataclasses.replace: the checks run again."""
    with pytest.raises(ValueError, match="--jump-forward"):
        dataclasses.replace(EngineConfig(), jump_forward="bogus")


def test_grammar_cache_memory_flag_bounds_the_service(monkeypatch, tmp_path):
    made = {}

    class RecordingService:  # stands in for grammar.service.service.GrammarService: only its arguments matter here
        def __init__(self, *args, **kw):
            made.update(kw, cache_dir=args[2])

        def warm_from_disk(self):
            return 0

        def start(self, wait=False, timeout_s=None):
            made["started"] = (wait, timeout_s)

    monkeypatch.setattr("grammar.service.service.GrammarService", RecordingService)
    engine = SimpleNamespace(tokenizer=[0] * 10, info=SimpleNamespace(vocab_size=10, eos_token_ids=(2,)))
    build_grammar_service(engine, load("--grammar-cache-dir", str(tmp_path)).grammar)
    assert made["max_memory_bytes"] == 512 << 20 and made["compile_timeout_s"] == 10.0
    assert str(made["cache_dir"]) == str(tmp_path)
    build_grammar_service(engine, load("--grammar-cache-memory-mb", "64", "--no-grammar-disk-cache").grammar)
    assert made["max_memory_bytes"] == 64 << 20 and made["cache_dir"] is None
    assert made["compile_memory_bytes"] == 4096 << 20
    # compile processes start with the server, which waits (bounded) for them before it listens
    wait, timeout_s = made["started"]
    assert wait and 0 < timeout_s <= 60
    build_grammar_service(engine, load("--grammar-compile-memory-mb", "0").grammar)
    assert made["compile_memory_bytes"] is None  # 0: no limit


def test_docs_name_only_real_flags():
    """docs/serving.md's options tables and the README name only flags `jumpgate serve` has."""
    root = Path(__file__).resolve().parents[2]
    serving = (root / "docs" / "serving.md").read_text()
    readme = (root / "README.md").read_text()
    known = {spec.flag for layer in LAYERS for _, spec in declared(layer)}
    options = set(re.findall(r"`(--[a-z-]+)", serving[serving.index("## Options") : serving.index("## Folders")]))
    assert {"--weights", "--host-pool-tokens", "--value-retries", "--api-key"} <= options and options <= known, (
        options - known
    )
    mentioned = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", readme + serving))
    assert mentioned <= known | {"--help"}, mentioned - known
