"""Strict answers on a schema whose greedy plan used to find no end (grammar/checks/plan_names.py),
with the real SmolLM2 and the real runtime, then through the real server and the official client:
at a small max_tokens the answer ends `stop` and valid (closing follows the short plan), and a
max_tokens below the plan is refused at submission, naming the minimum. Before the name hint the
plan wrote the optional properties first and found no end, so there was no closing and no minimum:
the same request ended `length`, cut."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from bench.harness.server_process import MODEL
from grammar import GrammarSpec
from runtime.api import EngineError, GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids, openai_client
from tests.grammar.checks.plan_cases import FAR_REQUIRED

pytestmark = pytest.mark.e2e

PROMPT = "Describe the book Dune with every field you can fill."


def request(handle, tokenizer, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        chat_ids(tokenizer, PROMPT),
        SamplingParams(max_new_tokens=max_tokens, temperature=0.0),
        constraint=handle,
        strict=True,
        refuse_unfit=True,
    )


def test_a_small_budget_ends_whole_and_valid(engine_idle_check, service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(FAR_REQUIRED))
    need = handle.min_completion_tokens()
    assert need is not None
    results = engine_idle_check.generate_many(
        [request(handle, tokenizer, n) for n in (need, need + 8, 48)], timeout=600
    )
    for result in results:
        assert result.finish_reason == "stop", result
        jsonschema.validate(json.loads(result.text), FAR_REQUIRED)


def test_a_budget_below_the_plan_is_refused_at_submission(engine_idle_check, service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(FAR_REQUIRED))
    need = handle.min_completion_tokens()
    with pytest.raises(EngineError, match=f"at least {need}"):
        engine_idle_check.generate_many([request(handle, tokenizer, need - 1)], timeout=600)


def test_the_server_answers_whole_or_refuses_with_the_minimum(jumpgate_server):
    client = openai_client(jumpgate_server)
    body = {
        "model": MODEL,
        "temperature": 0,
        "messages": [{"role": "user", "content": PROMPT}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "b", "schema": FAR_REQUIRED, "strict": True},
        },
    }
    answer = client.chat.completions.create(**body, max_tokens=24)
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), FAR_REQUIRED)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body, max_tokens=2)
    assert "raise max_tokens to at least" in caught.value.message
