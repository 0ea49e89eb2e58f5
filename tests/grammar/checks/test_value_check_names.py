"""The value check (grammar/checks/value_check.py) on names: a name written again is masked out
(escapes, nesting, keys split across tokens), rollback, drafts, dependentRequired, tool calls, the fallbacks."""

from __future__ import annotations

import pytest

from grammar.checks.value_check import ValueCheck
from grammar.checks.value_rules import SchemaNavigator
from tests.grammar.checks.value_check_vocab import ID, VOCAB, banned, check_after

# -- names -----------------------------------------------------------------------------------


def test_a_token_closing_a_name_already_written_is_masked_out():
    check = check_after(["{", '"ab"', ":", "1", ",", '"a'])
    out = banned(check)
    assert 'b"' in out  # would close "ab" again
    assert {"b", 'c"', "c"}.isdisjoint(out)  # growing the name, or closing another one, is fine
    assert check.banned == len(out)


def test_nothing_is_masked_before_a_name_is_written():
    assert banned(check_after(["{", '"a'])) == set()


def test_names_split_across_tokens_and_whole_in_one_token():
    check = check_after(["{", '"', "a", "b", '":', "1", ","])
    assert {'"ab"'} <= banned(check)  # opens and closes the same name in one token
    check = check_after(["{", '"a', "b", '":', "1"])
    out = banned(check)
    assert {',"ab":', '1,"ab":'} <= out  # the second writes 11, then the same name
    check = check_after(["{", '"ab"', ":"])
    assert '1,"ab":' in banned(check)  # a value, a comma and the same name, all in one token


def test_nested_objects_keep_their_own_names():
    check = check_after(["{", '"ab"', ":", "{", '"a'])
    assert 'b"' not in banned(check)  # "ab" is the outer object's name, not the inner one's
    check = check_after(["{", '"ab"', ":", "{", '"ab"', ":", "1", "}", ",", '"a'])
    assert 'b"' in banned(check)  # back in the outer object


def test_an_escaped_spelling_of_a_written_name_is_the_same_name():
    check = check_after(["{", '"ab"', ":", "1", ",", '"', "\\u0061"])
    assert 'b"' in banned(check)  # "\u0061b" is "ab"
    check = check_after(["{", '"ab"', ":", "1", ",", '"', "\\", "u0061"])  # the escape split in two
    assert 'b"' in banned(check)


def test_quotes_inside_values_are_not_names():
    # {"ab":"x\"ab"  -- an escaped quote inside a value, then the value ends: still one name written
    check = check_after(["{", '"ab"', ":", '"', "x", "\\", '"a', 'b"', ","])
    assert '"ab"' in banned(check)
    assert '"b"' not in banned(check)


def test_rollback_restores_the_names_written():
    check = check_after(["{", '"ab"', ":", "1", ","])
    for piece in ['"b"', ":", "1", ","]:
        check.accept(ID[piece])
    assert '"b"' in banned(check)
    check.rollback(4)
    assert '"b"' not in banned(check) and '"ab"' in banned(check)


def test_drafts_stop_before_a_repeat():
    check = check_after(["{", '"ab"', ":", "1", ","])
    assert check.first_violation([ID['"a'], ID['b"']]) == 1
    assert check.first_violation([ID['"a'], ID['c"']]) is None
    assert '"ab"' in banned(check)  # simulating changed nothing


def test_a_mask_the_check_would_empty_is_left_as_the_grammar_gave_it():
    check = check_after(["{", '"ab"', ":", "1", ",", '"a'])
    assert banned(check, {'b"'}) == set()
    assert check.dead_ends == 1


def _open_object(**more) -> dict:
    return {"type": "object", "properties": {"c": {"type": "integer"}}, **more}


# name -> (schema, the text before the object whose names repeat): every shape of object the
# grammar may write a name twice in (strict mode, SchemaNavigator's default, unless said)
REPEATABLE = {
    "no schema (json_object, tool calls)": (None, []),
    "free-form object": ({"type": "object"}, []),
    "no properties at all": ({"additionalProperties": {"type": "integer"}}, []),
    "declared and additionalProperties true": (_open_object(additionalProperties=True), []),
    "declared and additionalProperties schema": (_open_object(additionalProperties={"type": "integer"}), []),
    "declared and unevaluatedProperties schema": (_open_object(unevaluatedProperties={"type": "integer"}), []),
    "declared and patternProperties": (_open_object(patternProperties={"^a": {"type": "integer"}}), []),
    "patternProperties only": ({"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": False}, []),
    "empty properties (llguidance leaves it open)": ({"type": "object", "properties": {}}, []),
    "nested in a declared property": (
        {"type": "object", "properties": {"c": _open_object(additionalProperties=True)}},
        ["{", '"c"', ":"],
    ),
    "free object under additionalProperties": (
        {"type": "object", "additionalProperties": {"type": "object"}},
        ["{", '"c"', ":"],
    ),
    "items of an array": ({"type": "array", "items": _open_object(additionalProperties=True)}, ["[", "{", "}", ","]),
    "an anyOf branch": ({"anyOf": [{"type": "null"}, _open_object(additionalProperties=True)]}, []),
    "a $ref'd definition": (
        {
            "$defs": {"o": _open_object(additionalProperties={"type": "integer"})},
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/o"}},
        },
        ["{", '"c"', ":"],
    ),
    "declared, outside strict mode": ("loose", []),
}


