"""A gateway replica that dies mid-request answers 503 in the API's error shape, not a bare 500.

Where the 500 came from: the gateway is Serve's ingress deployment, so the request is held by Serve's
HTTP proxy actor, which calls the gateway replica through a handle. When the replica's process dies,
the proxy's handle call raises `RayActorError`; `HTTPProxy.send_request_to_replica`
(ray/serve/_private/proxy.py) maps it with `get_http_response_status` to 500
(ray/serve/_private/http_util.py: only timeouts, back-pressure and `DeploymentUnavailableError` get
408/429/503), and `send_http_response_on_exception` writes a body only for 408, 429 and 503, so the
proxy's ASGI app returns having sent nothing. uvicorn then answers its own `500 Internal Server
Error` in plain text ("ASGI callable returned without starting response"), or closes a stream that
had started. None of our code runs there: the replica that would answer is gone.

What Serve does let us change is the proxy's ASGI app: `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`
names a function returning Starlette middlewares that the proxy wraps around it
(`configure_http_middlewares`; `HTTPOptions.middlewares` itself is refused since Ray 2.5x). The
launcher sets it in the job's environment (launch.py), which the Serve controller and the proxy
it starts inherit. `ReplicaLost` watches what the proxy sends:

- nothing at all: a 503 `gateway_stopped` in the OpenAI shape (Anthropic's on /v1/messages),
  with `Retry-After`: the request may be sent again, another gateway replica (or the restarted
  one) serves it;
- an event stream left open: the error event that stream's API ends with, then its end, as a
  killed engine replica's streams end (docs/cluster.md, "Faults").

The proxy leaves a response unanswered only when the call to the replica raised (its actor died, or
Serve failed outside our app: the gateway's own errors are answered by the gateway), so every such
request gets the 503. A non-stream response cut after its start (the gateway writes whole bodies
in one message) is left to uvicorn, which closes the connection.

This module is imported by the proxy actor: it imports nothing of the gateway, only json.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

MESSAGE = "The gateway replica serving this request stopped before it answered; retry the request."
CODE = "gateway_stopped"
RETRY_AFTER_S = 1
IMPORT_PATH = "gateway.cluster.proxy_errors:proxy_middlewares"
ENV_VAR = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"

Send = Callable[[dict], Awaitable[None]]


def _is(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def error_body(path: str) -> bytes:
    """The 503's body in the shape of the API at `path`."""
    if _is(path, "/v1/messages"):
        body: dict[str, Any] = {"type": "error", "error": {"type": "overloaded_error", "message": MESSAGE}}
    else:
        body = {"error": {"message": MESSAGE, "type": "server_error", "param": None, "code": CODE}}
    return json.dumps(body, separators=(",", ":")).encode()


def error_event(path: str) -> bytes:
    """What ends a started event stream at `path`: its API's error event (and chat's `[DONE]`)."""
    if _is(path, "/v1/messages"):
        return b"event: error\ndata: " + error_body(path) + b"\n\n"
    if _is(path, "/v1/responses"):
        event = {"type": "error", "code": CODE, "message": MESSAGE, "param": None}
        return b"event: error\ndata: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
    return b"data: " + error_body(path) + b"\n\ndata: [DONE]\n\n"


class ReplicaLost:
    """Pure ASGI middleware around Serve's proxy app (module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        state = {"started": False, "done": False, "stream": False}

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                headers = dict((bytes(k).lower(), bytes(v)) for k, v in message.get("headers", ()))
                state["stream"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        await self.app(scope, receive, watch)
        path = scope.get("path", "")
        if not state["started"]:
            body = error_body(path)
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        elif state["stream"] and not state["done"]:
            await send({"type": "http.response.body", "body": error_event(path), "more_body": False})


def proxy_middlewares() -> list:
    """What `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` calls in the proxy: Starlette's wrapper of
    `ReplicaLost` (the proxy checks the type)."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaLost)]
