"""How faithfully a compiled JSON schema is kept: each keyword, at its JSON pointer, is

- `enforced`: xgrammar's token mask admits no output that breaks it (or, with engine
  "value_check", Jumpgate's value check does: grammar/checks/value_check.py masks out every token that
  would complete a repeated object name or a repeated item of a `uniqueItems` array (or, for
  object items, leave the item no way to end unlike the earlier ones), or close an object whose
  `dependentRequired` names are missing);
- `checked`: the mask may let a violation through, but validation after generation (jsonschema
  with its format checker, plus Jumpgate's duplicate-key check) detects it;
- `unenforced`: neither (a `format` that xgrammar does not mask and jsonschema cannot check).

The rules below were established against xgrammar 0.2.9 itself (a violating instance fed to a
GrammarMatcher, one per rule: tests/grammar/validation/test_fidelity_classifier.py keeps them honest):
- siblings beside `$ref`, `anyOf`, `oneOf` or `allOf` are dropped; `allOf` with more than one
  branch compiles as "any JSON value", except where grammar/rewrites/all_of.py writes it as the one object
  schema it equals (branches of only type, properties, required, min/maxProperties); `oneOf` is compiled as `anyOf`, so it is exact only where
  grammar/rewrites/one_of.py proves it equal to the `anyOf` of exclusive branches (which both engines then
  compile): distinct consts, a const discriminator, or JSON types (a type several unconstrained
  branches share is taken out of them: Kubernetes' `[string|null, integer|null]` is `string|integer`);
- `format: byte` (base64), and `ipv4`, `ipv6` and `date` (exactly what jsonschema's checker
  accepts: xgrammar's own masks for them admit more) are compiled as their patterns where the
  node has no pattern of its own (grammar/rewrites/formats.py); beside one, such a format is checked after
  generation, not enforced;
- beside `enum`/`const`, only the listed values are generated (other keywords are ignored), so
  the listed values that break the other keywords are left out first (grammar/rewrites/listed_values.py);
  where none is left, an optional property of a closed object (additionalProperties false, or
  the root in strict mode) is left out of the grammar, as it is valid only when absent;
- string keywords (minLength, pattern, format, ...) and number keywords act only under a declared
  `type`; minLength/maxLength are dropped beside `pattern` or `format`; `multipleOf` only for
  integers, with a whole divisor (xgrammar ignores `multipleOf: 2.5` under `type: integer`);
- a `multipleOf` that is not a binary fraction (0.01, 0.1) is exact in no engine: jsonschema (like
  most validators) divides in floating point and refuses some of its exact decimal multiples
  (19.99 for 0.01), which llguidance's exact decimal mask writes;
- `uniqueItems`, `contains` (+ min/maxContains), `not`, `if`/`then`/`else`, `dependentRequired`,
  `dependentSchemas`, `dependencies`, `patternProperties`, and `required` naming an undeclared
  property are not masked;
- names of additional properties may repeat (the grammar has no memory of names written).

Where every keyword xgrammar would not mask is one llguidance enforces exactly (marked as such
below: minLength/maxLength beside `pattern`, `multipleOf` (a binary fraction) on numbers or not
whole, keywords beside anyOf/allOf/$ref, allOf with several branches, scalar keywords without a
declared type, `required` naming an undeclared property, `if`/`then`/`else` on a discriminator,
alone or as an object's `allOf` of conditionals on one listed property: grammar/rewrites/conditionals.py;
`patternProperties` whose patterns no name can match two of, a `not` that says which names are
absent: grammar/rewrites/negation.py; a `pattern` that opens with lookaheads, or a string's `not` of patterns or
listed strings: grammar/rewrites/string_algebra.py) and
llguidance compiles the schema
without error or warning, the
schema is compiled by llguidance instead (`routed_schema_fidelity`); those keywords are then
`enforced` with engine "llguidance" (tests/grammar/validation/test_llguidance_fidelity.py feeds violations to its
matcher). Reports without an `engine` are xgrammar's.

The value check is the exact, cheaper form of check-and-roll-back for these keywords: the token
that would complete the repeat is never sampled. It runs for the json_schema and json_object
kinds and, for names only (it has no schema there), in tool-call arguments. So names of additional
properties are `enforced` (unless `propertyNames` limits the names: a name that cannot grow may
leave no way on); for json_schema also `uniqueItems` `enforced` where the items are free strings, unbounded
numbers, listed values, or closed objects (strict mode or additionalProperties: false) whose properties are
all free strings, unbounded numbers or listed values, that `minItems` does not exhaust (grammar/checks/value_rules.py,
`unique_items_exact`, `ObjectItems`), and `dependentRequired` where the object's names are closed and declared
and every dependent is required or declared after its trigger (`dependent_required_exact`);
elsewhere they stay `checked`.

Strict mode promises that every output fits, so it accepts only `enforced`: `checked` guarantees
detection, not validity. For a JSON schema (`response_format`) the grammar service turns `checked`
into `enforced` with engine ROLLBACK (`with_rollback`): the finished output is validated and a
failing value rewritten (grammar/checks/rollback.py), and a strict request whose rewrites run out
fails rather than answer; tool parameters are not checked whole, so there `checked` stays refused.
Only the duplicate-key risk is let through in strict mode, reported and
counted, because refusing it would refuse every open object of a tool (`{"type": "object"}`),
which tools use widely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Iterable

import jsonschema

from grammar.checks.value_rules import (
    SchemaNavigator,
    dependent_required_exact,
    names_only_dependencies,
    required_conditional,
    strict_closes,
    unique_items_exact,
)
from grammar.errors import join_pointer
from grammar.rewrites.all_of import distributed_any_of, merged_all_of, partly_merged_all_of
from grammar.rewrites.conditionals import allof_conditionals, discriminator
from grammar.rewrites.formats import FORMAT_PATTERNS, pattern_for
from grammar.rewrites.listed_values import fitting_values, omitted_properties
from grammar.rewrites.negation import negation
from grammar.rewrites.one_of import exclusive_branches
from grammar.rewrites.string_algebra import excluded_strings, leading_lookaheads

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

STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "format")
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
ARRAY_KEYWORDS = (
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
)
OBJECT_KEYWORDS = (
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
)
COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
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
# Validation keywords (2020-12 plus drafts 4-7); any other keyword is an annotation or unknown and
# does not change which values are valid.
VALIDATION_KEYWORDS = frozenset(
    ("type", "enum", "const")
    + STRING_KEYWORDS
    + NUMBER_KEYWORDS
    + ARRAY_KEYWORDS
    + OBJECT_KEYWORDS
    + COMBINATORS
    + ("not", "if", "then", "else")
)
_KEYWORD_TYPES = {**{k: ("string",) for k in STRING_KEYWORDS}, **{k: ("integer", "number") for k in NUMBER_KEYWORDS}}


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


def schema_fidelity(schema: Any, *, strict: bool = True, pointer: str = "", value_check: bool = True) -> FidelityReport:
    """Classify every validation keyword of `schema` (already validated; pointers under `pointer`);
    `value_check`: the output is followed by Jumpgate's value check (json_schema, json_object)."""
    return FidelityReport(tuple(_walk(schema, pointer, strict, value_check)))


