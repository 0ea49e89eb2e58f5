"""Pathological grammars (real tokenizer, real xgrammar): deep nesting, huge enums, recursive and
circular $ref chains, catastrophic regex shapes, specs of about 1 MB. Each one either compiles
within the time limit or is refused with a clear GrammarSpecError / GrammarCompileTimeout."""

from __future__ import annotations

import time

import pytest

from grammar import GrammarCompileTimeout, GrammarService, GrammarSpec, GrammarSpecError
from grammar.schema.limits import MAX_JSON_DEPTH, MAX_SPEC_BYTES
from tests.gateway.grammar_reliability_helpers import accepts

COMPILE_LIMIT_S = 20.0  # the service's limit for the parametrized cases
SLACK_S = 5.0  # scheduling noise on a shared CPU


@pytest.fixture(scope="module")
def service(tokenizer, vocab_size):
    svc = GrammarService(tokenizer, vocab_size, compile_timeout_s=COMPILE_LIMIT_S)
    yield svc
    svc.close()


def nested_objects(levels: int) -> dict:
    schema: dict = {"type": "string", "maxLength": 3}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"k": schema}, "required": ["k"], "additionalProperties": False}
    return schema


def required_integers(n: int) -> dict:
    """Many required properties: a real schema whose compile takes seconds (super-linear in n)."""
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        "required": [f"p{i}" for i in range(n)],
        "additionalProperties": False,
    }


