"""Logprobs end to end: a real `jumpgate serve` (SmolLM2-135M on CPU) driven by the official openai
client: chat with a JSON schema, streamed chat, and legacy text completions."""

from __future__ import annotations

import json
import math

import openai
import pytest

from bench.harness.server_process import MODEL, JumpgateServer
from tests.conftest import openai_client

pytestmark = pytest.mark.e2e

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "Which city is the Eiffel tower in? Reply in JSON."}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    srv = JumpgateServer(tmp_path_factory.mktemp("jumpgate-logprobs"), kv_pool_tokens=8192)
    srv.start()
    try:
        yield openai_client(srv)
    finally:
        srv.stop()


def check_entry(entry, top_count: int) -> None:
    assert entry.logprob <= 0.0
    assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or "\ufffd" in entry.token
    values = [t.logprob for t in entry.top_logprobs]
    assert len(values) <= top_count and values == sorted(values, reverse=True)
    if values:  # greedy: the chosen token is the most likely allowed one
        assert math.isclose(values[0], entry.logprob, abs_tol=1e-5)


def test_chat_logprobs_with_a_json_schema(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        response_format=RESPONSE_FORMAT,
        logprobs=True,
        top_logprobs=3,
    )
    choice = resp.choices[0]
    json.loads(choice.message.content)
    content = choice.logprobs.content
    assert "".join(e.token for e in content) == choice.message.content
    for entry in content:
        check_entry(entry, 3)
    # masked-out tokens never appear: the first token can only open the object
    assert content[0].top_logprobs and all(t.token.startswith("{") for t in content[0].top_logprobs)
    assert sum(math.exp(t.logprob) for t in content[0].top_logprobs) <= 1.0 + 1e-4


def test_streamed_chat_chunks_carry_the_same_logprobs(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2
    )
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2, stream=True
    )
    streamed, text = [], ""
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert text == whole.choices[0].message.content
    expected = whole.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in expected]
    for got, want in zip(streamed, expected):
        assert math.isclose(got.logprob, want.logprob, abs_tol=1e-3)


def test_completion_legacy_logprobs(client):
    resp = client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6, logprobs=2
    )
    choice = resp.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.text_offset) == len(lp.top_logprobs)
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0.0 and len(top) <= 2
        assert math.isclose(max(top.values()), value, abs_tol=1e-5)  # greedy


def test_bad_top_logprobs_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, logprobs=True, top_logprobs=21)
    assert err.value.body["param"] == "top_logprobs"
