"""Reliability over HTTP: overload, tenant isolation, hostile input and durability across SIGKILL.

One real `jumpgate serve` subprocess (SmolLM2-135M on CPU) serves the whole module; every generation
is greedy with a tiny max_tokens. The security checks that need no model run through the ASGI app
with the scripted FakeEngine. The durability test kills and restarts the server, so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
import uuid

import httpx
import pytest

from bench.harness.server_process import MODEL, JumpgateServer, is_idle
from gateway.auth import tenant_id

KEYS = {"load": "sk-load-0001", "alice": "sk-alice-0001", "bob": "sk-bob-0001"}
MAX_RUNNING, MAX_WAITING = 2, 2


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}


# --------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = [
        "--num-threads",
        "1",
        "--max-running-requests",
        str(MAX_RUNNING),
        "--max-waiting-requests",
        str(MAX_WAITING),
        "--max-concurrent-requests",
        "16",
        "--grammar-compile-timeout",
        "10",
    ]
    for key in KEYS.values():
        args += ["--api-key", key]
    srv = JumpgateServer(tmp_path_factory.mktemp("jumpgate-reliability"), kv_pool_tokens=8192, extra_args=args)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def chat_body(content: str, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 2}
    body.update(fields)
    return body


# --------------------------------------------------------------------------- 2. overload


def test_full_queue_is_refused_at_once_and_health_stays_fast(server):
    """MAX_RUNNING requests run and MAX_WAITING wait; the next one is a 503 with Retry-After at once
    (the queue is bounded, nothing piles up), and /health keeps answering within 100 ms."""
    # 3500 tokens each, EOS ignored: the held requests outlast the checks below on any host (two fit the pool)
    long_body = chat_body(
        "Write a very long story about a lighthouse keeper.", max_tokens=3500, ignore_eos=True, stream=True
    )
    held = MAX_RUNNING + MAX_WAITING

    async def hold(client: httpx.AsyncClient, i: int) -> None:
        body = {**long_body, "messages": [{"role": "user", "content": f"Story {i}: a lighthouse keeper."}]}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=auth("load")) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                pass  # keep reading until cancelled: the request stays in the engine meanwhile

    def health_latencies(n: int = 12) -> list[float]:
        out = []
        with httpx.Client(base_url=server.url, timeout=10) as c:
            c.get("/health")  # connect first: time the answers, not the TCP handshake
            for _ in range(n):
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                out.append(time.perf_counter() - t0)
                time.sleep(0.05)
        return out

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            tasks = [asyncio.ensure_future(hold(client, i)) for i in range(held)]
            try:
                m = await asyncio.to_thread(
                    server.wait_metrics,
                    lambda m: (
                        m.get("jumpgate_running_requests") == MAX_RUNNING
                        and m.get("jumpgate_waiting_requests") == MAX_WAITING
                    ),
                )
                assert m["jumpgate_running_requests"] == MAX_RUNNING, m
                assert m["jumpgate_waiting_requests"] == MAX_WAITING, m

                refusals = []
                for stream in (False, True):
                    t0 = time.perf_counter()
                    r = await client.post(
                        "/v1/chat/completions", headers=auth("load"), json=chat_body("one more, please", stream=stream)
                    )
                    refusals.append((r, time.perf_counter() - t0))
                latencies = await asyncio.to_thread(health_latencies)
                during = await asyncio.to_thread(server.metrics)
                return refusals, latencies, during
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    refusals, latencies, during = asyncio.run(scenario())
    for resp, elapsed in refusals:
        assert resp.status_code == 503, resp.text
        assert resp.headers["content-type"].startswith("application/json")  # not an SSE stream
        assert int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["code"] == "overloaded"
        assert elapsed < 1.0, elapsed  # refused at once, not after waiting for room
    assert during["jumpgate_running_requests"] == MAX_RUNNING  # still saturated while /health was timed
    median = sorted(latencies)[len(latencies) // 2]
    assert median < 0.1, latencies
    assert max(latencies) < 1.0, latencies

    # the held requests were cancelled by their clients: everything is released
    m = server.wait_metrics(timeout_s=30)
    assert is_idle(m), m
    assert (
        httpx.post(
            server.url + "/v1/chat/completions", headers=auth("load"), timeout=60, json=chat_body("still serving?")
        ).status_code
        == 200
    )


# --------------------------------------------------------------------------- 7. tenant isolation


def test_tenants_pay_their_own_prefill_and_salt_splits_further(server):
    unique = uuid.uuid4().hex
    content = f"Reference {unique}: name three colours of the rainbow."

    def cached(who: str, salt: str | None = None) -> int:
        body = chat_body(content, **({"cache_salt": salt} if salt else {}))
        r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=auth(who), timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    alice_first = cached("alice")
    alice_again = cached("alice")
    bob_first = cached("bob")  # the very same prompt, but another tenant
    bob_again = cached("bob")
    salt_first = cached("alice", "s1")  # same tenant, another salt
    salt_again = cached("alice", "s1")
    other_salt = cached("alice", "s2")
    bob_same_salt = cached("bob", "s1")  # a salt never crosses tenants either

    assert alice_first == 0
    assert alice_again > 0
    assert bob_first == 0, "bob reused alice's KV"
    assert bob_again > 0
    assert salt_first == 0 and salt_again > 0 and other_salt == 0 and bob_same_salt == 0

    explain = httpx.post(server.url + "/v1/cache/explain", json=chat_body(content), headers=auth("bob"), timeout=60)
    assert explain.status_code == 200 and explain.json()["cached_tokens"] > 0
    explain = httpx.post(
        server.url + "/v1/cache/explain",
        json=chat_body(content, cache_salt="never-used"),
        headers=auth("bob"),
        timeout=60,
    )
    assert explain.status_code == 200 and explain.json()["cached_tokens"] == 0


def test_another_tenants_schema_is_not_found(server):
    schema = {
        "type": "object",
        "properties": {"tag": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["tag", "n"],
        "additionalProperties": False,
        "title": uuid.uuid4().hex,
    }
    with httpx.Client(base_url=server.url, timeout=60) as c:
        up = c.post("/v1/schemas", json={"schema": schema, "name": "alice-only"}, headers=auth("alice"))
        assert up.status_code == 201, up.text
        sid = up.json()["id"]
        assert c.get(f"/v1/schemas/{sid}", headers=auth("alice")).status_code == 200

        assert c.get(f"/v1/schemas/{sid}", headers=auth("bob")).status_code == 404
        assert sid not in [e["id"] for e in c.get("/v1/schemas", headers=auth("bob")).json()["data"]]
        used = c.post("/v1/chat/completions", json=chat_body("hi", schema_id=sid), headers=auth("bob"))
        assert used.status_code == 404 and used.json()["error"]["code"] == "schema_not_found"
        assert c.delete(f"/v1/schemas/{sid}", headers=auth("bob")).status_code == 404
        assert c.get(f"/v1/schemas/{sid}", headers=auth("alice")).status_code == 200  # untouched

        # bob uploading the same schema creates his own copy: no "already exists" answer that would
        # tell him what another tenant registered
        mine = c.post("/v1/schemas", json={"schema": schema}, headers=auth("bob"))
        assert mine.status_code == 201 and mine.json()["id"] == sid
        assert c.delete(f"/v1/schemas/{sid}", headers=auth("bob")).status_code == 200
        assert c.get(f"/v1/schemas/{sid}", headers=auth("alice")).status_code == 200


# --------------------------------------------------------------------------- 6. security basics (ASGI app)


@pytest.fixture
def listener():
    """A local listening socket: any connection attempt would wait in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock, f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def connection_attempted(sock: socket.socket) -> bool:
    time.sleep(0.2)  # a connect that was under way would have reached the backlog by now
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_schemas_never_trigger_network_access(gateway_client, listener):
    sock, base = listener
    client = gateway_client()
    hostile_schemas = [
        {"type": "object", "properties": {"a": {"$ref": f"{base}/x.json"}}},
        {"$ref": f"{base}/x.json#/definitions/a"},
        {"$id": f"{base}/root.json", "type": "object", "properties": {"a": {"$ref": "other.json"}}},
        {"$schema": f"{base}/meta.json", "type": "object"},
        {"type": "object", "properties": {"a": {"$dynamicRef": f"{base}/x.json"}}},
        {"type": "object", "properties": {"a": {"$ref": "//127.0.0.1:{}/x.json".format(base.rsplit(":", 1)[1])}}},
    ]
    for schema in hostile_schemas:
        rf = {"type": "json_schema", "json_schema": {"name": "h", "schema": schema}}
        chat = client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": 4,
                "response_format": rf,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        upload = client.post("/v1/schemas", json={"schema": schema})
        completion = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4, "response_format": rf}
        )
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        tools = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 4, "tools": [tool], "messages": [{"role": "user", "content": "hi"}]},
        )
        for resp in (chat, upload, completion, tools):
            assert resp.status_code == 400, (schema, resp.text)
            assert resp.json()["error"]["message"]
    assert not connection_attempted(sock), "a schema made the server open a connection"


