"""The HTTP routes over a scripted fake engine: response shapes, SSE, tool calls, registry, cache
explain, health, and client disconnects aborting the engine request."""

from __future__ import annotations

import asyncio
import json

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import MODEL, USER, WEATHER_TOOL, chat

CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'


def sse_events(resp) -> list:
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in resp.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# ------------------------------------------------------------------ chat


def test_chat_completion_shape(gateway_client, fake_engine):
    resp = chat(gateway_client(), max_tokens=20, temperature=0, seed=7, stop=["END"])
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-") and resp.headers["x-request-id"] == body["id"]
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there!"}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    req = fake_engine.submitted[0]
    assert usage["prompt_tokens"] == len(req.prompt_ids)
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
    # the request reached the engine as asked
    assert req.sampling.max_new_tokens == 20 and req.sampling.temperature == 0 and req.sampling.seed == 7
    assert req.sampling.stop == ["END"] and req.constraint is None and req.namespace == ""


def test_default_max_tokens_fills_the_context(gateway_client, fake_engine):
    chat(gateway_client(max_tokens_limit=100_000))
    req = fake_engine.submitted[0]
    assert req.sampling.max_new_tokens == fake_engine.max_context - len(req.prompt_ids)


def test_length_finish_reason(gateway_client, fake_engine):
    fake_engine.finish_reason = "length"
    assert chat(gateway_client()).json()["choices"][0]["finish_reason"] == "length"


def test_n_choices_use_distinct_seeds(gateway_client, fake_engine):
    body = chat(gateway_client(), n=3, seed=10).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [r.sampling.seed for r in fake_engine.submitted] == [10, 11, 12]
    assert len({r.rid for r in fake_engine.submitted}) == 3
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["prompt_tokens"] == len(fake_engine.submitted[0].prompt_ids)


def test_chat_stream(gateway_client):
    resp = chat(gateway_client(), stream=True, stream_options={"include_usage": True})
    assert resp.status_code == 200
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello there!"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert all("usage" not in c for c in chunks[:-1])


def test_chat_stream_without_usage(gateway_client):
    events = sse_events(chat(gateway_client(), stream=True))
    assert all("usage" not in e for e in events[:-1])


def test_chat_stream_n2_interleaves_indexes(gateway_client):
    events = sse_events(chat(gateway_client(), stream=True, n=2))
    by_index = {0: "", 1: ""}
    for e in events[:-1]:
        for c in e["choices"]:
            by_index[c["index"]] += c["delta"].get("content", "")
    assert by_index == {0: "Hello there!", 1: "Hello there!"}


def test_tool_calls_parsed(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", "Oslo")
    resp = chat(gateway_client(), tools=[WEATHER_TOOL], tool_choice="required")
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert choice["message"]["content"] is None
    req = fake_engine.submitted[0]
    assert req.constraint is not None  # the tool grammar went to the engine
    assert req.constraint.kind == "tool_calls"


def test_tool_choice_none_renders_tools_without_grammar(gateway_client, fake_engine, tokenizer):
    resp = chat(gateway_client(), tools=[WEATHER_TOOL], tool_choice="none")
    assert resp.status_code == 200
    req = fake_engine.submitted[0]
    assert req.constraint is None
    assert "get_weather" in tokenizer.decode(req.prompt_ids)


def test_tool_call_stream_deltas(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    events = sse_events(chat(gateway_client(), tools=[WEATHER_TOOL], stream=True))
    deltas = [d for e in events[:-1] for c in e["choices"] for d in c["delta"].get("tool_calls", [])]
    first = deltas[0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d.get("function", {}) for d in deltas[1:])
    arguments = "".join(d["function"].get("arguments", "") for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}
    assert len(deltas) > 2  # the arguments arrived in pieces
    finals = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    assert finals == ["tool_calls"]


def test_json_schema_constraint_reaches_engine(gateway_client, fake_engine, tokenizer):
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
        "required": ["b", "a"],
    }
    fake_engine.reply = lambda req: '{"b":1,"a":"x"}'
    resp = chat(
        gateway_client(), response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    )
    assert resp.status_code == 200
    req = fake_engine.submitted[0]
    assert req.constraint.kind == "json_schema" and req.strict
    prompt = tokenizer.decode(req.prompt_ids)
    # schema text in the prompt: properties in the schema's own order (the generation order)
    assert '"properties":{"b":{"type":"integer"},"a":{"type":"string"}}' in prompt


def test_cache_salt_changes_namespace(gateway_client, fake_engine):
    client = gateway_client()
    chat(client, cache_salt="s1")
    chat(client, cache_salt="s2")
    chat(client)
    namespaces = [r.namespace for r in fake_engine.submitted]
    assert namespaces[0] != namespaces[1] and namespaces[2] == "" and "s1" not in namespaces[0]


def test_jump_forward_mode_passed(gateway_client, fake_engine):
    chat(gateway_client(), jump_forward="off", regex="[a-z]+")
    req = fake_engine.submitted[0]
    assert req.jump_forward == "off" and req.constraint.kind == "regex"


# ------------------------------------------------------------------ completions, models


def test_text_completion(gateway_client, fake_engine, tokenizer):
    resp = gateway_client().post(
        "/v1/completions", json={"model": MODEL, "prompt": "Once upon", "max_tokens": 5, "echo": True}
    )
    body = resp.json()
    assert resp.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Once upon" + "Hello there!"
    assert fake_engine.submitted[0].sampling.max_new_tokens == 5
    assert tokenizer.decode(fake_engine.submitted[0].prompt_ids) == "Once upon"


def test_text_completion_prompt_shapes(gateway_client, fake_engine):
    client = gateway_client()
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"], "n": 2}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    client.post("/v1/completions", json={"model": MODEL, "prompt": [[1, 2, 3], [4, 5]]})
    assert [r.prompt_ids for r in fake_engine.submitted[-2:]] == [[1, 2, 3], [4, 5]]


def test_text_completion_stream(gateway_client):
    resp = gateway_client().post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
    )
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    text = "".join(c["text"] for e in events[:-1] for c in e["choices"])
    assert text == "Hello there!"
    assert events[-2]["usage"]["completion_tokens"] == 4


