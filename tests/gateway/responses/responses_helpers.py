"""What the /v1/responses tests share (test_responses_logprobs.py too): the model name, a weather
tool, and creating a response and reading its stream's events."""

from __future__ import annotations

import json

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def create(client, **body):
    body.setdefault("model", MODEL)
    body.setdefault("input", "hi")
    return client.post("/v1/responses", json=body)


def events_of(resp) -> list[tuple[str, dict]]:
    assert resp.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in resp.text.split("\n\n"):
        if block.strip():
            head, _, data = block.partition("\ndata: ")
            assert head.startswith("event: "), block
            body = json.loads(data)
            assert body["type"] == head[len("event: ") :]
            out.append((body["type"], body))
    return out
