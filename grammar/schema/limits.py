"""Size limits on specs, checked before anything walks them recursively or compiles them.

A spec past these limits is refused with a clear message instead of exhausting the recursion
limit, the memory, or the compile time of the server.
"""

from __future__ import annotations

from typing import Any

from grammar.errors import GrammarSpecError, join_pointer

MAX_SPEC_BYTES = 1_000_000  # canonical JSON text (or regex / EBNF source), UTF-8 bytes
MAX_JSON_DEPTH = 64  # nesting of JSON containers; a schema level is usually 2 (properties/name)


def check_json_limits(value: Any, *, param: str | None = None) -> None:
    """Refuse text over MAX_SPEC_BYTES and JSON nested deeper than MAX_JSON_DEPTH."""
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_SPEC_BYTES:
            raise GrammarSpecError(
                f"spec is {size} bytes, over the {MAX_SPEC_BYTES}-byte limit; split or simplify it",
                "",
                param,
            )
        return
    # The walk keeps a lower bound of the compact JSON size, so a hostile payload (a few MB of tiny
    # containers) is refused after about MAX_SPEC_BYTES nodes instead of walking all of it first;
    # the path of a node is kept as a parent link and only spelled out for an error.
    lower_bound = 0
    stack: list[tuple[Any, int, tuple | None]] = [(value, 0, None)]
    while stack:
        node, depth, link = stack.pop()
        if isinstance(node, str):
            lower_bound += len(node) + 2
        elif not isinstance(node, (dict, list)):
            lower_bound += 1
        else:
            if depth >= MAX_JSON_DEPTH:
                raise GrammarSpecError(
                    f"nested deeper than {MAX_JSON_DEPTH} levels; flatten the schema or use $defs/$ref",
                    join_pointer("", *_path(link)),
                    param,
                )
            lower_bound += 1 + len(node)  # brackets and separators
            if isinstance(node, dict):
                lower_bound += sum(len(str(k)) + 3 for k in node)  # "key":
            if lower_bound <= MAX_SPEC_BYTES:  # checked before the children are queued
                items = node.items() if isinstance(node, dict) else enumerate(node)
                stack.extend((v, depth + 1, (link, k)) for k, v in items)
        if lower_bound > MAX_SPEC_BYTES:
            raise GrammarSpecError(
                f"spec is more than {MAX_SPEC_BYTES} bytes as JSON, over the {MAX_SPEC_BYTES}-byte limit; "
                "split or simplify it",
                "",
                param,
            )


def _path(link: tuple | None) -> list:
    path = []
    while link is not None:
        link, key = link
        path.append(key)
    return path[::-1]