def test_registry_paths_cannot_leave_the_folder(gateway_client, tmp_path):
    client = gateway_client()
    secret = tmp_path / "secret.json"
    secret.write_text('{"id": "sch_0000000000000000", "kind": "regex", "payload": "x", "created": 0}')
    for bad in (
        "..%2Fsecret",
        "..%2F..%2Fsecret",
        "sch_..%2F..%2Fsecret",
        "%2Fetc%2Fpasswd",
        "sch_%00",
        "..",
        "sch_" + "a" * 16 + "%2F..%2F..%2Fsecret",
    ):
        for method in ("GET", "DELETE"):
            resp = client.request(method, f"/v1/schemas/{bad}")
            assert resp.status_code in (400, 404, 405), (method, bad, resp.status_code)
    assert secret.exists()


def test_size_limits_on_every_input(gateway_client, fake_engine):
    client = gateway_client(max_body_bytes=64 * 1024, max_n=2, max_tokens_limit=50)
    big = "x" * (70 * 1024)
    user = [{"role": "user", "content": "hi"}]

    def error(resp, status: int) -> dict:
        assert resp.status_code == status, resp.text
        return resp.json()["error"]

    # bodies, on every POST route
    assert (
        error(
            client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": big}]}),
            413,
        )["code"]
        == "request_too_large"
    )
    assert error(client.post("/v1/completions", json={"model": MODEL, "prompt": big}), 413)
    assert error(client.post("/v1/schemas", json={"regex": big}), 413)
    assert error(
        client.post("/v1/cache/explain", json={"model": MODEL, "messages": [{"role": "user", "content": big}]}), 413
    )

    # n, max_tokens and choices, on both generation routes
    def param(route: str, **fields) -> str | None:
        body = {"model": MODEL, **({"prompt": "x"} if route == "/v1/completions" else {"messages": user}), **fields}
        return error(client.post(route, json=body), 400)["param"]

    assert param("/v1/chat/completions", n=3) == "n"
    assert param("/v1/completions", n=3) == "n"
    assert param("/v1/completions", max_tokens=51) == "max_tokens"
    assert param("/v1/chat/completions", max_completion_tokens=51) == "max_completion_tokens"
    assert param("/v1/completions", prompt=["a"] * 5, n=2) == "prompt"  # prompts x n
    assert param("/v1/chat/completions", stop=[str(i) for i in range(17)]) == "stop"
    # messages: many small ones fit the body limit but not the context
    many = [{"role": "user", "content": "hello there"}] * 1500
    assert (
        error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": many}), 400)["code"]
        == "context_length_exceeded"
    )
    assert fake_engine.submitted == []  # nothing above reached the engine

    # schemas: within the default body limit, over the spec limit
    roomy = gateway_client()
    huge_schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(10000)},
    }
    err = error(roomy.post("/v1/schemas", json={"schema": huge_schema}), 400)
    assert "byte limit" in err["message"] and err["param"] == "schema"
    err = error(roomy.post("/v1/schemas", json={"regex": "a" * 1_000_001}), 400)
    assert "byte limit" in err["message"] and err["param"] == "regex"


