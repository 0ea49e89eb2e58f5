"""`jumpgate serve`: load the model, start the engine thread and the grammar service, run uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from gateway.settings import Settings
from runtime.engine_config import EngineConfig

log = logging.getLogger("jumpgate")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jumpgate", description="Structured-output LLM gateway (OpenAI-compatible).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e, g = EngineConfig(), Settings()

    model = serve.add_argument_group("model and engine")
    model.add_argument("--model", default=None, help="Hugging Face folder or GGUF file (default: SmolLM2-135M-Instruct)")
    model.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                       help="extra model id accepted in requests (repeatable)")
    model.add_argument("--device", default=e.device, choices=["auto", "cpu", "cuda"])
    model.add_argument("--dtype", default=e.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    model.add_argument("--attention-backend", default=e.attention_backend, choices=["auto", "torch", "triton"],
                       help="auto: triton on CUDA, torch on CPU")
    model.add_argument("--no-cuda-graphs", action="store_true", help="run decode passes eagerly on CUDA")
    model.add_argument("--kv-pool-tokens", type=_positive_int, default=e.kv_pool_tokens,
                       help="KV cache size in tokens (default: sized from free memory)")
    model.add_argument("--max-context", type=_positive_int, default=e.max_context,
                       help="longest prompt + output (default: the model's)")
    model.add_argument("--schedule-policy", default=e.schedule_policy, choices=["lpm", "dfs-weight", "fcfs", "random"])
    model.add_argument("--jump-forward", default=e.jump_forward, choices=["verify", "direct", "off"])
    model.add_argument("--no-radix-cache", action="store_true", help="disable prefix reuse (RadixAttention)")
    model.add_argument("--max-running-requests", type=_positive_int, default=e.max_running_requests)
    model.add_argument("--max-waiting-requests", type=_positive_int, default=e.max_waiting_requests)
    model.add_argument("--chunked-prefill-tokens", type=_positive_int, default=e.chunked_prefill_tokens)
    model.add_argument("--num-threads", type=_positive_int, default=e.num_threads, help="torch intra-op threads")
    model.add_argument("--seed", type=int, default=e.seed)

    tiers = serve.add_argument_group("hierarchical KV cache (host and disk tiers, pinning)")
    tiers.add_argument("--host-pool-tokens", type=int, default=e.host_pool_tokens,
                       help="host-memory KV tier size in tokens (0 = tiers off)")
    tiers.add_argument("--disk-cache-dir", default=e.disk_cache_dir,
                       help="disk KV tier folder, reused after a restart (needs --host-pool-tokens)")
    tiers.add_argument("--disk-cache-bytes", type=_positive_int, default=e.disk_cache_bytes)
    tiers.add_argument("--hicache-write-policy", default=e.hicache_write_policy,
                       choices=["write_through", "write_through_selective", "write_back"])
    tiers.add_argument("--hicache-page-tokens", type=_positive_int, default=e.hicache_page_tokens)
    tiers.add_argument("--hicache-min-load-tokens", type=int, default=e.hicache_min_load_tokens,
                       help="lower-tier hits shorter than this are recomputed")
    tiers.add_argument("--pin-budget-tokens", type=int, default=e.pin_budget_tokens,
                       help="tokens of pinned schema prefixes kept in the device cache (0 = pinning off)")

    http = serve.add_argument_group("HTTP gateway")
    http.add_argument("--host", default=g.host)
    http.add_argument("--port", type=int, default=g.port)
    http.add_argument("--api-key", action="append", default=[], metavar="KEY",
                      help="accepted API key, one tenant each (repeatable; also $JUMPGATE_API_KEYS, comma-separated)")
    http.add_argument("--registry-dir", default=None, help="schema registry folder (default: ~/.cache/jumpgate/registry)")
    http.add_argument("--grammar-cache-dir", default=None,
                      help="compiled grammar disk cache (default: ~/.cache/jumpgate/grammars)")
    http.add_argument("--no-grammar-disk-cache", action="store_true")
    http.add_argument("--grammar-compile-timeout", type=float, default=10.0, help="seconds per grammar compile")
    http.add_argument("--grammar-cache-memory-mb", type=_positive_int, default=512,
                      help="compiled grammars kept in memory (least recently used go first)")
    http.add_argument("--max-body-bytes", type=_positive_int, default=g.max_body_bytes)
    http.add_argument("--max-tokens-limit", type=_positive_int, default=g.max_tokens_limit,
                      help="largest max_tokens a request may ask for")
    http.add_argument("--max-n", type=_positive_int, default=g.max_n)
    http.add_argument("--responses-max-stored", type=_positive_int, default=g.responses_max_stored,
                      help="stored /v1/responses per tenant (oldest dropped beyond it)")
    http.add_argument("--responses-max-bytes", type=_positive_int, default=g.responses_max_bytes,
                      help="bytes of stored /v1/responses per tenant (oldest dropped beyond it)")
    http.add_argument("--max-concurrent-requests", type=_positive_int, default=None,
                      help="in-flight generation requests in the gateway (default: running + waiting)")
    http.add_argument("--log-level", default=g.log_level, choices=["debug", "info", "warning", "error"])
    http.add_argument("--no-docs", action="store_true", help="disable the OpenAPI docs at /docs")
    return parser


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        cuda_graphs=not args.no_cuda_graphs,
        kv_pool_tokens=args.kv_pool_tokens,
        max_context=args.max_context,
        schedule_policy=args.schedule_policy,
        jump_forward=args.jump_forward,
        radix_cache=not args.no_radix_cache,
        max_running_requests=args.max_running_requests,
        max_waiting_requests=args.max_waiting_requests,
        chunked_prefill_tokens=args.chunked_prefill_tokens,
        num_threads=args.num_threads,
        seed=args.seed,
        host_pool_tokens=args.host_pool_tokens,
        disk_cache_dir=args.disk_cache_dir,
        disk_cache_bytes=args.disk_cache_bytes,
        hicache_write_policy=args.hicache_write_policy,
        hicache_page_tokens=args.hicache_page_tokens,
        hicache_min_load_tokens=args.hicache_min_load_tokens,
        pin_budget_tokens=args.pin_budget_tokens,
    )


def gateway_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ) if environ is None else environ
    keys = list(args.api_key) + [k.strip() for k in environ.get("JUMPGATE_API_KEYS", "").split(",") if k.strip()]
    concurrency = args.max_concurrent_requests or (args.max_running_requests + args.max_waiting_requests)
    return Settings(
        host=args.host,
        port=args.port,
        served_model_names=list(args.served_model_name),
        api_keys=keys,
        registry_dir=args.registry_dir,
        max_body_bytes=args.max_body_bytes,
        responses_max_stored=args.responses_max_stored,
        responses_max_bytes=args.responses_max_bytes,
        max_tokens_limit=args.max_tokens_limit,
        max_n=args.max_n,
        max_concurrent_requests=concurrency,
        # the grammar service enforces its own limit; ours only guards against a stuck service
        grammar_compile_timeout_s=args.grammar_compile_timeout + 5.0,
        log_level=args.log_level,
        openapi=not args.no_docs,
    )


def _cache_root() -> Path:
    return Path(os.environ.get("JUMPGATE_CACHE_DIR", Path.home() / ".cache" / "jumpgate"))


def build_grammar_service(engine: Any, args: argparse.Namespace) -> Any:
    from grammar.service import GrammarService

    cache_dir = None if args.no_grammar_disk_cache else Path(args.grammar_cache_dir or _cache_root() / "grammars")
    model_config = getattr(engine, "model_config", None)
    vocab = int(getattr(model_config, "vocab_size", 0) or len(engine.tokenizer))
    eos = getattr(engine, "eos_ids", None)
    service = GrammarService(
        engine.tokenizer, vocab, cache_dir, compile_timeout_s=args.grammar_compile_timeout,
        max_memory_bytes=args.grammar_cache_memory_mb << 20, stop_token_ids=sorted(eos) if eos else None,
    )
    try:
        loaded = service.warm_from_disk()
        if loaded:
            log.info("grammar cache: %d compiled grammars loaded from %s", loaded, cache_dir)
    except Exception:  # a damaged cache must not stop the server
        log.exception("grammar cache warm-up failed")
    return service


def banner(engine: Any, settings: Settings) -> str:
    device = getattr(engine, "device", "?")
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "no API key (open)"
    lines = [
        "Jumpgate: structured-output gateway",
        f"  model      {engine.model_name}  ({device})",
        f"  context    {engine.max_context} tokens",
        f"  KV pool    {getattr(engine, 'kv_pool_tokens', '?')} tokens",
        f"  listening  http://{settings.host}:{settings.port}/v1  ({auth})",
    ]
    if settings.openapi:
        lines.append(f"  docs       http://{settings.host}:{settings.port}/docs")
    return "\n".join(lines)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from runtime.engine import Engine

    settings = gateway_settings(args)
    settings.validate()
    engine = Engine(engine_config(args)).start()
    grammar_service = None
    try:
        grammar_service = build_grammar_service(engine, args)
        app = create_app(engine, grammar_service, settings)
        print(banner(engine, settings), flush=True)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
                    timeout_graceful_shutdown=5)
    finally:
        engine.shutdown()
        if grammar_service is not None:
            grammar_service.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
