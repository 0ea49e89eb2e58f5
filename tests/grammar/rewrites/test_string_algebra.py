"""grammar/rewrites/string_algebra.py: patterns that open with lookaheads, and a string's `not` of patterns or
listed strings, enforced by llguidance's regex algebra (intersection and complement).

The forms are taken apart as written and refused where they are not one intersection; the grammar it
writes is run on llguidance's real matcher with the real tokenizer, and every string it lets
through is checked with Python's `re` (what validation after generation uses); strict mode routes
such schemas to llguidance, refuses the shapes the form does not cover with the pattern's pointer,
and best effort compiles the pattern without its lookaheads for xgrammar."""

from __future__ import annotations

import re

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.engines.llguidance.schema import llguidance_refusal
from grammar.errors import GrammarSpecError
from grammar.rewrites.string_algebra import (
    Lookaheads,
    excluded_strings,
    lark_grammar,
    leading_lookaheads,
    without_lookaheads,
)
from grammar.validation.fidelity import CHECKED, ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity
from grammar.validation.json_schema_check import validate_json_schema
from tests.grammar.validation.test_llguidance_fidelity import writes

HANDLE = "^(?!@@)[\\w@]+$"  # the issue's example: `[\w@]+` minus `@@.*`
PASSWORD = "^(?=.*[A-Z])(?=.*\\d)(?=.{6,12}$)"


