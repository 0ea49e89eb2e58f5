"""The canonical text of a JSON value: two values are equal under JSON Schema's equality (1 and
1.0 are, true and 1 are not) exactly when their canonical texts are equal."""

from __future__ import annotations

import json
from typing import Any


def canonical(value: Any) -> str:
    """Equal under JSON Schema's equality exactly when equal as strings."""
    return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normal(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value