@pytest.mark.parametrize("shape", list(REPEATABLE))
def test_a_name_written_again_is_masked_out_in_every_object_that_admits_it(shape):
    schema, before = REPEATABLE[shape]
    navigator = (
        SchemaNavigator(_open_object(), strict=False)
        if schema == "loose"
        else (SchemaNavigator(schema) if schema is not None else None)
    )
    check = ValueCheck(VOCAB, navigator)
    for piece in before + ["{", '"ab"', ":", "1", ","]:
        check.accept(ID[piece])
    assert '"ab"' in banned(check)  # the same name whole in one token
    check.accept(ID['"a'])
    assert 'b"' in banned(check)  # its closing quote
    assert 'c"' not in banned(check)  # another name is fine


@pytest.mark.parametrize(
    "schema",
    [
        _open_object(),  # strict mode closes an object that declares properties and says nothing else
        _open_object(additionalProperties=False),
        {"type": "object", "unevaluatedProperties": False},
        {"type": "object", "maxProperties": 1},
    ],
)
def test_objects_whose_names_cannot_repeat_are_not_followed(schema):
    navigator = SchemaNavigator(schema)
    assert not navigator.names_may_repeat(navigator.root_nodes())


# -- dependentRequired -----------------------------------------------------------------------

DEPENDENT = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}, "d": {}}, "dependentRequired": {"a": ["c"]}}


def test_an_object_cannot_close_while_a_dependent_is_missing():
    check = check_after(["{", '"a"', ":"], DEPENDENT)
    assert {"1}"} <= banned(check) and "1" not in banned(check)
    check = check_after(["{", '"a"', ":", "1"], DEPENDENT)
    assert "}" in banned(check) and "," not in banned(check)
    check = check_after(["{", '"a"', ":", "1", ",", '"c"', ":", "1"], DEPENDENT)
    assert banned(check) == set()  # the dependent is there
    assert banned(check_after(["{", '"b"', ":", "1"], DEPENDENT)) == set()  # no trigger written


def test_no_name_past_a_missing_dependent_is_written():
    check = check_after(["{", '"a"', ":", "1", ",", '"'], DEPENDENT)
    out = banned(check)
    assert {"d", 'd"'} <= out  # "d" comes after "c" in the grammar's order: "c" could not follow
    assert not {"b", 'b"', "c", 'c"'} & out
    assert '"d"' in banned(check_after(["{", '"a"', ":", "1", ","], DEPENDENT))


# -- tool calls ------------------------------------------------------------------------------


def test_tool_calls_are_followed_from_their_marker_to_the_end_of_the_call():
    prose = ["{", '"ab"', ":", "1", ",", '"a']
    assert banned(check_after(prose, begin=b"<c>")) == set()  # free text before a call is not JSON
    call = ["x", "<", "c>", "{", '"ab"', ":", "1", ","]  # the marker split across tokens
    assert '"ab"' in banned(check_after(call, begin=b"<c>"))
    after = call + ['"b"', ":", "1", "}"] + prose
    assert banned(check_after(after, begin=b"<c>")) == set()  # the call ended: text again
    again = call + ['"b"', ":", "1", "}", "<c>", "{", '"b"', ":", "1", ","]
    out = banned(check_after(again, begin=b"<c>"))
    assert '"b"' in out and '"ab"' not in out  # a new call has its own names


def test_an_internal_error_lets_the_output_go_on_unchecked(caplog):
    check = check_after(["{", '"ab"', ":", "1", ",", '"a'])
    with caplog.at_level("ERROR", logger="jumpgate.grammar"):
        assert check.ban([[0]], 0) == 0  # not a tensor: fails inside the check
    assert check.broken and "value check failed" in caplog.text
    check.accept(ID["b"])  # and stays out of the way
    assert check.first_violation([ID['b"']]) is None
