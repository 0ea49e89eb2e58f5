"""`if`/`then`/`else` on a discriminator (grammar/conditionals.py): the lowered `anyOf` accepts
exactly the instances the original accepts, llguidance's matcher refuses what the branch forbids,
strict mode answers it, and the real model's answer through a real server validates."""

from __future__ import annotations

import itertools
import json

import httpx
import jsonschema
import pytest

from bench.server_process import MODEL
from grammar import GrammarSpec
from grammar.conditionals import discriminator, lower_conditionals
from grammar.fidelity import ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity
from grammar.llg_matcher import LLGuidanceHandle
from tests.test_llguidance_fidelity import writes

PAYMENT = {
    "type": "object",
    "properties": {"method": {"type": "string", "enum": ["card", "bank", "cash"]},
                   "card_number": {"type": "string", "pattern": "^[0-9]{4}$"}, "iban": {"type": "string"}},
    "required": ["method"],
    "if": {"properties": {"method": {"const": "card"}}},
    "then": {"required": ["card_number"]},
    "else": {"required": ["iban"]},
}


def instances():
    """Objects over the schema's names: every method (or none) with every subset of the others."""
    values = {"card_number": "1234", "iban": "DE00"}
    for method in ("card", "bank", "cash", None):
        for k in range(3):
            for names in itertools.combinations(values, k):
                obj = {n: values[n] for n in names}
                if method is not None:
                    obj["method"] = method
                yield obj


@pytest.mark.parametrize("optional,test_requires", [(False, False), (True, False), (True, True)])
def test_lowering_accepts_exactly_what_the_original_accepts(optional, test_requires):
    schema = json.loads(json.dumps(PAYMENT))
    if optional:
        schema["required"] = []
    if test_requires:
        schema["if"]["required"] = ["method"]
    lowered = lower_conditionals(schema)
    assert "if" not in lowered and "anyOf" in lowered
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(lowered)
    verdicts = [(obj, original.is_valid(obj), rewritten.is_valid(obj)) for obj in instances()]
    assert all(a == b for _, a, b in verdicts), [v for v in verdicts if v[1] != v[2]]
    assert any(a for _, a, _ in verdicts) and not all(a for _, a, _ in verdicts)


@pytest.mark.parametrize("node", [
    {"properties": {"x": {"type": "string"}}, "if": {"properties": {"x": {"const": "a"}}}, "then": {}},  # x unbounded
    {"properties": {"x": {"enum": [1, 2]}}, "if": {"properties": {"x": {"minimum": 2}}}, "then": {}},  # not a listing
    {"properties": {"x": {"enum": [1]}, "y": {"enum": [1]}},
     "if": {"properties": {"x": {"const": 1}, "y": {"const": 1}}}, "then": {}},  # two properties tested
    {"properties": {"x": {"enum": [1]}}, "anyOf": [{}], "if": {"properties": {"x": {"const": 1}}}},  # beside anyOf
])
def test_other_conditionals_are_left_alone(node):
    assert discriminator(node) is None
    assert lower_conditionals(node) == node


def test_fidelity_routes_a_discriminator_to_llguidance_and_strict_accepts_it():
    report = routed_schema_fidelity(PAYMENT, strict=True)
    assert report.engine == LLGUIDANCE
    assert report.refused_in_strict == ()
    verdicts = {(k.pointer, k.keyword): (k.status, k.engine) for k in report.keywords}
    for pointer in ("/if", "/then", "/else"):
        assert verdicts[(pointer, pointer[1:])] == (ENFORCED, LLGUIDANCE)
    # a branch's own keywords are classified under their pointers too
    assert (("/then/required", "required")) in verdicts


def test_an_unbounded_condition_is_still_refused_in_strict_mode():
    schema = {**PAYMENT, "properties": {**PAYMENT["properties"], "method": {"type": "string"}}}
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == XGRAMMAR
    assert {k.pointer for k in report.refused_in_strict} >= {"/if", "/then", "/else"}


def test_the_llguidance_grammar_refuses_what_the_branch_forbids(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", PAYMENT, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"method":"card","card_number":"1234"}')
    assert writes(handle, tokenizer, '{"method":"bank","iban":"DE00"}')
    assert not writes(handle, tokenizer, '{"method":"card","iban":"DE00"}')  # then: card_number missing
    assert not writes(handle, tokenizer, '{"method":"cash","card_number":"1234"}')  # else: iban missing


@pytest.mark.e2e
def test_the_real_model_answers_a_conditional_schema_validly(jumpgate_server):
    rf = {"type": "json_schema", "json_schema": {"name": "payment", "schema": PAYMENT, "strict": True}}
    asks = ["Pay by card, as JSON.", "Pay by bank transfer, as JSON.", "Pay in cash, as JSON."]
    with httpx.Client(base_url=jumpgate_server.url, timeout=180) as http:
        for ask in asks:
            resp = http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": ask}], "max_tokens": 64,
                "temperature": 0, "response_format": rf})
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), PAYMENT)
            assert choice["jumpgate"]["schema_valid"] is True
