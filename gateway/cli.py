"""`jumpgate serve`: load the model, start the engine thread and the grammar service, run uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Mapping, NamedTuple, Sequence

from gateway.cluster.settings import ClusterSettings
from gateway.settings import GRAMMAR_TIMEOUT_MARGIN_S, Settings, default_concurrency
from gateway.startup import banner, build_grammar_service
from grammar.settings import GrammarSettings
from runtime.engine_config import EngineConfig
from runtime.settings_fields import add_flags, from_args

log = logging.getLogger("jumpgate")

LAYERS = (EngineConfig, GrammarSettings, Settings, ClusterSettings)  # `jumpgate serve`'s flag groups, in help order


class ServeSettings(NamedTuple):
    engine: EngineConfig
    grammar: GrammarSettings
    gateway: Settings


def build_parser() -> argparse.ArgumentParser:
    """`jumpgate serve`'s flags, generated from the three settings objects' declarations."""
    parser = argparse.ArgumentParser(prog="jumpgate", description="Structured-output LLM gateway (OpenAI-compatible).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP", description="Serve a model over HTTP.")
    for layer in LAYERS:
        add_flags(serve, layer, layer.CLI_GROUP)
    serve.set_defaults(subparser=serve)  # so a bad value is reported with `jumpgate serve`'s usage
    return parser


def serve_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeSettings:
    """The three settings objects from parsed flags (ValueError naming the flag on a bad value)."""
    environ = dict(os.environ) if environ is None else environ
    engine = from_args(EngineConfig, args)
    grammar = from_args(GrammarSettings, args)
    gateway = from_args(Settings, args, environ, max_concurrent_requests=default_concurrency(engine),
                        grammar_compile_timeout_s=grammar.compile_timeout_s + GRAMMAR_TIMEOUT_MARGIN_S)
    return ServeSettings(engine, grammar, gateway)


def serve(config: ServeSettings, cluster: ClusterSettings | None = None) -> int:
    if cluster is not None and cluster.replicas:  # only here is Ray imported
        from gateway.cluster.launch import serve_cluster

        return serve_cluster(config, cluster)
    import uvicorn

    from gateway.app import create_app
    from runtime.engine import Engine

    settings = config.gateway
    engine = Engine(config.engine).start()
    grammar_service = None
    try:
        grammar_service = build_grammar_service(engine, config.grammar)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        return 2
    try:
        config = serve_settings(args)
        cluster = from_args(ClusterSettings, args)
    except ValueError as e:  # a bad value: exit 2 with the flag named, as argparse does
        args.subparser.error(str(e))
    logging.basicConfig(level=config.gateway.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(config, cluster)


if __name__ == "__main__":
    sys.exit(main())