def routed_schema_fidelity(schema: Any, *, strict: bool = True, rollback: bool = False) -> FidelityReport:
    """The report of the engine that compiles `schema`: xgrammar's, unless llguidance enforces
    exactly every keyword xgrammar would not mask and compiles the schema cleanly. With
    `rollback` (check-and-roll-back will keep the `checked` keywords) llguidance is taken where it
    enforces some of them and the rest are `checked`: what a mask can keep is not left to rewrites."""
    report = schema_fidelity(schema, strict=strict)
    refused = report.refused_in_strict
    exact = [k.exact_in_llguidance for k in refused]
    if rollback:
        if not any(exact) or not all(e or k.status == CHECKED for e, k in zip(exact, refused)):
            return report
    elif not refused or not all(exact):
        return report
    from grammar.engines.llguidance.schema import llguidance_refusal  # only schemas that need it load llguidance

    if llguidance_refusal(schema, strict=strict) is not None:
        return report
    return FidelityReport(tuple(_under_llguidance(k) for k in report.keywords), engine=LLGUIDANCE)


def _under_llguidance(entry: KeywordFidelity) -> KeywordFidelity:
    if entry.exact_in_llguidance:
        return replace(
            entry,
            status=ENFORCED,
            engine=LLGUIDANCE,
            reason=f"enforced by llguidance (xgrammar would not: {entry.reason})",
        )
    if entry.engine == VALUE_CHECK:
        return entry  # the value check rides on either engine's matcher
    return replace(entry, engine=LLGUIDANCE) if entry.status == ENFORCED else entry


