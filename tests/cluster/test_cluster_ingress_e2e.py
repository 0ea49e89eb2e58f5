"""`jumpgate serve --replicas 2` as a real process: the gateway is Ray Serve's ingress deployment,
served by Serve's HTTP proxy, driven by the official `openai` client (plain, strict json_schema,
streamed) and scraped for the router's decisions, which the ingress replica's own router made.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("ray", reason="the jumpgate[cluster] extra (Ray Serve) is not installed")
import httpx  # noqa: E402
import openai  # noqa: E402

from bench.harness.replica_killer import replica_pids  # noqa: E402
from bench.harness.server_process import MODEL, JumpgateServer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

CLUSTER_ARGS = [
    "--replicas",
    "2",
    "--replica-cpus",
    "0.5",
    "--router-stats-period",
    "0.5",
    "--num-threads",
    "1",
    "--max-running-requests",
    "4",
    "--max-waiting-requests",
    "16",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-ingress"), kv_pool_tokens=3072, extra_args=CLUSTER_ARGS, startup_timeout_s=420
    )
    srv.start()
    proc = srv.proc
    try:
        yield srv
    finally:
        srv.stop(timeout_s=60)  # SIGTERM: the driver shuts its local Ray instance down
    assert proc.returncode == 0, srv.log_tail()  # a clean tear-down, not Ray's abort on SIGTERM


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)


def test_plain_chat_completion(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], temperature=0, max_tokens=8
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_strict_json_schema_answer_parses(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a city."}],
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
    )
    assert r.choices[0].finish_reason == "stop"
    assert set(json.loads(r.choices[0].message.content)) == {"city"}


def test_stream_arrives_through_the_proxy_as_it_is_generated(client):
    arrivals, text = [], []
    with client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to twenty."}],
        temperature=0,
        max_tokens=24,
        stream=True,
    ) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
                text.append(chunk.choices[0].delta.content)
    assert len(text) >= 10 and "".join(text).strip()
    # a buffered response would arrive in one read; 24 decode steps on half a core take far longer
    assert arrivals[-1] - arrivals[0] > 0.1, arrivals


def routed(text: str) -> float:
    """The ingress router's decisions so far, every policy and replica together."""
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("jumpgate_router_decisions_total{")
    )


def test_metrics_show_the_ingress_routers_decisions(server, client):
    before = routed(server.metrics_text())
    for i in range(4):  # its own requests: the test holds alone or after the others
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say hi {i}."}], temperature=0, max_tokens=2
        )
    deadline = time.monotonic() + 30
    while True:  # replicas report their stats every 0.5 s
        text = server.metrics_text()
        replicas = {
            line.split('replica="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("jumpgate_replica_prompt_tokens_total{")
        }
        if len(replicas) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert routed(text) - before >= 4, text  # each of the four was routed here
    assert len(replicas) == 2, text


# A request that cannot end before the test acts on any host: it ignores EOS and asks for 2900 tokens
# (the most this server's 3072-token KV pool leaves room for; a larger max_tokens is refused with a 400).
LONG_STORY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a long story."}],
    "max_tokens": 2900,
    "ignore_eos": True,
    "temperature": 0,
}


def test_a_client_gone_mid_stream_aborts_the_engine_request(server):
    """The proxy sees the disconnect, Serve cancels the ingress request, the gateway cancels its
    handle call, and the replica aborts the engine request (LONG_STORY cannot end before the client
    leaves)."""
    cancelled = 'jumpgate_requests_total{outcome="cancelled",route="chat"}'
    before = server.metrics().get(cancelled, 0.0)
    body = {**LONG_STORY, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for _ in range(3):
                while not next(lines).startswith("data: "):
                    pass
        # leaving the block closes the connection mid-stream
    m = server.wait_metrics(
        lambda m: (
            m.get("jumpgate_running_requests") == 0
            and m.get(cancelled, 0) == before + 1
            and m.get("jumpgate_gateway_in_flight_requests") == 0
        ),
        timeout_s=20,
        interval_s=0.5,
    )
    assert m["jumpgate_running_requests"] == 0, m
    assert m["jumpgate_gateway_in_flight_requests"] == 0, m
    assert m[cancelled] == before + 1, m


def test_a_killed_gateway_replica_fails_its_requests_with_a_clear_503(server):
    """Last in this module: it kills the only gateway replica (Serve restarts it; no later test
    waits for that). Its two requests in flight, one whole and one streamed, end with 503
    `gateway_stopped` in the OpenAI shape and with that error event then `[DONE]`; before, Serve's
    proxy answered a bare `500 Internal Server Error` and cut the stream (docs/cluster.md, "Faults").
    Neither can end before the kill (LONG_STORY)."""
    body = LONG_STORY
    out: dict = {}
    streaming = threading.Event()

    def whole() -> None:
        out["whole"] = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)

    def streamed() -> None:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: "):
                    streaming.set()
            out["stream"] = (r.status_code, lines)

    clients = [threading.Thread(target=f, daemon=True) for f in (whole, streamed)]
    for t in clients:
        t.start()
    assert streaming.wait(60)
    server.wait_metrics(lambda m: m.get("jumpgate_gateway_in_flight_requests", 0) >= 2, timeout_s=20, interval_s=0.2)
    (pid,) = replica_pids(server.proc.pid, "gateway")
    os.kill(pid, signal.SIGKILL)
    for t in clients:
        t.join(60)
    whole_r, (status, lines) = out["whole"], out["stream"]
    assert whole_r.status_code == 503, whole_r.text
    assert whole_r.json()["error"]["code"] == "gateway_stopped" and whole_r.headers["retry-after"] == "1"
    assert status == 200
    events = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "gateway_stopped"
