"""`format: byte` compiled as its base64 pattern (grammar/rewrites/formats.py): the pattern accepts exactly
the strings Python's strict base64 decoder accepts, and both engines'
masks refuse what is not base64; with a pattern of its own the format stays unenforced.

`ipv4`, `ipv6` and `date` compiled as exact patterns (issue #16: xgrammar's own ipv4 mask admits
`000.000.000.0`, which jsonschema's format checker refuses): each pattern accepts exactly what the
checker accepts, and both engines' masks refuse the values xgrammar's built-in masks let through."""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import random
import re

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.rewrites.formats import BASE64, DATE, IPV4, IPV6, lower_formats
from grammar.validation.fidelity import (
    CHECKED,
    ENFORCED,
    LLGUIDANCE,
    UNENFORCED,
    XGRAMMAR,
    routed_schema_fidelity,
    schema_fidelity,
)
from tests.grammar.validation.fidelity_cases import grammar_accepts
from tests.grammar.validation.test_llguidance_fidelity import writes

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
    schema = {"type": "object", "required": ["data", "n"], "properties": {"data": BYTES, "n": {"minimum": 1}}}
    report = routed_schema_fidelity(schema)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"data":"QUI=","n":1}')
    assert not writes(handle, tokenizer, '{"data":"QUI","n":1}')
    assert not writes(handle, tokenizer, '{"data":"QUI=","n":0}')


# ==== ipv4, ipv6, date: exact patterns ===============================================================

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER  # what output validation checks with
EXACT = {"ipv4": IPV4, "ipv6": IPV6, "date": DATE}
# (format, valid, violating): each violating value is one xgrammar's built-in mask admits
EXACT_CASES = [
    (
        "ipv4",
        ["1.2.3.4", "0.0.0.0", "255.255.255.255", "10.0.200.9"],
        ["000.000.000.0", "01.2.3.4", "1.2.3.04", "00.0.0.0"],
    ),
    (
        "ipv6",
        ["::", "::1", "1:2:3:4:5:6:7:8", "fe80::a:0BCD", "1:2:3:4:5:6:7::", "::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4"],
        ["::ffff:01.2.3.4", "::ffff:1.2.3.00"],
    ),
    (
        "date",
        ["2024-02-29", "2000-02-29", "2023-12-31", "0001-01-01", "9999-12-31"],
        ["2023-02-29", "1900-02-29", "2023-04-31", "2023-02-30", "0000-01-01"],
    ),
]


def test_the_exact_patterns_accept_what_jsonschema_accepts():
    octets = ["0", "00", "000", "01", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "999", ""]
    for combo in itertools.product(octets, repeat=4):
        text = ".".join(combo)
        assert bool(re.fullmatch(IPV4, text)) == CHECKER.conforms(text, "ipv4"), text
    rnd = random.Random(16)
    parts = ["0", "1", "ab", "FFFF", "0000", "12345", "g", "", "1.2.3.4", "01.2.3.4", "256.1.1.1"]
    for _ in range(20000):
        text = ":".join(rnd.choice(parts) for _ in range(rnd.randint(1, 10)))
        if rnd.random() < 0.5:
            at = rnd.randint(0, len(text))
            text = text[:at] + ":" + text[at:]
        assert bool(re.fullmatch(IPV6, text)) == CHECKER.conforms(text, "ipv6"), text
    for year in range(0, 10000, 4):  # every leap-year candidate, and the year after it
        for y in (year, year + 1):
            text = f"{y:04d}-02-29"
            assert bool(re.fullmatch(DATE, text)) == CHECKER.conforms(text, "date"), text
    for y in ("0000", "0001", "1900", "2000", "2023", "2024", "9999"):
        for month in range(14):
            for day in range(33):
                text = f"{y}-{month:02d}-{day:02d}"
                assert bool(re.fullmatch(DATE, text)) == CHECKER.conforms(text, "date"), text


@pytest.mark.parametrize("fmt,valid,violating", EXACT_CASES, ids=[c[0] for c in EXACT_CASES])
def test_exact_formats_are_enforced_by_xgrammar(fmt, valid, violating):
    schema = {"type": "string", "format": fmt}
    assert lower_formats(schema) == {"type": "string", "pattern": EXACT[fmt]}
    report = routed_schema_fidelity(schema)
    assert report.engine == XGRAMMAR and report.guaranteed
    entry = next(k for k in report.keywords if k.keyword == "format")
    assert entry.status == ENFORCED and "pattern" in entry.reason
    for text in valid:
        assert CHECKER.conforms(text, fmt) and grammar_accepts(schema, f'"{text}"'), text
    for text in violating:
        assert not CHECKER.conforms(text, fmt), text
        assert not grammar_accepts(schema, f'"{text}"'), text


@pytest.mark.parametrize("fmt,valid,violating", EXACT_CASES, ids=[c[0] for c in EXACT_CASES])
def test_exact_formats_under_llguidance(service, tokenizer, fmt, valid, violating):
    schema = {
        "type": "object",
        "required": ["v", "n"],
        "properties": {"v": {"type": "string", "format": fmt}, "n": {"minimum": 1}},
    }
    assert routed_schema_fidelity(schema).engine == LLGUIDANCE
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle)
    for text in valid:
        assert writes(handle, tokenizer, f'{{"v":"{text}","n":1}}'), text
    for text in violating:
        assert not writes(handle, tokenizer, f'{{"v":"{text}","n":1}}'), text


def test_the_shortest_ipv4_is_valid(service, tokenizer):
    """The closing planner's shortest completion was `000.000.000.0` under xgrammar's own mask."""
    schema = {
        "type": "object",
        "properties": {"ip": {"type": "string", "format": "ipv4"}, "day": {"type": "string", "format": "date"}},
        "required": ["ip", "day"],
        "additionalProperties": False,
    }
    plan = service.compile(GrammarSpec.json_schema(schema)).new_matcher().completion_plan()
    value = json.loads(tokenizer.decode(plan))
    assert jsonschema.Draft202012Validator(schema, format_checker=CHECKER).is_valid(value), value


def test_an_exact_format_beside_a_pattern_is_checked_not_enforced():
    schema = {"type": "string", "format": "ipv4", "pattern": "^10\\."}
    assert lower_formats(schema) == schema
    assert [(k.keyword, k.status) for k in schema_fidelity(schema).not_masked] == [("format", CHECKED)]
