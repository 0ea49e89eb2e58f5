"""Logprobs at the HTTP layer over the scripted fake engine: request validation, the chat and
legacy completion shapes (whole and streamed), and what reaches the engine."""

from __future__ import annotations

import json

import pytest

from gateway.pipeline.logprobs import TokenTexts, chat_token_logprobs, completion_logprobs
from runtime.api import TokenLogprob
from tests.conftest import MODEL, chat
from tests.fake_engine import fake_logprobs
from tests.gateway.test_gateway_errors import assert_error

REPLY = "Hello there!"


def complete(client, **body):
    body.setdefault("model", MODEL)
    body.setdefault("prompt", "Say hello")
    return client.post("/v1/completions", json=body)


def sse_json(resp) -> list[dict]:
    blocks = [b[len("data: ") :] for b in resp.text.split("\n\n") if b.strip()]
    assert blocks[-1] == "[DONE]"
    return [json.loads(b) for b in blocks[:-1]]


def expected_records(tokenizer, top_count: int) -> list[TokenLogprob]:
    """What the fake engine sends for REPLY: records per 3-character piece."""
    pieces = [REPLY[i : i + 3] for i in range(0, len(REPLY), 3)]
    return [r for p in pieces for r in fake_logprobs(tokenizer.encode(p, add_special_tokens=False), top_count)]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
    ],
)
def test_bad_chat_logprobs_are_400(gateway_client, fake_engine, body, param):
    assert_error(chat(gateway_client(), **body), 400, param)
    assert fake_engine.submitted == []


@pytest.mark.parametrize(
    "body, param",
    [
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 1, "echo": True}, "echo"),
    ],
)
def test_bad_completion_logprobs_are_400(gateway_client, fake_engine, body, param):
    assert_error(complete(gateway_client(), **body), 400, param)
    assert fake_engine.submitted == []


@pytest.mark.parametrize(
    "body, count",
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
    ],
)
def test_chat_asks_the_engine_for_what_the_request_asked(gateway_client, fake_engine, body, count):
    resp = chat(gateway_client(), **body)
    assert resp.status_code == 200, resp.text
    assert fake_engine.submitted[0].sampling.logprobs == count
    if count is None:
        assert resp.json()["choices"][0]["logprobs"] is None


def test_chat_logprobs_shape(gateway_client, fake_engine, tokenizer):
    resp = chat(gateway_client(), logprobs=True, top_logprobs=2)
    assert resp.status_code == 200, resp.text
    content = resp.json()["choices"][0]["logprobs"]["content"]
    records = expected_records(tokenizer, 2)
    assert len(content) == len(records)
    assert "".join(e["token"] for e in content) == REPLY
    for entry, rec in zip(content, records):
        assert entry["logprob"] == rec.logprob
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert [t["logprob"] for t in entry["top_logprobs"]] == [v for _, v in rec.top]
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry.get("forced", False) is rec.forced  # the extension flag only where forced


def test_chat_stream_chunks_carry_their_logprobs(gateway_client, tokenizer):
    chunks = sse_json(chat(gateway_client(), logprobs=True, stream=True))
    carried = [c["choices"][0] for c in chunks if c["choices"][0]["logprobs"] is not None]
    assert carried and all(
        ch["delta"]["content"] == "".join(e["token"] for e in ch["logprobs"]["content"]) for ch in carried
    )
    assert sum(len(ch["logprobs"]["content"]) for ch in carried) == len(expected_records(tokenizer, 0))
    assert all(e["top_logprobs"] == [] for ch in carried for e in ch["logprobs"]["content"])


def test_completion_legacy_shape(gateway_client, tokenizer):
    resp = complete(gateway_client(), logprobs=3, max_tokens=10)
    assert resp.status_code == 200, resp.text
    lp = resp.json()["choices"][0]["logprobs"]
    records = expected_records(tokenizer, 3)
    assert "".join(lp["tokens"]) == REPLY
    assert lp["token_logprobs"] == [r.logprob for r in records]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert all(
        len(d) <= 3 and d[tok] == value for d, tok, value in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"])
    )


def test_completion_logprobs_zero_has_no_alternatives(gateway_client):
    lp = complete(gateway_client(), logprobs=0).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] is None and "".join(lp["tokens"]) == REPLY


def test_completion_stream_offsets_continue_across_chunks(gateway_client):
    chunks = sse_json(complete(gateway_client(), logprobs=1, stream=True))
    logprobs = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    tokens = [t for lp in logprobs for t in lp["tokens"]]
    offsets = [o for lp in logprobs for o in lp["text_offset"]]
    assert "".join(tokens) == REPLY
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]


def test_partial_utf8_token_reports_its_raw_bytes(tokenizer):
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("日本", add_special_tokens=False)
    partial = [t for t in ids if "\ufffd" in tokenizer.decode([t])]
    assert partial, "the test needs a token holding part of a character"
    entries = chat_token_logprobs([TokenLogprob(t, -1.0) for t in ids], texts)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == "日本"
    legacy = completion_logprobs([TokenLogprob(t, -1.0) for t in ids], texts)
    assert legacy.top_logprobs is None and legacy.token_logprobs == [-1.0] * len(ids)


def test_tool_call_stream_keeps_every_tokens_logprob(gateway_client, fake_engine, tokenizer):
    """The tool-call parser holds text back; the records still go out, on empty deltas if need be."""
    call = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    fake_engine.reply = lambda req: call
    chunks = sse_json(chat(gateway_client(), tools=[tool], stream=True, logprobs=True))
    entries = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert "".join(e["token"] for e in entries) == call
    whole = chat(gateway_client(), tools=[tool], logprobs=True).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    assert "".join(e["token"] for e in whole["logprobs"]["content"]) == call