def test_models(gateway_client):
    client = gateway_client(served_model_names=["smol"])
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL, "smol"]
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert chat(client, model="smol").status_code == 200


# ------------------------------------------------------------------ schema registry


def test_an_upload_over_another_versions_entry_is_a_clear_409_and_keeps_it(gateway_client, tmp_path):
    client = gateway_client()
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    entry = client.post("/v1/schemas", json={"schema": schema}).json()
    path = next((tmp_path / "registry").rglob(f"{entry['id']}.json"))
    theirs = json.dumps({**json.loads(path.read_text()), "schema_mode": {"mode": "strict"}}).encode()
    path.write_bytes(theirs)  # the same entry as another Jumpgate version (sharing the folder) wrote it
    again = client.post("/v1/schemas", json={"schema": schema})
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "schema_stored_by_other_version"
    assert path.read_bytes() == theirs
    assert client.delete(f"/v1/schemas/{entry['id']}").status_code == 200  # the user may still replace it
    assert client.post("/v1/schemas", json={"schema": schema}).status_code == 201


def test_schema_registry_roundtrip(gateway_client, fake_engine):
    client = gateway_client()
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    first = client.post("/v1/schemas", json={"name": "point", "schema": schema})
    assert first.status_code == 201, first.text
    entry = first.json()
    assert entry["id"].startswith("sch_") and entry["kind"] == "json_schema" and entry["name"] == "point"
    again = client.post("/v1/schemas", json={"schema": dict(reversed(list(schema.items())))})
    assert again.status_code == 200 and again.json()["id"] == entry["id"]  # canonical: same id
    assert client.get(f"/v1/schemas/{entry['id']}").json()["payload"] == schema
    assert [e["id"] for e in client.get("/v1/schemas").json()["data"]] == [entry["id"]]

    resp = chat(client, schema_id=entry["id"])
    assert resp.status_code == 200 and fake_engine.submitted[-1].constraint.kind == "json_schema"

    assert client.delete(f"/v1/schemas/{entry['id']}").json() == {
        "id": entry["id"],
        "deleted": True,
        "object": "schema",
    }
    assert chat(client, schema_id=entry["id"]).status_code == 404


def test_property_order_gives_distinct_ids(gateway_client):
    client = gateway_client()
    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    b = {"type": "object", "properties": {"y": {"type": "integer"}, "x": {"type": "integer"}}}
    ids = [client.post("/v1/schemas", json={"schema": s}).json()["id"] for s in (a, b)]
    assert ids[0] != ids[1]


def test_registered_tool_set_and_regex(gateway_client, fake_engine):
    client = gateway_client()
    tools_id = client.post("/v1/schemas", json={"tools": [WEATHER_TOOL]}).json()["id"]
    regex_id = client.post("/v1/schemas", json={"regex": "[0-9]{3}"}).json()["id"]
    fake_engine.reply = lambda req: CALL_TEXT
    body = chat(client, schema_id=tools_id).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    fake_engine.reply = lambda req: "123"
    chat(client, schema_id=regex_id)
    assert fake_engine.submitted[-1].constraint.kind == "regex"


# ------------------------------------------------------------------ cache explain, health, metrics


