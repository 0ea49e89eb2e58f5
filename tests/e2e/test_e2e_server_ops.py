"""End to end on the session's one real `jumpgate serve` (SmolLM2-135M on CPU): the schema registry, the
prefix cache and /v1/cache/explain, metrics, client disconnects freeing KV, the examples, and a
registry that survives a restart (last: it restarts the server). Greedy, small `max_tokens`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.server_process import MODEL
from tests.e2e.e2e_server_helpers import EXAMPLES, ROOT, assert_openai_error, chat_body

pytestmark = pytest.mark.e2e

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "population_millions": {"type": "number"}},
    "required": ["city", "population_millions"],
    "additionalProperties": False,
}


def sse_data(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


# --------------------------------------------------------------------------- registry


def test_registry_lifecycle(client, http):
    name = f"city-{uuid.uuid4().hex[:6]}"
    first = http.post("/v1/schemas", json={"name": name, "schema": CITY_SCHEMA})
    assert first.status_code == 201, first.text
    entry = first.json()
    assert entry["object"] == "schema" and entry["kind"] == "json_schema" and entry["id"].startswith("sch_")
    again = http.post("/v1/schemas", json={"name": name, "schema": CITY_SCHEMA})
    assert again.status_code == 200 and again.json()["id"] == entry["id"]

    got = http.get(f"/v1/schemas/{entry['id']}").json()
    assert got["payload"] == CITY_SCHEMA and got["name"] == name
    assert entry["id"] in [e["id"] for e in http.get("/v1/schemas").json()["data"]]

    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about Rome."}],
        temperature=0,
        max_tokens=48,
        extra_body={"schema_id": entry["id"]},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), CITY_SCHEMA)

    deleted = http.delete(f"/v1/schemas/{entry['id']}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert_openai_error(http.get(f"/v1/schemas/{entry['id']}"), 404, code="schema_not_found")
    assert entry["id"] not in [e["id"] for e in http.get("/v1/schemas").json()["data"]]
    assert_openai_error(
        http.post("/v1/chat/completions", json=chat_body(schema_id=entry["id"])),
        404,
        param="schema_id",
        code="schema_not_found",
    )


# --------------------------------------------------------------------------- prefix cache


def test_cached_tokens_and_cache_explain(client, http):
    system = f"[{uuid.uuid4().hex}] You are the archivist of a maritime museum. " + (
        "Answer visitors' questions about ships, harbours and navigation history in plain words. " * 12
    )

    def ask(question: str):
        return client.chat.completions.create(
            model=MODEL,
            temperature=0,
            max_tokens=4,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        )

    first = ask("Which ship is the oldest in the collection?")
    second = ask("Where was the lighthouse lens made?")
    cached_first = first.usage.prompt_tokens_details.cached_tokens
    cached_second = second.usage.prompt_tokens_details.cached_tokens
    assert cached_first < 16  # a fresh system prompt: at most the chat template's opening is shared
    assert cached_second > 0 and cached_second >= 0.8 * (first.usage.prompt_tokens - 20)

    question = "Tell me about the harbour master."
    resp = http.post(
        "/v1/cache/explain",
        json={
            "model": MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        },
    )
    assert resp.status_code == 200, resp.text
    info = resp.json()
    assert info["object"] == "cache.explanation"
    assert info["cached_tokens"] >= cached_second
    assert info["boundary"]["token_index"] == info["cached_tokens"] < info["prompt_tokens"]
    # the cached prefix ends where this request diverges from the earlier ones: at the user turn
    assert info["boundary"]["text_before"].endswith("user\n")
    assert info["boundary"]["text_after"].startswith(question[:20])
    assert sum(t["tokens"] for t in info["cached_by_tier"]) == info["cached_tokens"]

    fresh = http.post(
        "/v1/cache/explain",
        json={
            "model": MODEL,
            "messages": [
                {"role": "system", "content": f"[{uuid.uuid4().hex}] A new agent."},
                {"role": "user", "content": question},
            ],
        },
    ).json()
    assert fresh["cached_tokens"] < 16 and fresh["boundary"]["token_index"] == fresh["cached_tokens"]


def test_metrics_text(server, client, http):
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=2
    )
    resp = http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    for name in (
        'jumpgate_requests_total{outcome="success",route="chat"}',
        "jumpgate_prompt_tokens_total",
        "jumpgate_cached_prompt_tokens_total",
        "jumpgate_generation_tokens_total",
        "jumpgate_time_to_first_token_seconds_count",
        "jumpgate_e2e_request_latency_seconds_bucket",
        "jumpgate_running_requests",
        "jumpgate_waiting_requests",
        "jumpgate_kv_slots_free",
        "jumpgate_kv_slots_tree_held",
        "jumpgate_kv_slots_request_only",
        "jumpgate_kv_pool_slots",
        "jumpgate_gateway_in_flight_requests",
        "jumpgate_lookup_row_cost",
    ):
        assert name in text, name
    for family in text_string_to_metric_families(text):  # Prometheus's own parser reads all of it
        assert family.type in ("counter", "gauge", "histogram"), family.name
    m = server.metrics()
    assert m['jumpgate_requests_total{outcome="success",route="chat"}'] >= 1
    assert m["jumpgate_generation_tokens_total"] >= 1
    assert m["jumpgate_kv_pool_slots"] == 16384
    assert 0.0 < m["jumpgate_lookup_row_cost"] < 1.0  # measured (the prior until decode steps vary)


# --------------------------------------------------------------------------- disconnects


# A request the client leaves must still be generating when it leaves, whatever the host's speed: it
# ignores EOS and asks for the server's whole max_tokens limit (4096 decode steps), and the client
# leaves as soon as the server reports it running, not after a fixed time.
LONG = {"max_tokens": 4096, "ignore_eos": True}


def test_client_disconnect_mid_stream_frees_kv(server):
    cancelled_before = server.metrics().get('jumpgate_requests_total{outcome="cancelled",route="chat"}', 0.0)
    body = chat_body(
        messages=[{"role": "user", "content": "Write a very long story about dragons."}], stream=True, **LONG
    )
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            events = sse_data(resp)  # kept referenced: dropping the iterator would close the connection
            for _ in range(6):
                assert next(events) != "[DONE]"
            during = server.metrics()
            assert during["jumpgate_running_requests"] >= 1, during
            assert during["jumpgate_gateway_in_flight_requests"] >= 1, during
            assert during["jumpgate_kv_slots_request_only"] >= 1, during
        # leaving the block closes the connection mid-stream
    m = server.wait_metrics(timeout_s=10)
    assert m["jumpgate_running_requests"] == 0, m
    assert m["jumpgate_kv_slots_request_only"] == 0, m
    assert m["jumpgate_gateway_in_flight_requests"] == 0, m
    assert m['jumpgate_requests_total{outcome="cancelled",route="chat"}'] == cancelled_before + 1
    # the server keeps serving
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_client_timeout_on_whole_response_frees_kv(server):
    """A client that gives up waiting for a whole (non-streamed) answer, as a read timeout does:
    its connection closes while the answer is generated. The request is aborted and its KV freed.
    The client is a plain socket, so it leaves exactly when the server reports the request running
    and holding KV (no timer racing the decode)."""
    cancelled_before = server.metrics().get('jumpgate_requests_total{outcome="cancelled",route="chat"}', 0.0)
    body = json.dumps(
        chat_body(messages=[{"role": "user", "content": "Write a very long story about wizards."}], **LONG)
    ).encode()
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (url.host.encode(), url.port, len(body), body)
        )
        during = server.wait_metrics(
            lambda m: m["jumpgate_running_requests"] >= 1 and m["jumpgate_kv_slots_request_only"] >= 1,
            timeout_s=60,
            interval_s=0.02,
        )
        assert during["jumpgate_running_requests"] >= 1 and during["jumpgate_kv_slots_request_only"] >= 1, during
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # no answer yet: the client leaves mid-generation
            sock.recv(1)
    m = server.wait_metrics(timeout_s=10)
    assert m["jumpgate_running_requests"] == 0, m
    assert m["jumpgate_kv_slots_request_only"] == 0, m
    assert m["jumpgate_gateway_in_flight_requests"] == 0, m
    assert m['jumpgate_requests_total{outcome="cancelled",route="chat"}'] == cancelled_before + 1


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(
    "script,args,expect",
    [
        (
            "react_agent.py",
            ["--task", "What is 12 * 7? Use the calculator.", "--max-turns", "2", "--max-tokens", "48"],
            "answer:",
        ),
        ("extract_pydantic.py", ["--count", "1", "--max-tokens", "96"], "->"),
        ("rag_cached.py", ["--questions", "2", "--max-tokens", "12"], "cached_tokens="),
    ],
)
def test_example_runs(server, script, args, expect):
    env = {**os.environ, "JUMPGATE_BASE_URL": server.base_url, "JUMPGATE_API_KEY": "x"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert expect in proc.stdout, proc.stdout
    if script == "rag_cached.py":  # the second question reuses the document's KV
        cached = [int(x) for x in re.findall(r"cached_tokens=(\d+)", proc.stdout)]
        assert len(cached) == 2 and cached[1] > 500, proc.stdout


# --------------------------------------------------------------------------- restart (runs last)


def test_registry_survives_restart(server, client, http):
    up = http.post(
        "/v1/schemas",
        json={
            "name": "persisted",
            "schema": CITY_SCHEMA,
        },
    )
    assert up.status_code in (200, 201), up.text
    sid = up.json()["id"]
    regex = http.post("/v1/schemas", json={"regex": r"(yes|no)"}).json()["id"]
    old_pid = server.pid

    server.restart()  # same port, same registry and grammar cache folders
    assert server.pid != old_pid

    assert http.get(f"/v1/schemas/{sid}").json()["payload"] == CITY_SCHEMA
    ids = [e["id"] for e in http.get("/v1/schemas").json()["data"]]
    assert sid in ids and regex in ids
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about Oslo."}],
        temperature=0,
        max_tokens=48,
        extra_body={"schema_id": sid},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), CITY_SCHEMA)
    # same upload after the restart: same id, not created again
    again = http.post("/v1/schemas", json={"name": "persisted", "schema": CITY_SCHEMA})
    assert again.status_code == 200 and again.json()["id"] == sid
