"""Schemas shared by the name-hint tests (test_plan_names.py, test_plan_names_e2e.py)."""

# an object whose optional properties, declared first, each hold a large required-only object:
# the first letter in vocabulary order (`a`) starts one of them, and each costs ~200 tokens
BIG = {
    "type": "object",
    "properties": {f"field_number_{i:02d}": {"type": "string"} for i in range(40)},
    "required": [f"field_number_{i:02d}" for i in range(40)],
    "additionalProperties": False,
}
FAR_REQUIRED = {
    "type": "object",
    "properties": {**{f"a{i}": BIG for i in range(6)}, "title": {"type": "string"}},
    "required": ["title"],
    "additionalProperties": False,
}
