"""The value check (grammar/checks/value_check.py) on a small hand-made vocabulary: which tokens it masks
out after a given text (names and unique items; escapes, nesting, tokens spanning several
structural characters, keys split across tokens), rollback, drafts, and the empty-mask fallback.
The real vocabulary and grammars: tests/grammar/checks/test_value_check_matcher.py."""

from __future__ import annotations

import math

import pytest
import torch

from grammar.checks.value_check import ValueCheck, ValueCheckVocab
from grammar.checks.value_rules import SchemaNavigator, canonical

PIECES = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    '"',
    "a",
    "b",
    "c",
    "ab",
    'b"',
    'c"',
    '":',
    '"a',
    '"ab"',
    ',"ab":',
    '1,"ab":',
    "1",
    "0",
    "2",
    "1.0",
    ".0",
    "-",
    '"a"',
    '","',
    '",',
    "\\",
    "u0061",
    "\\u0061",
    "x",
    "y",
    '"]',
    '"}',
    "},",
    "true",
    "false",
    "e",
    'a"',
    '"b"',
    "1]",
    "0,",
    "t",
    "f",
    "d",
    'd"',
    '"c"',
    '"d"',
    "1}",
    "<c>",
    "<",
    "c>",
]
VOCAB = ValueCheckVocab([p.encode() for p in PIECES], frozenset())
ID = {p: i for i, p in enumerate(PIECES)}


def check_after(text_tokens: list[str], schema=None, begin: bytes | None = None) -> ValueCheck:
    check = ValueCheck(VOCAB, SchemaNavigator(schema) if schema is not None else None, begin)
    for piece in text_tokens:
        check.accept(ID[piece])
    return check


def banned(check: ValueCheck, allowed: set[str] | None = None) -> set[str]:
    """The pieces `check.ban` clears from a mask allowing `allowed` (default: every piece)."""
    allowed = set(PIECES) if allowed is None else allowed
    mask = torch.zeros((1, math.ceil(len(PIECES) / 32)), dtype=torch.int32)
    for piece in allowed:
        i = ID[piece]
        mask[0, i // 32] |= (1 << (i % 32)) if i % 32 != 31 else -(1 << 31)
    check.ban(mask, 0)
    words = mask[0].tolist()
    left = {p for p in PIECES if (words[ID[p] // 32] >> (ID[p] % 32)) & 1}
    return allowed - left


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


# -- unique items ----------------------------------------------------------------------------

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
NUMBERS = {"type": "array", "items": {"type": "number"}, "uniqueItems": True}
INTEGERS = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
LETTERS = {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}
OBJECTS = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}


def test_a_string_item_equal_to_an_earlier_one_cannot_close():
    check = check_after(["[", '"ab"', ",", '"a'], STRINGS)
    out = banned(check)
    assert 'b"' in out and "b" not in out and 'c"' not in out
    assert '"ab"' in banned(check_after(["[", '"ab"', ","], STRINGS))
    # without uniqueItems nothing is masked
    assert banned(check_after(["[", '"ab"', ",", '"a'], {"type": "array"})) == set()


def test_numbers_repeat_when_equal_as_json_values():
    check = check_after(["[", "1", ",", "1"], NUMBERS)
    out = banned(check)
    assert {",", "]"} <= out
    assert "1]" not in out and not {"0", "0,", ".0"} & out  # 10, 11 are new; 1.0 is not complete yet
    check.accept(ID[".0"])
    assert "," in banned(check)  # ... and then it equals 1
    check = check_after(["[", "1.0", ","], NUMBERS)
    assert "1]" in banned(check)  # 1 == 1.0, completed by the bracket inside the token


def test_an_integer_zero_is_refused_as_soon_as_written_again():
    check = check_after(["[", "0", ","], INTEGERS)
    assert {"0", "0,"} <= banned(check)  # `0` cannot grow into another integer
    assert "1" not in banned(check)


def test_listed_items_refuse_a_used_value_early_and_the_comma_once_all_are_used():
    check = check_after(["[", '"a"', ","], LETTERS)
    out = banned(check)
    assert '"a' in out and '"a"' in out  # "a... can only spell the used "a"
    assert '"b"' not in out and '"' not in out
    check = check_after(["[", '"a"', ",", '"b"'], LETTERS)
    out = banned(check)
    assert "," in out and "]" not in out  # no unused value left: the array must close


def test_object_items_compare_canonically_at_their_closing_brace():
    check = check_after(
        ["[", "{", '"a"', ":", "1", ",", '"b"', ":", "2", "}", ",", "{", '"b"', ":", "2", ",", '"a"', ":", "1"], OBJECTS
    )
    out = banned(check)
    assert "}" in out and "}," in out  # {"b":2,"a":1} equals {"a":1,"b":2}
    check = check_after(["[", "{", '"a"', ":", "1", "}", ",", "{", '"a"', ":", "2"], OBJECTS)
    assert "}" not in banned(check)


# object items of scalar properties: the check steers each item away from the earlier ones
TAGS = {
    "type": "array",
    "uniqueItems": True,
    "items": {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
    },
}
NAMES = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "object", "required": ["c"], "properties": {"c": {"type": "string"}}},
}
OPTIONAL = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "object", "properties": {"ab": {"const": 1}, "b": {"const": 1}}},
}  # both optional: {}, {"ab":1}, {"b":1}, {"ab":1,"b":1}
FLAGS = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "object", "required": ["b"], "properties": {"b": {"type": "boolean"}}},
}


