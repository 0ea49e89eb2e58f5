"""The fidelity report's types and vocabulary: each JSON schema keyword at its pointer is
`enforced` (a mask keeps it), `checked` (validation after generation detects a break) or
`unenforced`; `with_rollback` turns `checked` into check-and-roll-back's `enforced`. The rules that
decide which: grammar/validation/fidelity_walk.py; what each way of keeping a keyword makes of its
entry (status, engine, reason): the keyword table's row (grammar/validation/keywords/, read by
`keyword_entry`; docs/keywords.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema

from grammar.schema.keyword_sets import (  # noqa: F401 -- the report's vocabulary, re-exported
    ARRAY_KEYWORDS,
    COMBINATORS,
    KEYWORD_TYPES,
    NUMBER_KEYWORDS,
    OBJECT_KEYWORDS,
    STRING_KEYWORDS,
    VALIDATION_KEYWORDS,
)
from grammar.validation.keywords import DEFAULT_RULES, ROWS

ENFORCED, CHECKED, UNENFORCED = "enforced", "checked", "unenforced"
XGRAMMAR, LLGUIDANCE = "xgrammar", "llguidance"  # the engines that compile JSON schemas
VALUE_CHECK = "value_check"  # Jumpgate's own mask over repeated names and items (grammar/checks/value_check.py)
ROLLBACK = "check_and_rollback"  # the finished output checked, a failing value rewritten (grammar/checks/rollback.py)
DUPLICATE_KEYS = "duplicate keys"  # the pseudo-keyword under which the open-object risk is reported
# Formats whose shape xgrammar 0.2.9 masks (a malformed value is refused by the grammar).
MASKED_FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
        "json-pointer",
        "relative-json-pointer",
    }
)
# Formats jsonschema can check after generation, with the packages installed here.
CHECKABLE_FORMATS = frozenset(jsonschema.FormatChecker().checkers)


@dataclass(frozen=True)
class KeywordFidelity:
    pointer: str  # JSON pointer of the keyword itself (for DUPLICATE_KEYS: of its object schema)
    keyword: str
    status: str  # ENFORCED, CHECKED or UNENFORCED
    reason: str = ""
    engine: str = XGRAMMAR  # whose mask the status is about
    # xgrammar approximates this keyword where llguidance enforces it exactly
    exact_in_llguidance: bool = field(default=False, compare=False)
    rule: str = field(default="", compare=False)  # the keyword table's row that keeps it ("": masked plainly)

    def as_dict(self) -> dict[str, str]:
        out = {"pointer": self.pointer, "keyword": self.keyword, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.engine != XGRAMMAR:
            out["engine"] = self.engine
        return out


# How each means of the keyword table reads in an entry before routing and rollback: its status,
# whose mask it is about, and whether llguidance's mask would keep it exactly.
_KEPT = {
    XGRAMMAR: (ENFORCED, XGRAMMAR, False),
    LLGUIDANCE: (CHECKED, XGRAMMAR, True),
    VALUE_CHECK: (ENFORCED, VALUE_CHECK, False),
    ROLLBACK: (CHECKED, XGRAMMAR, False),
    CHECKED: (CHECKED, XGRAMMAR, False),
    UNENFORCED: (UNENFORCED, XGRAMMAR, False),
}
# keyword -> the table's rule for a keyword no engine masks, where nothing more specific applies
NEVER_MASKED = DEFAULT_RULES


def keyword_entry(pointer: str, keyword: str, rule: str = "", **fields: Any) -> KeywordFidelity:
    """The entry for `keyword` at `pointer` kept as the keyword table's row `rule` says: its status,
    engine and reason (the row's template, filled with `keyword` and `fields`); "" is a keyword the
    engine masks plainly."""
    if not rule:
        return KeywordFidelity(pointer, keyword, ENFORCED)
    row = ROWS[rule]
    status, engine, exact = _KEPT[row.kept_by]
    reason = row.reason.format(keyword=keyword, **fields)
    return KeywordFidelity(pointer, keyword, status, reason, engine=engine, exact_in_llguidance=exact, rule=rule)


@dataclass(frozen=True)
class FidelityReport:
    keywords: tuple[KeywordFidelity, ...] = ()
    engine: str = XGRAMMAR  # the engine that compiles the schema

    @property
    def not_masked(self) -> tuple[KeywordFidelity, ...]:
        """Every keyword the mask does not enforce (what strict mode has to refuse or flag)."""
        return tuple(k for k in self.keywords if k.status != ENFORCED)

    @property
    def refused_in_strict(self) -> tuple[KeywordFidelity, ...]:
        """What strict mode refuses: everything not masked except the duplicate-key risk."""
        return tuple(k for k in self.not_masked if k.keyword != DUPLICATE_KEYS)

    @property
    def guaranteed(self) -> bool:
        return not self.not_masked

    def as_dict(self) -> dict[str, Any]:
        counts = {status: sum(k.status == status for k in self.keywords) for status in (ENFORCED, CHECKED, UNENFORCED)}
        out = {"guaranteed": self.guaranteed, "counts": counts, "keywords": [k.as_dict() for k in self.keywords]}
        if self.engine != XGRAMMAR:
            out["engine"] = self.engine
        return out


def uses_rollback(report: FidelityReport | None) -> bool:
    """Does the report count on check-and-roll-back for some keyword?"""
    return report is not None and any(k.engine == ROLLBACK for k in report.keywords)


def needs_rollback(report: FidelityReport) -> bool:
    """Does the report leave keywords (besides the duplicate-key risk) to validation alone?"""
    return any(k.status == CHECKED and k.keyword != DUPLICATE_KEYS for k in report.keywords)


def with_rollback(report: FidelityReport, retries: int) -> FidelityReport:
    """The report once check-and-roll-back keeps the `checked` keywords (those validation after
    generation detects): `enforced`, engine ROLLBACK. No output breaks them: a value that does is
    rewritten, and a strict request whose rewrites run out fails instead of answering."""
    why = (
        f"checked when the output is whole; a value that breaks it is rolled back and written again (at most "
        f"{retries} times, then a strict request fails with value_retries_exhausted)"
    )
    return replace(
        report,
        keywords=tuple(
            replace(k, status=ENFORCED, engine=ROLLBACK, reason=f"{k.reason}; {why}" if k.reason else why)
            if k.status == CHECKED and k.keyword != DUPLICATE_KEYS
            else k
            for k in report.keywords
        ),
    )
