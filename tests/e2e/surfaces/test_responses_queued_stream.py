"""Streams start at once: while the engine's one running slot is busy, a queued streaming request
still gets its headers and first event (chat: the role chunk; responses: response.created) within a
client read timeout far shorter than its wait. Then the client leaves, which aborts the queued
request, and the server ends idle."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.harness.server_process import MODEL, JumpgateServer, is_idle, parse_metrics

pytestmark = pytest.mark.e2e

READ_TIMEOUT_S = 3.0  # far less than the 4000-token request ahead of them takes


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-queued"), kv_pool_tokens=8192, extra_args=["--max-running-requests", "1"]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def first_event(http: httpx.Client, path: str, body: dict) -> tuple[int, str, float]:
    """(status, first event's data, engine requests waiting while that event was in hand; an earlier
    client's queued request may not be aborted yet, hence >= 1 below)."""
    with http.stream("POST", path, json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                return resp.status_code, line[len("data: ") :], waiting(http)
    raise AssertionError("the stream ended without an event")


def waiting(http: httpx.Client) -> float:
    return parse_metrics(http.get("/metrics").text).get("jumpgate_waiting_requests", -1)


def test_queued_streams_start_while_another_request_runs(server):
    long_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    timeout = httpx.Timeout(60, read=READ_TIMEOUT_S)
    with (
        httpx.Client(base_url=server.url, timeout=60) as long_http,
        long_http.stream("POST", "/v1/chat/completions", json=long_body) as long_stream,
    ):
        lines = long_stream.iter_lines()  # kept open: leaving a `for` over it would close the response
        line = ""
        while not (line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content")):
            line = next(lines)  # until a generated token: the long request holds the one running slot
        with httpx.Client(base_url=server.url, timeout=timeout) as http:
            status, data, queued = first_event(
                http,
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8},
            )
            assert status == 200 and json.loads(data)["choices"][0]["delta"]["role"] == "assistant" and queued >= 1
            status, data, queued = first_event(
                http, "/v1/responses", {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 8}
            )
            assert status == 200 and json.loads(data)["type"] == "response.created" and queued >= 1
            with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": True}) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                assert waiting(http) >= 1
    # every client left: the long request and the queued ones were aborted
    assert is_idle(server.wait_metrics(timeout_s=60))
