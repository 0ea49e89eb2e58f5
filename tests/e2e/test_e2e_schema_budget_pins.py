"""End to end, one real `jumpgate serve` (SmolLM2-135M on CPU): OpenAI's limit of 128 tools is
answered (the tools text is compacted to the prompt budget, the grammar enforces every tool), and a
pinned schema prefix is resident again right after a restart."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import jsonschema
import pytest

from bench.harness.server_process import MODEL, JumpgateServer

pytestmark = pytest.mark.e2e

PIN_BUDGET = 4096
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}


def many_tools(count: int = 128, params: int = 20) -> list[dict[str, Any]]:
    """128 tools of 20 string parameters each (short strings, so a call stays cheap on a CPU)."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{t}",
                "description": f"Tool number {t}: does one thing well for the user's request.",
                "parameters": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": [f"param_{p}" for p in range(params)],
                    "properties": {
                        f"param_{p}": {"type": "string", "maxLength": 6, "description": f"Parameter {p} of tool {t}"}
                        for p in range(params)
                    },
                },
            },
        }
        for t in range(count)
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-budget-pins"),
        kv_pool_tokens=16384,
        extra_args=["--pin-budget-tokens", str(PIN_BUDGET)],
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def test_128_tools_with_20_string_parameters_get_a_valid_tool_call(http):
    tools = many_tools()
    resp = http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "temperature": 0,
            "max_tokens": 400,
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "tool_42"}},
            "messages": [{"role": "user", "content": "Use tool 42 with short values."}],
        },
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] <= 4096 + 200  # the tools text took at most half the context
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "tool_42"
    jsonschema.validate(json.loads(call["function"]["arguments"]), tools[42]["function"]["parameters"])


def explain(http, system: str, schema_id: str) -> dict[str, Any]:
    resp = http.post(
        "/v1/cache/explain",
        json={
            "model": MODEL,
            "schema_id": schema_id,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Name a city."}],
        },
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_pinned_schema_prefix_is_cached_right_after_a_restart(server, http):
    system = f"[{uuid.uuid4().hex}] You name one city, as JSON."
    pinned = http.post("/v1/schemas", json={"schema": CITY_SCHEMA, "pin": True, "system_prompt": system})
    assert pinned.status_code in (200, 201), pinned.text
    schema_id, pinned_tokens = pinned.json()["id"], pinned.json()["pinned_tokens"]
    assert pinned_tokens > 20
    other_system = f"[{uuid.uuid4().hex}] Not pinned."
    unpinned = http.post("/v1/schemas", json={"schema": {"type": "object", "properties": {"n": {"type": "integer"}}}})
    assert unpinned.status_code in (200, 201), unpinned.text

    old_pid = server.pid
    server.restart()  # same registry folder; a fresh engine with an empty KV cache
    assert server.pid != old_pid

    info = explain(http, system, schema_id)
    assert info["cached_tokens"] >= pinned_tokens  # the whole pinned prefix: system prompt + schema text
    # the control: a schema uploaded without a pin starts cold after the restart
    assert explain(http, other_system, unpinned.json()["id"])["cached_tokens"] < 16
