"""End to end: one real `jumpgate serve` subprocess (SmolLM2-135M on CPU) for the whole module,
driven by the official `openai` client and by raw httpx for what the client cannot send.

Every generation is greedy with a small `max_tokens`, so the module stays fast on a CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from bench.server_process import MODEL
from tests.conftest import openai_client

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "schema_corpus"
EXAMPLES = ROOT / "examples"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "pattern": "^[0-9+\\-*/(). ]{1,40}$"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "web_search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 60},
                    "num_results": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
]
TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER_Q = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "population_millions": {"type": "number"}},
    "required": ["city", "population_millions"],
    "additionalProperties": False,
}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(jumpgate_server):
    return jumpgate_server  # the session's one server (tests/conftest.py)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=180) as c:
        yield c


def chat_body(**fields) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": WEATHER_Q, "temperature": 0, "max_tokens": 8}
    body.update(fields)
    return body


def assert_openai_error(resp: httpx.Response, status: int, *, param: Any = ..., code: Any = ...) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if param is not ...:
        assert err["param"] == param, err
    if code is not ...:
        assert err["code"] == code, err
    return err


def check_tool_calls(message, *, allowed: set[str] | None = None) -> list[tuple[str, dict]]:
    """Every call has an id, a known name and JSON arguments valid for that tool's schema."""
    assert message.tool_calls, message
    out = []
    ids = set()
    for call in message.tool_calls:
        assert call.type == "function"
        assert call.id and call.id.startswith("call_") and call.id not in ids
        ids.add(call.id)
        name = call.function.name
        assert name in (allowed or TOOL_PARAMS), name
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, TOOL_PARAMS[name])
        out.append((name, args))
    return out


def sse_data(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- basics


def test_health_and_models(server, client, http):
    assert http.get("/health").json() == {"status": "ok", "model": MODEL}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_plain_chat(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        temperature=0,
        max_tokens=12,
    )
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    u = resp.usage
    assert u is not None and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None and 0 <= u.prompt_tokens_details.cached_tokens < u.prompt_tokens


def test_streamed_chat_matches_non_streamed(client):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=16)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_long_prompt_over_one_prefill_chunk(client):
    """A cold prompt longer than one prefill chunk (512 tokens) must be answered from its whole
    text (regression: a pass made only of mid-prompt chunks used to skip the forward, leaving those
    positions' KV unwritten and the answer garbage)."""
    rag = load_example("rag_cached")
    system = "Answer the passenger's question using only the handbook below. Be brief.\n\n" + rag.DOCUMENT
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": "How long does the Blue route crossing take?"},
    ]
    salt = {"cache_salt": uuid.uuid4().hex}  # a namespace of its own: the first request is cold
    cold = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, extra_body=salt)
    assert cold.usage.prompt_tokens > 512 and cold.usage.prompt_tokens_details.cached_tokens < 16
    # The answer quotes the handbook's Blue route line. transformers' fp32 greedy reference says
    # "The Blue route crossing takes 18 minutes."; the q4 default (auto on a CPU with native bf16)
    # says "The Blue route crossing is a 20-minute crossing", the route's frequency from the same
    # line: a quantization drift, not the unwritten-KV bug, whose answers do not quote the text.
    answer = cold.choices[0].message.content
    assert "Blue route" in answer and ("18 minutes" in answer or "20-minute" in answer), answer
    warm = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, extra_body=salt)
    assert warm.usage.prompt_tokens_details.cached_tokens > 512
    assert warm.choices[0].message.content == cold.choices[0].message.content


# --------------------------------------------------------------------------- tools


def test_tool_choice_none(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=12,
    )
    choice = resp.choices[0]
    assert choice.message.tool_calls is None
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


def test_tool_choice_auto(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are a function-calling assistant."}, *WEATHER_Q],
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=96,
    )
    choice = resp.choices[0]
    if choice.message.tool_calls:  # the model chose to call: calls must be complete and valid
        check_tool_calls(choice.message)
        assert choice.finish_reason == "tool_calls"
    else:  # the model chose to answer: plain text that never opens a call
        assert "<tool_call>" not in (choice.message.content or "")
        assert choice.finish_reason in ("stop", "length")


