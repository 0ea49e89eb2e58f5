"""The exact rewrites both engines compile a JSON schema through (each module proves its own):

1. grammar/one_of.py: a `oneOf` with provably exclusive branches as their `anyOf`;
2. grammar/listed_values.py: `enum`/`const` cut to the values that fit the other keywords, and
   optional properties no value fits left out of closed objects;
3. grammar/formats.py: `format: byte` as its base64 pattern.

The order matters: `oneOf` is judged on the branches as written (as grammar/fidelity.py judges
it), before listed values are cut. grammar/fidelity.py classifies the schema as written and says
`enforced` for what these rewrites make exact.
"""

from __future__ import annotations

from typing import Any

from grammar.canonical import canonical_schema
from grammar.formats import lower_formats
from grammar.listed_values import lower_listed_values
from grammar.one_of import lower_one_of


def lower_for_masks(schema: Any, strict: bool) -> Any:
    """The canonical form of `schema` with every rewrite above applied."""
    return lower_formats(lower_listed_values(lower_one_of(canonical_schema(schema)), strict=strict))
