"""A rewrite held to the family of values the keyword it broke allows (grammar/checks/value_family.py
through grammar/checks/rollback.py): an `enum` under a root `else` (dependabot's
`package-ecosystem`), a `const`, a `type`; with a byte vocabulary, so each step's mask is exact."""

from __future__ import annotations

import numpy as np
import torch

from grammar.checks.rollback import RollbackCheck, RollbackRules, RollbackVocab, ToolCallRollbackRules
from grammar.checks.value_family import combine, error_family, item_pattern, matches, open_value, spellings

BYTES = RollbackVocab([bytes([b]) for b in range(256)] + [b"", b'"np', b'"pip', b'"pip3"', b"2}", b"23"])
ID = {t: i for i, t in enumerate(BYTES.texts)}
STOP = ID[b""]
# the root `else` narrows the ecosystem to a list the grammar (a free string) does not mask
ECOSYSTEMS = {
    "type": "object",
    "properties": {"beta": {"type": "boolean"}, "eco": {"type": "string"}},
    "if": {"properties": {"beta": {"const": True}}, "required": ["beta"]},
    "then": {},
    "else": {"properties": {"eco": {"enum": ["npm", "pip"]}}},
}


def written(schema, *texts: bytes, retries: int = 3) -> RollbackCheck:
    c = RollbackCheck(RollbackRules(schema, BYTES, retries))
    for t in texts:
        for piece in [t] if t in ID else [bytes([b]) for b in t]:
            c.accept(ID[piece])
    c.accept(STOP)
    return c


