"""What a serving process builds around its engine: the grammar service (with its disk cache
warmed) and the start-up banner. Shared by single-process `jumpgate serve` and cluster replicas.
Also the checks `jumpgate serve` runs before loading the model (the port, the folders it writes),
so a start-up that cannot succeed fails in a second with one line naming the problem."""

from __future__ import annotations

import logging
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from gateway.settings import Settings
from grammar.settings import GrammarSettings

if TYPE_CHECKING:  # runtime.api imports torch; `jumpgate serve --help` should not wait for it
    from runtime.api import EngineClient

log = logging.getLogger("jumpgate")

# How long start-up waits for the grammar compile processes before it serves anyway (they then go
# on starting in the background, and a compile waits for them without counting it against its limit).
COMPILE_PROCESSES_WAIT_S = 30.0


def start_compile_fork_server() -> None:
    """Start the grammar compile processes' fork server now, before the model loads: its import of
    xgrammar (and torch, ~2 CPU-seconds) then overlaps the load instead of the first requests."""
    from grammar.service.compile_process import warm_up

    warm_up()


class StartupError(Exception):
    """A start-up that cannot succeed; the message is the one line `jumpgate serve` prints."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now (before the model loads) and handed to uvicorn, so
    a port in use fails at once and no other process can take it while the model loads."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise StartupError(f"--host {host}: cannot resolve the address ({e.strerror})") from e
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise StartupError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from e
    return sock


def check_folders(folders: Iterable[tuple[str, Path]]) -> None:
    """Each (flag, folder) the server writes exists or can be made, and takes a new file."""
    for flag, folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            raise StartupError(f"{flag} {folder}: cannot write there ({e.strerror or e})") from e


def build_grammar_service(engine: EngineClient, settings: GrammarSettings) -> Any:
    from grammar.service.service import GrammarService

    cache_dir = settings.cache_path()
    info = engine.info
    service = GrammarService(
        engine.tokenizer,
        info.vocab_size,
        cache_dir,
        compile_timeout_s=settings.compile_timeout_s,
        max_memory_bytes=settings.max_memory_bytes,
        max_disk_bytes=settings.max_disk_bytes,
        stop_token_ids=sorted(info.eos_token_ids) or None,
        compile_memory_bytes=settings.compile_memory_bytes,
        value_retries=settings.value_retries,
    )
    # Ready before the server listens: children still starting in the background (an import and a
    # tokenizer each on a 2-core machine) slowed the first requests' prefill ~2x (docs/perf-log.md).
    service.start(wait=True, timeout_s=COMPILE_PROCESSES_WAIT_S)
    try:
        loaded = service.warm_from_disk()
        if loaded:
            log.info("grammar cache: %d compiled grammars loaded from %s", loaded, cache_dir)
    except Exception:  # a damaged cache must not stop the server
        log.exception("grammar cache warm-up failed")
    return service


def banner(engine: EngineClient, settings: Settings) -> str:
    from gateway.pipeline import grammar_adapter  # imports xgrammar: not for `jumpgate serve --help`

    info = engine.info
    auth = f"{len(settings.api_keys)} API key(s)" if settings.api_keys else "no API key (open)"
    lines = [
        "Jumpgate: structured-output gateway",
        f"  model      {info.model_name}  ({info.device}, {info.dtype}, {info.attention_backend} attention)",
        f"  weights    {info.weights}: {info.weights_reason}",
        f"  context    {info.max_context} tokens",
        f"  KV pool    {info.kv_pool_tokens} tokens",
        f"  formats    tool calls {grammar_adapter.tool_call_format_name()}, "
        f"reasoning {grammar_adapter.reasoning_format_name()}",
        f"  listening  http://{settings.host}:{settings.port}/v1  ({auth})",
    ]
    if settings.openapi:
        lines.append(f"  docs       http://{settings.host}:{settings.port}/docs")
    return "\n".join(lines)
