"""The fidelity classifier's rules for string and number keywords (minLength, pattern, format,
multipleOf, ...): which xgrammar masks, which only validation detects, which llguidance would
enforce exactly. The rest of the walk: fidelity_walk.py.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from grammar.rewrites.formats import FORMAT_PATTERNS, pattern_for
from grammar.rewrites.string_algebra import leading_lookaheads
from grammar.validation.fidelity_report import (
    CHECKABLE_FORMATS,
    CHECKED,
    ENFORCED,
    KEYWORD_TYPES,
    MASKED_FORMATS,
    UNENFORCED,
)


def classify_scalar_keyword(node: dict, keyword: str, types: set[str] | None, mark) -> None:
    """Mark one string or number keyword of `node` (`types`: its allowed JSON types, None when
    undeclared) through `mark(keyword, status, reason, exact_in_llguidance=...)`."""
    applies_to = KEYWORD_TYPES[keyword]
    if types is not None and not types & set(applies_to):
        return  # the keyword cannot apply to any allowed type (JSON Schema ignores it too)
    if keyword == "multipleOf" and not _binary_fraction(node[keyword]):
        mark(
            keyword,
            CHECKED,
            f"multipleOf {node[keyword]!r} is not a binary fraction: jsonschema (like most "
            "validators) divides in floating point and refuses some of its exact multiples "
            "(19.99 is not a multiple of 0.01 there), so no mask can promise a value it accepts; "
            "use an integer or a power-of-two fraction (0.5, 0.25), or best effort",
        )
    elif types is None:
        mark(
            keyword,
            CHECKED,
            f"{keyword} is masked only under a declared type ({' or '.join(applies_to)}); add one beside it",
            exact_in_llguidance=True,
        )
    elif keyword == "pattern" and leading_lookaheads(node[keyword]) is not None:
        mark(
            keyword,
            CHECKED,
            "xgrammar has no lookahead (it would enforce the pattern without it); llguidance "
            "enforces lookaheads that open an anchored pattern, on the way through closed "
            "objects and arrays, with printable ASCII values",
            exact_in_llguidance=True,
        )
    elif keyword in ("minLength", "maxLength") and ("pattern" in node or "format" in node):
        mark(
            keyword,
            CHECKED,
            f"{keyword} is ignored beside {'pattern' if 'pattern' in node else 'format'}; "
            "write the length into the pattern (e.g. ^[a-z]{1,5}$)",
            exact_in_llguidance="pattern" in node and "format" not in node,
        )
    elif keyword == "multipleOf" and ("number" in types or _one_sided_range(node) or not _whole(node[keyword])):
        mark(
            keyword,
            CHECKED,
            "multipleOf is masked only for type integer with a whole divisor (xgrammar ignores "
            "2.5), and not beside a one-sided range (give both a lower and an upper bound, or "
            "neither)",
            exact_in_llguidance=True,
        )
    elif keyword == "format" and pattern_for(node) is not None:
        mark(keyword, ENFORCED, f"format {node['format']!r} is compiled as its pattern")
    elif keyword == "format" and (node["format"] not in MASKED_FORMATS or node["format"] in FORMAT_PATTERNS):
        # a format compiled as its pattern, beside a pattern of its own, is left to the engine's
        # built-in mask, which admits values the format does not (an ipv4 octet with a leading zero)
        fmt = node["format"]
        if fmt in CHECKABLE_FORMATS:
            mark(keyword, CHECKED, f"format {fmt!r} is not masked; it is checked after generation")
        else:
            mark(keyword, UNENFORCED, f"format {fmt!r} is neither masked nor checkable here")
    else:
        mark(keyword, ENFORCED)


def _binary_fraction(divisor: Any) -> bool:
    """Is `divisor` exactly the decimal it is written as (an integer, 0.5, 0.25, 2.5)? Then the
    exact multiples an engine writes are exact floats too, and jsonschema's float division finds
    them whole; 0.01 is not (19.99 / 0.01 == 1998.9999999999998)."""
    if not isinstance(divisor, float):
        return True  # an integer (or an invalid divisor, refused before this)
    return math.isfinite(divisor) and Fraction(divisor) == Fraction(repr(divisor))


def _whole(divisor: Any) -> bool:
    return not isinstance(divisor, float) or divisor.is_integer()


def _one_sided_range(node: dict) -> bool:
    low = "minimum" in node or "exclusiveMinimum" in node
    high = "maximum" in node or "exclusiveMaximum" in node
    return low != high