def tools_fidelity(tools: Iterable[Any]) -> FidelityReport:
    """One report for the parameters of every tool (pointers `/i/function/parameters/...`).

    A tool is strict unless its `function.strict` is false, as the tool-call grammar compiles it.
    """
    found: list[KeywordFidelity] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        params = function.get("parameters") or {}
        if isinstance(params, dict) and "type" not in params:
            params = {"type": "object", **params}  # as the grammar compiles it
        strict = function.get("strict") is not False
        found += _walk(
            params, join_pointer("", i, "function", "parameters"), strict, value_check=False, names_checked=True
        )
    return FidelityReport(tuple(found))


def spec_fidelity(kind: str, payload: Any, strict: bool = True, retries: int = 0) -> FidelityReport | None:
    """The report for a grammar spec's kind and payload; None for kinds without a schema.
    `retries` > 0: a JSON schema's or a tool's `checked` keywords are kept by check-and-roll-back
    with that many rewrites (for a JSON schema routing then prefers llguidance for the rest, and
    the report says so; tool calls compile with xgrammar)."""
    if kind == "json_schema":
        report = routed_schema_fidelity(payload, strict=strict, rollback=retries > 0)
        return with_rollback(report, retries) if retries and needs_rollback(report) else report
    if kind == "tool_calls" and isinstance(payload, dict):
        report = tools_fidelity(payload.get("tools") or [])
        return with_rollback(report, retries) if retries and needs_rollback(report) else report
    return None


# -- the walk --------------------------------------------------------------------------------


def _walk(
    schema: Any, pointer: str, strict: bool, value_check: bool, names_checked: bool = False
) -> list[KeywordFidelity]:
    """`value_check`: the whole value check follows this schema; `names_checked`: only its names
    (tool arguments: the check has no schema there)."""
    found: list[KeywordFidelity] = []
    stack: list[tuple[Any, str, str | None]] = [(schema, pointer, None)]  # (node, pointer, implied type)
    navigator = SchemaNavigator(schema, strict) if value_check else None
    while stack:
        node, here, implied = stack.pop()
        if not isinstance(node, dict):
            continue  # boolean schemas are exact
        entries, children = _classify_node(
            node, here, strict, implied, navigator, value_check or names_checked, root=node is schema, document=schema
        )
        found += entries
        stack.extend(reversed(children))
    return found