# --------------------------------------------------------------------------- 5. durability (last: kills the server)


def upload_loop(server: JumpgateServer, stop: threading.Event, acked: list, worker: int) -> None:
    """Upload distinct schemas until the server goes away; remember every acknowledged one."""
    i = 0
    with httpx.Client(base_url=server.url, timeout=10) as c:
        while not stop.is_set():
            i += 1
            if i % 2:
                payload = {"regex": f"w{worker}n{i}-[a-z]{{1,8}}"}
            else:
                payload = {
                    "schema": {
                        "type": "object",
                        "properties": {f"w{worker}n{i}": {"type": "integer"}},
                        "required": [f"w{worker}n{i}"],
                        "additionalProperties": False,
                    }
                }
            try:
                resp = c.post("/v1/schemas", json=payload, headers=auth("load"))
            except httpx.HTTPError:
                return  # the server is gone
            if resp.status_code in (200, 201):
                acked.append((payload, resp.json()["id"]))


def grammar_files(server) -> set[str]:
    """The compiled grammars on disk, as paths under the cache folder (each tokenizer's in its namespace)."""
    return {str(p.relative_to(server.grammar_cache_dir)) for p in server.grammar_cache_dir.rglob("*.json")}


def test_registry_survives_sigkill_and_damaged_files_are_ignored_then_rebuilt(server):
    grammar_files_before = grammar_files(server)
    acked: list = []
    stop = threading.Event()
    workers = [threading.Thread(target=upload_loop, args=(server, stop, acked, w), daemon=True) for w in range(2)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 20
    while len(acked) < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(acked) >= 12, "uploads did not get going"
    os.kill(server.pid, signal.SIGKILL)  # mid-upload: some request is always in flight here
    server.proc.wait(timeout=30)
    stop.set()
    for w in workers:
        w.join(30)
    acked_now = list(acked)

    server.start()  # same port, same registry and grammar cache folders
    with httpx.Client(base_url=server.url, timeout=60, headers=auth("load")) as c:
        listed = c.get("/v1/schemas").json()["data"]
        listed_ids = [e["id"] for e in listed]
        # nothing acknowledged was lost, and only complete entries are listed
        assert {sid for _, sid in acked_now} <= set(listed_ids)
        assert len(listed_ids) == len(set(listed_ids))
        files = sorted((server.registry_dir / tenant_id(KEYS["load"])).glob("sch_*.json"))
        for path in files:
            json.loads(path.read_text())  # every entry file on disk is whole
        assert len(listed_ids) == len(files)
        for entry in listed:
            got = c.get(f"/v1/schemas/{entry['id']}")
            assert got.status_code == 200 and got.json() == entry
        # the same upload again: the same id, not created a second time
        for payload, sid in acked_now:
            again = c.post("/v1/schemas", json=payload)
            assert again.status_code == 200 and again.json()["id"] == sid, again.text

    # damage one registry entry and one compiled grammar, then restart
    damaged_payload, damaged_id = acked_now[0]
    entry_path = next(server.registry_dir.rglob(f"{damaged_id}.json"))
    entry_path.write_bytes(b'{"id": "sch_')
    new_grammars = sorted(grammar_files(server) - grammar_files_before)
    assert new_grammars, "the uploads compiled no grammar"
    grammar_path = server.grammar_cache_dir / new_grammars[0]
    grammar_path.write_text("not a compiled grammar")
    server.restart()

    with httpx.Client(base_url=server.url, timeout=60, headers=auth("load")) as c:
        listed_ids = [e["id"] for e in c.get("/v1/schemas").json()["data"]]
        assert damaged_id not in listed_ids  # ignored, not a 500
        assert {sid for _, sid in acked_now[1:]} <= set(listed_ids)
        assert c.get(f"/v1/schemas/{damaged_id}").status_code == 404
        rebuilt = c.post("/v1/schemas", json=damaged_payload)
        assert rebuilt.status_code == 201 and rebuilt.json()["id"] == damaged_id, rebuilt.text
        assert c.get(f"/v1/schemas/{damaged_id}").status_code == 200
        for payload, _ in acked_now[1:]:  # recompiles the grammar whose cache file was damaged
            assert c.post("/v1/schemas", json=payload).status_code == 200
        # the registered entries work in requests after all this
        regex_id = next(sid for payload, sid in acked_now if "regex" in payload)
        used = c.post("/v1/chat/completions", json=chat_body("code?", schema_id=regex_id, max_tokens=12))
        assert used.status_code == 200, used.text

    log = server.log_tail(200_000)
    assert "grammar cache: discarding unreadable" in log and new_grammars[0] in log, log[-3000:]
    assert "schema registry: ignoring damaged entry" in log and damaged_id in log, log[-3000:]
    assert grammar_path.exists() and grammar_path.read_text() != "not a compiled grammar"  # rebuilt
