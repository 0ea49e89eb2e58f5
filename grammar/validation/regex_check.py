"""Regex checks: a pattern is refused with Python's precise message, or xgrammar's when only
xgrammar (whose dialect is the one that decides) refuses it."""

from __future__ import annotations

import re
from typing import Any

import xgrammar

from grammar.errors import GrammarSpecError, xgrammar_message
from grammar.rewrites.string_algebra import leading_lookaheads as lookahead_form
from grammar.schema.limits import check_json_limits


def validate_regex(
    pattern: Any, *, param: str | None = "regex", pointer: str = "", leading_lookaheads: bool = False
) -> None:
    """Refuse a pattern that is not a string, or that Python or xgrammar cannot parse.

    Python's `re` runs first for its precise messages; xgrammar (an ECMAScript-like dialect
    without lookaround or backreferences) decides what is actually supported. With
    `leading_lookaheads` (a schema's `pattern`), lookaheads that open an anchored pattern are
    let through: llguidance enforces them (grammar/rewrites/string_algebra.py), xgrammar compiles the rest.
    """
    if not isinstance(pattern, str):
        raise GrammarSpecError(f"regex must be a string, got {type(pattern).__name__}", pointer, param)
    check_json_limits(pattern, param=param)
    try:
        re.compile(pattern)
    except re.error as e:
        if _xgrammar_regex_error(pattern) is not None:  # both refuse: Python says it best
            where = f" at position {e.pos}" if e.pos is not None else ""
            raise GrammarSpecError(f"invalid regex {pattern!r}: {e.msg}{where}", pointer, param) from None
        return  # valid in xgrammar's dialect, which is the one that matters
    except (RecursionError, OverflowError) as e:  # pathological nesting / counts
        raise GrammarSpecError(f"regex {pattern!r} is too complex: {e}", pointer, param) from None
    form = lookahead_form(pattern) if leading_lookaheads else None
    problem = _xgrammar_regex_error(pattern if form is None else form.without())
    if problem is not None:
        raise GrammarSpecError(f"regex {pattern!r} is not supported: {problem}", pointer, param)


_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f", "\v": "\\v"}


def escaped_controls(pattern: str) -> str:
    """`pattern` with each raw control character written as its escape (`\\n` for a line feed):
    the same regex, which xgrammar can read. Its regex-to-EBNF step refuses a raw line feed in a
    character class, as GitHub's workflow schema writes `(.|[\\r\\n])*` in JSON ("Character class
    should not contain newline")."""
    if not any(ch < " " for ch in pattern):
        return pattern
    out, escaping = [], False
    for ch in pattern:
        if ch < " ":
            escape = _CONTROL_ESCAPES.get(ch, f"\\x{ord(ch):02x}")
            out.append(escape[1:] if escaping else escape)  # after a lone `\`, only the letter
            escaping = False
            continue
        out.append(ch)
        escaping = ch == "\\" and not escaping
    return "".join(out)


def optional_groups_counted(pattern: str) -> str:
    """`pattern` with each optional group `(...)?` written `(...){0,1}`: the same regex, which
    xgrammar 0.2.9 reads right. Its regex-to-EBNF step makes the group's first item optional on
    its own when the group ends in a repeat: `1(xy+)?` takes `1yy`, and the semantic-version
    pattern `...(-[0-9A-Za-z.-]+)?$` took `2.1.1.1.0`, so the mask let out values the pattern
    refuses. A lazy or possessive `)??` / `)?+` is left as written."""
    if ")?" not in pattern:
        return pattern
    out: list[str] = []
    escaping = in_class = False
    n = len(pattern)
    for i, ch in enumerate(pattern):
        if escaping:
            escaping = False
        elif ch == "\\":
            escaping = True
        elif in_class:
            in_class = ch != "]" or (out and out[-1] == "[")  # `[]...]`: a leading `]` is a member
        elif ch == "[":
            in_class = True
        elif (
            ch == "?"
            and out
            and out[-1] == ")"
            and not _escaped_at(pattern, i - 1)
            and (i + 1 >= n or pattern[i + 1] not in "?+")
        ):
            out.append("{0,1}")
            continue
        out.append(ch)
    return "".join(out)


def _escaped_at(pattern: str, i: int) -> bool:
    """Is `pattern[i]` preceded by an odd run of backslashes (written as a literal)?"""
    run = 0
    while i - 1 - run >= 0 and pattern[i - 1 - run] == "\\":
        run += 1
    return run % 2 == 1


def xgrammar_regex(pattern: str) -> str:
    """`pattern` as xgrammar must be given it to enforce exactly that regex."""
    return optional_groups_counted(escaped_controls(pattern))


def _xgrammar_regex_error(pattern: str) -> str | None:
    """xgrammar's complaint about `pattern`, or None if it parses."""
    try:
        xgrammar.Grammar.from_regex(xgrammar_regex(pattern))
    except (RuntimeError, ValueError) as e:
        return xgrammar_message(e)
    return None
