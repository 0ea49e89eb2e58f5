"""Shorter prompt text for long schemas and tool sets: the compaction ladder.

The grammar always enforces the whole schema; the prompt text is only a hint to the model. When the
full text would not fit the prompt budget, `PromptRenderer` renders the first of these levels that
does. Each level is a pure function of the schema (no randomness, no dict-order dependence beyond
the schema's own), so the same schema renders the same text and still shares a radix-cache prefix.

  0 full        the schema as given
  1 trimmed     every description cut to DESCRIPTION_CHARS
  2 structure   names, types, required; annotations dropped, enums shortened to ENUM_SHOWN values
  3 names       property names (and required) only, no types
  4 tool names  tools: function names only; a schema: as level 3
"""

from __future__ import annotations

from typing import Any, Callable

from grammar.schema.keyword_sets import DEPENDENCIES_KEYWORD, NAMED_SCHEMA_MAPS, SCHEMA_KEYWORDS, SCHEMA_LIST_KEYWORDS

FULL, TRIMMED, STRUCTURE, NAMES, TOOL_NAMES = range(5)
LEVELS = (FULL, TRIMMED, STRUCTURE, NAMES, TOOL_NAMES)
LEVEL_NAMES = ("full", "trimmed", "structure", "names", "tool_names")

DESCRIPTION_CHARS = 80
ENUM_SHOWN = 8

# what the structure level drops: text for people, not shape
_ANNOTATIONS = frozenset(
    {
        "description",
        "title",
        "examples",
        "example",
        "default",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$schema",
        "$id",
    }
)


def _walk(schema: Any, local: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`schema` with `local` applied to it and to every sub-schema (keywords only, never to a
    property that happens to be called "description")."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in NAMED_SCHEMA_MAPS and isinstance(value, dict):
            out[keyword] = {name: _walk(sub, local) for name, sub in value.items()}
        elif keyword == DEPENDENCIES_KEYWORD and isinstance(value, dict):  # name -> schema or names
            out[keyword] = {name: _walk(sub, local) for name, sub in value.items()}
        elif keyword in SCHEMA_LIST_KEYWORDS and isinstance(value, list):
            out[keyword] = [_walk(sub, local) for sub in value]
        elif keyword in SCHEMA_KEYWORDS and isinstance(value, (dict, list)):
            out[keyword] = [_walk(s, local) for s in value] if isinstance(value, list) else _walk(value, local)
        else:
            out[keyword] = value
    return local(out)


def _trim(text: Any) -> Any:
    if isinstance(text, str) and len(text) > DESCRIPTION_CHARS:
        return text[:DESCRIPTION_CHARS].rstrip() + "…"
    return text


def _trimmed(node: dict[str, Any]) -> dict[str, Any]:
    if "description" in node:
        node["description"] = _trim(node["description"])
    return node


def _structure(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k not in _ANNOTATIONS}
    if isinstance(out.get("enum"), list) and len(out["enum"]) > ENUM_SHOWN:
        out["enum"] = out["enum"][:ENUM_SHOWN]
    return out


def _names(schema: Any) -> Any:
    """The top level's property names and required list; nested shapes are left to the grammar."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {k: schema[k] for k in ("type", "required") if k in schema}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {name: {} for name in schema["properties"]}
    return out


def compact_schema(schema: Any, level: int) -> Any:
    """The schema as the prompt shows it at `level`."""
    if level == FULL:
        return schema
    if level == TRIMMED:
        return _walk(schema, _trimmed)
    if level == STRUCTURE:
        return _walk(schema, _structure)
    return _names(schema)


def compact_tool(tool: Any, level: int) -> Any:
    """An OpenAI tool as the prompt shows it at `level`."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if level == FULL or not isinstance(function, dict):
        return tool
    if level == TOOL_NAMES:
        return {"type": tool.get("type", "function"), "function": {"name": function.get("name")}}
    out = {k: v for k, v in function.items() if level == TRIMMED or k not in _ANNOTATIONS}
    if level == TRIMMED and "description" in out:
        out["description"] = _trim(out["description"])
    if "parameters" in function:
        out["parameters"] = compact_schema(function["parameters"], level)
    return {**tool, "function": out}


def compact_tools(tools: list[Any], level: int) -> list[Any]:
    return [compact_tool(t, level) for t in tools]
