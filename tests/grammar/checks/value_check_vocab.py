"""The small hand-made vocabulary the value check's unit tests run on, and what the check masks
out after a given text. The real vocabulary and grammars: tests/grammar/checks/test_value_check_matcher.py."""

from __future__ import annotations

import math

import torch

from grammar.checks.value_check import ValueCheck
from grammar.checks.value_rules import SchemaNavigator
from grammar.checks.value_text import ValueCheckVocab

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