def item(*pieces: str) -> list[str]:
    return ["{", *pieces, "}"]


def test_a_listed_value_that_could_only_end_an_object_item_as_a_repeat_is_masked_out():
    first = item('"a"', ":", "1", ",", '"b"', ":", "true")
    check = check_after(["[", *first, ",", "{", '"a"', ":", "1", ",", '"b"', ":"], TAGS)
    out = banned(check)
    assert {"t", "true"} <= out and not {"f", "false"} & out
    check = check_after(["[", *first, ",", "{", '"a"', ":", "2", ",", '"b"', ":"], TAGS)
    assert banned(check) & {"t", "true"} == set()  # a differs already


def test_a_value_end_that_leaves_only_used_combinations_is_masked_out_and_the_number_grows():
    items = [
        "[",
        *item('"a"', ":", "1", ",", '"b"', ":", "true"),
        ",",
        *item('"a"', ":", "1", ",", '"b"', ":", "false"),
        ",",
    ]
    check = check_after(items + ["{", '"a"', ":", "1"], TAGS)
    out = banned(check)
    assert "," in out and '1,"ab":' in out  # "b" could only repeat true or false
    assert not {"0", "1", "2"} & out  # 10, 11, 12 are new
    check = check_after(items + ["{", '"a"', ":", "1", "0"], TAGS)
    assert "," not in banned(check)  # 10 is new
    zeros = [t.replace("1", "0") if t == "1" else t for t in items]
    check = check_after(zeros + ["{", '"a"', ":"], TAGS)
    out = banned(check)
    assert {"0", "0,"} <= out and "1" not in out  # an integer 0 cannot grow: it is settled at once


def test_a_free_string_value_cannot_close_into_a_repeated_item():
    check = check_after(["[", *item('"c"', ":", '"ab"'), ",", "{", '"c"', ":", '"a'], NAMES)
    out = banned(check)
    assert 'b"' in out and "b" not in out and 'c"' not in out
    check = check_after(["[", *item('"c"', ":", '"ab"'), ",", "{", '"c"', ":", '"a', "b"], NAMES)
    assert {'"', '"}', '"]'} <= banned(check)
    out = banned(check_after(["[", *item('"c"', ":", '"ab"'), ",", "{", '"c"', ":"], NAMES))
    assert '"ab"' in out and not {'"a', '"'} & out  # the whole string in one token


def test_optional_properties_steer_the_names_and_the_close():
    earlier = ["[", *item('"ab"', ":", "1"), ","]
    check = check_after(earlier + ["{", '"ab"', ":", "1"], OPTIONAL)
    out = banned(check)
    assert {"}", "},"} <= out and "," not in out  # {"ab":1} again, unless "b" follows
    used = ["[", "{", "}", ",", *item('"ab"', ":", "1", ",", '"b"', ":", "1"), ",", *item('"b"', ":", "1"), ","]
    check = check_after(used + ["{"], OPTIONAL)
    out = banned(check)
    assert {"}", '"b"'} <= out and '"ab"' not in out  # only {"ab":1} is left
    check = check_after(used + ["{", '"ab"', ":", "1"], OPTIONAL)
    assert "," in banned(check) and "}" not in banned(check)
    check = check_after(used + ["{", '"'], OPTIONAL)
    assert "b" in banned(check) and "ab" not in banned(check)  # the name's text decides too


