"""The registry of constraint kinds: one module per kind, each a `ConstraintKind` (see base.py,
which also says how to add one)."""

from __future__ import annotations

from grammar.errors import GrammarSpecError
from grammar.kinds import choice, ebnf, json_object, json_schema, regex, structural_tag, tool_calls
from grammar.kinds.base import ConstraintKind

KINDS: dict[str, ConstraintKind] = {
    k.name: k
    for k in (
        json_schema.KIND,
        json_object.KIND,
        regex.KIND,
        ebnf.KIND,
        choice.KIND,
        structural_tag.KIND,
        tool_calls.KIND,
    )
}

__all__ = ["KINDS", "ConstraintKind", "kind_for"]


def kind_for(name: str, param: str | None = None) -> ConstraintKind:
    """The kind called `name`; GrammarSpecError (pointing at `param`) for a name not registered."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise GrammarSpecError(f"unknown grammar kind {name!r}; expected one of {', '.join(KINDS)}", "", param)
    return kind
