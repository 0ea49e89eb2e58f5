"""`format: byte` compiled as its base64 pattern (grammar/formats.py): the pattern accepts exactly
the strings Python's strict base64 decoder accepts, and both engines'
masks refuse what is not base64; with a pattern of its own the format stays unenforced."""

from __future__ import annotations

import base64
import binascii
import itertools
import re

import pytest

from grammar import GrammarSpec
from grammar.fidelity import ENFORCED, LLGUIDANCE, UNENFORCED, XGRAMMAR, routed_schema_fidelity, schema_fidelity
from grammar.formats import BASE64, lower_formats
from grammar.llg_matcher import LLGuidanceHandle
from tests.test_fidelity_classifier import grammar_accepts
from tests.test_llguidance_fidelity import writes

BYTES = {"type": ["string", "null"], "format": "byte"}  # as Kubernetes writes a []byte field


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)  # as Go's StdEncoding (Kubernetes): unused bits may be set
        return True
    except (binascii.Error, ValueError):
        return False


def test_the_pattern_is_exactly_strict_base64():
    alphabet = "Az09+/=-_ \n"
    for n in range(7):
        for chars in itertools.product(alphabet, repeat=n) if n <= 4 else []:
            text = "".join(chars)
            assert bool(re.fullmatch(BASE64, text)) == _is_base64(text), text
    for data in (b"", b"a", b"ab", b"abc", bytes(range(256))):
        assert re.fullmatch(BASE64, base64.b64encode(data).decode())


def test_byte_is_enforced_by_xgrammar():
    report = routed_schema_fidelity(BYTES)
    assert report.engine == XGRAMMAR and report.guaranteed
    entry = next(k for k in report.keywords if k.keyword == "format")
    assert entry.status == ENFORCED and "pattern" in entry.reason
    for good in ('"QUJD"', '"QUI="', '""', "null"):
        assert grammar_accepts(BYTES, good), good
    for bad in ('"QUJ"', '"Q==="', '"QU JD"', '"QUJD\\n"'):
        assert not grammar_accepts(BYTES, bad), bad


def test_byte_beside_a_pattern_stays_unenforced():
    schema = {"type": "string", "format": "byte", "pattern": "^[A-Z]+$"}
    assert lower_formats(schema) == schema
    assert [(k.keyword, k.status) for k in schema_fidelity(schema).not_masked] == [("format", UNENFORCED)]


def test_byte_under_llguidance(service, tokenizer):
    # a scalar keyword without a declared type routes the schema to llguidance
    schema = {"type": "object", "required": ["data", "n"],
              "properties": {"data": BYTES, "n": {"minimum": 1}}}
    report = routed_schema_fidelity(schema)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"data":"QUI=","n":1}')
    assert not writes(handle, tokenizer, '{"data":"QUI","n":1}')
    assert not writes(handle, tokenizer, '{"data":"QUI=","n":0}')
