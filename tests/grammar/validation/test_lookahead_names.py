"""Lookahead in property-name patterns (issue #42, item 5).

A `patternProperties` name pattern that opens with lookaheads (`^(?!x_)[a-z_]+$`) was refused
("Lookahead is not supported yet") though the same pattern is kept for a string value. Now it is
served as a value's is where no mask can write it: the grammar writes names by the pattern without
its lookaheads (grammar/rewrites/string_algebra.py), and check-and-roll-back keeps the whole pattern (the
fidelity report says so). The real model through the real engine answers with names that all
match it.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.rewrites.string_algebra import without_lookaheads
from grammar.validation.fidelity import CHECKED, ENFORCED, ROLLBACK, XGRAMMAR, schema_fidelity, spec_fidelity
from grammar.validation.json_schema_check import validate_json_schema
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

NAME = "^(?!x_)[a-z_]+$"
LAYOUT = {
    "type": "object",
    "patternProperties": {NAME: {"type": "integer"}},
    "additionalProperties": False,
    "minProperties": 2,
}


def test_a_lookahead_name_pattern_is_accepted():
    validate_json_schema(LAYOUT)  # before: "Lookahead is not supported yet"
    with pytest.raises(Exception, match="not supported"):  # other lookaround stays refused
        validate_json_schema({"type": "object", "patternProperties": {"^[a-z]+(?<!x)$": {}}})


def test_the_report_says_check_and_rollback_keeps_it():
    report = spec_fidelity("json_schema", LAYOUT, True, 4)
    assert report.refused_in_strict == ()
    kept = {(k.pointer, k.keyword): k for k in report.keywords}
    entry = kept[("/patternProperties", "patternProperties")]
    assert (entry.status, entry.engine) == (ENFORCED, ROLLBACK)
    # without the check (--value-retries 0) it is checked after generation, and strict mode refuses it
    bare = schema_fidelity(LAYOUT, strict=True)
    entry = {(k.pointer, k.keyword): k for k in bare.keywords}[("/patternProperties", "patternProperties")]
    assert entry.status == CHECKED and entry.engine == XGRAMMAR and not entry.exact_in_llguidance
    assert "lookahead" in entry.reason
    assert [k.keyword for k in spec_fidelity("json_schema", LAYOUT, True, 0).refused_in_strict] == ["patternProperties"]


def test_the_grammar_writes_names_by_the_pattern_without_its_lookaheads():
    got = without_lookaheads(
        {
            "type": "object",
            "patternProperties": {NAME: {"type": "integer"}, "^[a-z_]+$": {"minimum": 0}, "^(?=a)\\w+": {}},
        }
    )
    # the same names as before, the one already there kept apart; a pattern not anchored at the end stays so
    assert got["patternProperties"] == {"^[a-z_]+$": {"minimum": 0}, "^(?:[a-z_]+)$": {"type": "integer"}, "^\\w+": {}}


def test_the_service_compiles_it_in_strict_mode(service):
    handle = service.compile(GrammarSpec("json_schema", LAYOUT, True))
    assert handle.fidelity.refused_in_strict == ()
    assert handle.new_matcher().withholds_output  # check-and-roll-back rides on its matcher


@pytest.mark.e2e
def test_the_real_model_answers_with_names_that_match_the_pattern(real_engine, service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", LAYOUT, True))
    ids = chat_ids(
        tokenizer,
        "Give the window layout as a JSON map from setting name to integer: width 640, "
        "height 480, x_offset 12, y_offset 8.",
        "You are a JSON API. Reply with one compact JSON value only.",
    )
    (result,) = real_engine.generate_many(
        [
            GenerateRequest(
                ids,
                SamplingParams(max_new_tokens=96, temperature=0.0),
                constraint=handle,
                strict=True,
                refuse_unfit=True,
            )
        ],
        timeout=600,
    )
    assert result.finish_reason == "stop", result
    value = json.loads(result.text)
    assert len(value) >= 2 and all(re.search(NAME, name) for name in value), result.text
    jsonschema.validate(value, LAYOUT)
