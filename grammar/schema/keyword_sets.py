"""Which JSON Schema keywords validate, grouped by the values they apply to: the one list the
fidelity report (grammar/validation/) and the value check's schema questions (grammar/checks/)
both read, so they cannot disagree about what "a keyword that changes which values are valid" is.
Any other keyword is an annotation (grammar/schema/walk.py: ANNOTATION_KEYWORDS) or unknown.

It also says where sub-schemas live (SCHEMA_KEYWORDS and below): every walker of a schema, in
grammar/, the gateway's prompt compaction and the fidelity bench's corpus, reads that one table.
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

# Where sub-schemas live. keyword -> value is one schema
SCHEMA_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "items",
    }
)
# keyword -> value is a list of schemas ("items" may also be a list in drafts 4-7)
SCHEMA_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
# keyword -> value maps names to schemas; the names' order carries no meaning
SCHEMA_MAP_KEYWORDS = frozenset({"$defs", "definitions", "patternProperties", "dependentSchemas"})
# `properties` maps names to schemas too, but its order is the order in which fields are
# generated (xgrammar follows it), so it is kept as written.
ORDERED_SCHEMA_MAP_KEYWORD = "properties"
# draft-7 `dependencies`: name -> schema or list of names
DEPENDENCIES_KEYWORD = "dependencies"
# every keyword whose value maps names to schemas
NAMED_SCHEMA_MAPS = frozenset(SCHEMA_MAP_KEYWORDS | {ORDERED_SCHEMA_MAP_KEYWORD})
