"""The issue's schema through a real `jumpgate serve` (SmolLM2-135M on CPU): a string with `pattern`
and `maxLength` (xgrammar drops the length) is compiled by llguidance, so strict mode answers it,
and every value the model writes respects both keywords even when asked for a long word."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from bench.server_process import MODEL, JumpgateServer

pytestmark = pytest.mark.e2e

WORD = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
        "required": ["word"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give me one very long English word, like 'extraordinary', as JSON."}]


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    server = JumpgateServer(tmp_path_factory.mktemp("jumpgate-llguidance"), kv_pool_tokens=8192)
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=180) as client:
            yield client
    finally:
        server.stop()


def test_strict_pattern_with_max_length_answers_within_the_length(http):
    rf = {"type": "json_schema", "json_schema": {"name": "word", "schema": WORD, "strict": True}}
    resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 24,
                                                   "response_format": rf, "n": 3, "temperature": 1.0, "seed": 7})
    assert resp.status_code == 200, resp.text
    for choice in resp.json()["choices"]:
        word = json.loads(choice["message"]["content"])["word"]
        assert re.fullmatch(r"[a-z]{1,5}", word), word
        assert choice["jumpgate"] == {**choice["jumpgate"], "schema_mode": "strict", "schema_valid": True}


def test_schema_check_says_llguidance_enforces_the_length(http):
    check = http.post("/v1/schemas/check", json={"schema": WORD}).json()
    assert check["strict_accepted"] is True
    assert check["fidelity"]["engine"] == "llguidance"
    length = [k for k in check["fidelity"]["keywords"] if k["pointer"] == "/properties/word/maxLength"]
    assert [(k["status"], k["engine"]) for k in length] == [("enforced", "llguidance")]
