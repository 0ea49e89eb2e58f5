"""A rewrite held to its keyword's values, with the real SmolLM2 (greedy, strict): an `enum` only a
root `if`/`else` applies (SchemaStore dependabot's `package-ecosystem`: the grammar writes a free
string there) was rewritten as one free string after another until the rewrites ran out
(`value_retries_exhausted`); held to the enum's values (grammar/checks/value_family.py) the first
rewrite is one of them. The control, without the check, shows the model really writes a value
outside the enum on this prompt."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from grammar import GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

ECOSYSTEMS = ["bundler", "cargo", "gomod", "maven", "npm", "pip"]
UPDATES = {
    "type": "object",
    "required": ["package-ecosystem", "directory"],
    "additionalProperties": False,
    "properties": {
        "enable-beta-ecosystems": {"type": "boolean"},
        "package-ecosystem": {"type": "string", "minLength": 1},
        "directory": {"type": "string"},
        # a lookahead beside an anyOf: llguidance refuses the schema, so it stays with xgrammar and
        # check-and-roll-back keeps the conditional, as dependabot's does
        "target-branch": {"anyOf": [{"type": "string", "pattern": "^(?!refs/).+"}, {"type": "null"}]},
    },
    "if": {"properties": {"enable-beta-ecosystems": {"const": True}}, "required": ["enable-beta-ecosystems"]},
    "then": {},
    "else": {"properties": {"package-ecosystem": {"enum": ECOSYSTEMS}}},
}
SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
PROMPT = "Dependabot should keep the Python packages in requirements.txt of the repository root up to date."


def request(handle, tokenizer) -> GenerateRequest:
    return GenerateRequest(
        chat_ids(tokenizer, PROMPT, SYSTEM),
        SamplingParams(max_new_tokens=64, temperature=0.0),
        constraint=handle,
        strict=True,
        refuse_unfit=True,
    )


def test_a_listed_value_is_rewritten_into_the_list(engine_idle_check, service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(UPDATES))
    assert handle.rollback_rules is not None
    control = dataclasses.replace(handle, rollback_rules=None, _memo={})
    before = engine_idle_check.stats().value_rewrites
    unchecked, checked = engine_idle_check.generate_many(
        [request(control, tokenizer), request(handle, tokenizer)], timeout=600
    )
    assert json.loads(unchecked.text)["package-ecosystem"] not in ECOSYSTEMS  # the model's own choice
    assert checked.finish_reason == "stop", checked
    jsonschema.validate(json.loads(checked.text), UPDATES)
    assert json.loads(checked.text)["package-ecosystem"] in ECOSYSTEMS
    assert engine_idle_check.stats().value_rewrites - before == 1  # one rewrite, into the list
