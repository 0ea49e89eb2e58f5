"""gateway/cluster/proxy_errors.py's middleware around Serve's proxy app, driven as plain ASGI (no
Ray): what the proxy leaves unanswered when a gateway replica dies becomes a 503 in the API's
error shape, a stream it leaves open ends with that API's error event, and every other answer
passes through as it was. The real kill is in tests/cluster/test_cluster_ingress_e2e.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.cluster import proxy_errors
from gateway.cluster.proxy_errors import CODE, ReplicaLost, proxy_middlewares

SSE = [(b"content-type", b"text/event-stream")]


def run(app, path: str = "/v1/chat/completions", scope_type: str = "http") -> list[dict]:
    """The messages `ReplicaLost(app)` sends for one request to `path`."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(ReplicaLost(app)({"type": scope_type, "path": path}, receive, send))
    return sent


async def dies_before_answering(scope, receive, send) -> None:
    return None  # Serve's proxy after RayActorError: a 500 status inside, nothing sent


async def dies_mid_stream(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b'data: {"x":1}\n\n', "more_body": True})


async def answers(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 429, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"error":{}}', "more_body": False})


async def streams_whole(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def test_a_request_the_proxy_left_unanswered_gets_a_503_in_the_openai_shape():
    start, body = run(dies_before_answering)
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json" and headers[b"retry-after"] == b"1"
    assert int(headers[b"content-length"]) == len(body["body"]) and body["more_body"] is False
    error = json.loads(body["body"])["error"]
    assert error["code"] == CODE and error["type"] == "server_error" and "retry" in error["message"]


def test_on_the_messages_route_the_503_is_in_anthropics_shape():
    _, body = run(dies_before_answering, "/v1/messages")
    assert json.loads(body["body"]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": proxy_errors.MESSAGE},
    }


@pytest.mark.parametrize(
    "path, event",
    [
        ("/v1/chat/completions", b'data: {"error":{"message":'),
        ("/v1/messages", b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"'),
        ("/v1/responses", b'event: error\ndata: {"type":"error","code":"gateway_stopped"'),
    ],
)
def test_a_stream_left_open_ends_with_its_apis_error_event(path, event):
    sent = run(dies_mid_stream, path)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    last = sent[-1]
    assert last["more_body"] is False and last["body"].startswith(event)
    assert proxy_errors.MESSAGE.encode() in last["body"]  # Anthropic's error has no code
    assert last["body"].endswith(b"data: [DONE]\n\n") == (path == "/v1/chat/completions")


@pytest.mark.parametrize("app", [answers, streams_whole])
def test_every_answer_the_proxy_sent_passes_as_it_was(app):
    expected: list[dict] = []

    async def record(message: dict) -> None:
        expected.append(message)

    asyncio.run(app({}, None, record))
    assert run(app) == expected


def test_other_scopes_pass_through_untouched():
    assert run(dies_before_answering, scope_type="websocket") == []


def test_the_launcher_names_the_middleware_for_the_proxy():
    """The proxy imports `IMPORT_PATH` and checks that it returns Starlette middlewares."""
    from starlette.middleware import Middleware

    module, _, name = proxy_errors.IMPORT_PATH.partition(":")
    assert module == proxy_errors.__name__ and getattr(proxy_errors, name) is proxy_middlewares
    (middleware,) = proxy_middlewares()
    assert isinstance(middleware, Middleware) and middleware.cls is ReplicaLost
    assert proxy_errors.ENV_VAR == "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
