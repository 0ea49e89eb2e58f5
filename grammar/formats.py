"""Formats neither engine knows, written as the `pattern` they mean (both engines mask patterns).

OpenAPI's `byte` (base64, RFC 4648 section 4, with its padding: what Kubernetes' `[]byte` fields
hold) is the common one. A node is rewritten only where it has no `pattern` of its own (two
patterns on one string would need their intersection); grammar/fidelity.py reports such a
`format` enforced under the same condition. grammar/compact_json.py and grammar/llg_schema.py
rewrite before compiling; the output is then validated against the schema as written (jsonschema
treats an unknown format as an annotation, so a masked value always passes).
"""

from __future__ import annotations

from typing import Any

from grammar.schema_walk import rewrite_bottom_up

BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
FORMAT_PATTERNS = {"byte": BASE64}


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
