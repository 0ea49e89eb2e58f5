"""`jumpgate serve`: load the model, start the engine thread and the grammar service, run uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

from gateway.cluster.settings import ClusterSettings
from gateway.settings import GRAMMAR_TIMEOUT_MARGIN_S, Settings, default_concurrency
from gateway.startup import (
    StartupError,
    banner,
    bind_listener,
    build_grammar_service,
    check_folders,
    start_compile_fork_server,
)
from grammar.settings import GrammarSettings
from runtime.engine_config import EngineConfig
from runtime.settings_fields import add_flags, from_args

log = logging.getLogger("jumpgate")

LAYERS = (EngineConfig, GrammarSettings, Settings, ClusterSettings)  # `jumpgate serve`'s flag groups, in help order


class OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one line naming it, not the usage of sixty flags above it (exit 2, as argparse)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class ServeSettings(NamedTuple):
    engine: EngineConfig
    grammar: GrammarSettings
    gateway: Settings


def build_parser() -> argparse.ArgumentParser:
    """`jumpgate serve`'s flags, generated from the three settings objects' declarations."""
    parser = OneLineErrors(prog="jumpgate", description="Structured-output LLM gateway (OpenAI-compatible).")
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
    gateway = from_args(
        Settings,
        args,
        environ,
        max_concurrent_requests=default_concurrency(engine),
        grammar_compile_timeout_s=grammar.compile_timeout_s + GRAMMAR_TIMEOUT_MARGIN_S,
    )
    return ServeSettings(engine, grammar, gateway)


def written_folders(config: ServeSettings) -> list[tuple[str, Path]]:
    """(flag, folder) for every folder this server writes, as the parts that write them resolve it."""
    from gateway.app import default_registry_dir

    registry = Path(config.gateway.registry_dir) if config.gateway.registry_dir else default_registry_dir()
    folders = [
        ("--registry-dir", registry),
        ("the responses folder beside --registry-dir", registry.parent / "responses"),
        ("the files folder beside --registry-dir", registry.parent / "files"),
        ("the batches folder beside --registry-dir", registry.parent / "batches"),
    ]
    grammars = config.grammar.cache_path()
    if grammars is not None:
        folders.append(("--grammar-cache-dir", grammars))
    if config.engine.disk_cache_dir:
        folders.append(("--disk-cache-dir", Path(config.engine.disk_cache_dir).expanduser()))
    return folders


def serve(config: ServeSettings, cluster: ClusterSettings | None = None) -> int:
    """Serve until stopped; a start-up that cannot succeed raises StartupError (one line)."""
    if cluster is not None and cluster.replicas:  # only here is Ray imported
        from gateway.cluster.launch import serve_cluster

        return serve_cluster(config, cluster)
    import uvicorn

    from gateway.app import create_app
    from runtime.engine.engine import Engine
    from runtime.model.config import ModelLoadError

    settings = config.gateway
    # The cheap checks first: a port in use or a folder it cannot write fails before the model loads.
    check_folders(written_folders(config))
    listener = bind_listener(settings.host, settings.port)
    try:
        start_compile_fork_server()
        try:
            engine = Engine(config.engine).start()
        except (ModelLoadError, OSError) as e:  # OSError: e.g. the GGUF's converted copy cannot be written
            raise StartupError(f"cannot load the model: {e}") from e
        grammar_service = None
        try:
            try:
                grammar_service = build_grammar_service(engine, config.grammar)
                app = create_app(engine, grammar_service, settings)
            except (OSError, ValueError) as e:  # a folder that changed under us; --chat-template / formats
                raise StartupError(str(e)) from e
            bound = dataclasses.replace(settings, port=listener.getsockname()[1])  # --port 0: the port it got
            print(banner(engine, bound), flush=True)
            server = uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=settings.host,
                    port=settings.port,
                    log_level=settings.log_level,
                    access_log=False,
                    timeout_graceful_shutdown=5,
                )
            )
            server.run(sockets=[listener])
            if not server.started:  # uvicorn logged why (the app's start-up hook failed)
                raise StartupError("the HTTP server did not start (see the log line above)")
        finally:
            engine.shutdown()
            if grammar_service is not None:
                grammar_service.close()
    finally:
        listener.close()
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
    logging.basicConfig(
        level=config.gateway.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return serve(config, cluster)
    except StartupError as e:
        print(f"jumpgate serve: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