def closed(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


ACCOUNT = closed(
    {
        "handle": {"type": "string", "pattern": HANDLE, "maxLength": 8},
        "password": {"type": "string", "pattern": PASSWORD},
        "aliases": {"type": "array", "items": {"$ref": "#/$defs/alias"}, "maxItems": 2},
        "age": {"type": "integer", "minimum": 0},
    },
    ["handle", "age"],
) | {"$defs": {"alias": {"type": "string", "pattern": "^(?!x)[a-z]+$"}}}


@pytest.mark.parametrize(
    "pattern,form",
    [
        (HANDLE, Lookaheads((), ("@@",), "[\\w@]+", True)),
        (PASSWORD, Lookaheads((".*[A-Z]", ".*\\d", ".{6,12}$"), (), "", False)),
        ("^(?=a|b)(?!ab)[a-z]{2}", Lookaheads(("a|b",), ("ab",), "[a-z]{2}", False)),
        ("^(?!\\(x\\))[()x]+$", Lookaheads((), ("\\(x\\)",), "[()x]+", True)),
        ("^(?![)])a\\$", Lookaheads((), ("[)]",), "a\\$", False)),  # `\$` is a dollar, not the end
    ],
)
def test_leading_lookaheads_are_taken_apart(pattern, form):
    assert leading_lookaheads(pattern) == form


@pytest.mark.parametrize(
    "pattern",
    [
        "(?!@@)[\\w@]+$",  # not anchored: a search could start anywhere
        "^a(?!b)c$",  # a lookahead after the first character
        "^(?<!x)a$",  # lookbehind
        "^(?!x)a|b$",  # `^(?!x)a` or `b$`: no single intersection
        "^(?=(?!a)b)b$",  # a lookahead inside a lookahead
        "^[a-z]+$",  # no lookahead at all
        "^(?!x",  # unbalanced
    ],
)
def test_other_forms_are_not_taken(pattern):
    assert leading_lookaheads(pattern) is None


@pytest.fixture(scope="module")
def account(service):
    handle = service.compile(GrammarSpec("json_schema", ACCOUNT, True))
    assert isinstance(handle, LLGuidanceHandle)
    return handle


@pytest.mark.parametrize(
    "text,ok",
    [
        ('{"handle":"a@b","age":3}', True),
        ('{"handle":"@@root","age":3}', False),  # the negative lookahead
        ('{"handle":"@root","age":3}', True),  # one @ is not two
        ('{"handle":"abcdefghi","age":3}', False),  # maxLength beside the pattern
        ('{"handle":"a b","age":3}', False),  # the body
        ('{"handle":"ab","password":"Secret12","age":3}', True),
        ('{"handle":"ab","password":"secret12","age":3}', False),  # no capital
        ('{"handle":"ab","password":"Secret","age":3}', False),  # no digit
        ('{"handle":"ab","password":"Secret12345678","age":3}', False),  # (?=.{6,12}$)
        ('{"handle":"ab","aliases":["bo","al"],"age":3}', True),
        ('{"handle":"ab","aliases":["xo"],"age":3}', False),  # through the $ref
        ('{"handle":"ab","aliases":["a","b","c"],"age":3}', False),  # maxItems
        ('{"handle":"ab","age":-1}', False),  # the rest is llguidance's own JSON schema
        ('{"age":3}', False),  # required
        ('{"handle":"ab","age":3,"extra":1}', False),  # closed
        ('{"handle":"ab", "age":3}', False),  # compact, as everywhere
    ],
)
def test_the_grammar_keeps_every_lookahead(account, tokenizer, text, ok):
    assert writes(account, tokenizer, text) is ok
    if ok:
        jsonschema.validate(__import__("json").loads(text), ACCOUNT)


def test_every_handle_the_grammar_allows_matches_the_pattern_in_python(account, tokenizer):
    """Soundness against the validator: candidates of every kind, the grammar's yes implies re's."""
    words = ["a", "@", "@@", "@a@", "a@@", "@@a", "_x", "ab cd", "é", "a-b", "x" * 9, "A1", "@\u0661"]
    allowed = [w for w in words if writes(account, tokenizer, f'{{"handle":"{w}","age":1}}')]
    assert allowed and all(re.search(HANDLE, w) and len(w) <= 8 for w in allowed)
    assert {"@@", "@@a", "ab cd", "x" * 9}.isdisjoint(allowed)
    assert "é" not in allowed  # values are printable ASCII (a subset: sound, if narrower)


def test_strict_routes_such_schemas_to_llguidance_and_says_so(account):
    report = routed_schema_fidelity(ACCOUNT, strict=True)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    got = {k.pointer: (k.status, k.engine) for k in report.keywords if k.keyword == "pattern"}
    assert got == {
        "/properties/handle/pattern": (ENFORCED, LLGUIDANCE),
        "/properties/password/pattern": (ENFORCED, LLGUIDANCE),
        "/$defs/alias/pattern": (ENFORCED, LLGUIDANCE),
    }
    assert account.min_completion_tokens() is not None  # strict closing plans through the Lark grammar


@pytest.mark.parametrize(
    "schema,where",
    [
        (closed({"h": {"anyOf": [{"type": "string", "pattern": HANDLE}, {"type": "null"}]}}, ["h"]), "/properties/h"),
        (closed({"h": {"type": "string", "pattern": HANDLE, "format": "email"}}, ["h"]), "/properties/h"),
        (closed({"h\u00e9": {"type": "string", "pattern": HANDLE}}, []), "/"),
    ],
)
def test_shapes_the_form_does_not_cover_are_refused_in_strict_mode(schema, where):
    assert where in llguidance_refusal(schema, strict=True) or "escaping" in llguidance_refusal(schema, strict=True)
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine in (None, XGRAMMAR)
    refused = [k for k in report.refused_in_strict if k.keyword == "pattern"]
    assert refused and refused[0].status == CHECKED and "lookahead" in refused[0].reason


def test_best_effort_compiles_the_pattern_without_its_lookaheads_for_xgrammar(service, tokenizer):
    schema = {"type": "object", "properties": {"h": {"type": "string", "pattern": HANDLE}}, "required": ["h"]}
    assert without_lookaheads(schema)["properties"]["h"]["pattern"] == "^[\\w@]+$"
    assert "/" in llguidance_refusal(schema, strict=False)  # an open object: not the Lark form's
    assert routed_schema_fidelity(schema, strict=False).engine in (None, XGRAMMAR)
    handle = service.compile(GrammarSpec("json_schema", schema, False))
    assert not isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"h":"@@a"}')  # a superset: validation after generation reports it
    assert not writes(handle, tokenizer, '{"h":"a b"}')


def test_lookaround_outside_the_form_is_still_an_invalid_schema():
    with pytest.raises(GrammarSpecError, match="not supported"):
        validate_json_schema({"type": "string", "pattern": "^a(?!b)c$"})
    with pytest.raises(GrammarSpecError, match="not supported"):  # nor in a name's pattern (issue #42)
        validate_json_schema({"type": "object", "patternProperties": {"^a(?!x)b$": {}}})
    validate_json_schema({"type": "object", "patternProperties": {"^(?!x)a$": {}}})  # the form is taken
    validate_json_schema({"type": "string", "pattern": HANDLE})


