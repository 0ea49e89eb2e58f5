"""The fidelity report's types and vocabulary: each JSON schema keyword at its pointer is
`enforced` (a mask keeps it), `checked` (validation after generation detects a break) or
`unenforced`; `with_rollback` turns `checked` into check-and-roll-back's `enforced`. The rules that
decide which: grammar/validation/fidelity_walk.py (docs/structured-output.md, docs/keywords.md).
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

ENFORCED, CHECKED, UNENFORCED = "enforced", "checked", "unenforced"
XGRAMMAR, LLGUIDANCE = "xgrammar", "llguidance"  # the engines that compile JSON schemas
VALUE_CHECK = "value_check"  # Jumpgate's own mask over repeated names and items (grammar/checks/value_check.py)
ROLLBACK = "check_and_rollback"  # the finished output checked, a failing value rewritten (grammar/checks/rollback.py)
DUPLICATE_KEYS = "duplicate keys"  # the pseudo-keyword under which the open-object risk is reported
OMITTED = (
    "no listed value satisfies the property's other keywords, so it is valid only when absent: the "
    "object is closed and the grammar leaves it out"
)

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

NEVER_MASKED = {
    "uniqueItems": "uniqueItems is not masked: an array may repeat an item",
    "contains": "contains is not masked: an array need not hold a matching item",
    "minContains": "minContains is not masked",
    "maxContains": "maxContains is not masked",
    "not": "not is not masked: a value the sub-schema describes can be generated",
    "if": "if/then/else is not masked: the conditional branch is not applied",
    "then": "if/then/else is not masked: the conditional branch is not applied",
    "else": "if/then/else is not masked: the conditional branch is not applied",
    "dependentRequired": "dependentRequired is not masked: a dependent property may be left out",
    "dependentSchemas": "dependentSchemas is not masked",
    "dependencies": "dependencies is not masked",
    "patternProperties": "patternProperties is not masked (xgrammar mis-handles names matching the patterns)",
}
NAMES_CHECKED = (
    "enforced by Jumpgate's value check: a token that would close a name already written in "
    "the same object is masked out"
)
VALUE_CHECKED = {
    "uniqueItems": "enforced by Jumpgate's value check: a token that would complete an item equal to an earlier "
    "one, or leave an object item no way to end unlike every earlier one, is masked out",
    "dependentRequired": "enforced by Jumpgate's value check: the object cannot close, nor skip past a missing "
    "dependent name, while a written name's dependents are missing",
}


@dataclass(frozen=True)
class KeywordFidelity:
    pointer: str  # JSON pointer of the keyword itself (for DUPLICATE_KEYS: of its object schema)
    keyword: str
    status: str  # ENFORCED, CHECKED or UNENFORCED
    reason: str = ""
    engine: str = XGRAMMAR  # whose mask the status is about
    # xgrammar approximates this keyword where llguidance enforces it exactly
    exact_in_llguidance: bool = field(default=False, compare=False)

    def as_dict(self) -> dict[str, str]:
        out = {"pointer": self.pointer, "keyword": self.keyword, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.engine != XGRAMMAR:
            out["engine"] = self.engine
        return out


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
