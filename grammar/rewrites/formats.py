"""Formats written as the `pattern` they mean (both engines mask patterns): ones neither engine
knows, and ones whose built-in masks admit strings jsonschema's format checker refuses.

OpenAPI's `byte` (base64, RFC 4648 section 4, with its padding: what Kubernetes' `[]byte` fields
hold) is the common unknown one. `ipv4`, `ipv6` and `date` are masked by xgrammar, but loosely:
its ipv4 admits leading zeros (`000.000.000.0`, which Python's ipaddress and so jsonschema
refuse; the closing planner's shortest ipv4 was exactly that), ipv6 the same in an embedded IPv4
tail, and its date admits every day up to 31 in every month and the year 0000 (`2023-02-30`,
`0000-01-01`: `datetime.date` refuses both). Their patterns here are exact: what they match is
what jsonschema's checker accepts. A node is rewritten only where it has no `pattern` of its own (two
patterns on one string would need their intersection); grammar/validation/fidelity.py reports such a
`format` enforced under the same condition. grammar/engines/xgrammar/schema.py and grammar/engines/llguidance/schema.py
rewrite before compiling; the output is then validated against the schema as written (jsonschema
treats an unknown format as an annotation, so a masked value always passes).
"""

from __future__ import annotations

from typing import Any

from grammar.schema.walk import rewrite_bottom_up

BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# ipaddress.IPv4Address: four decimal octets 0-255, no leading zero
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
IPV4 = rf"^{_IPV4}$"


def _ipv6() -> str:
    """ipaddress.IPv6Address without a scope id (jsonschema refuses one): eight groups of 1-4 hex
    digits, or fewer around one `::` (which stands for at least one group), the last two groups
    possibly an IPv4 address."""
    h = "[0-9A-Fa-f]{1,4}"

    def groups(n: int) -> str:  # exactly n groups joined by ':'
        return "" if n == 0 else h if n == 1 else f"(?:{h}:){{{n - 1}}}{h}"

    def up_to(n: int, tail: str = "") -> str:  # 0..n groups, each followed by ':' when a tail follows
        if tail:
            return f"(?:{h}:){{0,{n}}}{tail}" if n else tail
        return f"(?:{h}(?::{h}){{0,{n - 1}}})?" if n else ""

    forms = [f"(?:{h}:){{7}}{h}", f"(?:{h}:){{6}}{_IPV4}"]
    forms += [groups(k) + "::" + up_to(7 - k) for k in range(8)]
    forms += [groups(k) + "::" + up_to(5 - k, _IPV4) for k in range(6)]
    return "^(?:" + "|".join(forms) + ")$"


IPV6 = _ipv6()

# datetime.date.fromisoformat on YYYY-MM-DD: years 0001-9999, each month's own length, 29 February
# in leap years only (divisible by 4 and not by 100, or by 400)
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
DATE = f"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)$"

FORMAT_PATTERNS = {"byte": BASE64, "ipv4": IPV4, "ipv6": IPV6, "date": DATE}


def pattern_for(node: dict) -> str | None:
    """The pattern `node`'s format is compiled as (None: its format is not one of these, or the
    node has a pattern of its own)."""
    fmt = node.get("format")
    return FORMAT_PATTERNS.get(fmt) if isinstance(fmt, str) and "pattern" not in node else None


def lower_formats(node: Any) -> Any:
    """`node` with every such format replaced by its pattern."""
    return rewrite_bottom_up(node, _lower_format)


def _lower_format(out: dict) -> Any:
    pattern = pattern_for(out)  # the recursion leaves `format` and `pattern` as they are
    if pattern is None:
        return out
    lowered = {k: v for k, v in out.items() if k != "format"}
    lowered["pattern"] = pattern
    return {k: lowered[k] for k in sorted(lowered)}
