"""One row of the keyword table (grammar/validation/keywords/), and the small schemas its examples use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeywordRow:
    keywords: str  # what the row covers, as the docs name it
    kept_by: str  # xgrammar | llguidance | value_check | check_and_rollback | unenforced | checked
    condition: str  # when this row applies ("" : always)
    module: str  # where it is done
    example: dict[str, Any]  # a schema in which the keyword is kept this way
    pointer: str  # the keyword's JSON pointer in `example`
    keyword: str  # the keyword at `pointer`, as the fidelity report names it
    rule: str = ""  # the name the walk gives this way of keeping it ("": plainly masked by the engine)
    reason: str = ""  # what the report says (a str.format template: {keyword}, and fields the walk gives)
    default_for: tuple[str, ...] = ()  # keywords this row keeps when the walk has nothing more specific
    strict: bool = True  # the example's mode
    via: str = "json_schema"  # the example's kind: json_schema, or tool_calls (the example is a tool's parameters)


def obj(name: str, schema: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {name: schema}, "required": [name], **more}


OBJECT_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