def _classify_node(
    node: dict,
    here: str,
    strict: bool,
    implied: str | None,
    navigator: SchemaNavigator | None,
    names_checked: bool,
    root: bool = False,
    document: Any = None,
):
    entries: list[KeywordFidelity] = []
    children: list[tuple[Any, str, str | None]] = []
    present = [k for k in node if k in VALIDATION_KEYWORDS]
    for name in ("$defs", "definitions"):  # reachable through $ref: classified where they are written
        if isinstance(node.get(name), dict):
            children += [(v, join_pointer(here, name, k), None) for k, v in node[name].items()]

    def mark(keyword: str, status: str, reason: str = "", exact_in_llguidance: bool = False) -> None:
        if status != ENFORCED and status != UNENFORCED:
            status = _checked_or_unenforced(node, keyword)
        entries.append(
            KeywordFidelity(
                join_pointer(here, keyword), keyword, status, reason, exact_in_llguidance=exact_in_llguidance
            )
        )

    combinator = next((k for k in COMBINATORS if k in node), None)
    if combinator is not None:
        return _classify_combinator(node, here, strict, combinator, present, mark, entries, children, document)
    if "enum" in node or "const" in node:
        return _classify_listed_values(node, here, present, mark, entries, children)

    types = _types(node, implied)
    for keyword in present:
        value = node[keyword]
        if keyword == "type":
            mark(keyword, ENFORCED)
        elif keyword in _KEYWORD_TYPES:
            _classify_scalar_keyword(node, keyword, types, mark)
        elif keyword in NEVER_MASKED:
            if keyword == "uniqueItems" and value is not True:
                continue  # uniqueItems: false asks nothing
            if keyword in ("then", "else") and "if" not in node:
                continue  # ignored by JSON Schema without `if`
            if keyword in ("if", "then", "else") and discriminator(node, None, document) is not None:
                mark(
                    keyword,
                    CHECKED,
                    NEVER_MASKED[keyword] + " by xgrammar; on a discriminator llguidance enforces it as anyOf branches",
                    exact_in_llguidance=True,
                )
                if keyword != "if":
                    children.append((value, join_pointer(here, keyword), None))
                continue
            # draft-7 `dependencies` of names, and `if` one name is present `then` others are, are
            # dependentRequired by another spelling (grammar/checks/value_rules.py: name_dependencies)
            spelled = (keyword == "dependencies" and names_only_dependencies(node) is not None) or (
                keyword in ("if", "then") and required_conditional(node) is not None
            )
            if (keyword in VALUE_CHECKED or spelled) and navigator is not None:
                why_not = (
                    unique_items_exact(node, navigator)
                    if keyword == "uniqueItems"
                    else dependent_required_exact(node, strict)
                )
                if why_not is None:
                    entries.append(
                        KeywordFidelity(
                            join_pointer(here, keyword),
                            keyword,
                            ENFORCED,
                            VALUE_CHECKED[keyword if not spelled else "dependentRequired"],
                            engine=VALUE_CHECK,
                        )
                    )
                else:
                    mark(keyword, CHECKED, why_not)
                continue
            if keyword == "not" and negation(value) is not None:
                # names absent (grammar/rewrites/negation.py): llguidance compiles it as `properties: {name:
                # false}`, which xgrammar refuses; the sub-schema itself is never generated
                mark(
                    keyword,
                    CHECKED,
                    NEVER_MASKED[keyword] + " by xgrammar; llguidance enforces this form "
                    "(names that must be absent) as properties that may not be written",
                    exact_in_llguidance=True,
                )
                continue
            if keyword == "not" and node.get("type") == "string" and excluded_strings(value) is not None:
                # a string's `not` of patterns or listed strings: a complement in llguidance's regexes
                # (grammar/rewrites/string_algebra.py); the sub-schema itself is never generated
                mark(
                    keyword,
                    CHECKED,
                    NEVER_MASKED[keyword] + " by xgrammar; llguidance enforces a string's `not` of "
                    "patterns or listed strings (as a regex complement), on the way through "
                    "closed objects and arrays, with printable ASCII values",
                    exact_in_llguidance=True,
                )
                continue
            if (
                keyword == "patternProperties"
                and isinstance(value, dict)
                and any(leading_lookaheads(k) is not None for k in value)
            ):
                # no engine's name regexes have lookaheads: the grammar writes the names without
                # them (grammar/rewrites/string_algebra.py), validation after generation keeps them
                mark(
                    keyword,
                    CHECKED,
                    NEVER_MASKED[keyword] + "; a name pattern that opens with lookaheads is "
                    "masked without them (no engine writes lookaheads in names)",
                )
                children += [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
                continue
            if keyword == "patternProperties" and isinstance(value, dict):
                # llguidance matches names against the patterns exactly (and refuses patterns two
                # of which a name could match, which then stay refused here)
                mark(
                    keyword,
                    CHECKED,
                    NEVER_MASKED[keyword] + "; llguidance enforces patterns that do not overlap",
                    exact_in_llguidance=True,
                )
                children += [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
                continue
            mark(keyword, CHECKED, NEVER_MASKED[keyword])
        elif keyword == "required":
            declared = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            undeclared = [n for n in value if n not in declared] if isinstance(value, list) else []
            if undeclared:
                names = ", ".join(map(str, undeclared))
                mark(
                    keyword,
                    CHECKED,
                    f"required names properties not declared in properties ({names}), which xgrammar does not force",
                    exact_in_llguidance=True,
                )
            else:
                mark(keyword, ENFORCED)
        elif keyword == "unevaluatedProperties":
            closed = strict or node.get("additionalProperties") is False
            mark(
                keyword,
                ENFORCED if closed else CHECKED,
                "" if closed else "unevaluatedProperties is not masked outside strict mode",
            )
        elif keyword == "unevaluatedItems":
            exact = value is False
            mark(keyword, ENFORCED if exact else CHECKED, "" if exact else "only unevaluatedItems: false is masked")
        elif keyword == "properties" and isinstance(value, dict):
            mark(keyword, ENFORCED)
            omitted = omitted_properties(node, strict=strict, root=root)
            for name in omitted:  # grammar/rewrites/listed_values.py leaves them out of the grammar
                entries += [
                    KeywordFidelity(join_pointer(here, keyword, name, k), k, ENFORCED, OMITTED)
                    for k in value[name]
                    if k in VALIDATION_KEYWORDS
                ]
            children += [c for c, name in zip(_subschemas(node, keyword, here), value) if name not in omitted]
        else:  # items, prefixItems, additionalProperties, min/maxItems, min/maxProperties, propertyNames
            mark(keyword, ENFORCED)
            children += _subschemas(node, keyword, here)
    if _allows_additional_names(node, types, strict):
        if names_checked and "propertyNames" not in node:
            entries.append(KeywordFidelity(here, DUPLICATE_KEYS, ENFORCED, NAMES_CHECKED, engine=VALUE_CHECK))
        else:
            entries.append(
                KeywordFidelity(
                    here,
                    DUPLICATE_KEYS,
                    CHECKED,
                    "names of additional properties are not kept unique by the grammar; "
                    "a repeated name is detected after generation",
                )
            )
    return entries, children


def _classify_combinator(node, here, strict, combinator, present, mark, entries, children, document=None):
    value = node[combinator]
    siblings = [k for k in present if k != combinator]
    # a oneOf is compiled as the anyOf of its exclusive branches (grammar/rewrites/one_of.py), where known
    exclusive = exclusive_branches(value, document) if combinator == "oneOf" else None
    conditionals = allof_conditionals(node, document) if combinator == "allOf" else None
    # An allOf (an anyOf with keywords beside it) compiled as the object schema(s) it merges into
    # (grammar/rewrites/all_of.py) is classified as compiled: the merged node where it is written, whose
    # keywords then show what xgrammar does with them together. `partial`: some allOf branches
    # cannot merge; the merged node has the rest and the keywords beside, the check keeps them.
    merged = merged_all_of(node, document) if combinator == "allOf" else None
    partial = partly_merged_all_of(node, document) if combinator == "allOf" and merged is None else None
    if conditionals:
        # an allOf of conditionals on one listed property: llguidance enforces it as one anyOf
        # (grammar/rewrites/conditionals.py); each conditional's keywords are reported where they are written
        why = (
            "if/then/else is not masked by xgrammar; in an allOf of conditionals on one listed property, "
            "llguidance enforces them as anyOf branches"
        )
        mark("allOf", CHECKED, why, exact_in_llguidance=True)
        for i in conditionals:
            for keyword in ("if", "then", "else"):
                if keyword in value[i]:
                    entries.append(
                        KeywordFidelity(
                            join_pointer(here, "allOf", i, keyword), keyword, CHECKED, why, exact_in_llguidance=True
                        )
                    )
                    if keyword != "if":
                        children.append((value[i][keyword], join_pointer(here, "allOf", i, keyword), None))
        rest = [i for i in range(len(value)) if i not in conditionals]
        if len(rest) == 1:  # the one other branch is walked as a single-branch allOf's would be
            children.append((value[rest[0]], join_pointer(here, "allOf", rest[0]), None))
    elif merged is not None:
        mark("allOf", ENFORCED)
        children.append((merged, here, None))
        return entries, children
    elif partial is not None and len(value) > 1:
        mark(
            "allOf",
            CHECKED,
            "allOf branches that are not plain schemas are not masked by xgrammar",
            exact_in_llguidance=True,
        )
    elif combinator == "allOf" and isinstance(value, list) and len(value) > 1:
        mark("allOf", CHECKED, "allOf with several branches compiles as any JSON value", exact_in_llguidance=True)
    elif combinator == "anyOf" and siblings and (spread := distributed_any_of(node, document)) is not None:
        mark("anyOf", ENFORCED)
        children += [(b, join_pointer(here, "anyOf", i), None) for i, b in enumerate(spread["anyOf"])]
        return entries, children
    elif combinator == "oneOf" and exclusive is None:
        mark("oneOf", CHECKED, "oneOf branches that may overlap are compiled as anyOf (more than one may match)")
    else:
        mark(combinator, ENFORCED)
        children += _subschemas(node, combinator, here)
    if partial is not None:  # the keywords beside are in the merged node
        children.append((partial, here, None))
        return entries, children
    for keyword in siblings:
        if (
            keyword == "type"
            and combinator in ("anyOf", "oneOf")
            and _branch_types_within(value if exclusive is None else exclusive, node["type"])
        ):
            mark(keyword, ENFORCED)  # every branch already has one of these types
            continue
        if keyword in ("then", "else") and "if" not in node:
            continue
        mark(
            keyword,
            CHECKED,
            f"keywords beside {combinator} are ignored by xgrammar (only {combinator} is compiled); "
            f"move {keyword} into the {combinator} branches",
            exact_in_llguidance=combinator in ("anyOf", "allOf", "$ref") or exclusive is not None,
        )
    return entries, children


def _classify_listed_values(node, here, present, mark, entries, children):
    listed = [node["const"]] if "const" in node else list(node.get("enum") or [])
    rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
    implied = _values_fit(listed, rest)
    fitting = fitting_values(node) if not implied else None  # non-empty: compiled as just these
    for keyword in present:
        if keyword in ("enum", "const"):
            mark(keyword, ENFORCED)
        elif keyword in ("then", "else") and "if" not in node:
            continue
        elif implied:
            mark(keyword, ENFORCED)  # every listed value satisfies it, and only listed values are generated
        elif fitting:
            mark(
                keyword,
                ENFORCED,
                "only the listed values that satisfy it are generated (grammar/rewrites/listed_values.py)",
            )
        else:
            mark(
                keyword,
                CHECKED,
                "beside enum/const only the listed values are compiled; this keyword is ignored "
                "and a listed value breaks it",
            )
    return entries, children


def _classify_scalar_keyword(node: dict, keyword: str, types: set[str] | None, mark) -> None:
    applies_to = _KEYWORD_TYPES[keyword]
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


def _checked_or_unenforced(node: dict, keyword: str) -> str:
    if keyword == "format" and node.get("format") not in CHECKABLE_FORMATS:
        return UNENFORCED
    return CHECKED


def _types(node: dict, implied: str | None) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return {implied} if implied else None


def _subschemas(node: dict, keyword: str, here: str) -> list[tuple[Any, str, str | None]]:
    value = node[keyword]
    if keyword in ("properties",) and isinstance(value, dict):
        return [(v, join_pointer(here, keyword, k), None) for k, v in value.items()]
    if keyword in ("prefixItems", "anyOf", "oneOf", "allOf") and isinstance(value, list):
        return [(v, join_pointer(here, keyword, i), None) for i, v in enumerate(value)]
    if keyword == "propertyNames":
        return [(value, join_pointer(here, keyword), "string")]  # names are strings
    if keyword in ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems") and isinstance(
        value, dict
    ):
        return [(value, join_pointer(here, keyword), None)]
    return []


def _allows_additional_names(node: dict, types: set[str] | None, strict: bool) -> bool:
    """Can the grammar write a property name it did not declare (so perhaps twice)?"""
    if types is not None and "object" not in types:
        return False
    if types is None and not any(k in node for k in OBJECT_KEYWORDS):
        return False
    most = node.get("maxProperties")
    if isinstance(most, int) and most <= 1:
        return False  # one name cannot repeat
    if node.get("patternProperties"):
        return True  # a name matching a pattern may be written again, whatever else closes the object
    if node.get("additionalProperties") is False or node.get("unevaluatedProperties") is False:
        return False
    return not (strict and strict_closes(node))  # strict closes an object of declared names only


def _branch_types_within(branches: Any, declared: Any) -> bool:
    allowed = {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else set()
    if not isinstance(branches, list) or not branches:
        return False
    for branch in branches:
        t = branch.get("type") if isinstance(branch, dict) else None
        got = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if not got or not got <= allowed | ({"integer"} if "number" in allowed else set()):
            return False
    return True


def _values_fit(values: list[Any], rest: dict) -> bool:
    """Does every listed value satisfy the other keywords of its schema (so they need no mask)?"""
    if not any(k in VALIDATION_KEYWORDS for k in rest):
        return True
    if any(k in rest for k in ("$ref",)):
        return False  # would need the whole document to resolve
    try:
        validator = jsonschema.Draft202012Validator(rest, format_checker=jsonschema.FormatChecker())
        return all(validator.is_valid(v) for v in values)
    except Exception:  # a value jsonschema cannot judge here (e.g. a reference): assume it does not fit
        return False