def test_the_comma_between_object_items_is_masked_out_once_every_item_is_used():
    check = check_after(["[", *item('"b"', ":", "true"), ",", *item('"b"', ":", "false")], FLAGS)
    out = banned(check)
    assert "," in out and "]" not in out
    assert "," not in banned(check_after(["[", *item('"b"', ":", "true")], FLAGS))


def test_steering_object_items_rolls_back_with_the_output():
    check = check_after(["[", *item('"b"', ":", "true"), ",", "{", '"b"', ":"], FLAGS)
    assert "true" in banned(check)
    check.rollback(5)  # back before the first item closed
    assert banned(check) == set()


def test_uniqueness_follows_properties_refs_and_branches():
    schema = {
        "$defs": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "type": "object",
        "properties": {"t": {"anyOf": [{"$ref": "#/$defs/tags"}, {"type": "null"}]}},
    }
    check = check_after(["{", '"', "t", '":', "[", '"ab"', ",", '"a'], schema)
    assert 'b"' in banned(check)
    check = check_after(["{", '"', "x", '":', "[", '"ab"', ",", '"a'], schema)  # an undeclared name
    assert 'b"' not in banned(check)


def test_canonical_equality_is_json_schemas():
    assert canonical(1) == canonical(1.0) != canonical(True)
    assert canonical({"a": [1, {"b": 2.0}]}) == canonical({"a": [1.0, {"b": 2}]})
    assert canonical("a") != canonical(["a"])


@pytest.mark.parametrize("pieces", [["[", '"ab"', ",", '"ab"'], ["[", "1", ",", "1", "]"]])
def test_accepting_a_repeat_anyway_keeps_following(pieces):
    # the engine may take a token the check would mask (a stored plan, a fallback): no crash
    check = check_after(pieces, STRINGS if '"ab"' in pieces else NUMBERS)
    check.rollback(len(pieces))
    assert banned(check) == set()


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


def test_object_item_steering_agrees_with_brute_force_over_every_item_and_prefix():
    # every item the grammar could write (declared order, optional names left out or not), every
    # set of earlier items from a seeded sample: after each character it allowed, the check allows
    # exactly the characters that leave some completion unlike every earlier item
    import itertools
    import json
    import random

    fields = [("a", ["true", "false"], False), ("b", ["1", "2", '"x"'], True), ("c", ["null"], False)]
    schema = {
        "type": "array",
        "uniqueItems": True,
        "items": {
            "type": "object",
            "required": ["b"],
            "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2, "x"]}, "c": {"type": "null"}},
        },
    }
    texts = []
    for combo in itertools.product(*[values + ([None] if not required else []) for _, values, required in fields]):
        pairs = [f'"{name}":{v}' for (name, _, _), v in zip(fields, combo) if v is not None]
        texts.append("{" + ",".join(pairs) + "}")
    chars = sorted({c for t in texts for c in t} | {",", "[", "]"})
    vocab = ValueCheckVocab([c.encode() for c in chars], frozenset())
    cid = {c: i for i, c in enumerate(chars)}
    rng = random.Random(16)
    for earlier in [[]] + [rng.sample(texts, k) for k in (1, 2, 5, 11, len(texts) - 1) for _ in range(3)]:
        used = {canonical(json.loads(t)) for t in earlier}
        head = "[" + "".join(t + "," for t in earlier)
        check = ValueCheck(vocab, SchemaNavigator(schema))
        for c in head:
            check.accept(cid[c])
        for text in texts:
            for i in range(len(text)):
                truth = any(t.startswith(text[: i + 1]) and canonical(json.loads(t)) not in used for t in texts)
                assert check.violates(cid[text[i]]) is not truth, (earlier, text[: i + 1])
                if not truth:
                    break  # the check never lets the writer past here
                check.accept(cid[text[i]])
            check.rollback(i + 1 if truth else i)
        check = ValueCheck(vocab, SchemaNavigator(schema))
        for c in head[:-1]:
            check.accept(cid[c])
        if earlier:  # a comma (a next item) only while an unused item is left
            assert check.violates(cid[","]) is (len(earlier) == len(texts))