def test_cache_explain(gateway_client, fake_engine, tokenizer):
    resp = gateway_client().post("/v1/cache/explain", json={"model": MODEL, "messages": USER, "cache_salt": "a"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    ids, namespace = fake_engine.explained[0]
    assert body["prompt_tokens"] == len(ids) and body["cached_tokens"] == 10 and namespace != ""
    assert {"tier": "device", "tokens": 10} in body["cached_by_tier"]
    boundary = body["boundary"]
    assert boundary["token_index"] == 10
    assert tokenizer.decode(ids[:10]).endswith(boundary["text_before"])
    assert tokenizer.decode(ids[10:]).startswith(boundary["text_after"])
    assert 0 < len(boundary["text_before"]) <= 40 and 0 < len(boundary["text_after"]) <= 40
    assert fake_engine.submitted == []  # nothing generated


def test_health_and_metrics(gateway_client):
    client = gateway_client()
    assert client.get("/health").json() == {"status": "ok", "model": MODEL}
    chat(client)
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }
    assert m[("jumpgate_requests_total", (("outcome", "success"), ("route", "chat")))] == 1
    assert m[("jumpgate_generation_tokens_total", ())] == 4
    assert m[("jumpgate_cached_prompt_tokens_total", ())] == 3
    # the fake engine's snapshot
    assert m[("jumpgate_kv_slots_used", ())] == 96 and m[("jumpgate_kv_slots_tree_held", ())] == 90
    assert m[("jumpgate_jump_forward_tokens_total", ())] == 5
    assert m[("jumpgate_running_requests", ())] == 1 and m[("jumpgate_waiting_requests", ())] == 2
    assert ("jumpgate_grammar_cache_misses_total", ()) in m
    assert m[("jumpgate_time_to_first_token_seconds_count", ())] == 1


def test_openapi_docs(gateway_client):
    spec = gateway_client().get("/docs/openapi.json").json()
    assert "/v1/chat/completions" in spec["paths"] and "/v1/schemas" in spec["paths"]


# ------------------------------------------------------------------ disconnects abort the engine request


async def _drive(app, body: dict, disconnect_after_chunks: int | None) -> tuple[list[dict], bool]:
    """Run one request through the ASGI app; the client vanishes after N body chunks
    (None: right after sending the request, i.e. while a whole response is being prepared)."""
    sent: list[dict] = []
    payload = msgspec.json.encode(body)
    body_sent = False
    gone = asyncio.Event()

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        if disconnect_after_chunks is None:
            await asyncio.sleep(0.05)
            gone.set()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if disconnect_after_chunks is not None and len(chunks) >= disconnect_after_chunks:
            gone.set()
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            gone.set()  # as a server does once the response is complete

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=20)
    return sent, gone.is_set()


def _app(engine, grammar, tmp_path):
    return create_app(engine, grammar, Settings(registry_dir=str(tmp_path / "reg")))


def test_stream_disconnect_aborts_engine_request(fake_engine, gateway_grammar, tmp_path):
    fake_engine.reply = lambda req: "x" * 300  # 100 events
    fake_engine.delay = 0.01
    app = _app(fake_engine, gateway_grammar, tmp_path)
    body = {"model": MODEL, "messages": USER, "stream": True}
    sent, gone = asyncio.run(_drive(app, body, disconnect_after_chunks=3))
    assert gone
    rid = fake_engine.submitted[0].rid
    assert fake_engine.aborted.count(rid) >= 1
    services = app.state.services
    assert services.limiter.in_flight == 0
    assert services.metrics.requests_counted("chat", "cancelled") == 1


def test_nonstream_disconnect_aborts_engine_request(fake_engine, gateway_grammar, tmp_path):
    fake_engine.reply = lambda req: "x" * 300
    fake_engine.delay = 0.01
    app = _app(fake_engine, gateway_grammar, tmp_path)
    body = {"model": MODEL, "messages": USER, "n": 2}
    asyncio.run(_drive(app, body, disconnect_after_chunks=None))
    rids = [r.rid for r in fake_engine.submitted]
    assert len(rids) == 2 and all(r in fake_engine.aborted for r in rids)
    services = app.state.services
    assert services.limiter.in_flight == 0
    assert services.metrics.requests_counted("chat", "cancelled") == 1


def test_finished_stream_does_not_abort(fake_engine, gateway_grammar, tmp_path):
    app = _app(fake_engine, gateway_grammar, tmp_path)
    sent, _ = asyncio.run(
        _drive(app, {"model": MODEL, "messages": USER, "stream": True}, disconnect_after_chunks=10**6)
    )
    assert b"[DONE]" in b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert fake_engine.aborted == []


def test_immediate_disconnect_releases_everything(fake_engine, gateway_grammar, tmp_path):
    fake_engine.reply = lambda req: "x" * 300
    fake_engine.delay = 0.01
    app = _app(fake_engine, gateway_grammar, tmp_path)
    asyncio.run(_drive(app, {"model": MODEL, "messages": USER, "stream": True, "n": 2}, disconnect_after_chunks=0))
    services = app.state.services
    assert all(r.rid in fake_engine.aborted for r in fake_engine.submitted)
    assert services.limiter.in_flight == 0
    assert services.metrics.requests_counted("chat", "cancelled") == 1