# Each case: a spec, and what the outcome must be: ("ok", texts it must accept, texts it must reject)
# or ("refused", a fragment of the message).
CASES = {
    "nested-within-limit": (
        GrammarSpec.json_schema(nested_objects(MAX_JSON_DEPTH // 2 - 2)),
        ("ok", ['{"k":' * (MAX_JSON_DEPTH // 2 - 2) + '"abc"' + "}" * (MAX_JSON_DEPTH // 2 - 2)], ['{"k":1}']),
    ),
    "nested-past-limit": (GrammarSpec.json_schema(nested_objects(MAX_JSON_DEPTH)), ("refused", "nested deeper")),
    "enum-20k-strings": (
        GrammarSpec.json_schema(
            {
                "type": "object",
                "properties": {"v": {"enum": [f"value_{i}" for i in range(20000)]}},
                "required": ["v"],
                "additionalProperties": False,
            }
        ),
        ("ok", ['{"v":"value_0"}', '{"v":"value_19999"}'], ['{"v":"value_20000"}', '{"v":"other"}']),
    ),
    "enum-20k-integers": (GrammarSpec.json_schema({"enum": list(range(20000))}), ("ok", ["0", "19999"], ["20000"])),
    "ref-cycle": (
        GrammarSpec.json_schema(
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/a"}},
            }
        ),
        ("refused", "Circular $ref"),
    ),
    "ref-self": (
        GrammarSpec.json_schema(
            {"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}
        ),
        ("refused", "Circular $ref"),
    ),
    "ref-root-to-root": (GrammarSpec.json_schema({"$ref": "#"}), ("refused", "Circular $ref")),
    "ref-to-nowhere": (
        GrammarSpec.json_schema({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}),
        ("refused", "does not resolve"),
    ),
    "recursive-tree": (
        GrammarSpec.json_schema(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 5},
                    "children": {"type": "array", "items": {"$ref": "#"}},
                },
                "required": ["name", "children"],
                "additionalProperties": False,
            }
        ),
        (
            "ok",
            ['{"name":"a","children":[{"name":"b","children":[{"name":"c","children":[]}]}]}'],
            ['{"name":"a","children":[{"name":"b"}]}'],
        ),
    ),
    "ref-chain-500": (
        GrammarSpec.json_schema(
            {
                "$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(500)}, "d500": {"type": "integer"}},
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/d0"}},
                "required": ["x"],
                "additionalProperties": False,
            }
        ),
        ("ok", ['{"x":42}'], ['{"x":"42"}']),
    ),
    "regex-nested-plus": (GrammarSpec.regex("(a+)+$"), ("ok", ["a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"], ["aab"])),
    "regex-alternation-star": (GrammarSpec.regex("(a|a)*b"), ("ok", ["b", "aaaaaab"], ["aaaa"])),
    "regex-star-star": (GrammarSpec.regex("(a*)*b"), ("ok", ["aaab"], ["aaac"])),
    "regex-overlapping-plus": (GrammarSpec.regex("(x+x+)+y"), ("ok", ["xxy", "xxxxxxxxy"], ["xy"])),
    "regex-nested-counts": (GrammarSpec.regex("((a{1,30}){1,30}){1,30}"), ("ok", ["a" * 50], ["b"])),
    "regex-long-counts": (GrammarSpec.regex("[a-z]{1,500}[0-9]{1,500}"), ("ok", ["abc123"], ["123abc"])),
    "schema-with-catastrophic-pattern": (
        GrammarSpec.json_schema(
            {
                "type": "object",
                "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
                "required": ["s"],
                "additionalProperties": False,
            }
        ),
        ("ok", ['{"s":"aaaa"}'], ['{"s":"aab"}']),
    ),
    "schema-near-1mb": (
        GrammarSpec.json_schema(
            {
                "type": "object",
                "description": "d" * (MAX_SPEC_BYTES - 2000),
                "properties": {"a": {"type": "boolean"}},
                "required": ["a"],
                "additionalProperties": False,
            }
        ),
        ("ok", ['{"a":true}'], ['{"a":1}']),
    ),
    "schema-over-1mb": (
        GrammarSpec.json_schema(
            {
                "type": "object",
                "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(10000)},
            }
        ),
        ("refused", f"over the {MAX_SPEC_BYTES}-byte limit"),
    ),
    "regex-over-1mb": (GrammarSpec.regex("a" * (MAX_SPEC_BYTES + 1)), ("refused", "byte limit")),
    "ebnf-left-recursion": (GrammarSpec.ebnf('root ::= root "a" | "b"'), ("either", None)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pathological_spec_compiles_in_time_or_is_refused_clearly(name, service, tokenizer):
    spec, expected = CASES[name]
    started = time.monotonic()
    try:
        handle = service.compile(spec)
        error = None
    except GrammarSpecError as e:  # GrammarCompileTimeout is one too
        handle, error = None, e
    elapsed = time.monotonic() - started
    assert elapsed < COMPILE_LIMIT_S + SLACK_S, f"{name} took {elapsed:.1f} s"

    if error is not None:
        # a refusal always says what is wrong, and for which request parameter
        assert error.message and error.param == spec.param, error
        if isinstance(error, GrammarCompileTimeout):
            assert "took longer than" in error.message
            return  # too slow on this machine: refused as too complex, which is allowed
    kind = expected[0]
    if kind == "refused":
        assert error is not None, f"{name} should be refused"
        assert expected[1] in str(error), str(error)
    elif kind == "ok":
        assert error is None, f"{name} was refused: {error}"
        _, good, bad = expected
        for text in good:
            assert accepts(handle, tokenizer, text), (name, text)
        for text in bad:
            assert not accepts(handle, tokenizer, text), (name, text)


@pytest.mark.parametrize(
    "schema,template",
    [
        (
            {
                "type": "object",
                "properties": {"s": {"type": "string", "maxLength": 4}},
                "required": ["s"],
                "additionalProperties": False,
            },
            '{{"s":"{}"}}',
        ),
        (
            {
                "type": "object",
                "properties": {"s": {"type": "string", "minLength": 1}},
                "required": ["s"],
                "additionalProperties": False,
            },
            '{{"s":"{}"}}',
        ),
        (
            {"type": "object", "propertyNames": {"maxLength": 4}, "additionalProperties": {"type": "integer"}},
            '{{"{}":1}}',
        ),
    ],
)
def test_length_bounded_strings_refuse_raw_control_characters(schema, template, service, tokenizer):
    """xgrammar writes a length-bounded string's characters as [^"\\\r\n], which let a raw TAB or
    \x01 into the output (not JSON); the compiled grammar must only allow what JSON allows."""
    handle = service.compile(GrammarSpec.json_schema(schema))
    assert accepts(handle, tokenizer, template.format("ab"))
    for bad in ("a\tb", "a\x01", "\x1f"):
        assert not accepts(handle, tokenizer, template.format(bad)), repr(bad)


def test_a_refusal_is_fast_and_cached_specs_stay_fast(service):
    """Limits are checked before any work, so hostile sizes cost almost nothing; a repeat of a
    compiled pathological spec is a memory hit."""
    started = time.monotonic()
    with pytest.raises(GrammarSpecError):
        service.compile(CASES["schema-over-1mb"][0])
    with pytest.raises(GrammarSpecError):
        service.compile(CASES["nested-past-limit"][0])
    assert time.monotonic() - started < 2.0
    service.compile(CASES["enum-20k-strings"][0])
    started = time.monotonic()
    service.compile(CASES["enum-20k-strings"][0])
    assert time.monotonic() - started < 0.5
