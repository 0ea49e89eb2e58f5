"""The value check (grammar/checks/value_check.py) on uniqueItems: repeated strings, numbers, listed
values and object items are masked out, checked against brute force over every item and prefix."""

from __future__ import annotations

import pytest

from grammar.checks.value_check import ValueCheck
from grammar.checks.value_rules import SchemaNavigator, canonical
from grammar.checks.value_text import ValueCheckVocab
from tests.grammar.checks.value_check_vocab import ID, banned, check_after

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
