"""Walking the sub-schemas of a JSON schema, by keyword (the table of where they live is
grammar/schema/keyword_sets.py, used by every walker).

Canonicalization, `$ref` checks and semantic checks all need to know which values are schemas
(to recurse into), which are maps of named schemas, and which are plain data (enum, const, ...).
Keeping that knowledge in one table means the walkers cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

from grammar.errors import join_pointer

# where sub-schemas live, by keyword: the one table is grammar/schema/keyword_sets.py, re-exported here
from grammar.schema.keyword_sets import (
    DEPENDENCIES_KEYWORD,
    NAMED_SCHEMA_MAPS,
    ORDERED_SCHEMA_MAP_KEYWORD,
    SCHEMA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
)

# Keywords that constrain no value (annotations): every walker that asks "does this node say
# anything but X" ignores these.
ANNOTATION_KEYWORDS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "example",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$id",
        "$schema",
        "$anchor",
        "markdownDescription",
    }
)


def resolve_local_ref(root: Any, ref: str) -> Any:
    """The node a local `$ref` ("#", "#/$defs/name", JSON pointer escapes) names in `root`; None
    when it names nothing there (remote references are refused before any walker runs)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node: Any = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def follow_local_refs(node: Any, root: Any, *, only_bare: bool = False, limit: int = 16) -> Any:
    """`node` with a chain of local `$ref`s followed (at most `limit` links; None where one names
    nothing). `only_bare`: follow only a node that holds nothing but `$ref` and annotations (a
    sibling keyword would constrain the value too, so the target alone is not what it means)."""
    for _ in range(limit):
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not isinstance(ref, str) or root is None:
            return node
        if only_bare and any(k != "$ref" and k not in ANNOTATION_KEYWORDS for k in node):
            return node
        node = resolve_local_ref(root, ref)
    return node


# The schema lowerings (conditionals, one_of, formats, listed values, llguidance's rewrite) walk every
# value below a node: NAMED_SCHEMA_MAPS' values are maps of named schemas, these are plain data.
DATA_KEYWORDS = ("const", "enum", "default", "examples")


def rewrite_bottom_up(node: Any, rewrite: Callable[[dict], Any]) -> Any:
    """`node` with `rewrite` applied to every object in it, children before their parent (data
    keywords' values are left as they are)."""
    if isinstance(node, list):
        return [rewrite_bottom_up(v, rewrite) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in NAMED_SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: rewrite_bottom_up(sub, rewrite) for name, sub in value.items()}
        elif key in DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = rewrite_bottom_up(value, rewrite)
    return rewrite(out)


def iter_subschemas(schema: Any, pointer: str = "") -> Iterator[tuple[Any, str]]:
    """Yield (schema, JSON pointer) for the schema and every sub-schema under it, depth first."""
    stack = [(schema, pointer)]
    while stack:
        node, here = stack.pop()
        yield node, here
        if not isinstance(node, dict):
            continue  # boolean schemas have no children
        children: list[tuple[Any, str]] = []
        for keyword, value in node.items():
            if keyword in SCHEMA_KEYWORDS:
                if isinstance(value, list):  # draft 4-7 tuple form of "items"
                    children += [(v, join_pointer(here, keyword, i)) for i, v in enumerate(value)]
                else:
                    children.append((value, join_pointer(here, keyword)))
            elif keyword in SCHEMA_LIST_KEYWORDS and isinstance(value, list):
                children += [(v, join_pointer(here, keyword, i)) for i, v in enumerate(value)]
            elif (keyword in SCHEMA_MAP_KEYWORDS or keyword == ORDERED_SCHEMA_MAP_KEYWORD) and isinstance(value, dict):
                children += [(v, join_pointer(here, keyword, name)) for name, v in value.items()]
            elif keyword == DEPENDENCIES_KEYWORD and isinstance(value, dict):
                children += [
                    (v, join_pointer(here, keyword, name)) for name, v in value.items() if isinstance(v, (dict, bool))
                ]
        stack.extend(reversed(children))


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), computed without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1 if not node else depth)
    return deepest
