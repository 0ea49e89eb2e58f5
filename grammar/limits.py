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
    stack: list[tuple[Any, int, tuple]] = [(value, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise GrammarSpecError(
                f"nested deeper than {MAX_JSON_DEPTH} levels; flatten the schema or use $defs/$ref",
                join_pointer("", *path),
                param,
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((v, depth + 1, path + (k,)) for k, v in items)
