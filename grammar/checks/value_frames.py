"""The value check's stack frames: an object or array being written, with what it has held so far
(names, canonical items) and the schema rules that apply there."""

from __future__ import annotations

from typing import NamedTuple

from grammar.checks.object_items import ItemRule, ObjectItems
from grammar.checks.value_rules import DependentNames


class ObjectFrame(NamedTuple):
    keys: frozenset  # names written so far (decoded; kept only where the grammar may repeat one)
    nodes: tuple | None  # the schema nodes of this object (None: no schema rules)
    key: str | None  # the name whose value is being written
    want_key: bool  # the next string is a name
    start: int  # offset of its `{` when it is an item of a unique array, else -1
    free: bool  # the grammar may write a name twice here (it does not close the object's names)
    deps: DependentNames | None  # dependentRequired here (None: none)
    model: ObjectItems | None = None  # an item of a unique array of scalar-property objects (value_rules.py)
    done: tuple = ()  # with a model: the (name, canonical value) pairs written so far


class ArrayFrame(NamedTuple):
    items: frozenset  # canonical forms of the items so far (unique arrays only)
    count: int  # items started
    nodes: tuple | None
    rule: ItemRule | None  # None: items may repeat
    start: int


def dependents_pending(frame) -> bool:
    """Is `frame` an object holding a name whose dependentRequired names are not all written?"""
    return type(frame) is ObjectFrame and frame.deps is not None and bool(frame.deps.missing(frame.keys))
