"""Which JSON Schema keywords validate, grouped by the values they apply to: the one list the
fidelity report (grammar/validation/) and the value check's schema questions (grammar/checks/)
both read, so they cannot disagree about what "a keyword that changes which values are valid" is.
Any other keyword is an annotation (grammar/schema/walk.py: ANNOTATION_KEYWORDS) or unknown.
"""

from __future__ import annotations

STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "format")
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
ARRAY_KEYWORDS = (
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
)
OBJECT_KEYWORDS = (
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
)
COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
CONDITIONALS = ("not", "if", "then", "else")

# Validation keywords of 2020-12 and drafts 4-7 that the fidelity report classifies one by one.
VALIDATION_KEYWORDS = frozenset(
    ("type", "enum", "const")
    + STRING_KEYWORDS
    + NUMBER_KEYWORDS
    + ARRAY_KEYWORDS
    + OBJECT_KEYWORDS
    + COMBINATORS
    + CONDITIONALS
)
# Validating keywords the report does not classify: drafts 4-7's `additionalItems` and the dynamic
# references (json_schema_check.py checks that those resolve). A walker asking "does this node
# say anything besides X" must still count them.
UNCLASSIFIED_VALIDATION_KEYWORDS = frozenset(("additionalItems", "$dynamicRef", "$recursiveRef"))
ALL_VALIDATION_KEYWORDS = VALIDATION_KEYWORDS | UNCLASSIFIED_VALIDATION_KEYWORDS
# The JSON types a string or number keyword applies to (JSON Schema ignores it on other values).
KEYWORD_TYPES = {**{k: ("string",) for k in STRING_KEYWORDS}, **{k: ("integer", "number") for k in NUMBER_KEYWORDS}}