def test_the_lark_text_embeds_what_holds_no_lookahead_whole():
    text = lark_grammar(closed({"h": {"type": "string", "pattern": HANDLE}, "n": {"type": "integer"}}, ["h"]))
    assert '%json {"type": "integer"' in text and "~/(?:@@)(?s:.*)/" in text


# ------------------------------------------------------------------ a string's `not`

TEMPLATE_FREE = closed(
    {
        "branch": {"type": "string", "not": {"pattern": "<<.*>>"}, "maxLength": 20},  # circle-ci
        "secret": {"type": "string", "not": {"pattern": "^([Bb][Uu][Ii][Ll][Dd][Kk][Ii][Tt][Ee]|[Bb][Kk])"}},
        "env": {"type": "string", "pattern": "^[a-z]+$", "not": {"enum": ["default", "a.b"]}},
        "tag": {"type": "string", "not": {"anyOf": [{"const": "latest"}, {"pattern": "^-|-$"}]}},
    },
    ["branch"],
)


@pytest.mark.parametrize(
    "not_value,regexes",
    [
        ({"pattern": "<<.*>>"}, ["(?s:.*)(?:<<.*>>)(?s:.*)"]),
        ({"pattern": "^a|b$"}, ["(?:a)(?s:.*)", "(?s:.*)(?:b)"]),
        ({"type": "string", "const": "a.b"}, ["a\\.b"]),
        ({"enum": ["x", "y-z"]}, ["x", "y\\-z"]),
        ({"anyOf": [{"const": "x"}, {"pattern": "^y$"}]}, ["x", "(?:y)"]),
    ],
)
def test_a_strings_not_is_the_complement_of_what_it_lists(not_value, regexes):
    assert excluded_strings(not_value) == regexes


@pytest.mark.parametrize(
    "not_value",
    [
        {"minLength": 3},
        {"enum": [1, 2]},
        {"type": "integer"},
        {"pattern": "a(?=b)"},
        {"pattern": "a^b"},
        {"anyOf": [{"const": "x"}, {"minimum": 2}]},
        {"required": ["a"]},
        {"anyOf": []},
    ],
)
def test_other_nots_are_not_written(not_value):
    assert excluded_strings(not_value) is None


@pytest.fixture(scope="module")
def template_free(service):
    handle = service.compile(GrammarSpec("json_schema", TEMPLATE_FREE, True))
    assert isinstance(handle, LLGuidanceHandle)
    return handle


@pytest.mark.parametrize(
    "text,ok",
    [
        ('{"branch":"main"}', True),
        ('{"branch":"<<pipeline.git.branch>>"}', False),
        ('{"branch":"a<<b>>c"}', False),  # the pattern searches
        ('{"branch":"a<<b"}', True),
        ('{"branch":"main","secret":"MY_KEY"}', True),
        ('{"branch":"main","secret":"buildkite_key"}', False),
        ('{"branch":"main","secret":"BK_TOKEN"}', False),
        ('{"branch":"main","secret":"my_bk"}', True),  # anchored at the start only
        ('{"branch":"main","env":"prod"}', True),
        ('{"branch":"main","env":"default"}', False),
        ('{"branch":"main","env":"defaults"}', True),  # a listed string is the whole string
        ('{"branch":"main","tag":"latest"}', False),
        ('{"branch":"main","tag":"-v1"}', False),
        ('{"branch":"main","tag":"v1-"}', False),
        ('{"branch":"main","tag":"v-1"}', True),
    ],
)
def test_the_grammar_keeps_every_not(template_free, tokenizer, text, ok):
    assert writes(template_free, tokenizer, text) is ok
    valid = jsonschema.Draft202012Validator(TEMPLATE_FREE).is_valid(__import__("json").loads(text))
    assert valid is ok  # the grammar's verdict is the validator's, both ways, on these


def test_strict_routes_a_strings_not_to_llguidance():
    report = routed_schema_fidelity(TEMPLATE_FREE, strict=True)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    assert {k.pointer for k in report.keywords if k.keyword == "not" and k.status == ENFORCED} == {
        f"/properties/{name}/not" for name in ("branch", "secret", "env", "tag")
    }
    untyped = closed({"v": {"not": {"pattern": "x"}}}, ["v"])  # a number is no string: `not` holds for it
    assert routed_schema_fidelity(untyped, strict=True).refused_in_strict
