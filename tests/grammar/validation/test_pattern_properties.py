"""`patternProperties` in strict mode (grammar/validation/fidelity.py routes it to llguidance): names are
matched against the patterns and their values against the matching schema, a name matching a
pattern is never written twice (the value check follows such objects even when
`additionalProperties: false` closes everything else), patterns a name could match two of stay
refused, and the real model's answer through a real server validates."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch

from bench.harness.server_process import MODEL
from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.validation.fidelity import DUPLICATE_KEYS, ENFORCED, LLGUIDANCE, VALUE_CHECK, routed_schema_fidelity
from tests.grammar.validation.test_llguidance_fidelity import writes


def masked_writes(handle, tokenizer, text: str) -> bool:
    """Whether the mask (the grammar's, then the value check's) allows each token of `text` and
    then the stop token (`writes` feeds tokens without asking the mask)."""
    matcher = handle.new_matcher()
    mask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
    for token_id in tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]:
        mask.fill_(-1)
        matcher.fill_bitmask(mask, 0)
        if not (int(mask[0, token_id // 32]) >> (token_id % 32)) & 1 or not matcher.accept(token_id):
            return False
    return matcher.is_terminated()


ENV = {
    "type": "object",
    "patternProperties": {"^[A-Z_][A-Z0-9_]*$": {"type": "string", "maxLength": 12}},
    "additionalProperties": False,
    "minProperties": 2,
}
# a declared name that also matches a pattern must satisfy both schemas
HEADERS = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "x-id": {"type": "integer", "minimum": 5}},
    "patternProperties": {"^x-": {"type": "integer", "maximum": 10}},
    "required": ["name"],
}


def test_strict_routes_disjoint_patterns_to_llguidance_with_names_checked():
    for schema in (ENV, HEADERS):
        report = routed_schema_fidelity(schema, strict=True)
        assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
        verdicts = {(k.pointer, k.keyword): (k.status, k.engine) for k in report.keywords}
        assert verdicts[("/patternProperties", "patternProperties")] == (ENFORCED, LLGUIDANCE)
        # names matching a pattern could repeat: the value check keeps them unique
        assert verdicts[("", DUPLICATE_KEYS)] == (ENFORCED, VALUE_CHECK)
    assert ("/patternProperties/^[A-Z_][A-Z0-9_]*$/maxLength", "maxLength") in {
        (k.pointer, k.keyword) for k in routed_schema_fidelity(ENV, strict=True).keywords
    }  # pattern schemas walked


def test_the_grammar_matches_names_and_values_and_never_repeats_a_name(service, tokenizer):
    env = service.compile(GrammarSpec("json_schema", ENV, True))
    assert isinstance(env, LLGuidanceHandle)
    assert writes(env, tokenizer, '{"HOME":"/root","PATH":"/bin"}')
    assert not writes(env, tokenizer, '{"HOME":"/root","path":"/bin"}')  # no pattern matches: closed
    assert not writes(env, tokenizer, '{"HOME":"/root","PATH":1}')  # the pattern's type
    assert not writes(env, tokenizer, '{"HOME":"/root","PATH":"/usr/local/bin"}')  # the pattern's maxLength
    assert not writes(env, tokenizer, '{"HOME":"/root"}')  # minProperties
    assert masked_writes(env, tokenizer, '{"HOME":"/root","PATH":"/bin"}')
    assert writes(env, tokenizer, '{"HOME":"/root","HOME":"/tmp"}')  # the grammar alone would repeat a name
    assert not masked_writes(env, tokenizer, '{"HOME":"/root","HOME":"/tmp"}')  # the value check does not
    assert masked_writes(env.without_value_check(), tokenizer, '{"HOME":"/root","HOME":"/tmp"}')
    headers = service.compile(GrammarSpec("json_schema", HEADERS, True))
    assert isinstance(headers, LLGuidanceHandle)
    assert writes(headers, tokenizer, '{"name":"a","x-id":7,"x-b":1}')
    assert not writes(headers, tokenizer, '{"name":"a","x-id":20}')  # the pattern's maximum
    assert not writes(headers, tokenizer, '{"name":"a","x-id":3}')  # the property's minimum
    assert not writes(headers, tokenizer, '{"name":"a","x-b":"s"}')  # the pattern's type


def test_overlapping_patterns_stay_refused():
    schema = {"type": "object", "patternProperties": {"^I_": {"type": "integer"}, "_X$": {"type": "integer"}}}
    report = routed_schema_fidelity(schema, strict=True)
    assert [(k.pointer, k.keyword) for k in report.refused_in_strict] == [("/patternProperties", "patternProperties")]


@pytest.mark.e2e
def test_the_real_model_answers_a_pattern_properties_map_validly(jumpgate_server):
    rf = {"type": "json_schema", "json_schema": {"name": "env", "schema": ENV, "strict": True}}
    with httpx.Client(base_url=jumpgate_server.url, timeout=180) as http:
        check = http.post("/v1/schemas/check", json={"schema": ENV}).json()
        assert check["strict_accepted"] is True and check["fidelity"]["engine"] == "llguidance"
        resp = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": 96,
                "temperature": 0,
                "response_format": rf,
                "messages": [{"role": "user", "content": "Environment variables for a web server, as JSON."}],
            },
        )
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    text = choice["message"]["content"]
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    assert len({k for k, _ in pairs}) == len(pairs) >= 2, text  # no name twice
    jsonschema.validate(json.loads(text), ENV)
    assert choice["jumpgate"]["schema_valid"] is True and choice["finish_reason"] in ("stop", "length")
