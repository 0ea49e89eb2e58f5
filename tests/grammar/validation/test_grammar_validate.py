"""Refusals say what is wrong and where (JSON pointer + request parameter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grammar import GrammarSpec, GrammarSpecError, validate_json_schema, validate_regex, validate_spec

DATA = Path(__file__).parents[2] / "data"


def refusal(schema, **kw) -> GrammarSpecError:
    with pytest.raises(GrammarSpecError) as e:
        validate_json_schema(schema, **kw)
    assert e.value.message
    return e.value


def test_meta_schema_error_points_at_the_bad_keyword():
    e = refusal({"type": "object", "properties": {"age": {"type": "integer", "minimum": "zero"}}})
    assert e.pointer == "/properties/age/minimum"
    assert e.param == "response_format"
    assert "not a valid JSON schema" in e.message and "Draft202012" in e.message
    assert "response_format/properties/age/minimum" in str(e)


def test_draft_comes_from_dollar_schema():
    # draft-04 spells exclusiveMinimum as a boolean; 2020-12 as a number
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    validate_json_schema(draft4)
    e = refusal({k: v for k, v in draft4.items() if k != "$schema"})
    assert e.pointer == "/exclusiveMinimum"
    assert refusal({"$schema": "https://example.com/dialect", "type": "string"}).pointer == "/$schema"


@pytest.mark.parametrize(
    "ref",
    ["https://example.com/address.json", "address.json", "file:///etc/passwd", "other.json#/$defs/a", "urn:x:y"],
)
def test_refs_outside_the_document_are_refused(ref):
    e = refusal({"type": "object", "properties": {"address": {"$ref": ref}}})
    assert e.pointer == "/properties/address/$ref"
    assert "outside this schema" in e.message


def test_local_refs_must_resolve_and_anchors_are_refused():
    validate_json_schema({"$defs": {"a/b": {"type": "string"}}, "$ref": "#/$defs/a~1b"})
    validate_json_schema({"type": "object", "properties": {"next": {"$ref": "#"}}})
    assert refusal({"$defs": {}, "items": {"$ref": "#/$defs/nope"}, "type": "array"}).pointer == "/items/$ref"
    assert "anchors" in refusal({"$ref": "#thing"}).message
    assert refusal({"$dynamicRef": "#x"}).pointer == "/$dynamicRef"


def test_unsatisfiable_bounds_point_at_the_lower_bound():
    assert (
        refusal({"type": "object", "properties": {"age": {"type": "integer", "minimum": 9, "maximum": 3}}}).pointer
        == "/properties/age/minimum"
    )
    assert refusal({"type": "number", "exclusiveMinimum": 1, "maximum": 1}).pointer == "/exclusiveMinimum"
    assert refusal({"type": "string", "minLength": 5, "maxLength": 2}).pointer == "/minLength"
    assert refusal({"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 1}).pointer == "/minItems"
    assert refusal({"enum": []}).pointer == "/enum"


def test_a_value_every_instance_holds_and_no_value_fits_is_refused():
    # BFCL's shape: an array whose enum lists strings, as a required property
    bfcl = {
        "type": "object",
        "required": ["intents"],
        "properties": {"intents": {"type": "array", "items": {"type": "string"}, "enum": ["Weather", "News"]}},
    }
    e = refusal(bfcl)
    assert e.pointer == "/properties/intents/enum" and "no instance can match" in e.message
    # Kubernetes' IntOrString as its own document: an object that must be a string or an integer
    assert refusal({"oneOf": [{"type": "string"}, {"type": "integer"}], "type": "object"}).pointer == "/oneOf"
    assert refusal({"type": "boolean", "anyOf": [{"type": "string"}, {"type": "array"}]}).pointer == "/anyOf"
    # where the value may be absent, or a branch may share the type, the schema is fine
    validate_json_schema({**bfcl, "required": []})
    validate_json_schema({"type": "number", "oneOf": [{"type": "integer"}, {"type": "string"}]})
    validate_json_schema({"type": "object", "oneOf": [{"type": "string"}, {"required": ["a"]}]})


def test_required_property_that_cannot_appear():
    e = refusal({"type": "object", "properties": {"a": {}}, "required": ["a", "b"], "additionalProperties": False})
    assert e.pointer == "/required/1"


def test_patterns_are_checked_where_they_are():
    e = refusal({"type": "object", "properties": {"code": {"type": "string", "pattern": "^(ab$"}}})
    assert e.pointer == "/properties/code/pattern"
    assert "position" in e.message
    e = refusal({"type": "string", "pattern": "(?<=x)y"})  # Python accepts it, xgrammar does not
    assert e.pointer == "/pattern" and "Lookbehind" in e.message
    assert refusal({"type": "object", "patternProperties": {"([": {}}}).pointer == "/patternProperties/(["


def test_strict_contains_without_items_is_refused_but_allowed_without_strict():
    schema = {"type": "array", "contains": {"type": "integer"}}
    assert refusal(schema).pointer == "/contains"
    validate_json_schema(schema, strict=False)


def test_root_must_be_an_object_and_pointer_prefix_is_applied():
    assert "must be an object" in refusal(True).message
    e = refusal({"type": "strin"}, param="tools", pointer_prefix="/0/function/parameters")
    assert (e.param, e.pointer) == ("tools", "/0/function/parameters/type")


@pytest.mark.parametrize(
    "pattern, fragment",
    [
        ("(", "position"),
        ("a{2,1}", ""),
        ("(a)\\1", "Backreference"),
        ("\\bword", "Word boundary"),
        ("(?i)abc", "not supported"),
    ],
)
def test_bad_regexes_are_refused(pattern, fragment):
    with pytest.raises(GrammarSpecError) as e:
        validate_spec(GrammarSpec.regex(pattern))
    assert e.value.param == "regex"
    assert fragment in e.value.message


def test_regex_corpus_is_valid():
    for entry in json.loads((DATA / "regex_corpus.json").read_text()):
        validate_regex(entry["pattern"])
    with pytest.raises(GrammarSpecError, match="must be a string"):
        validate_regex(123)


def test_validate_spec_dispatches_by_kind():
    validate_spec(GrammarSpec.json_object())
    validate_spec(GrammarSpec.ebnf('root ::= "a"'))
    with pytest.raises(GrammarSpecError, match="non-empty"):
        validate_spec(GrammarSpec.ebnf("  "))
    with pytest.raises(GrammarSpecError) as e:
        validate_spec(GrammarSpec.json_schema({"type": "object", "properties": {"x": {"$ref": "http://a/b"}}}))
    assert e.value.pointer == "/properties/x/$ref"


@pytest.mark.parametrize(
    "raw,escaped",
    [
        ("^(.|[\r\n])*$", "^(.|[\\r\\n])*$"),  # GitHub's workflow schema, as JSON decodes it
        ("a\tb", "a\\tb"),
        ("a\\\nb", "a\\nb"),  # an escaped raw line feed is a line feed
        ("a\\\\\nb", "a\\\\\\nb"),  # an escaped backslash, then a raw line feed
        ("a\x01", "a\\x01"),
        ("^[a-z]+$", "^[a-z]+$"),
    ],
)
def test_raw_control_characters_in_patterns_are_written_as_escapes(raw, escaped):
    import re

    from grammar.validation.regex_check import escaped_controls

    assert escaped_controls(raw) == escaped
    for text in ("a\tb", "a\nb", "x\r\ny", "a\x01"):
        assert bool(re.fullmatch(raw, text)) == bool(re.fullmatch(escaped, text))  # the same regex


def test_a_raw_line_feed_in_a_character_class_compiles(service, tokenizer):
    """xgrammar's lexer refused it ("Character class should not contain newline"), so GitHub's
    workflow schemas were an invalid schema even in best effort."""
    schema = {
        "type": "object",
        "properties": {"run": {"type": "string", "pattern": "^\\$\\{\\{(.|[\r\n])*\\}\\}$"}},
        "required": ["run"],
        "additionalProperties": False,
    }
    validate_json_schema(schema)
    validate_regex("^(.|[\r\n])*$")
    for strict in (True, False):
        handle = service.compile(GrammarSpec("json_schema", schema, strict))
        matcher = handle.new_matcher()
        # (xgrammar writes a patterned string without JSON escapes: a subset, so no line feed here)
        text = '{"run":"${{ secrets.token }}"}'
        assert all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False)), strict
    regex = service.compile(GrammarSpec("regex", "x[\r\n]y"))
    matcher = regex.new_matcher()
    assert all(matcher.accept(t) for t in tokenizer.encode("x\ny", add_special_tokens=False))


@pytest.mark.parametrize(
    "pattern, counted",
    [
        ("^(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$", "^(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+){0,1}$"),
        ("(?:ab+)?c", "(?:ab+){0,1}c"),
        ("a\\)?b", "a\\)?b"),  # an escaped parenthesis is a character
        ("a\\\\(b)?", "a\\\\(b){0,1}"),  # after an escaped backslash it closes a group
        ("[)?]x", "[)?]x"),  # inside a class
        ("(a)??", "(a)??"),  # lazy: left as written
        ("^[a-z]+$", "^[a-z]+$"),
    ],
)
def test_optional_groups_are_written_as_counted_groups(pattern, counted):
    import re

    from grammar.validation.regex_check import optional_groups_counted

    assert optional_groups_counted(pattern) == counted
    for text in ("", "c", "abc", "abbc", "a)b", "ab", "a\\", "a\\b", ")x", "0", "0-rc.1", "0.1"):
        assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(counted, text))  # the same regex


SEMVER = "^(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$"


def test_the_mask_keeps_an_optional_group_that_ends_in_a_repeat(service, tokenizer):
    """xgrammar 0.2.9 read `(-[0-9A-Za-z.-]+)?` as if its `-` were optional on its own, so a
    strict answer closed at the budget wrote the version `2.1.1.1.0` (issue #42 item 1): every
    prefix the mask lets through must complete, by the closing plan, to a value the pattern takes."""
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"version": {"type": "string", "pattern": SEMVER}},
        "required": ["version"],
        "additionalProperties": False,
    }
    handle = service.compile(GrammarSpec("json_schema", schema, True))

    def accepts(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert not accepts('{"version":"2.1.1.1')
    assert accepts('{"version":"2.1.1-rc.1"}') and accepts('{"version":"10.0.3"}')
    for prefix in ('{"version":"2.1.1', '{"version":"2.1.1.', '{"version":"2.1.1-rc', '{"version":"2.'):
        matcher = handle.new_matcher()
        ids = tokenizer.encode(prefix, add_special_tokens=False)
        if not all(matcher.accept(t) for t in ids):
            continue  # refused by the mask: nothing to close
        plan = matcher.completion_plan()
        assert plan is not None, prefix
        text = tokenizer.decode(ids + plan)
        jsonschema.validate(json.loads(text), schema)  # closing keeps the pattern the mask keeps
    regex = service.compile(GrammarSpec("regex", "1(xy+)?"))  # the regex kind reads patterns the same way
    for text, ok in (("1yy", False), ("1xyy", True)):
        matcher = regex.new_matcher()
        assert all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False)) == ok, text
