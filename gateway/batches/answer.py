"""Answering one batch line: an in-process POST to the server's own route (the same preparation,
generation, validation and error bodies as online traffic), marked in its ASGI scope with the
line's tenant and the engine's background priority. No socket, no API key: HTTP clients cannot
set scope keys."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.auth import INTERNAL_TENANT_SCOPE_KEY
from gateway.chat.chat_route import PRIORITY_SCOPE_KEY
from runtime.api import BACKGROUND_PRIORITY


class LocalCaller:
    """POSTs JSON bodies to an ASGI app in this process; `app` is set once the app exists."""

    def __init__(self, app: Any = None):
        self.app = app

    async def post(self, path: str, body: bytes, tenant: str, priority: int = BACKGROUND_PRIORITY) -> tuple[int, bytes]:
        """(status, response body). Cancelling the call is a client that left: the route aborts
        its engine requests."""
        assert self.app is not None, "LocalCaller.app is not set"
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"host", b"jumpgate.batch"),
            ],
            INTERNAL_TENANT_SCOPE_KEY: tenant,
            PRIORITY_SCOPE_KEY: priority,
        }
        sent_body = False
        never = asyncio.Event()  # the caller never disconnects; cancellation ends the call instead
        status = 500
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)
