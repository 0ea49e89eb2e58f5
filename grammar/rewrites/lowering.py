"""The exact rewrites both engines compile a JSON schema through (each module proves its own):

1. grammar/rewrites/all_of.py: an `allOf` of object schemas as the one object schema it equals;
2. grammar/rewrites/one_of.py: a `oneOf` with provably exclusive branches as their `anyOf`;
3. grammar/rewrites/listed_values.py: `enum`/`const` cut to the values that fit the other keywords, and
   optional properties no value fits left out of closed objects;
4. grammar/rewrites/formats.py: `format: byte` as its base64 pattern.

The order matters: an `allOf` is merged as written (as grammar/validation/fidelity.py judges it; merging only
makes a `oneOf`'s branches plainer), and `oneOf` is judged on the branches as written, before
listed values are cut. grammar/validation/fidelity.py classifies the schema as written and says
`enforced` for what these rewrites make exact.
"""

from __future__ import annotations

from typing import Any

from grammar.rewrites.all_of import lower_all_of
from grammar.rewrites.conditionals import narrow_by_branches
from grammar.rewrites.formats import lower_formats
from grammar.rewrites.listed_values import lower_listed_values
from grammar.rewrites.one_of import lower_one_of
from grammar.schema.canonical import canonical_schema


def lower_for_masks(schema: Any, strict: bool, partial_all_of: bool = False) -> Any:
    """The canonical form of `schema` with every rewrite above applied. `partial_all_of`
    (xgrammar): an `allOf` is merged without the branches that cannot be, and a property that both
    branches of an `if` declare is narrowed to their `anyOf` (grammar/rewrites/conditionals.py
    `narrow_by_branches`), both left to check-and-roll-back (llguidance enforces those, so it
    gets them as written)."""
    canonical = canonical_schema(schema)
    if partial_all_of:
        canonical = narrow_by_branches(canonical)
    merged = lower_all_of(canonical, partial=partial_all_of)
    return lower_formats(lower_listed_values(lower_one_of(merged), strict=strict))
