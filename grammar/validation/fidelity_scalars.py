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
    KEYWORD_TYPES,
    MASKED_FORMATS,
)


def classify_scalar_keyword(node: dict, keyword: str, types: set[str] | None, mark) -> None:
    """Mark one string or number keyword of `node` (`types`: its allowed JSON types, None when
    undeclared) through `mark(keyword, rule, **fields)`: the keyword table's row that keeps it
    (grammar/validation/keywords/), "" where the engine masks it plainly."""
    applies_to = KEYWORD_TYPES[keyword]
    if types is not None and not types & set(applies_to):
        return  # the keyword cannot apply to any allowed type (JSON Schema ignores it too)
    if keyword == "multipleOf" and not _binary_fraction(node[keyword]):
        mark(keyword, "multipleOf.float_division", divisor=node[keyword])
    elif types is None:
        mark(keyword, "scalar.untyped", types=" or ".join(applies_to))
    elif keyword == "pattern" and leading_lookaheads(node[keyword]) is not None:
        mark(keyword, "pattern.lookahead")
    elif keyword in ("minLength", "maxLength") and ("pattern" in node or "format" in node):
        mark(keyword, "length.beside_format" if "format" in node else "length.beside_pattern")
    elif keyword == "multipleOf" and ("number" in types or _one_sided_range(node) or not _whole(node[keyword])):
        mark(keyword, "multipleOf.not_integer")
    elif keyword == "format" and pattern_for(node) is not None:
        mark(keyword, "format.pattern", format=node["format"])
    elif keyword == "format" and (node["format"] not in MASKED_FORMATS or node["format"] in FORMAT_PATTERNS):
        # a format compiled as its pattern, beside a pattern of its own, is left to the engine's
        # built-in mask, which admits values the format does not (an ipv4 octet with a leading zero)
        fmt = node["format"]
        mark(keyword, "format.checked" if fmt in CHECKABLE_FORMATS else "format.unknown", format=fmt)
    else:
        mark(keyword)


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
