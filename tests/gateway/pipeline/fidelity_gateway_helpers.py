"""What the gateway's schema fidelity tests share: a response_format body and a schema with
uniqueItems the value check does not claim."""

from __future__ import annotations

# bounded items: a repeated item may have no way to grow into a new one, so the value check does
# not claim uniqueItems here (grammar/checks/value_rules.py) and strict mode refuses it
UNIQUE = {
    "type": "object",
    "properties": {"ids": {"type": "array", "items": {"type": "integer", "maximum": 100}, "uniqueItems": True}},
    "required": ["ids"],
}


def json_schema(schema, **extra):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, **extra}}
