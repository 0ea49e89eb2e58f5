"""What the end-to-end server tests share (test_e2e_bad_input.py too): the corpus and examples folders,
tools and a weather question, a chat body, and the OpenAI error shape every refusal must have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from bench.harness.server_process import MODEL

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
WEATHER_Q = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]


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