def allowed(c: RollbackCheck, texts: list[bytes]) -> set[bytes]:
    """What the check leaves of a mask allowing `texts`."""
    mask = torch.zeros((1, (len(BYTES.texts) + 31) // 32), dtype=torch.int32)
    words = mask[0].numpy().view(np.uint32)
    for t in texts:
        words[ID[t] >> 5] |= np.uint32(1 << (ID[t] & 31))
    c.ban(mask, 0)
    return {t for t in texts if int(words[ID[t] >> 5]) >> (ID[t] & 31) & 1}


FREE = [b'"', b'"np', b'"pip', b'"pip3"', b"x", b"}"]  # what a free string's mask allows at its start


def test_a_listed_value_rewrite_is_held_to_the_list_not_only_off_the_failed_text():
    c = written(ECOSYSTEMS, b'{"eco":"pip3"}')
    c.rollback(c.verdict())
    assert c.text == b'{"eco":'
    # before: only `"pip3"` was banned, so `"np`... and `"x`... were open; now only the list's starts
    assert allowed(c, FREE) == {b'"', b'"np', b'"pip'}
    c.accept(ID[b'"pip'])
    # `"pip` goes on only to end as "pip" (no `3`, no other letter)
    assert allowed(c, [b'"', b"3", b"x", b"}"]) == {b'"'}
    c.accept(ID[b'"'])
    # the value is one of the list's: the family lets go
    assert allowed(c, [b"}", b","]) == {b"}", b","}
    c.accept(ID[b"}"])
    c.accept(STOP)
    assert c.verdict() is None


def test_the_family_stands_aside_where_the_grammar_allows_none_of_it():
    c = written(ECOSYSTEMS, b'{"eco":"pip3"}')
    c.rollback(c.verdict())
    # a grammar that allows no string here (the family is the grammar's business, not the check's)
    assert allowed(c, [b"x", b"}"]) == {b"x", b"}"}


def test_a_rollback_before_the_rewrite_began_frees_the_text():
    c = written(ECOSYSTEMS, b'{"eco":"pip3"}')
    c.rollback(c.verdict())
    c.rollback(len(b'"eco":'))  # an earlier value rewritten: back to `{`
    assert allowed(c, [b'"', b"x", b"}"]) == {b'"', b"x", b"}"}


def test_a_const_number_is_held_and_ends_only_where_it_is_whole():
    schema = {"type": "object", "properties": {"v": {"type": "integer"}}, "else": {}, "then": {}, "if": False}
    schema["else"] = {"properties": {"v": {"const": 2}}}
    c = written(schema, b'{"v":7}')
    c.rollback(c.verdict())
    assert allowed(c, [b"2", b"7", b"2}", b"23", b"1"]) == {b"2", b"2}"}
    c.accept(ID[b"2"])
    assert allowed(c, [b"3", b"}", b","]) == {b"}", b","}


def test_a_type_is_held_by_how_its_values_open():
    schema = {"type": "object", "properties": {"n": {}}, "if": True, "then": {"properties": {"n": {"type": "integer"}}}}
    c = written(schema, b'{"n":"x"}')
    c.rollback(c.verdict())
    assert allowed(c, [b'"', b"2", b"-", b"t", b"["]) == {b"2", b"-"}
    c.accept(ID[b"2"])
    assert allowed(c, [b"3", b"}"]) == {b"3", b"}"}  # opened as a number: the family lets go


def test_families_of_one_value_intersect():
    listed = error_family("enum", ["a", 1, True])
    assert combine([listed, error_family("type", "string")]) == ((b'"a"', True),)
    assert combine([listed, error_family("type", ["integer", "boolean"])]) == ((b"1", True), (b"true", True))
    assert combine([error_family("const", "b"), listed]) == ()
    assert error_family("pattern", "^a") is None and error_family("minimum", 3) is None


def test_spellings_cover_what_a_grammar_may_write():
    assert spellings("é") == ['"é"'.encode(), b'"\\u00e9"']
    assert spellings(2.0) == [b"2.0", b"2"]
    assert spellings({"a": [1, None]}) == [b'{"a":[1,null]}']


# dependabot's shape: every item of `updates` is held to the root `else`'s list
ITEMS = {
    "type": "object",
    "properties": {"beta": {"type": "boolean"}, "updates": {"type": "array", "items": {"type": "object"}}},
    "if": {"properties": {"beta": {"const": True}}, "required": ["beta"]},
    "then": {},
    "else": {"properties": {"updates": {"items": {"properties": {"eco": {"enum": ["npm", "pip"]}}}}}},
}


def test_open_value_finds_the_place_being_written():
    assert open_value(b'{"u":[{"eco":"pi') == (("u", 0, "eco"), b'{"u":[{"eco":')
    assert open_value(b'{"u":[{"a":1},{"eco":') == (("u", 1, "eco"), b'{"u":[{"a":1},{"eco":')
    assert open_value(b'{"u":[{"a":1},{"eco"') == (("u", 1, "eco"), b'{"u":[{"a":1},{"eco":')  # `":"x` in one token
    assert open_value(b'{"u":[1,2') == (("u", 1), b'{"u":[1,')
    assert open_value(b'{"a":"x"') is None  # a value written, not a name
    assert open_value(b'{"a\\"b') is None  # inside a name
    assert open_value(b"") == ((), b"")
    assert item_pattern(("u", 3, "eco")) == ("u", None, "eco") and item_pattern(("u", "eco")) is None
    assert matches(("u", None, "eco"), ("u", 7, "eco")) and not matches(("u", None, "eco"), ("u", "x", "eco"))


def test_a_family_broken_in_one_item_is_held_in_every_item():
    # two items break the list; the last one is rewritten first (held there), and from then on the
    # same place of any item is held: the first item's rewrite writes the second item listed too
    c = written(ITEMS, b'{"updates":[{"eco":"x"},{"eco":"y"}]}')
    c.rollback(c.verdict())
    assert c.text == b'{"updates":[{"eco":"x"},{"eco":'
    for piece in b'"pip"}]}':
        c.accept(ID[bytes([piece])])
    c.accept(STOP)
    c.rollback(c.verdict())  # the first item now
    assert c.text == b'{"updates":[{"eco":'
    for piece in b'"npm"},{"eco":':
        c.accept(ID[bytes([piece])])
    # the second item, written again after the rollback, is held to the list (before: free again)
    assert allowed(c, FREE) == {b'"', b'"np', b'"pip'}
    # and right after a name, a token that would write the colon and the value at once is held too
    d = written(ITEMS, b'{"updates":[{"eco":"x"}]}')
    d.rollback(d.verdict())
    d.rollback(len(b'":'))
    assert d.text == b'{"updates":[{"eco'
    d.accept(ID[b'"'])
    assert allowed(d, [b":", b"x"]) == {b":"}


def test_tool_call_checks_hold_no_item_places():
    assert RollbackRules.item_places and not ToolCallRollbackRules.item_places