def test_tool_choice_required(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(check_tool_calls(choice.message)) == 1
    assert not choice.message.content


def test_tool_choice_named(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 times 7?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = check_tool_calls(choice.message, allowed={"calculator"})
    assert len(calls) == 1 and calls[0][0] == "calculator"


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls(client, parallel):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and in Rome, please."}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        temperature=0,
        max_tokens=96,
    )
    choice = resp.choices[0]
    calls = check_tool_calls(choice.message)
    if parallel:
        # one or more calls; if the model keeps adding calls until the budget, strict closing still
        # ends every call (finish_reason "length"), so each one parsed above
        assert len(calls) >= 1
        assert choice.finish_reason in ("tool_calls", "length")
    else:
        assert len(calls) == 1
        assert choice.finish_reason == "tool_calls"


def test_streamed_tool_call_deltas(client):
    kwargs = dict(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    whole = client.chat.completions.create(**kwargs)
    calls: dict[int, dict[str, Any]] = {}
    finish = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
        assert not delta.content  # required: no free text
        for d in delta.tool_calls or []:
            if d.index not in calls:  # the opening delta: id, type and name
                assert d.id and d.id.startswith("call_") and d.type == "function" and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:  # then argument pieces only
                assert d.id is None and (d.function.name is None)
                calls[d.index]["arguments"] += d.function.arguments or ""
    assert finish == ["tool_calls"]
    assert list(calls) == [0]
    call = calls[0]
    args = json.loads(call["arguments"])
    jsonschema.validate(args, TOOL_PARAMS[call["name"]])
    ref = whole.choices[0].message.tool_calls[0]
    assert (call["name"], call["arguments"]) == (ref.function.name, ref.function.arguments)


def test_tool_result_round_trip(client):
    """An assistant tool call and its role=tool result are accepted back into the conversation."""
    msgs = [
        {"role": "user", "content": "What's the weather in Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    resp = client.chat.completions.create(
        model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=12
    )
    assert isinstance(resp.choices[0].message.content, str)
    assert resp.choices[0].message.tool_calls is None


# --------------------------------------------------------------------------- structured output


class City(BaseModel):
    city: str
    country: str
    population_millions: float


def test_json_schema_parse_with_pydantic(client):
    resp = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Paris is the capital of France, about 2.1 million people."}],
        response_format=City,
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert json.loads(choice.message.content) == choice.message.parsed.model_dump()


def test_json_object(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a JSON object with a key 'color'."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=48,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


def test_regex_extension(client):
    pattern = r"\d{4}-\d{2}-\d{2}"
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "When did the Apollo 11 landing happen?"}],
        extra_body={"regex": pattern},
        temperature=0,
        max_tokens=16,
    )
    assert re.fullmatch(pattern, resp.choices[0].message.content)
    assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("schema_file", ["loop_prone_string_array.json", "loop_prone_nested_arrays.json"])
def test_loop_prone_schema_at_tight_budget_still_parses(http, schema_file):
    schema = json.loads((CORPUS / schema_file).read_text())
    body = chat_body(
        messages=[{"role": "user", "content": "List as many items as you possibly can, hundreds of them."}],
        response_format={"type": "json_schema", "json_schema": {"name": "loopy", "strict": True, "schema": schema}},
    )
    # the server says how few tokens the smallest valid output needs; give it a little more than that
    err = assert_openai_error(
        http.post("/v1/chat/completions", json={**body, "max_tokens": 1}), 400, param="max_tokens"
    )
    need = int(re.search(r"needs (\d+) tokens", err["message"]).group(1))
    resp = http.post("/v1/chat/completions", json={**body, "max_tokens": need + 12})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


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
    ):
        assert name in text, name
    for family in text_string_to_metric_families(text):  # Prometheus's own parser reads all of it
        assert family.type in ("counter", "gauge", "histogram"), family.name
    m = server.metrics()
    assert m['jumpgate_requests_total{outcome="success",route="chat"}'] >= 1
    assert m["jumpgate_generation_tokens_total"] >= 1
    assert m["jumpgate_kv_pool_slots"] == 16384


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
