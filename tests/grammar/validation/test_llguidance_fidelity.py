"""llguidance's claims, checked on its real matcher: for every keyword the fidelity report hands
over to llguidance (xgrammar would only approximate it), the compiled grammar accepts a valid value
and refuses a violating one; the report, the cache key and the routing say which engine compiled."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar, llguidance_refusal
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
from grammar.validation.fidelity import ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity, schema_fidelity
from runtime.model.loader import read_config
from tests.grammar.validation.fidelity_cases import NOT_MASKED_CASES

# The cases of the classifier's table that llguidance takes over (explicit, so it cannot grow or
# shrink unnoticed); every other case stays with xgrammar and strict mode still refuses it.
EXPECTED_LLGUIDANCE = {
    "pattern_with_maxLength",
    "pattern_with_minLength",
    "multipleOf_number",
    "multipleOf_one_sided_range",
    "multipleOf_fractional_divisor",
    # (type_beside_anyOf and minimum_beside_allOf now hold an if/then/else or a not, which llguidance does
    # not enforce either: their plain forms are merged for xgrammar, grammar/rewrites/all_of.py)
    "allOf_two_branches",
    "minimum_beside_ref",
    "required_undeclared",
    "minLength_without_type",
    "minimum_without_type",
    "patternProperties",
}
TAKEN = [c for c in NOT_MASKED_CASES if c[0] in EXPECTED_LLGUIDANCE]
DATA = Path(__file__).parents[2] / "data"


def writes(handle, tokenizer, text: str) -> bool:
    """Whether the grammar lets the model write exactly `text` and then stop."""
    matcher = handle.new_matcher()
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.accept(token_id):
            return False
    return matcher.accept(tokenizer.eos_token_id) and matcher.is_terminated()


def test_the_cases_llguidance_takes_over_are_the_expected_ones():
    taken = {c[0] for c in NOT_MASKED_CASES if routed_schema_fidelity(c[1], strict=c[2]).engine == LLGUIDANCE}
    assert taken == EXPECTED_LLGUIDANCE


@pytest.mark.parametrize("name,schema,strict,valid,violating,expected", TAKEN, ids=[c[0] for c in TAKEN])
def test_llguidance_refuses_what_xgrammar_would_let_through(
    service, tokenizer, name, schema, strict, valid, violating, expected
):
    pointer, keyword, _ = expected
    handle = service.compile(GrammarSpec("json_schema", schema, strict))
    assert isinstance(handle, LLGuidanceHandle)
    verdict = {(k.pointer, k.keyword): k for k in handle.fidelity.keywords}[(pointer, keyword)]
    assert (verdict.status, verdict.engine) == (ENFORCED, LLGUIDANCE)
    assert "enforced by llguidance" in verdict.reason
    assert handle.fidelity.refused_in_strict == ()
    assert writes(handle, tokenizer, valid)
    assert not writes(handle, tokenizer, violating)


def test_the_issue_schema_refuses_a_sixth_letter(service, tokenizer):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
        "required": ["name"],
    }
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert writes(handle, tokenizer, '{"name":"abcde"}')
    assert not writes(handle, tokenizer, '{"name":"abcdef"}')
    assert not writes(handle, tokenizer, '{"name":""}')  # the pattern's + still holds
    assert not writes(handle, tokenizer, '{"name":"abc","x":1}')  # strict closes the object


def test_the_cache_key_names_the_engine(service):
    routed = GrammarSpec("json_schema", {"type": "number", "multipleOf": 0.5}, True)
    plain = GrammarSpec("json_schema", {"type": "number"}, True)
    assert service.key(routed) != routed.key(service.fingerprint)  # llguidance's key has the engine
    assert service.key(plain) == plain.key(service.fingerprint)  # xgrammar's keys are unchanged
    first = service.compile(routed)
    assert service.compile(routed) is first  # a memory hit under the engine's key
    assert service.get_cached(routed) is first
    assert not isinstance(service.compile(plain), LLGuidanceHandle)


def test_keywords_neither_engine_nor_the_value_check_enforce_stay_with_xgrammar_and_refused():
    # uniqueItems over pattern-bound items: llguidance does not implement it and the value check
    # does not claim it (a repeat could not grow into a new item), so nothing is routed
    schema = {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "uniqueItems": True}
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == XGRAMMAR
    assert {k.keyword for k in report.refused_in_strict} == {"uniqueItems", "maxLength"}


def test_keywords_the_value_check_enforces_do_not_keep_a_schema_from_llguidance():
    schema = {
        "type": "object",
        "required": ["code", "tags"],
        "properties": {
            "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "uniqueItems": {"type": "string", "enum": ["a name, not the keyword"]},
        },
    }
    assert llguidance_refusal(schema, strict=True) is None  # uniqueItems is the value check's job
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    assert '"uniqueItems"' in llguidance_grammar(schema, strict=True)  # the property keeps its name


def test_a_divisor_that_is_no_binary_fraction_stays_refused(tokenizer, smollm_dir):
    """llguidance's multipleOf mask is exact in decimal: with 0.01 it writes 19.99, which jsonschema
    (dividing in floats: 1998.9999999999998) refuses, so a strict answer would fail validation. Such
    a schema is not routed to llguidance, and strict mode refuses it; 0.25 is routed."""
    schema = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]}
    eos = tokenizer.eos_token_id
    grammar = llguidance_grammar(schema, strict=True)
    llg_tokenizer = LLGuidanceTokenizer(tokenizer, read_config(smollm_dir).vocab_size, [eos]).get()
    handle = LLGuidanceHandle(
        "k", "json_schema", grammar, compile_llguidance(llg_tokenizer, grammar, "t", None), frozenset({eos})
    )
    assert writes(handle, tokenizer, '{"price":19.99}')  # what routing it to llguidance would let through
    assert not jsonschema.Draft202012Validator(schema).is_valid({"price": 19.99})
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == XGRAMMAR
    assert [(k.pointer, k.keyword) for k in report.refused_in_strict] == [
        ("/properties/price/multipleOf", "multipleOf")
    ]
    assert "binary fraction" in report.refused_in_strict[0].reason
    quarter = {**schema, "properties": {"price": {"type": "number", "multipleOf": 0.25}}}
    assert routed_schema_fidelity(quarter, strict=True).engine == LLGUIDANCE


def test_lookaround_llguidance_cannot_intersect_is_refused_by_it_too():
    # llguidance's JSON patterns (Rust regex + derivre) have no look-around; grammar/rewrites/string_algebra.py
    # writes leading lookaheads of an anchored pattern as intersections (tests/test_lookahead.py),
    # nothing else
    assert "look-around" in llguidance_refusal({"type": "string", "pattern": "^[a-z](?=a)[a-z]+$"}, strict=True)


def test_schemas_xgrammar_masks_fully_stay_with_xgrammar():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]}
    assert routed_schema_fidelity(schema) == schema_fidelity(schema)
    assert "engine" not in routed_schema_fidelity(schema).as_dict()


def test_strict_closes_an_all_of_as_a_whole(service, tokenizer):
    # each branch declares some of the names; closing the branches one by one would refuse them all.
    # Mergeable allOfs now compile as one object in either engine (grammar/rewrites/all_of.py)
    schema = json.loads((DATA / "schema_corpus" / "allof_base_and_extension.json").read_text())
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert handle.fidelity.refused_in_strict == ()
    assert writes(handle, tokenizer, '{"id":1,"name":"a"}')
    assert not writes(handle, tokenizer, '{"id":1}')  # both branches' required hold
    assert not writes(handle, tokenizer, '{"id":1,"name":"a","x":2}')  # closed over the branches' names
    beside = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "allOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
    }
    handle = service.compile(GrammarSpec("json_schema", beside, True))
    assert writes(handle, tokenizer, '{"a":1,"b":2}')
    assert not writes(handle, tokenizer, '{"a":1}')
    assert not writes(handle, tokenizer, '{"a":1,"b":2,"c":3}')
