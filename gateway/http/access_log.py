"""One log line per request: method, path, status, request id, prompt/cached/completion tokens, time.

An ASGI middleware puts a `RequestLog` in the scope; generation routes fill it (for streams, when
the stream ends); the line is written when the response is done (the last body chunk was sent or
the app raised), so a streamed request is logged once, with its totals.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.pipeline.generation import RequestLog

log = logging.getLogger("jumpgate.access")

SCOPE_KEY = "jumpgate.request_log"
DECODE_HEADER = b"x-jumpgate-decode-ms-per-token"  # the mean decode step (RequestLog.decode_ms_per_token)


def request_log_of(scope: Any) -> RequestLog:
    record = scope.get(SCOPE_KEY)
    if record is None:  # a route called outside the middleware (unit tests of a handler)
        record = scope[SCOPE_KEY] = RequestLog()
    return record


def access_log_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        record = RequestLog()
        scope[SCOPE_KEY] = record  # type: ignore[literal-required]
        status = 0
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if record.request_id != "-":
                    headers.append((b"x-request-id", record.request_id.encode()))
                if record.decode_ms_per_token is not None:  # a whole answer (a stream starts before it)
                    headers.append((DECODE_HEADER, f"{record.decode_ms_per_token:.3f}".encode()))
                message["headers"] = headers  # type: ignore[typeddict-unknown-key]
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        except BaseException:
            status = status or 500
            raise
        finally:
            elapsed_ms = (time.perf_counter() - start) * 1000
            parts = [
                f"{scope.get('method', '-')} {scope.get('path', '-')} {status}",
                f"id={record.request_id}",
            ]
            if record.prompt_tokens or record.completion_tokens:
                parts.append(
                    f"prompt_tokens={record.prompt_tokens} cached_tokens={record.cached_tokens} "
                    f"completion_tokens={record.completion_tokens}"
                )
            if record.outcome:
                parts.append(f"outcome={record.outcome}")
            if record.decode_ms_per_token is not None:
                parts.append(f"decode_ms_per_token={record.decode_ms_per_token:.2f}")
            parts.append(f"time_ms={elapsed_ms:.1f}")
            log.info(" ".join(parts))

    return middleware
