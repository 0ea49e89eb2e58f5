"""Canonical JSON: one text per meaning, so equal specs hash (and cache) equally.

Object keys are sorted and separators fixed (",", ":") -- except the names under a schema's
`properties`, whose order is the order in which the fields are generated. Sorting them would make
two schemas that produce different outputs share one compiled grammar (and a schema that puts
`reasoning` before `answer` would silently get `answer` first).
"""

from __future__ import annotations

import json
from typing import Any

from grammar.schema.walk import (
    DEPENDENCIES_KEYWORD,
    ORDERED_SCHEMA_MAP_KEYWORD,
    SCHEMA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
)


def canonical_json(value: Any) -> str:
    """Compact JSON of an already-canonicalized value (key order is taken as given)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_data(value: Any) -> Any:
    """Plain JSON data with every object's keys sorted (lists keep their order)."""
    if isinstance(value, dict):
        return {k: canonical_data(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical_data(v) for v in value]
    return value


def canonical_schema(schema: Any) -> Any:
    """A JSON schema with keywords sorted, sub-schemas canonicalized, `properties` order kept."""
    if not isinstance(schema, dict):
        return canonical_data(schema)
    out: dict[str, Any] = {}
    for keyword in sorted(schema):
        value = schema[keyword]
        if keyword in SCHEMA_KEYWORDS:
            out[keyword] = [canonical_schema(v) for v in value] if isinstance(value, list) else canonical_schema(value)
        elif keyword in SCHEMA_LIST_KEYWORDS and isinstance(value, list):
            out[keyword] = [canonical_schema(v) for v in value]
        elif keyword in SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            out[keyword] = {name: canonical_schema(value[name]) for name in sorted(value)}
        elif keyword == ORDERED_SCHEMA_MAP_KEYWORD and isinstance(value, dict):
            out[keyword] = {name: canonical_schema(v) for name, v in value.items()}
        elif keyword == DEPENDENCIES_KEYWORD and isinstance(value, dict):
            out[keyword] = {
                name: canonical_schema(value[name]) if isinstance(value[name], dict) else canonical_data(value[name])
                for name in sorted(value)
            }
        else:
            out[keyword] = canonical_data(value)
    return out


def canonical_tool(tool: Any) -> Any:
    """An OpenAI tool with sorted keys, its `function.parameters` canonicalized as a schema."""
    if not isinstance(tool, dict):
        return canonical_data(tool)
    out = canonical_data(tool)
    function = tool.get("function")
    if isinstance(function, dict) and "parameters" in function:
        out["function"]["parameters"] = canonical_schema(function["parameters"])
    return out
